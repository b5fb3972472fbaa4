"""
The study's report on a grid's runs (annex/study.py run), from the repository root:

  python annex/study.py report out/grid_64m        (or python annex/report.py out/grid_64m)

Reads every cell folder (cell.json, summary.json, log.jsonl) and writes into the grid's folder report.md
(also printed), report.json (every number, schema "nanonorm-study-report/1") and, with matplotlib,
signflip.png and saturation.png:
  - val loss, mean and std over seeds, at the final AND the best checkpoint; each variant's change
    against the same architecture with LayerNorm in %, with each seed's change and a paired t-test;
  - the screening rule "saturation > threshold -> DyT helps" on the DyT cells, with saturation at the end
    of the run (the study's test) and at the screen's step, against the change at the final and at the
    best checkpoint: accuracy, balanced accuracy, AUC, leave-one-scale-out, with bootstrap intervals;
  - mean HTSR alpha and activation effective rank of the final checkpoints (analyze.py, cached in each
    cell's analysis.json; --analysis=False skips them);
  - the study's published figures beside ours (PUBLISHED below).
Collapsed (train loss at the unigram level of its budget), diverged and failed runs are listed, never
averaged. `python annex/report.py --help` lists the options.
"""
import functools
import glob
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python annex/report.py

from analyze import DEFAULTS as ANALYZE_DEFAULTS
from analyze import analyze, fmt
from annex.plots import pyplot, save_png
from annex.study import PUBLISHED_RULE, THRESHOLD, command_line, eval_at, label, read_json, status
from data.common import DataError, atomic_write, load_split, unigram_entropy, write_json
from norm_stats import AT_2
from train import COLLAPSE_MARGIN

OPTIONS = dict(threshold=THRESHOLD, screen_steps=0, collapse_margin=COLLAPSE_MARGIN, bootstrap=2000,
               seed=0, analysis=True, device='cpu')
POINTWISE = ('dyt', 'derf')  # the norms with an alpha and a saturation (norm_stats.squashed)
BUDGETS = ('1M', '10M', '50M', 'all')  # the study's; 'all' = all of WikiText-103 train (its "118M")
# Verma 2026 (arXiv 2604.23434), 64m unless noted.
PUBLISHED = {
    'val_loss': {('64m', b, v): x for v, row in (('ln', (9.384, 4.260, 3.666, 3.631)),
                                                 ('dyt', (6.819, 4.510, 4.386, 4.313)),
                                                 ('diff', (9.490, 3.706, 3.380, 3.359)))
                 for b, x in zip(BUDGETS, row)}
    | {('64m', '1M', 'rmsnorm'): 9.317, ('64m', 'all', 'rmsnorm'): 3.635,
       ('64m', '1M', 'hardtanh'): 6.246, ('64m', '10M', 'hardtanh'): 4.660,
       ('64m', 'all', 'hardtanh'): 4.562, ('64m', 'all', 'llama_ln'): 3.537,
       ('64m', 'all', 'llama_dyt'): 5.626, ('64m', 'all', 'llama_dyt_gelu'): 4.476},
    'change_%': {(s, b, 'dyt'): x for s, row in (('64m', (-27.3, 5.9, 19.7, 18.8)),
                                                 ('124m', (-9.6, -12.3, None, 12.8)),
                                                 ('354m', (4.3, -24.1, None, 13.4)),
                                                 ('1.3b', (2.1, -1.8, None, 10.4)),
                                                 ('3.78b', (1.7, None, None, 27.9)))
                 for b, x in zip(BUDGETS, row) if x is not None},
    'saturation': {('64m', b, 'dyt'): x for b, x in zip(BUDGETS, (.493, .414, .237, .234))},
    'htsr_alpha': {('64m', '1M', 'ln'): 5.37, ('64m', '1M', 'dyt'): 3.14, ('64m', 'all', 'ln'): 4.18,
                   ('64m', 'all', 'dyt'): 2.76},
    'erank': {('64m', '1M', 'ln'): 426, ('64m', '1M', 'dyt'): 167, ('64m', 'all', 'ln'): 357,
              ('64m', 'all', 'dyt'): 198}}

# -------------------------------------------------------------------------------------------- statistics


def t_pvalue(t, df):
    """Two-sided p-value of Student's t with an integer number of degrees of freedom: the finite sums of
    Abramowitz & Stegun 26.7.3-4 in theta = atan(|t| / sqrt(df))."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    for k in range(1, (df - 1) // 2 if df % 2 else df // 2):
        term *= c2 * (2 * k / (2 * k + 1) if df % 2 else (2 * k - 1) / (2 * k))
        total += term
    if df % 2:
        return 1 - 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0))
    return 1 - math.sin(theta) * total


def paired_t(a, b):
    """Paired t-test of a - b over seeds: mean difference, t and two-sided p (None with fewer than 2
    pairs)."""
    d = np.asarray(a, float) - np.asarray(b, float)
    if len(d) < 2 or d.std(ddof=1) == 0:
        return dict(n=len(d), mean_diff=float(d.mean()) if len(d) else None, t=None, p=None)
    t = float(d.mean() / (d.std(ddof=1) / math.sqrt(len(d))))
    return dict(n=len(d), mean_diff=float(d.mean()), t=t, p=t_pvalue(t, len(d) - 1))


def auc(scores, positive):
    """P(score of a positive > score of a negative), ties counting half (Mann-Whitney); None without
    both."""
    pos = [s for s, y in zip(scores, positive) if y]
    neg = [s for s, y in zip(scores, positive) if not y]
    if not pos or not neg:
        return None
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


def fit_threshold(sats, helps, prior):
    """The threshold with the best accuracy on these items (ties: the one closest to the published
    `prior`). Candidates: the prior, the midpoints between distinct saturations, and one below and one
    above them all."""
    s = sorted(set(sats))
    cands = [prior, s[0] - 1] + [(x + y) / 2 for x, y in zip(s, s[1:])] + [s[-1] + 1]
    return max(cands, key=lambda t: (sum((x > t) == h for x, h in zip(sats, helps)), -abs(t - prior)))


def rule_stats(items, threshold):
    """items: [(scale, saturation, helps)]. Accuracy, balanced accuracy, AUC of saturation for "DyT
    helps", and leave-one-scale-out accuracy (threshold fitted on the other scales; None with one
    scale)."""
    sats, helps = [i[1] for i in items], [i[2] for i in items]
    pred = [x > threshold for x in sats]
    rates = [np.mean([p == h for p, h in zip(pred, helps) if h == cls]) for cls in (True, False)
             if cls in helps]
    scales = sorted(set(i[0] for i in items))
    loso = None
    if len(scales) > 1:
        right = 0
        for held in scales:
            rest = [i for i in items if i[0] != held]
            t = fit_threshold([i[1] for i in rest], [i[2] for i in rest], threshold)
            right += sum((i[1] > t) == i[2] for i in items if i[0] == held)
        loso = right / len(items)
    return dict(n=len(items), accuracy=float(np.mean([p == h for p, h in zip(pred, helps)])),
                balanced_accuracy=float(np.mean(rates)) if len(rates) == 2 else None,
                auc=auc(sats, helps), loso=loso)


def bootstrap_rule(items, threshold, n_boot, seed):
    """rule_stats plus a 95% percentile interval for each statistic: items resampled with replacement
    (rng = numpy default_rng(seed); one rng.integers(0, n, n) per resample); undefined resamples are
    dropped."""
    res = rule_stats(items, threshold)
    rng, draws = np.random.default_rng(seed), []
    for _ in range(n_boot):
        draws.append(rule_stats([items[i] for i in rng.integers(0, len(items), len(items))], threshold))
    for key in ('accuracy', 'balanced_accuracy', 'auc', 'loso'):
        vals = [d[key] for d in draws if d[key] is not None]
        res[f'{key}_ci'] = [float(v) for v in np.percentile(vals, [2.5, 97.5])] if vals else None
    return res

# ---------------------------------------------------------------------------------------- runs and cells


@functools.lru_cache(maxsize=None)
def budget_entropy(dataset, data_dir, train_tokens):
    """(unigram entropy of a train budget, its token count), from the data; None when the data is not
    here."""
    try:
        data = load_split(dataset, 'train', data_dir)[:train_tokens]
    except DataError:  # the report then falls back on what train.py recorded
        return None
    return unigram_entropy(data), len(data)


def collect(grid_dir, opts):
    """One row per cell folder (cell.json) with its status, losses, saturations and collapse flag."""
    rows = []
    for path in glob.glob(os.path.join(grid_dir, '*', 'cell.json')):
        cell, d = read_json(path), os.path.dirname(path)
        row = dict(name=cell['name'], scale=cell['scale'], budget=label(cell['budget']),
                   variant=cell['variant'], seed=cell['seed'], dir=d, status=status(d),
                   budget_tokens=cell['budget'], index=cell.get('index', 0))
        s = read_json(os.path.join(d, 'summary.json'))
        if row['status'] == 'failed':
            failed = read_json(os.path.join(d, 'failed.json'))
            row['reason'] = f"train.py exited with {failed['returncode']}"
        if s:
            cfg = s['config']
            entropy, n_train = (budget_entropy(cfg['dataset'], cfg['data_dir'], cfg['train_tokens'])
                                or (s.get('unigram_entropy'), s.get('budget_tokens')))
            steps = opts['screen_steps'] or cell.get('screen_steps', 500)
            early = eval_at(d, steps)
            early = early if early and early['iter'] == steps else None  # an eval at exactly that step
            row.update(norm=cfg['norm'], n_params=s['n_params'], final=s['final_val_loss'],
                       best=s['best_val_loss'], best_iter=s['best_iter'], acc=s.get('final_val_acc'),
                       final_iter=s['final_iter'], train_loss=s['final_train_loss'],
                       unigram_entropy=entropy,
                       tokens_per_param=n_train / s['n_params'] if n_train else None,
                       sat=s['saturation'][AT_2] if s['saturation'] else None,
                       screen_sat=early['saturation'][AT_2] if early and early['saturation'] else None,
                       screen_iter=early and early['iter'])
            if row['status'] == 'diverged':
                row['reason'] = s['diverged_reason']
            elif entropy is not None and s['final_train_loss'] > entropy - opts['collapse_margin']:
                row['status'] = 'collapsed'
                row['reason'] = (f"train loss {s['final_train_loss']:.3f} is at the unigram level of "
                                 f"its budget ({entropy:.3f} nats): it predicts token frequencies only")
        rows.append(row)
    if not rows:
        raise SystemExit(f'error: no cell folders (*/cell.json) under {grid_dir}; run a grid first '
                         '(python annex/study.py run config/grid_mini.py)')
    size = {}  # scales from the smallest model up, then budgets from the smallest, then the grid's order
    for r in rows:
        size[r['scale']] = min(size.get(r['scale'], math.inf), r.get('n_params') or math.inf)
    return sorted(rows, key=lambda r: (size[r['scale']], r['scale'], r['budget_tokens'] or math.inf,
                                       r['index'], r['variant'] != baseline(r['variant']), r['name']))


def baseline(variant):
    """The variant a change is measured against: the same architecture with LayerNorm."""
    return 'llama_ln' if variant.startswith('llama') else 'diff' if variant == 'dyt_diff' else 'ln'


def summarize(rows):
    """Per (scale, budget, variant): mean and std over seeds of the finished runs, and the change against
    the baseline variant in % at the final and at the best checkpoint, with a paired t-test over common
    seeds."""
    groups = {}
    for r in rows:
        groups.setdefault((r['scale'], r['budget'], r['variant']), []).append(r)
    out = []
    for (scale, budget, variant), runs in groups.items():
        ok = {r['seed']: r for r in runs if r['status'] == 'finished'}
        g = dict(scale=scale, budget=budget, variant=variant, n=len(ok), seeds=sorted(ok),
                 norm=next((r['norm'] for r in runs if 'norm' in r), None),
                 excluded={r['name']: r['status'] for r in runs if r['status'] != 'finished'},
                 tokens_per_param=next((r['tokens_per_param'] for r in ok.values()), None))
        for key in ('final', 'best', 'acc', 'sat', 'screen_sat', 'best_iter', 'htsr_alpha', 'erank'):
            vals = [r[key] for r in ok.values() if r.get(key) is not None]
            g[key] = float(np.mean(vals)) if vals else None
            g[key + '_std'] = float(np.std(vals, ddof=1)) if len(vals) > 1 else None
        base = {r['seed']: r for r in groups.get((scale, budget, baseline(variant)), [])
                if r['status'] == 'finished'}
        if variant != baseline(variant) and ok and base:
            common = sorted(set(ok) & set(base))
            for key in ('final', 'best'):
                b = np.mean([r[key] for r in base.values()])
                g[f'change_{key}'] = float(100 * (g[key] - b) / b)
                ours, theirs = [ok[s][key] for s in common], [base[s][key] for s in common]
                g[f'seed_change_{key}'] = [100 * (x - y) / y for x, y in zip(ours, theirs)]
                g[f'paired_{key}'] = paired_t(ours, theirs)
        out.append(g)
    return out


def screening(groups, runs, opts):
    """The rule 'saturation > threshold -> DyT helps' scored on every DyT cell (scale x budget, seed
    means), with saturation at the end of the run (as the study did) and after the screen's steps,
    against the change at the final and at the best checkpoint; and how step-N saturation relates to
    final saturation, run by run."""
    dyt = [g for g in groups if g['norm'] == 'dyt' and g.get('change_final') is not None]
    rule = {}
    for sat, name in (('sat', 'final_sat'), ('screen_sat', 'screen_sat')):
        for outcome in ('final', 'best'):
            items = [(g['scale'], g[sat], g[f'change_{outcome}'] < 0) for g in dyt if g[sat] is not None]
            if items:
                rule[f'{name}/{outcome}'] = dict(
                    bootstrap_rule(items, opts['threshold'], opts['bootstrap'], opts['seed']),
                    screen_steps=next((r['screen_iter'] for r in runs if r.get('screen_iter')), None))
    pairs = [(r['screen_sat'], r['sat']) for r in runs  # the rule is DyT's: Derf saturates otherwise
             if r['status'] == 'finished' and r.get('norm') == 'dyt' and r.get('screen_sat') is not None
             and r.get('sat') is not None]
    a, b = np.array(pairs).T if pairs else ([], [])
    th = opts['threshold']
    varies = len(pairs) > 2 and a.std() and b.std()  # r needs 3 runs and a spread on each side
    link = dict(n=len(pairs), pearson=float(np.corrcoef(a, b)[0, 1]) if varies else None,
                same_side=float(np.mean([(x > th) == (y > th) for x, y in pairs])) if pairs else None,
                mean_screen=float(np.mean(a)) if pairs else None,
                mean_final=float(np.mean(b)) if pairs else None)
    return rule, link


def spectra_and_rank(runs, opts):
    """Mean HTSR alpha and activation effective rank of each finished LN/DyT run's final checkpoint, with
    analyze.py's functions; cached in the cell folder as analysis.json."""
    for r in runs:
        if r['status'] != 'finished' or (r['variant'] != baseline(r['variant'])
                                         and r['norm'] not in POINTWISE):
            continue
        cache = os.path.join(r['dir'], 'analysis.json')
        res = read_json(cache)
        if not res or res.get('final_iter') != r['final_iter']:
            try:
                a, _ = analyze(os.path.join(r['dir'], 'ckpt.pt'), 'all',
                               dict(ANALYZE_DEFAULTS, device=opts['device']))
                res = dict(final_iter=r['final_iter'], htsr_alpha=a['spectra']['mean_alpha'],
                           erank=a['rank']['mean_blocks'])
            except SystemExit as e:
                res = dict(final_iter=r['final_iter'], error=str(e))
            write_json(cache, res)
        r.update(htsr_alpha=res.get('htsr_alpha'), erank=res.get('erank'),
                 analysis_error=res.get('error'))

# ----------------------------------------------------------------------------------- report.md and plots


def pm(mean, std):
    return '-' if mean is None else fmt(mean, '.4f') + ('' if std is None else f' ± {fmt(std, ".4f")}')


def change_cell(g, key):
    if g.get(f'change_{key}') is None:
        return '-'
    p = g[f'paired_{key}']['p']
    seeds = ', '.join(f'{c:+.1f}' for c in g[f'seed_change_{key}'])
    return f"{g[f'change_{key}']:+.1f}% ({seeds}; p={fmt(p, '.3f')})"


def beside_published(groups):
    """Every published figure that has a counterpart among our cells (same scale, budget label and
    variant)."""
    ours = dict(val_loss='final', saturation='sat', htsr_alpha='htsr_alpha', erank='erank',
                **{'change_%': 'change_final'})
    return [dict(figure=what, scale=g['scale'], budget=g['budget'], variant=g['variant'], published=x,
                 ours=g.get(ours[what]),
                 difference=None if g.get(ours[what]) is None else g[ours[what]] - x)
            for what, table in PUBLISHED.items() for g in groups for key, x in table.items()
            if key == (g['scale'], g['budget'], g['variant'])]


def table(header, rows):
    """A markdown table: the header's cells, then one list of cells per row."""
    return ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)] \
        + ['| ' + ' | '.join(map(str, r)) + ' |' for r in rows] + ['']


def markdown(grid_dir, rows, groups, rule, link, pub, opts):
    counts = {st: sum(r['status'] == st for r in rows) for st in ('finished', 'collapsed', 'diverged',
                                                                  'failed', 'partial', 'new')}
    md = [f'# Study report: {grid_dir}', '',
          'Runs: ' + ', '.join(f'{n} {st}' for st, n in counts.items() if n)
          + '. Means are over finished runs only; collapsed, diverged, failed and unfinished runs are '
          'listed below, never averaged in. Change = (variant - baseline) / baseline over seed means; '
          'in brackets each seed\'s paired change and the paired t-test p-value over seeds. Val '
          'accuracy is next-token accuracy for language runs, test-set accuracy for a ViT.', '',
          '## Validation loss: final and best checkpoint', '']
    md += table(['scale', 'budget', 'tokens/param', 'variant', 'n', 'final val loss',
                 'best val loss (mean step)', 'change, final', 'change, best', 'final val accuracy',
                 'saturation, end / screen'],
                [[g['scale'], g['budget'], fmt(g['tokens_per_param'], '.3g'), g['variant'], g['n'],
                  pm(g['final'], g['final_std']),
                  f"{pm(g['best'], g['best_std'])} ({fmt(g['best_iter'], '.0f')})",
                  change_cell(g, 'final'), change_cell(g, 'best'), pm(g['acc'], g['acc_std']),
                  f"{fmt(g['sat'], '.3f')} / {fmt(g['screen_sat'], '.3f')}"]
                 for g in groups])

    def with_ci(s, k):
        return fmt(s[k], '.2f') + (f" [{', '.join(fmt(v, '.2f') for v in s[k + '_ci'])}]" if s[k + '_ci']
                                   else '')
    md += [f"## Screening rule: saturation > {opts['threshold']} -> DyT helps", '',
           'Items: DyT cells (scale x budget, seed means). Leave-one-scale-out fits the threshold on '
           f"the other scales. 95% bootstrap intervals ({opts['bootstrap']} resamples of the items). "
           f'{PUBLISHED_RULE}.', '']
    md += table(['saturation at / outcome at', 'n', 'accuracy', 'balanced accuracy', 'AUC',
                 'leave-one-scale-out'],
                [[key.replace('screen_sat', f"step {s['screen_steps']}"), s['n']]
                 + [with_ci(s, k) for k in ('accuracy', 'balanced_accuracy', 'auc', 'loso')]
                 for key, s in rule.items()])
    md += [f"Saturation after {next((s['screen_steps'] for s in rule.values()), '-')} steps against "
           f"saturation at the end, over {link['n']} DyT runs: mean {fmt(link['mean_screen'], '.3f')} "
           f"vs {fmt(link['mean_final'], '.3f')}, Pearson r {fmt(link['pearson'], '.3f')}, same side of "
           f"the threshold in {fmt(link['same_side'], '.0%')}.", '']
    analysed = [g for g in groups if g.get('htsr_alpha') is not None or g.get('erank') is not None]
    if analysed:
        md += ['## Weight spectra and activation rank (final checkpoints, analyze.py)', '']
        md += table(['scale', 'budget', 'variant', 'mean HTSR alpha', 'activation effective rank'],
                    [[g['scale'], g['budget'], g['variant'], fmt(g['htsr_alpha'], '.2f'),
                      fmt(g['erank'], '.1f')] for g in analysed])
    md += ['## The study\'s published figures (Verma 2026, final checkpoint, mean of 3 seeds) beside '
           'ours', '']
    md += table(['figure', 'scale', 'budget', 'variant', 'published', 'ours', 'difference'],
                [[p['figure'], p['scale'], p['budget'], p['variant'], f"{p['published']:g}",
                  fmt(p['ours'], '.4g'), fmt(p['difference'], '+.4g')] for p in pub]) if pub else \
        ['No cell of this grid has a published counterpart (the study: GPT-2 64m-3.78b on '
         'WikiText-103).', '']
    md += ['## Runs not averaged', '']
    md += [f"- {r['name']}: **{r['status']}**" + (f" ({r['reason']})" if r.get('reason') else '')
           for r in rows if r['status'] != 'finished'] or ['None.']
    return '\n'.join(md) + '\n'


def plots(report_dir, groups, opts):
    plt, names = pyplot(), []
    if plt is None:
        return names

    def save(fig, name):
        save_png(fig, os.path.join(report_dir, name))
        names.append(name)
    compared = [g for g in groups if g.get('change_final') is not None]
    if any(g['tokens_per_param'] for g in compared):  # token budgets (a ViT grid has none)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        for ax, key in zip(axes, ('final', 'best')):
            for scale, variant in dict.fromkeys((g['scale'], g['variant']) for g in compared):
                line = sorted((g['tokens_per_param'], g[f'change_{key}'], g['budget']) for g in compared
                              if (g['scale'], g['variant']) == (scale, variant)
                              and g['tokens_per_param'])
                ax.plot([x for x, _, _ in line], [y for _, y, _ in line], 'o-',
                        label=f'{scale} {variant}')
                for x, y, b in line:
                    ax.annotate(b, (x, y), fontsize=7, xytext=(3, 3), textcoords='offset points')
            ax.axhline(0, c='gray', lw=0.8)
            ax.set(xscale='log', xlabel='training tokens per parameter', title=f'{key} checkpoint')
        axes[0].plot([tokens / 63.5e6 for tokens in (1e6, 10e6, 50e6, 118e6)],  # 63.5M parameters
                     [PUBLISHED['change_%']['64m', b, 'dyt'] for b in BUDGETS], 'k--', alpha=0.4,
                     label='Verma 2026, 64m dyt (published)')  # its final step
        axes[0].set_ylabel('val loss change vs LayerNorm (%)')
        axes[0].legend(fontsize=8)
        fig.suptitle('The sign flip: below 0, the variant beats LayerNorm')
        save(fig, 'signflip.png')
    dyt = [g for g in compared if g['norm'] == 'dyt' and g['sat'] is not None]
    if dyt:
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, marker, what in (('sat', 'o', 'end of run'), ('screen_sat', 's', 'screen step')):
            pts = [(g[key], g['change_final'], f"{g['scale']} {g['budget']}") for g in dyt
                   if g[key] is not None]
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker,
                       label=f'saturation at {what}')
            for x, y, name in pts:
                ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords='offset points')
        ax.axvline(opts['threshold'], ls=':', c='gray', label=f"threshold {opts['threshold']}")
        ax.axhline(0, c='gray', lw=0.8)
        ax.set(xlabel='saturation (fraction |alpha x| > 2)', ylabel='DyT change, final (%)',
               title='Does saturation predict the change?')
        ax.legend(fontsize=8)
        save(fig, 'saturation.png')
    return names


def main(argv):
    """The report on the grid folder in argv (and --key=value options): what report.json holds."""
    opts, rest = command_line(OPTIONS, argv)
    if len(rest) != 1 or not os.path.isdir(rest[0]):
        raise SystemExit('usage: python annex/study.py report GRID_OUT_DIR (the out_dir of '
                         '`python annex/study.py run`)')
    rows = collect(rest[0], opts)
    if opts['analysis']:
        spectra_and_rank(rows, opts)
    groups = summarize(rows)
    rule, link = screening(groups, rows, opts)
    pub = beside_published(groups)
    md = markdown(rest[0], rows, groups, rule, link, pub, opts)
    write_json(os.path.join(rest[0], 'report.json'), dict(schema='nanonorm-study-report/1', options=opts,
                                                          runs=rows, groups=groups, rule=rule,
                                                          screen_vs_final=link, published=pub))
    atomic_write(os.path.join(rest[0], 'report.md'), lambda f: f.write(md.encode()))
    names = plots(rest[0], groups, opts)
    print(md + f"\nwrote {rest[0]}/report.md, report.json" + ''.join(f', {n}' for n in names))
    return dict(runs=rows, groups=groups, rule=rule, screen_vs_final=link, published=pub)


if __name__ == '__main__':
    main(sys.argv[1:])
