"""annex/stats.py against independent computations: Student's t against its closed forms and printed
tables, the paired interval, Holm and the exact binomial interval by hand, and the screening rule on the
study's 12 published cells, its leave-one-scale-out by a brute force written here; the cluster bootstrap
on a case whose answer is known."""
import math
from collections import Counter

import numpy as np
import pytest

from annex import stats

# Student's t_{0.975} for df 1, 3, 4, 9, 30, from a printed table.
T975 = {1: 12.7062, 3: 3.182446, 4: 2.776445, 9: 2.262157, 30: 2.042272}


def t_cdf_closed(t, df):
    """P(T <= t) in closed form for df 1 to 5 (the textbook expressions, not A&S's sums)."""
    x, r = 1 + t * t / df, math.sqrt(df)
    return {1: 0.5 + math.atan(t) / math.pi,
            2: 0.5 + t / (2 * math.sqrt(2 + t * t)),
            3: 0.5 + (t / (r * x) + math.atan(t / r)) / math.pi,
            4: 0.5 + 3 / 8 * t / math.sqrt(x) * (1 - t * t / (12 * x)),
            5: 0.5 + (t / (r * x) * (1 + 2 / (3 * x)) + math.atan(t / r)) / math.pi}[df]


def test_t_against_closed_forms_and_tables():
    for df in range(1, 6):
        for t in (-7.5, -2.0, -0.3, 0.0, 0.4, 1.0, 3.3, 12.0):
            assert stats.t_cdf(t, df) == pytest.approx(t_cdf_closed(t, df), abs=1e-13)
            assert stats.t_pvalue(t, df) == pytest.approx(2 * (1 - t_cdf_closed(abs(t), df)), abs=1e-13)
        assert stats.t_cdf(0, df) == 0.5
    for q in (1e-4, 0.01, 0.3, 0.5, 0.8, 0.975, 0.9999):
        df1, df2 = math.tan(math.pi * (q - 0.5)), (2 * q - 1) / math.sqrt(2 * q * (1 - q))
        assert stats.t_quantile(q, 1) == pytest.approx(df1, rel=1e-12, abs=1e-15)
        assert stats.t_quantile(q, 2) == pytest.approx(df2, rel=1e-12, abs=1e-15)
    for df, t in T975.items():
        assert stats.t_quantile(0.975, df) == pytest.approx(t, abs=1e-5)
        assert stats.t_quantile(0.025, df) == pytest.approx(-t, abs=1e-5)
        assert stats.t_pvalue(t, df) == pytest.approx(0.05, abs=1e-5)
    with pytest.raises(ValueError):
        stats.t_quantile(1.0, 3)


def test_t_tail_keeps_its_relative_accuracy_down_to_1e_300():
    """Far in the tail p is computed, never 1 minus a sum near 1 (which reached 0 and -2.2e-16):
    against tail-safe closed forms for df 1 and 2, and for any df against the leading term of the
    tail, 2 Gamma((df+1)/2) df^(df/2-1) / (sqrt(pi) Gamma(df/2) t^df), whose relative error is
    O(df/t^2): nothing at these t."""
    for t in (30.0, 1e3, 1e8, 1e50, 1e150, 1e299):
        assert stats.t_pvalue(t, 1) == pytest.approx(2 / math.pi * math.atan(1 / t), rel=1e-12)
        assert stats.t_cdf(-t, 1) == pytest.approx(math.atan(1 / t) / math.pi, rel=1e-12)
    for t in (30.0, 1e3, 1e8, 1e50, 1e149):
        u2 = (1 / t) ** 2  # df 2: 1 - t / sqrt(2 + t^2), without the cancellation
        want = 2 * u2 / (math.sqrt(1 + 2 * u2) * (math.sqrt(1 + 2 * u2) + 1))
        assert stats.t_pvalue(-t, 2) == pytest.approx(want, rel=1e-12)
    for df, t in ((3, 1e20), (3, 1e99), (5, 1e40), (5, 1e59), (10, 1e20), (10, 1e29), (30, 1e9)):
        log_lead = (math.log(2) + math.lgamma((df + 1) / 2) + (df / 2 - 1) * math.log(df)
                    - 0.5 * math.log(math.pi) - math.lgamma(df / 2) - df * math.log(t))
        p = stats.t_pvalue(t, df)
        assert p == pytest.approx(math.exp(log_lead), rel=1e-9) and 1e-300 < p < 1e-50
    for df in (1, 2, 3, 4, 7, 30):  # the two ways agree where they meet, t^2 = df; p falls, > 0
        edge = math.sqrt(df)
        assert stats.t_pvalue(edge * (1 + 1e-9), df) == pytest.approx(
            stats.t_pvalue(edge * (1 - 1e-9), df), rel=1e-8)
        ps = [stats.t_pvalue(t, df) for t in (0.5, 1, 2, 5, 20, 100, 1e4, 1e8)]
        assert all(a > b > 0 for a, b in zip(ps, ps[1:]))


def test_paired_by_hand():
    a, b = [3.1, 3.4, 2.9, 3.3], [3.0, 3.0, 3.1, 3.0]
    d = [x - y for x, y in zip(a, b)]  # 0.1, 0.4, -0.2, 0.3: mean 0.15, squares sum 0.21, sd sqrt(0.07)
    mean = sum(d) / 4
    ss = 0.0
    for x in d:
        ss += (x - mean) ** 2
    sd = math.sqrt(ss / 3)
    assert mean == pytest.approx(0.15) and sd == pytest.approx(math.sqrt(0.07))
    res = stats.paired(a, b)
    t = mean / (sd / 2)
    assert res['n'] == 4 and res['mean_diff'] == pytest.approx(mean)
    assert res['sd_diff'] == pytest.approx(sd) and res['t'] == pytest.approx(t)
    assert res['ci'] == pytest.approx([mean - T975[3] * sd / 2, mean + T975[3] * sd / 2], abs=1e-6)
    assert res['p_less'] == pytest.approx(t_cdf_closed(t, 3), abs=1e-12)
    assert res['p_less'] + res['p_greater'] == pytest.approx(1, abs=1e-15)
    assert res['p'] == pytest.approx(2 * min(res['p_less'], res['p_greater']), abs=1e-15)
    assert res['p_less'] > 0.5 > res['p_greater']  # a positive mean difference
    res99 = stats.paired(a, b, level=0.99)  # a wider interval at a higher level, same centre
    assert res99['ci'][0] < res['ci'][0] and sum(res99['ci']) / 2 == pytest.approx(mean)
    down = stats.paired(b, a)  # the other way round: the one-sided p's swap
    assert down['t'] == pytest.approx(-t)
    assert down['p_less'] == pytest.approx(res['p_greater'], abs=1e-15)

    res = stats.paired([3.1, 3.5], [3.0, 3.2])  # df 1: d = 0.1, 0.3, sd = sqrt(0.02)
    half = math.tan(math.pi * 0.475) * math.sqrt(0.02) / math.sqrt(2)
    assert math.tan(math.pi * 0.475) == pytest.approx(12.7062, abs=1e-4)
    assert res['ci'] == pytest.approx([0.2 - half, 0.2 + half], rel=1e-9)
    assert res['p'] == pytest.approx(1 - 2 / math.pi * math.atan(0.2 / 0.1), abs=1e-12)  # t = 0.2 / 0.1


def test_paired_edge_cases():
    empty = stats.paired([], [])
    assert empty['n'] == 0 and all(v is None for k, v in empty.items() if k != 'n')
    one = stats.paired([2.5], [2.0])
    assert one['n'] == 1 and one['mean_diff'] == 0.5
    assert all(v is None for k, v in one.items() if k not in ('n', 'mean_diff'))
    flat = stats.paired([3.0, 4.0, 5.0], [2.5, 3.5, 4.5])  # every seed +0.5: t's limit is +infinity
    assert flat['mean_diff'] == pytest.approx(0.5) and flat['sd_diff'] == 0 and flat['ci'] == [0.5, 0.5]
    assert flat['t'] is None and (flat['p'], flat['p_less'], flat['p_greater']) == (0.0, 1.0, 0.0)
    down = stats.paired([2.0, 3.0], [2.5, 3.5])  # every seed -0.5
    assert (down['p'], down['p_less'], down['p_greater']) == (0.0, 0.0, 1.0)
    same = stats.paired([2.0, 3.0, 4.0], [2.0, 3.0, 4.0])  # no change at all: t = 0
    assert (same['p'], same['p_less'], same['p_greater']) == (1.0, 0.5, 0.5)
    with pytest.raises(ValueError):
        stats.paired([1.0, 2.0], [1.0])


def test_holm_by_hand():
    # m = 4 (None does not count); sorted p's 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 give 0.02, 0.03,
    # 0.06, 0.04; the running maximum makes the last 0.06. Back in the input order:
    adj = stats.holm([0.01, 0.04, 0.03, None, 0.005])
    assert adj[3] is None
    assert [adj[i] for i in (0, 1, 2, 4)] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # m = 3: 0.2 * 3 = 0.6, 0.5 * 2 = 1.0, 0.9 * 1 = 0.9 -> running max 0.6, 1.0, 1.0; capped at 1
    assert stats.holm([0.9, 0.2, 0.5]) == pytest.approx([1.0, 0.6, 1.0])
    assert stats.holm([0.04]) == [0.04] and stats.holm([None, None]) == [None, None]
    assert stats.holm([]) == []


def test_intersection_union():
    assert stats.intersection_union([0.01, 0.2, 0.04]) == 0.2
    assert stats.intersection_union([0.03]) == 0.03
    assert stats.intersection_union([0.01, None]) is None and stats.intersection_union([]) is None


def binom_tail(k, n, p, upper):
    """P(X >= k) (upper) or P(X <= k) for X ~ Binomial(n, p), by an explicit loop."""
    total = 0.0
    for i in range(n + 1):
        if (i >= k) if upper else (i <= k):
            total += math.comb(n, i) * p ** i * (1 - p) ** (n - i)
    return total


def test_clopper_pearson_tables_and_tails():
    # Published 95% intervals (the (9, 12) values corrected by the tail sums below: 0.428142, 0.945139).
    table = {(0, 10): (0.0, 0.308497), (10, 10): (0.691503, 1.0), (5, 10): (0.187086, 0.812914),
             (9, 12): (0.428142, 0.945139), (1, 20): (0.001265, 0.248733)}
    for (k, n), want in table.items():
        lo, hi = stats.clopper_pearson(k, n)
        assert (lo, hi) == pytest.approx(want, abs=1e-6)
        if k > 0:
            assert binom_tail(k, n, lo, upper=True) == pytest.approx(0.025, abs=1e-12)
        if k < n:
            assert binom_tail(k, n, hi, upper=False) == pytest.approx(0.025, abs=1e-12)
    assert stats.clopper_pearson(0, 10)[1] == pytest.approx(1 - 0.025 ** 0.1, abs=1e-12)
    assert stats.clopper_pearson(10, 10)[0] == pytest.approx(0.025 ** 0.1, abs=1e-12)
    lo, hi = stats.clopper_pearson(3, 7, level=0.9)
    assert binom_tail(3, 7, lo, True) == pytest.approx(0.05, abs=1e-12)
    assert binom_tail(3, 7, hi, False) == pytest.approx(0.05, abs=1e-12)
    assert stats.clopper_pearson(0, 0) == (None, None)


def test_auc_and_fit_threshold_by_hand():
    # positives 0.9, 0.5; negatives 0.5, 0.1: pairs 0.9>0.5, 0.9>0.1, 0.5=0.5 (half), 0.5>0.1 -> 3.5 / 4
    assert stats.auc([0.9, 0.5, 0.5, 0.1], [True, True, False, False]) == 0.875
    assert stats.auc([0.1, 0.9], [True, False]) == 0.0
    assert stats.auc([0.1, 0.9], [True, True]) is None and stats.auc([], []) is None
    scores, helps = [0.1, 0.3, 0.5, 0.7], [False, False, True, True]
    assert stats.fit_threshold(scores, helps) == pytest.approx(0.4)  # the only 4-of-4 midpoint
    # 0.125 F, 0.375 T, 0.625 F, 0.875 T: candidates -0.875 (2 right), 0.25 (3), 0.5 (2), 0.75 (3),
    # 1.875 (2)
    scores, helps = [0.125, 0.375, 0.625, 0.875], [False, True, False, True]
    assert stats.candidates(scores) == [-0.875, 0.25, 0.5, 0.75, 1.875]
    assert stats.best_thresholds(scores, helps, stats.candidates(scores)) == [0.25, 0.75]
    assert stats.fit_threshold(scores, helps) == 0.25  # tie: the smallest
    assert stats.fit_threshold([0.2, 0.2], [True, True]) == pytest.approx(-0.8)  # one below all


# The study's published DyT cells: (scale, budget, tokens per parameter, saturation, DyT helps).
CELLS = [('64m', '1M', 0.0156, 0.493, True), ('64m', '10M', 0.156, 0.413, False),
         ('64m', '50M', 0.781, 0.237, False), ('64m', '118M', 1.84, 0.234, False),
         ('124m', '1M', 0.0081, 0.466, True), ('124m', '10M', 0.081, 0.292, True),
         ('124m', '118M', 0.952, 0.193, False),
         ('354m', '1M', 0.0028, 0.490, False), ('354m', '10M', 0.028, 0.369, True),
         ('354m', '118M', 0.333, 0.327, False),
         ('1.3b', '1M', 0.0008, 0.393, False), ('1.3b', '118M', 0.090, 0.238, False)]
SATURATION = [(s, sat, y) for s, _, _, sat, y in CELLS]
TOKENS = [(s, -tp, y) for s, _, tp, _, y in CELLS]  # "helps iff T/P is small" as "score > threshold"


def brute_threshold(scores, outcomes):
    """fit_threshold's choice found another way: every threshold in one gap between sorted distinct
    scores predicts the same, so count each gap once, keep the best gaps, and take the lowest one's
    representative (midpoint, or 1 beyond the end)."""
    s = sorted(set(scores))
    gaps = [(-math.inf, s[0], s[0] - 1)] + [(x, y, (x + y) / 2) for x, y in zip(s, s[1:])]
    gaps.append((s[-1], math.inf, s[-1] + 1))
    counts = []
    for lo, hi, rep in gaps:
        right = 0
        for x, y in zip(scores, outcomes):
            right += (x > rep) == y
        counts.append(right)
    return [rep for (_, _, rep), c in zip(gaps, counts) if c == max(counts)][0]


def brute_loso(items):
    """Leave-one-scale-out right at the lowest best threshold of the other scales, and its fewest
    and most right over a grid of thresholds 1e-4 apart (finer than any gap between the scores) that
    fit the other scales as well."""
    right, lo, hi = 0, 0, 0
    grid = np.arange(-2.0, 1.0, 1e-4)
    for held in {g for g, _, _ in items}:
        rest = [(x, y) for g, x, y in items if g != held]
        t = brute_threshold([x for x, _ in rest], [y for _, y in rest])
        right += sum((x > t) == y for g, x, y in items if g == held)
        fit = sum((x > grid) == y for x, y in rest)  # per threshold of the grid
        got = sum((x > grid) == y for g, x, y in items if g == held)
        lo += got[fit == fit.max()].min()
        hi += got[fit == fit.max()].max()
    return right, lo, hi


def test_rule_stats_on_the_published_cells():
    # Saturation > 0.43: wrong on 124m/10M (0.292, helps), 354m/1M (0.490, hurts), 354m/10M (0.369,
    # helps). Helps recall 2/4, hurts 7/8. AUC: the positives beat 8, 7, 4, 5 of the 8 negatives = 24/32.
    res = stats.rule_stats(SATURATION, 0.43)
    assert (res['n'], res['correct'], res['threshold'], res['fitted']) == (12, 9, 0.43, False)
    assert res['accuracy'] == 0.75 and res['balanced_accuracy'] == 0.6875 and res['auc'] == 0.75
    assert res['accuracy_ci'] == pytest.approx([0.428142, 0.945139], abs=1e-6)
    # LOSO by hand, ties to the smallest threshold (the given 0.43 plays no part): 64m out -> 0.265
    # (5 of 8 on the rest, as 0.348, 0.4295 and 1.49 are), 3 of 4 right (0.413 wrong); 124m out ->
    # 0.4915 (8 of 9), 1 of 3; 354m out -> 0.4395, 1 of 3; 1.3b out -> 0.2645 (7 of 10, tied with 3
    # more), 1 of 2: 6 of 12, the study's own 50%. Over every tie-break: 5 to 8 of 12.
    assert (res['loso_correct'], res['loso']) == (6, 0.5)
    assert brute_loso(SATURATION) == (6, 5, 8)
    assert res['loso_range'] == pytest.approx([5 / 12, 8 / 12])

    # T/P < 0.0855: wrong on 354m/1M and 1.3b/1M (tiny T/P, hurts); the positives' T/P beat 6 of the 8.
    res = stats.rule_stats(TOKENS, -0.0855)
    assert res['correct'] == 10 and res['auc'] == 0.75 and res['balanced_accuracy'] == 0.875
    # LOSO by hand, the same tie-break: 64m out -> T/P < 0.0855, 4 of 4; 124m out -> T/P < 0.059
    # (tied with "never helps"), 2 of 3; 354m out -> T/P < 0.0855, 2 of 3; 1.3b out -> T/P < 0.1185,
    # 0 of 2: 8 of 12; over every tie-break 7 to 10 (the study's 0.0855 kept in every fold: 10)
    assert (res['loso_correct'], res['loso_range']) == (8, pytest.approx([7 / 12, 10 / 12]))
    assert brute_loso(TOKENS) == (8, 7, 10)

    res = stats.rule_stats(TOKENS)  # fitted: the only 10-of-12 gap is T/P in (0.081, 0.090]
    assert res['fitted'] and res['correct'] == 10 and -0.090 < res['threshold'] < -0.081
    assert res['loso_correct'] == 8  # refitted as above: the given threshold plays no part
    fitted = stats.rule_stats(SATURATION)
    assert fitted['fitted'] and fitted['loso_correct'] == 6
    assert fitted['correct'] == max(sum((x > t) == y for _, x, y in SATURATION)
                                    for t in [0.0] + [x for _, x, _ in SATURATION])


def test_rule_stats_edge_cases():
    empty = stats.rule_stats([], 0.5)
    assert empty['n'] == 0 and all(v is None for k, v in empty.items() if k != 'n')
    one_scale = stats.rule_stats([('64m', 0.6, True), ('64m', 0.2, True)], 0.5)
    assert one_scale['loso'] is one_scale['loso_correct'] is one_scale['balanced_accuracy'] is None
    assert one_scale['auc'] is None and one_scale['accuracy'] == 0.5


# Two scales, threshold 0.5: every A item predicted right, every B item wrong.
A = [('A', 0.9, True), ('A', 0.1, False)]
B = [('B', 0.9, False), ('B', 0.1, True)]


def test_cluster_bootstrap_known_answer():
    draws = stats.cluster_resamples(A + B, 4000, seed=0)
    assert draws == stats.cluster_resamples(A + B, 4000, seed=0)
    assert draws != stats.cluster_resamples(A + B, 4000, seed=1)
    # each resample is 2 scales drawn with replacement: AA (accuracy 1), AB or BA (1/2), BB (0)
    acc = Counter(sum((x > 0.5) == y for _, x, y in r) / len(r) for r in draws)
    assert set(acc) == {0.0, 0.5, 1.0}
    for value, p in ((0.0, 0.25), (0.5, 0.5), (1.0, 0.25)):
        assert acc[value] / 4000 == pytest.approx(p, abs=0.03)
    twice = next(r for r in draws if all(g == 'A' for g, _, _ in r))
    assert sorted(twice) == sorted(A + A)
    assert stats.rule_stats(twice, 0.5)['loso'] is None  # both copies: one scale, nothing to leave out

    ci = stats.bootstrap_rule(A + B, 1000, seed=0, threshold=0.5)
    assert ci['accuracy'] == ci['balanced_accuracy'] == ci['auc'] == [0.0, 1.0]
    # one scale: every resample is the scale itself, so the interval is the in-sample value
    one = [('A', 0.9, True), ('A', 0.1, True), ('A', 0.2, False)]
    ci = stats.bootstrap_rule(one, 200, seed=3, threshold=0.5)
    assert ci['accuracy'] == pytest.approx([2 / 3, 2 / 3]) and ci['auc'] == [0.5, 0.5]
    assert ci['loso'] is None  # LOSO needs two groups


def test_bootstrap_percentiles_on_the_published_cells():
    # 201 resamples: the 2.5th and 97.5th percentiles fall exactly on the 6th and 196th sorted values
    acc = sorted(sum((x > 0.43) == y for _, x, y in r) / len(r)
                 for r in stats.cluster_resamples(SATURATION, 201, seed=7))
    ci = stats.bootstrap_rule(SATURATION, 201, seed=7, threshold=0.43)
    assert ci['accuracy'] == [acc[5], acc[195]] and acc[5] < 0.75 < acc[195]
    assert all(lo <= hi for lo, hi in ci.values())
