"""
The statistics of the study's report (annex/report.py), in pure Python and numpy: Student's t and paired
t intervals over seeds, Holm's adjusted p-values, the sign-flip intersection-union test, exact
(Clopper-Pearson) binomial intervals, the screening rule's scores (accuracy, balanced accuracy, AUC,
leave-one-scale-out) and a bootstrap that resamples scales rather than cells.
"""
import math

import numpy as np


def _bisect(f, lo, hi):
    """The root of an increasing f on [lo, hi] (f(lo) <= 0 <= f(hi)), halving until the bracket cannot be
    split in floating point."""
    mid = (lo + hi) / 2
    while lo < mid < hi:
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
        mid = (lo + hi) / 2
    return mid

# ------------------------------------------------------------------------------------------- Student's t


def t_pvalue(t, df):
    """Two-sided p-value of Student's t with an integer number of degrees of freedom (>= 1): for
    t^2 <= df the finite sums of Abramowitz & Stegun 26.7.3-4 in theta = atan(|t| / sqrt(df)); in the
    tail, where 1 minus those sums would cancel, the incomplete beta's series (t_tail)."""
    if t * t > df:
        return t_tail(t, df)
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    for k in range(1, (df - 1) // 2 if df % 2 else df // 2):
        term *= c2 * (2 * k / (2 * k + 1) if df % 2 else (2 * k - 1) / (2 * k))
        total += term
    if df % 2:
        return 1 - 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0))
    return 1 - math.sin(theta) * total


def t_tail(t, df):
    """P(|T| > |t|) for t^2 > df as I_x(df/2, 1/2), x = df / (df + t^2) < 1/2 (A&S 26.7.1), by the
    power series of A&S 26.5.4, x^a (1-x)^b / (a B(a, b)) sum_n (a+b)_n / (a+1)_n x^n, each term under
    x times the last; in logarithms, so that it keeps its relative accuracy down to the smallest
    floats (no overflow of t^2 either)."""
    a, b = df / 2, 0.5
    log_r = math.log(df) - 2 * math.log(abs(t))  # r = df / t^2 < 1, and x = r / (1 + r)
    log_x = log_r - math.log1p(math.exp(log_r))
    x, total, term, n = math.exp(log_x), 1.0, 1.0, 0
    while term > 1e-17 * total:
        term *= x * (a + b + n) / (a + 1 + n)
        total += term
        n += 1
    log_front = (a * log_x - b * math.log1p(math.exp(log_r)) - math.log(a)
                 - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)))
    return math.exp(log_front) * total


def t_cdf(t, df):
    """P(T <= t) for Student's t with df degrees of freedom (by symmetry from the two-sided p)."""
    half = t_pvalue(t, df) / 2
    return 1 - half if t >= 0 else half


def t_quantile(q, df):
    """The t with t_cdf(t, df) == q (0 < q < 1), by bisection in theta = atan(t / sqrt(df)): its bracket,
    (-pi/2, pi/2), holds every quantile."""
    if not 0 < q < 1:
        raise ValueError(f't_quantile: q must be in (0, 1), got {q}')
    theta = _bisect(lambda th: t_cdf(math.sqrt(df) * math.tan(th), df) - q, -math.pi / 2, math.pi / 2)
    return math.sqrt(df) * math.tan(theta)


def paired(a, b, level=0.95):
    """Paired t-test and interval of the mean of d = a - b (one pair per seed): p two-sided, p_less for
    "mean(d) < 0", p_greater for "mean(d) > 0". Fields that need 2 pairs are None. A zero spread (every
    seed moved alike) gives the interval [mean, mean] and the p-values of t's limit, 0 or infinite
    (t itself None: JSON has no infinity), so that the comparison stays in Holm's family."""
    if len(a) != len(b):
        raise ValueError(f'paired: {len(a)} values against {len(b)}; pass the seeds both have')
    d, n = np.asarray(a, float) - np.asarray(b, float), len(a)
    res = dict(n=n, mean_diff=None, sd_diff=None, t=None, p=None, p_less=None, p_greater=None, ci=None)
    if n == 0:
        return res
    res['mean_diff'] = mean = float(d.mean())
    if n == 1:
        return res
    res['sd_diff'] = sd = float(d.std(ddof=1))
    if sd == 0:
        limit = 0.0
        if mean != 0:
            limit = math.copysign(math.inf, mean)
        return res | dict(ci=[mean, mean], **t_probabilities(limit, n - 1))
    se = sd / math.sqrt(n)
    t, half = mean / se, t_quantile((1 + level) / 2, n - 1) * se
    return res | dict(t=t, ci=[mean - half, mean + half], **t_probabilities(t, n - 1))


def t_probabilities(t, df):  # two-sided, for "mean < 0", for "mean > 0"
    return dict(p=t_pvalue(t, df), p_less=t_cdf(t, df), p_greater=t_cdf(-t, df))

# ---------------------------------------------------------------------------------- multiple comparisons


def holm(ps):
    """Holm-Bonferroni adjusted p-values, in the input order; None entries stay None and are not counted
    among the m tests."""
    order = sorted((i for i, p in enumerate(ps) if p is not None), key=lambda i: ps[i])
    out, running = list(ps), 0.0
    for j, i in enumerate(order):  # j = rank - 1: the p-value is multiplied by m - rank + 1
        running = max(running, min(1.0, (len(order) - j) * ps[i]))
        out[i] = running
    return out


def intersection_union(ps):
    """p-value of "every one of these one-sided alternatives holds" (e.g. the change flips sign between
    two budgets): the largest p. Intersection-union test (Berger 1982): each test is run at level alpha,
    with no correction. None if the list is empty or any p is None."""
    return max(ps) if ps and None not in ps else None

# ---------------------------------------------------------------------------------------------- binomial


def _binom(n, p, ks):
    """P(X in ks) for X ~ Binomial(n, p), the terms summed one by one (math.comb: n up to ~1000)."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in ks)


def clopper_pearson(k, n, level=0.95):
    """Exact binomial interval for k successes in n trials: lo solves P(X >= k | lo) = (1 - level) / 2
    (lo = 0 when k == 0), hi solves P(X <= k | hi) = (1 - level) / 2 (hi = 1 when k == n), by bisection
    on the binomial sums. (None, None) when n == 0."""
    if n == 0:
        return None, None
    tail = (1 - level) / 2
    lo = 0.0 if k == 0 else _bisect(lambda p: _binom(n, p, range(k, n + 1)) - tail, 0.0, 1.0)
    hi = 1.0 if k == n else _bisect(lambda p: tail - _binom(n, p, range(k + 1)), 0.0, 1.0)
    return lo, hi

# ------------------------------------------------------------------------------------ the screening rule


def auc(scores, positive):
    """P(score of a positive > score of a negative), ties counting half (Mann-Whitney); None without
    both classes."""
    pos = [s for s, y in zip(scores, positive) if y]
    neg = [s for s, y in zip(scores, positive) if not y]
    if not pos or not neg:
        return None
    return sum((p > q) + 0.5 * (p == q) for p in pos for q in neg) / (len(pos) * len(neg))


def candidates(scores):
    """One threshold per gap of the sorted distinct scores (every threshold in a gap predicts
    alike): one below all, the midpoints between consecutive scores, one above all."""
    s = sorted(set(scores))
    return [s[0] - 1] + [(x + y) / 2 for x, y in zip(s, s[1:])] + [s[-1] + 1]


def best_thresholds(scores, outcomes, cands):
    """The candidates t with the best accuracy of "outcome iff score > t", in their order."""
    right = [sum((x > t) == y for x, y in zip(scores, outcomes)) for t in cands]
    return [t for t, r in zip(cands, right) if r == max(right)]


def fit_threshold(scores, outcomes):
    """The threshold with the best accuracy, ties to the smallest: for every predictor written as
    'score > threshold', a tie goes to predicting "helps" more often."""
    return best_thresholds(scores, outcomes, candidates(scores))[0]


def rule_stats(items, threshold=None):
    """How well "outcome iff score > threshold" predicts, on items [(group, score, outcome)]:
    accuracy with its exact interval, balanced accuracy (mean of the two classes' recalls), AUC of
    the score, and leave-one-group-out accuracy (each group predicted by a threshold fitted on the
    other groups; None with one group) with loso_range, its lowest and highest over every choice
    among tied thresholds. The refit ignores the given threshold, so that the tie-break is the same
    for every predictor. threshold None: fitted in-sample (fitted=True)."""
    n = len(items)
    if n == 0:
        return dict(n=0) | dict.fromkeys(('threshold', 'fitted', 'correct', 'accuracy', 'accuracy_ci',
                                          'balanced_accuracy', 'auc', 'loso', 'loso_correct',
                                          'loso_range'))
    groups = [g for g, _, _ in items]
    scores, outcomes = [float(s) for _, s, _ in items], [bool(y) for _, _, y in items]
    fitted = threshold is None
    if fitted:
        threshold = fit_threshold(scores, outcomes)
    right = [(s > threshold) == y for s, y in zip(scores, outcomes)]
    recalls = [np.mean([r for r, y in zip(right, outcomes) if y == cls]) for cls in set(outcomes)]
    loso = dict(loso=None, loso_correct=None, loso_range=None)
    if len(set(groups)) > 1:
        folds = [leave_out(scores, outcomes, groups, held) for held in sorted(set(groups))]
        loso = dict(loso_correct=sum(f[0] for f in folds), loso=sum(f[0] for f in folds) / n,
                    loso_range=[sum(f[1] for f in folds) / n, sum(f[2] for f in folds) / n])
    return dict(n=n, threshold=threshold, fitted=fitted, correct=sum(right), accuracy=sum(right) / n,
                accuracy_ci=list(clopper_pearson(sum(right), n)),
                balanced_accuracy=float(np.mean(recalls)) if len(recalls) == 2 else None,
                auc=auc(scores, outcomes), **loso)


def leave_out(scores, outcomes, groups, held):
    """The held-out group's items right at the threshold fitted on the other groups, then the fewest
    and the most right over every threshold that fits the others as well (any tie-break): the
    candidates of all the scores, so that a gap of the others' scores holding held-out scores counts
    once per side of each."""
    rest = [(s, y) for s, y, g in zip(scores, outcomes, groups) if g != held]
    rest_scores, rest_outcomes = [s for s, _ in rest], [y for _, y in rest]
    mine = [(s, y) for s, y, g in zip(scores, outcomes, groups) if g == held]
    ties = best_thresholds(rest_scores, rest_outcomes, candidates(scores))
    counts = [sum((s > t) == y for s, y in mine) for t in ties]
    fitted = fit_threshold(rest_scores, rest_outcomes)
    return sum((s > fitted) == y for s, y in mine), min(counts), max(counts)


def cluster_resamples(items, n_boot, seed):
    """n_boot bootstrap resamples of items [(group, ...)] by group: the cells of one scale are not
    independent, so the bootstrap resamples scales (a cluster bootstrap), not cells. Each resample draws
    as many groups as there are, with replacement, and takes every item of each. A group drawn twice
    keeps its label, so leave-one-group-out holds both copies out together: a copy is never predicted
    from a threshold fitted on its twin."""
    rng = np.random.default_rng(seed)
    groups = sorted(set(i[0] for i in items))
    members = {g: [i for i in items if i[0] == g] for g in groups}
    return [[i for g in rng.integers(0, len(groups), len(groups)) for i in members[groups[g]]]
            for _ in range(n_boot)]


def bootstrap_rule(items, n_boot, seed, threshold=None):
    """95% percentile intervals [lo, hi] of rule_stats' accuracy, balanced_accuracy, auc and loso over
    cluster_resamples; resamples where a statistic is undefined are dropped (None if none is left)."""
    draws = [rule_stats(r, threshold) for r in cluster_resamples(items, n_boot, seed)]
    out = {}
    for key in ('accuracy', 'balanced_accuracy', 'auc', 'loso'):
        vals = [d[key] for d in draws if d[key] is not None]
        out[key] = [float(v) for v in np.percentile(vals, [2.5, 97.5])] if vals else None
    return out
