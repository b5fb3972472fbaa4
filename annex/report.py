"""
The study's report on a grid's runs (annex/study.py run), from the repository root:

  python annex/study.py report out/grid_64m        (or python annex/report.py out/grid_64m)
  python annex/study.py report --published          the rule and its baseline on the study's 12 cells

Reads every cell folder (cell.json, summary.json, log.jsonl) and writes into the grid's folder report.md
(also printed), report.json (every number, schema "nanonorm-study-report/2") and, with matplotlib,
signflip.png, saturation.png and, with two or more scales, capacity.png (the change against
parameters, a line per budget):
  - val loss per cell, mean and sample std over seeds, at the final and the best checkpoint, beside the
    budget's unigram level on val (the val loss of predicting the budget's token frequencies: what a
    collapsed model scores); tokens per parameter as the run saw them, min(budget, steps x tokens/step);
  - each variant's effect against the same architecture with LayerNorm, over the seeds both have: the
    change in nats and % with a paired-t 95% interval, how many seeds agree in sign and (from 3 seeds)
    the paired t-test's p with Holm's adjustment across the report's comparisons; the sign flip
    (better at the smallest budget AND worse at the largest) seed by seed with collapses counted,
    and as one intersection-union test over the paired seeds;
  - collapse counted: per cell the runs collapsed (final train loss within collapse_margin of the unigram
    level), diverged, near unigram (within near_margin) and norm layers over 99% saturated;
  - the screening rule "saturation > threshold -> helps" for DyT and Derf, with collapsed runs dropped
    (per protocol) and scored as "hurts" (intention to treat), beside a tokens-per-parameter baseline:
    accuracy with an exact binomial interval, balanced accuracy, AUC, leave-one-scale-out, and intervals
    from a bootstrap that resamples scales;
  - mean HTSR alpha and activation effective rank of the final checkpoints (analyze.py, cached in each
    cell's analysis.json; --analysis=False skips them); the study's published figures beside ours.
Failed, unfinished, nonfinite (a loss that is not a number) and damaged runs (a file torn,
incomplete or lost) are listed with what to do. `python annex/report.py --help` lists the options.
"""
import functools
import glob
import math
import os
import sys
from collections import namedtuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python annex/report.py

from analyze import DEFAULTS as ANALYZE_DEFAULTS
from analyze import analyze, fmt
from checkpoint import load_checkpoint
from annex.collapse import COLLAPSE_MARGIN
from annex.plots import pyplot, save_png
from annex.stats import bootstrap_rule, holm, intersection_union, paired, rule_stats
from annex.study import (PUBLISHED_RULE, THRESHOLD, command_line, has_checkpoint, label, last_eval,
                         load_json, log_records, read_json, status)
from annex.protocol import budget_tokens, eot_id
from data.common import (DataError, atomic_write, entropy_of, load_meta, load_split, token_counts,
                         write_json)
from model import NORMS
from norm_stats import AT_2

OPTIONS = dict(threshold=THRESHOLD, screen_steps=0, collapse_margin=COLLAPSE_MARGIN, near_margin=0.5,
               bootstrap=2000, seed=0, analysis=True, test=True, test_limit=0, device='cpu',
               published=False)
# the norms with a saturation: model.py's classes with squashed() and cut() (DyT, Derf)
POINTWISE = tuple(name for name, cls in NORMS.items() if hasattr(cls, 'squashed'))
ENDED = ('finished', 'collapsed', 'diverged')  # runs that reached their end: intention to treat counts
STATUSES = ENDED + ('nonfinite', 'damaged', 'failed', 'partial', 'new')
CELL_KEYS = {'name', 'scale', 'budget', 'variant', 'seed'}
# what the report reads of a summary.json (and of its config): without one it is incomplete
SUMMARY_KEYS = ('final_val_loss', 'best_val_loss', 'best_iter', 'final_iter', 'final_train_loss',
                'n_params', 'saturation', 'config')
CONFIG_KEYS = ('dataset', 'data_dir', 'train_tokens', 'n_layer', 'n_head', 'n_embd', 'norm')
# a run's numbers that are averaged or judge it, in words: one not finite sets the run apart
MEASURED = dict(final='final val loss', best='best val loss', final_paper='final val loss (paper)',
                train_loss='final train loss', acc='final val accuracy', sat='saturation',
                screen_sat="saturation at the screen's step")
MIN_SEEDS_FOR_P = 3  # a t-test on 2 seeds has 1 degree of freedom: signs and intervals say more
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
# The 12 cells the study scored its rule on (its results/full/manifests/predictor_validation.json):
# (scale, budget, training tokens per parameter, DyT saturation at the end, DyT change vs LN in %).
PAPER_CELLS = (('64m', '1M', 0.0156, 0.493, -27.3), ('64m', '10M', 0.156, 0.413, 5.9),
               ('64m', '50M', 0.781, 0.237, 19.7), ('64m', 'all', 1.84, 0.234, 18.8),
               ('124m', '1M', 0.0081, 0.466, -9.6), ('124m', '10M', 0.081, 0.292, -12.3),
               ('124m', 'all', 0.952, 0.193, 12.8), ('354m', '1M', 0.0028, 0.490, 4.3),
               ('354m', '10M', 0.028, 0.369, -24.1), ('354m', 'all', 0.333, 0.327, 13.4),
               ('1.3b', '1M', 0.0008, 0.393, 2.1), ('1.3b', 'all', 0.090, 0.238, 10.4))
# Its other artifact (saturation_sweep/crossover_predictor.json) disagrees on three of them.
PAPER_CELLS_OTHER = {('124m', '10M'): dict(change=6.1), ('354m', '1M'): dict(sat=0.500),
                     ('354m', 'all'): dict(sat=0.565)}

# ---------------------------------------------------------------------------------------- runs and cells


@functools.lru_cache(maxsize=None)
def budget_reference(dataset, data_dir, train_tokens, budget_docs=None):
    """The unigram levels of a train budget (its prefix, or its budget_docs subset: budget_tokens), from
    the data: {'entropy': of its token frequencies, 'n_train': its tokens, 'val_unigram': the val loss
    of predicting those frequencies (add-one smoothed over the vocabulary), 'layout' (its tokenization)};
    None when the data is not here or not tokens."""
    try:
        meta = load_meta(dataset, data_dir)
        if meta['kind'] != 'tokens':
            return None
        train = budget_tokens(load_split(dataset, 'train', data_dir), train_tokens, budget_docs,
                              eot_id(meta))
        val = load_split(dataset, 'val', data_dir)
    except DataError:  # the report then falls back on what train.py recorded
        return None
    counts = token_counts(train, meta['vocab_size'])
    logp = np.log(counts + 1.0) - math.log(len(train) + len(counts))
    val_unigram = -float(np.mean(logp[np.asarray(val)])) if len(val) else None
    return dict(entropy=entropy_of(counts), n_train=len(train), val_unigram=val_unigram,
                layout=meta.get('layout', 'file'))


def collect(grid_dir, opts):
    """One row per cell folder (cell.json, read_run), scales from the smallest model up, then
    budgets from the smallest, then the grid's order; folders whose cell.json cannot be read
    last."""
    rows = [read_run(path, opts) for path in glob.glob(os.path.join(grid_dir, '*', 'cell.json'))]
    if not rows:
        raise SystemExit(f'error: no cell folders (*/cell.json) under {grid_dir}; run a grid first '
                         '(python annex/study.py run config/grid_mini.py)')
    named, unnamed = [r for r in rows if 'scale' in r], [r for r in rows if 'scale' not in r]
    size = {}
    for r in named:
        size[r['scale']] = min(size.get(r['scale'], math.inf), r.get('n_params') or math.inf)
    return sorted(named, key=lambda r: (size[r['scale']], r['scale'],
                                        r['budget_tokens'] or math.inf, r['index'],
                                        r['variant'] != baseline(r['variant']), r['name'])) \
        + sorted(unnamed, key=lambda r: r['name'])


def read_run(path, opts):
    """A cell folder's row: its cell, its status and why, and from a whole summary.json its figures.
    A damaged folder (cell.json or summary.json torn, incomplete or unreadable; files lost) is
    'damaged', named with the file and what to do; a run whose losses are not finite,
    'nonfinite'."""
    d = os.path.dirname(path)
    cell, problem = load_json(path)
    if problem is None and not isinstance(cell, dict):
        problem = f'{path} is not a JSON object'
    elif problem is None and not CELL_KEYS <= cell.keys():
        problem = f"{path} lacks {', '.join(sorted(CELL_KEYS - cell.keys()))}"
    if problem:  # without its cell the run cannot be placed in the grid
        return dict(name=os.path.basename(d), dir=d, status='damaged',
                    reason=f'{problem}: delete {d} and run the grid again')
    row = dict(name=cell['name'], scale=cell['scale'], budget=label(cell['budget']),
               variant=cell['variant'], seed=cell['seed'], dir=d, status=status(d),
               budget_tokens=cell['budget'], index=cell.get('index', 0))
    records, torn = log_records(d)
    if torn:
        row['log_problem'] = (f"{d}/log.jsonl line{'s' * (len(torn) > 1)} "
                              f"{', '.join(map(str, torn))} not a record (a torn write): skipped; "
                              'delete the line to clear this note')
    s, problem = load_json(os.path.join(d, 'summary.json'))
    if problem is None and s is not None:
        problem = incomplete(s, os.path.join(d, 'summary.json'))
    if problem:
        fix = 'the cell trains anew'
        if has_checkpoint(d):
            fix = 'the cell resumes from its checkpoint'
        row.update(status='damaged', reason=f'{problem}: delete it and run the grid again ({fix})')
    elif s is None:
        row.update(unfinished(d, row['status'], records))
    else:
        row.update(figures(d, cell, s, records, opts))
        row.update(verdict(row, s, opts))
    return row


def incomplete(summary, path):
    """What a summary.json lacks of what the report reads (None: nothing), in words."""
    if not isinstance(summary, dict):
        return f'{path} is not a JSON object'
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    if not missing and isinstance(summary['config'], dict):
        missing = [f'config.{k}' for k in CONFIG_KEYS if k not in summary['config']]
    elif not missing:
        missing = ['config (an object)']
    if missing:
        return f"{path} is incomplete: no {', '.join(missing)}"
    return None


def unfinished(d, st, records):
    """Status and reason of a run without summary.json: failed (failed.json), never finished
    ('partial': a checkpoint, still running or stopped; 'new'), or damaged: its log says it saved a
    checkpoint or diverged, and neither that nor summary.json is there."""
    if st == 'failed':
        failed, problem = load_json(os.path.join(d, 'failed.json'))
        if problem is None and not isinstance(failed, dict):
            problem = f'{d}/failed.json is not a JSON object'
        return dict(reason=problem or f"train.py exited with {failed.get('returncode')}")
    if st == 'partial':
        return dict(reason='never finished: a checkpoint and no summary.json (still running, or '
                           'stopped: run the grid again to resume it)')
    ended = [r for r in records if r['event'] in ('saved', 'diverged')]
    if ended:
        event, it = ended[-1]['event'], ended[-1]['iter']
        return dict(status='damaged', reason=(
            f'{d}/log.jsonl records a {event} at iter {it} but summary.json and the checkpoint are '
            f'missing (files lost): delete {d} and run the grid again'))
    return {}


def figures(d, cell, s, records, opts):
    """A run's figures from its summary.json (and the eval at the screen's step from its log)."""
    cfg = s['config']
    budget = (cfg['dataset'], cfg['data_dir'], cfg['train_tokens'], cfg.get('budget_docs'))
    ref = budget_reference(*budget) or dict(  # the data is elsewhere: what train.py recorded
        entropy=s.get('unigram_entropy'), n_train=s.get('budget_tokens'), val_unigram=None,
        layout=s.get('layout'))
    entropy, n_train = ref['entropy'], ref['n_train']
    seen = min(n_train, s['tokens']) if n_train and s.get('tokens') is not None else n_train
    steps = opts['screen_steps'] or cell.get('screen_steps', 500)
    early = last_eval(records, steps)
    early = early if early and early['iter'] == steps else None  # an eval at exactly that step
    layers = (s.get('saturation_layers') or {}).values()
    row = dict(dataset=cfg['dataset'], data_dir=cfg['data_dir'],
               shape=[cfg['n_layer'], cfg['n_head'], cfg['n_embd']])
    row.update(norm=cfg['norm'], n_params=s['n_params'], final=s['final_val_loss'],
               final_paper=s.get('final_val_loss_paper'),  # the study's protocol, if logged
               paper_protocol=bool(cfg.get('paper_val')) and ref['layout'] == 'paper',
               best=s['best_val_loss'], best_iter=s['best_iter'], acc=s.get('final_val_acc'),
               final_iter=s['final_iter'], train_loss=s['final_train_loss'],
               unigram_entropy=entropy, val_unigram=ref['val_unigram'], tokens_seen=seen,
               tokens_per_param=seen / s['n_params'] if seen else None,
               sat=s['saturation'][AT_2] if s['saturation'] else None,
               screen_sat=early['saturation'][AT_2] if early and early.get('saturation') else None,
               screen_iter=early and early['iter'],
               layers_saturated=sum(v[AT_2] > 0.99 for v in layers) if layers else None)
    if s.get('images'):  # a ViT: its best test accuracy at the study's eval epochs, as reported
        from annex.vit import accuracy_at_epochs
        row['acc_epochs'] = accuracy_at_epochs(d)['best_of_those']
    return row


def verdict(row, s, opts):
    """A run's status beyond the runner's and why: nonfinite (a loss or saturation not a number, set
    to None), collapsed (train loss at the unigram level), near unigram (flagged), diverged's
    reason."""
    bad = {k: row[k] for k in MEASURED if isinstance(row[k], float) and not math.isfinite(row[k])}
    out = dict.fromkeys(bad) | dict(near_unigram=False)
    if row['status'] == 'diverged':
        return out | dict(reason=s['diverged_reason'])
    if bad:
        return out | dict(status='nonfinite', reason=(
            ', '.join(f'{MEASURED[k]} {v}' for k, v in bad.items()) + ': left out, not averaged '
            "(train.py did not call it diverged): read its train.out and log.jsonl, and delete "
            f"{row['dir']} to run it again"))
    entropy, train_loss = row['unigram_entropy'], row['train_loss']
    gap = None if entropy is None or train_loss is None else entropy - train_loss  # below unigram
    if gap is not None and gap < opts['collapse_margin']:
        return out | dict(status='collapsed', reason=(
            f'train loss {train_loss:.3f} is at the unigram level of its budget ({entropy:.3f} '
            'nats): it predicts token frequencies only'))
    if row['status'] == 'finished' and gap is not None and gap < opts['near_margin']:
        return out | dict(near_unigram=True, reason=(
            f'train loss {train_loss:.3f} is {gap:.2f} nats below the unigram level of its budget '
            f'({entropy:.3f}): averaged in, flagged'))
    return out


def baseline(variant):
    """The variant a change is measured against: the same architecture with LayerNorm."""
    return 'llama_ln' if variant.startswith('llama') else 'diff' if variant == 'dyt_diff' else 'ln'


def mean_std(values):
    """Mean and sample standard deviation (ddof 1), None where undefined."""
    values = [v for v in values if v is not None]
    return (float(np.mean(values)) if values else None,
            float(np.std(values, ddof=1)) if len(values) > 1 else None)


def effect(ours, theirs, key):
    """The change of `key` from the baseline runs to ours over the seeds both finished: in nats with a
    paired-t 95% interval, in % of the baseline's mean over those seeds, each seed's %, and how many
    seeds are lower."""
    common = sorted(set(ours) & set(theirs))
    a, b = [ours[s].get(key) for s in common], [theirs[s].get(key) for s in common]
    if not common or None in a + b:
        return None
    res, base = paired(a, b), float(np.mean(b))
    to_pct = 100 / base
    return dict(res, seeds=common, base=base, pct=res['mean_diff'] * to_pct,
                pct_ci=None if res['ci'] is None else [v * to_pct for v in res['ci']],
                seed_pct=[(x - y) * to_pct for x, y in zip(a, b)],
                lower=sum(x < y for x, y in zip(a, b)))


def summarize(rows):
    """Per (scale, budget, variant): run counts by status, means and sample stds over finished runs,
    and the effect against the baseline variant at the final and at the best checkpoint."""
    groups = {}
    for r in rows:
        if 'scale' in r:  # a folder whose cell.json is damaged belongs to no cell
            groups.setdefault((r['scale'], r['budget'], r['variant']), []).append(r)
    out = []
    for (scale, budget, variant), runs in groups.items():
        ok = {r['seed']: r for r in runs if r['status'] == 'finished'}
        ended = [r for r in runs if r['status'] in ENDED]
        g = dict(scale=scale, budget=budget, variant=variant, n=len(ok), seeds=sorted(ok),
                 norm=next((r['norm'] for r in runs if 'norm' in r), None), n_ended=len(ended),
                 **{k: sum(r['status'] == k for r in runs) for k in ('collapsed', 'diverged')},
                 near_unigram=sum(r.get('near_unigram', False) for r in runs),
                 excluded={r['name']: r['status'] for r in runs if r['status'] != 'finished'},
                 status_by_seed={r['seed']: r['status'] for r in runs},
                 tokens_per_param=max((r['tokens_per_param'] for r in ended  # a diverged run saw less
                                       if r['tokens_per_param']), default=None),
                 n_params=max((r['n_params'] for r in runs if r.get('n_params')), default=None),
                 val_unigram=next((r['val_unigram'] for r in ended if r['val_unigram']), None),
                 layers_saturated=max((r['layers_saturated'] for r in ended
                                       if r.get('layers_saturated') is not None), default=None))
        g['collapse_rate'] = g['collapsed'] / len(ended) if ended else None
        g['paper_protocol'] = bool(ok) and all(r['paper_protocol'] for r in ok.values())
        for key in ('final', 'final_paper', 'best', 'acc', 'sat', 'screen_sat', 'best_iter',
                    'htsr_alpha', 'erank', 'test_final', 'test_best', 'acc_epochs'):
            g[key], g[key + '_std'] = mean_std([r.get(key) for r in ok.values()])
        for key in ('sat', 'screen_sat'):  # every run that ended: the collapsed are the most saturated
            g[key + '_itt'] = mean_std([r.get(key) for r in ended])[0]
        base = {r['seed']: r for r in groups.get((scale, budget, baseline(variant)), [])
                if r['status'] == 'finished'}
        if variant != baseline(variant):
            for key in ('final', 'best', 'final_paper', 'test_final', 'test_best'):
                g[f'effect_{key}'] = effect(ok, base, key)
                g[f'change_{key}'] = g[f'effect_{key}'] and g[f'effect_{key}']['pct']
            for key in ('sat', 'screen_sat'):  # per protocol: over the seeds the change is over
                g[key + '_paired'] = mean_std([ok[s].get(key) for s in ok if s in base])[0]
        out.append(g)
    for key in ('final', 'best'):  # Holm over the comparisons with a p-value, one family per checkpoint
        tested = [g[f'effect_{key}'] for g in out if g.get(f'effect_{key}')
                  and g[f'effect_{key}']['n'] >= MIN_SEEDS_FOR_P and g[f'effect_{key}']['p'] is not None]
        for e, adjusted in zip(tested, holm([e['p'] for e in tested])):
            e['holm'] = adjusted
    return out


def sign_flips(groups):
    """Per (scale, variant) of a norm other than LayerNorm with a baseline: "better than the
    baseline at the smallest budget AND worse at the largest", at the scale's smallest and largest
    budgets always. By intention to treat (flip_by_seed), seed by seed with a collapsed or diverged
    side counted; per protocol, over the finished paired seeds: the intersection-union test (each
    one-sided paired t; p = the larger of the two; not corrected across rows) and the seeds in which
    both hold."""
    arms, out = {}, []
    for g in groups:  # budget-sorted
        arms.setdefault((g['scale'], g['variant']), []).append(g)
    for (scale, variant), cells in arms.items():
        norm = next((g['norm'] for g in cells if g['norm']), None)
        base = {g['budget']: g for g in arms.get((scale, baseline(variant)), [])}
        if variant == baseline(variant) or norm in (None, 'layernorm') or len(cells) < 2:
            continue
        small, large = cells[0], cells[-1]
        if small['budget'] not in base or large['budget'] not in base:
            continue
        out.append(dict(scale=scale, variant=variant, small=small['budget'], large=large['budget'],
                        **flip_by_seed(small, base[small['budget']], large, base[large['budget']]),
                        **flip_per_protocol(small['effect_final'], large['effect_final'])))
    return out


def seed_signs(g, base):
    """Per seed of which both sides ended: -1 where the variant is better, +1 where worse, 0
    neither. Two finished runs: the sign of their change; a collapsed or diverged side is the worse
    (intention to treat: a collapse is not "better"), and two are neither."""
    e = g['effect_final']
    paired = dict(zip(e['seeds'], e['seed_pct'])) if e else {}
    signs = {}
    for seed, ours in g['status_by_seed'].items():
        theirs = base['status_by_seed'].get(seed)
        if ours not in ENDED or theirs not in ENDED:
            continue
        if ours != 'finished' or theirs != 'finished':
            signs[seed] = (ours != 'finished') - (theirs != 'finished')
        elif seed in paired:
            signs[seed] = int(np.sign(paired[seed]))
    return signs


def flip_by_seed(small, small_base, large, large_base):
    """The flip by intention to treat: seeds better at the smallest budget, worse at the largest,
    and both, each of the seeds judged there."""
    at_small, at_large = seed_signs(small, small_base), seed_signs(large, large_base)
    both = sorted(set(at_small) & set(at_large))
    return dict(itt_better=sum(v < 0 for v in at_small.values()), itt_small_n=len(at_small),
                itt_worse=sum(v > 0 for v in at_large.values()), itt_large_n=len(at_large),
                itt_flipped=sum(at_small[s] < 0 < at_large[s] for s in both), itt_seeds=len(both))


def flip_per_protocol(small, large):
    """The flip over the finished paired seeds (None where a budget has none): each budget's change
    in % with its interval, the seeds of both budgets that flip, and the intersection-union p."""
    out = dict(small_pct=None, small_ci=None, large_pct=None, large_ci=None, seeds=0, flipped=0,
               p=None, n=0)
    for side, e in (('small', small), ('large', large)):
        if e:
            out.update({f'{side}_pct': e['pct'], f'{side}_ci': e['pct_ci']})
    if small and large:
        seeds = sorted(set(small['seeds']) & set(large['seeds']))
        d_small = dict(zip(small['seeds'], small['seed_pct']))
        d_large = dict(zip(large['seeds'], large['seed_pct']))
        out.update(seeds=len(seeds), flipped=sum(d_small[s] < 0 < d_large[s] for s in seeds),
                   p=intersection_union([small['p_less'], large['p_greater']]),
                   n=min(small['n'], large['n']))
    return out


Item = namedtuple('Item', 'scale sat screen_sat tokens_per_param helps')  # one cell, as the rule sees it


def rule_items(groups, norm):
    """The rule's items for one norm, one per cell (scale x budget x variant with a LayerNorm
    baseline): {(analysis, outcome): [Item]}, helps None where the cell is not scored. Per protocol:
    the finished paired seeds, helps iff the mean change is below 0, saturation over those seeds.
    Intention to treat: every run that ended; a cell with a collapsed or diverged run hurts, and one
    with neither such a run nor paired seeds is not scored."""
    items = {}
    for g in groups:
        if g['norm'] != norm or g['variant'] == baseline(g['variant']) or not g['n_ended']:
            continue
        if not any(h['variant'] == baseline(g['variant']) and h['n'] and (h['scale'], h['budget']) ==
                   (g['scale'], g['budget']) for h in groups):
            continue
        for outcome in ('final', 'best'):
            change = g.get(f'change_{outcome}')
            helps = None if change is None else change < 0
            items.setdefault(('per protocol', outcome), []).append(
                Item(g['scale'], g['sat_paired'], g['screen_sat_paired'], g['tokens_per_param'],
                     helps))
            if g['collapsed'] + g['diverged'] > 0:
                helps = False
            items.setdefault(('intention to treat', outcome), []).append(
                Item(g['scale'], g['sat_itt'], g['screen_sat_itt'], g['tokens_per_param'], helps))
    return items


def score_rule(items, opts, screen_steps=None):
    """Each predictor on the items scored that have a saturation at the end: saturation at the end
    and at the screen's step against the threshold, and the baseline 'helps iff tokens per parameter
    is below t', t fitted on the items (scored as -T/P > -t, so that every rule reads 'score >
    threshold'); not_scored counts the other items."""
    out, cells = [], len(items)
    items = [i for i in items if i.sat is not None and i.helps is not None]
    for predictor, score, threshold in (
            ('saturation (end)', lambda i: i.sat, opts['threshold']),
            (f'saturation (step {screen_steps})', lambda i: i.screen_sat, opts['threshold']),
            ('tokens/param (fitted)',
             lambda i: None if i.tokens_per_param is None else -i.tokens_per_param, None)):
        scored = [(i.scale, score(i), i.helps) for i in items if score(i) is not None]
        if not scored:
            continue
        res = rule_stats(scored, threshold)
        one_scale = len({i[0] for i in scored}) < 2  # resampling one scale gives the same cells
        res['intervals'] = {} if one_scale else bootstrap_rule(scored, opts['bootstrap'], opts['seed'],
                                                               threshold)
        out.append(dict(res, predictor=predictor, not_scored=cells - len(scored)))
    return out


def screening(groups, runs, opts):
    """The rule scored for DyT and Derf, both ways and at both checkpoints; and how the screen's
    saturation relates to the end's, run by run."""
    screen_steps = next((r['screen_iter'] for r in runs if r.get('screen_iter')), None)
    rule = []
    for norm in POINTWISE:
        for (analysis, outcome), items in rule_items(groups, norm).items():
            for res in score_rule(items, opts, screen_steps):
                rule.append(dict(res, norm=norm, analysis=analysis, outcome=outcome,
                                 screen_steps=screen_steps))
    pairs = [(r['screen_sat'], r['sat']) for r in runs if r['status'] in ENDED
             and r.get('norm') in POINTWISE and r.get('screen_sat') is not None
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
    """Mean HTSR alpha and activation effective rank of each finished LN/DyT/Derf run's final checkpoint,
    with analyze.py's functions; cached in the cell folder as analysis.json."""
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


def test_losses(runs, opts):
    """Each finished token run's loss on its dataset's held-out test split (annex/eval.py's perplexity:
    consecutive windows, every token predicted once; test_limit > 0 caps the windows) at the final
    checkpoint and at the one picked on val (best.pt), so the best is reported on data it was not picked
    on. Cached in the cell folder as test.json; a dataset without a test split is noted there."""
    from annex.eval import eval_perplexity  # here: only a report with test=True needs it
    for r in runs:
        if r['status'] != 'finished' or not r.get('tokens_per_param'):  # token runs (not a ViT's)
            continue
        cache = os.path.join(r['dir'], 'test.json')
        res = read_json(cache)
        if not res or res.get('final_iter') != r['final_iter']:
            res = dict(final_iter=r['final_iter'])
            try:
                tokens = load_split(r['dataset'], 'test', r['data_dir'])
            except DataError as e:
                res['error'] = str(e)
            else:
                for key, name in (('test_final', 'ckpt.pt'), ('test_best', 'best.pt')):
                    path = os.path.join(r['dir'], name)
                    if key == 'test_best' and r['best_iter'] == r['final_iter']:  # the same weights
                        res[key] = res['test_final']
                    elif os.path.exists(path):  # no best.pt when step 0 was best: not saved
                        model, _ = load_checkpoint(path, device=opts['device'])
                        res[key] = eval_perplexity(model, tokens, opts['test_limit'] or None,
                                                   f"{r['name']} {name}", batch_tokens=8192,
                                                   device=opts['device'])['loss']
            write_json(cache, res)
        r.update(test_final=res.get('test_final'), test_best=res.get('test_best'),
                 test_error=res.get('error'))

# ----------------------------------------------------------------------------------- report.md and plots


def pm(mean, std):
    return '-' if mean is None else fmt(mean, '.4f') + ('' if std is None else f' ± {fmt(std, ".4f")}')


def interval(ci, spec):
    return '' if ci is None or None in ci else f" [{fmt(ci[0], spec)}, {fmt(ci[1], spec)}]"


def effect_cells(e):
    """An effect as table cells: nats [CI], % [CI], seeds lower, p (Holm)."""
    if e is None:
        return ['-'] * 4
    p = '-' if e['n'] < MIN_SEEDS_FOR_P or e['p'] is None else \
        f"{fmt(e['p'], '.3f')} ({fmt(e.get('holm'), '.3f')})"
    return [f"{e['mean_diff']:+.4f}{interval(e['ci'], '+.4f')}",
            f"{e['pct']:+.1f}%{interval(e['pct_ci'], '+.1f')}",
            f"{e['lower']} of {e['n']}", p]


def beside_published(groups):
    """Every published figure that has a counterpart among our cells (same scale, budget label and
    variant), with what makes it comparable or not: losses and changes under the study's protocol
    (paper_val on data/wikitext103/paper) where every run of the cell logged it, else ours, noted."""
    out = []
    for what, published in PUBLISHED.items():
        for g in groups:
            x = published.get((g['scale'], g['budget'], g['variant']))
            if x is None:
                continue
            paper = what in ('val_loss', 'change_%') and g['paper_protocol']  # losses: comparable?
            key = dict(val_loss='final', saturation='sat', htsr_alpha='htsr_alpha', erank='erank',
                       **{'change_%': 'change_final'})[what] + ('_paper' if paper else '')
            notes = [] if paper or what not in ('val_loss', 'change_%') else [
                "not comparable: our fixed val set and whole-file tokenization, not the study's val "
                'slices (rerun with paper_val on data/wikitext103/paper)']
            if 'diff' in g['variant']:
                notes.append("the study's Differential Attention is not the reference form ours is")
            if (g['scale'], g['budget']) == ('124m', '10M') and what == 'change_%':
                notes.append("the study's artifacts disagree: -12.3% here, +6.1% in "
                             'crossover_predictor.json')
            ours = g.get(key)
            out.append(dict(figure=what, scale=g['scale'], budget=g['budget'], variant=g['variant'],
                            published=x, ours=ours, difference=None if ours is None else ours - x,
                            protocol='paper' if paper else 'ours', notes=notes))
    return out


def table(header, rows):
    """A markdown table: the header's cells, then one list of cells per row."""
    return ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)] \
        + ['| ' + ' | '.join(map(str, r)) + ' |' for r in rows] + ['']


def rule_table(rule):
    """The rule's rows: right of n with the exact binomial 95% interval; balanced accuracy, AUC and
    leave-one-scale-out with the scale-resampling bootstrap's 95% interval; leave-one-scale-out's
    range over tie-breaks; the cells not scored."""
    def boot(r, key, spec='.2f'):
        return fmt(r[key], spec) + interval(r['intervals'].get(key), spec)
    return table(['norm', 'runs counted', 'outcome at', 'predictor', 'threshold',
                  'right of n (exact 95%)', 'balanced accuracy', 'AUC', 'leave-one-scale-out',
                  'leave-one-scale-out, any tie-break', 'not scored'],
                 [[r.get('norm', 'dyt'), r.get('analysis', '-'), r.get('outcome', 'final'),
                   r['predictor'], (f"T/P < {-r['threshold']:.3g}" if r['predictor'].startswith('tokens')
                                    else f"> {r['threshold']:.3g}"),
                   f"{r['correct']} of {r['n']} = {fmt(r['accuracy'], '.0%')}"
                   f"{interval(r['accuracy_ci'], '.0%')}",
                   boot(r, 'balanced_accuracy'), boot(r, 'auc'), boot(r, 'loso'),
                   interval(r['loso_range'], '.2f').strip() or '-', r.get('not_scored', 0)]
                  for r in rule])


RULE_NOTE = ('Per protocol drops collapsed and diverged runs (the study\'s way) and scores a cell '
             'on its finished seeds paired with LayerNorm, saturation included; intention to treat '
             'keeps every run that ended and scores a cell with a collapsed or diverged run as '
             '"hurts"; a cell with neither paired seeds nor such a run is not scored, and counted. '
             'The tokens-per-parameter baseline fits its threshold on the same cells (in-sample, so it '
             'is favoured); leave-one-scale-out refits every threshold on the other scales, a tie '
             'to the smallest threshold for every predictor (predicting "helps" more often), '
             'beside its range over every tie-break. Intervals: exact (Clopper-Pearson) for the '
             'count right, otherwise percentiles of {boot} bootstrap resamples of scales (cells of '
             'one scale are not independent; one scale gives none).')


def markdown(grid_dir, rows, groups, flips, rule, link, pub, opts):
    counts = {st: sum(r['status'] == st for r in rows) for st in STATUSES}
    near = sum(r.get('near_unigram', False) for r in rows)
    md = [f'# Study report: {grid_dir}', '',
          'Runs: ' + ', '.join(f'{n} {st}' for st, n in counts.items() if n)
          + (f' ({near} of the finished near the unigram level)' if near else '') + '. Means and sample '
          'standard deviations (ddof 1) over finished runs; collapsed (final train loss within '
          f"{opts['collapse_margin']} nats of the budget's unigram level), diverged, nonfinite (a "
          'loss that is not a number), damaged (a file torn, incomplete or lost), failed and '
          'unfinished runs are counted and listed, not averaged in; near unigram (within '
          f"{opts['near_margin']} nats) are averaged in and flagged. Tokens/param: what the run saw, "
          'min(budget, steps x tokens per step). Unigram level on val: the val loss of predicting the '
          "budget's token frequencies (add-one smoothed), what a collapsed model scores. Val accuracy "
          'is next-token accuracy for language runs, test-set accuracy for a ViT.', '',
          '## Validation loss: final and best checkpoint', '']
    md += table(['scale', 'budget', 'tokens/param', 'variant', 'finished / collapsed / diverged / near '
                 'unigram', 'collapse rate', 'final val loss', 'best val loss (mean step)',
                 'unigram level on val',
                 'final val accuracy', 'saturation, end / screen',
                 'layers > 99% saturated (most in a run)'],
                [[g['scale'], g['budget'], fmt(g['tokens_per_param'], '.3g'), g['variant'],
                  f"{g['n']} / {g['collapsed']} / {g['diverged']} / {g['near_unigram']}",
                  fmt(g['collapse_rate'], '.0%'),
                  pm(g['final'], g['final_std']),
                  f"{pm(g['best'], g['best_std'])} ({fmt(g['best_iter'], '.0f')})",
                  fmt(g['val_unigram'], '.4f'), pm(g['acc'], g['acc_std']) + (
                      f" (best at epochs 1/25/50/75/100: {g['acc_epochs']:.4f})" if g['acc_epochs']
                      else ''),
                  f"{fmt(g['sat'], '.3f')} / {fmt(g['screen_sat'], '.3f')}",
                  fmt(g['layers_saturated'], 'd')] for g in groups])
    compared = [g for g in groups if g.get('effect_final') or g.get('effect_best')]
    md += ['## Effects against the same architecture with LayerNorm', '',
           'Over the seeds both have: variant minus baseline in nats with the paired-t 95% interval, in '
           "% of the baseline's mean over those seeds (taken as fixed), how many seeds are lower, and "
           "the paired t-test's two-sided p with Holm's adjustment over the table's comparisons at that "
           f'checkpoint (from {MIN_SEEDS_FOR_P} seeds; with 2, one degree of freedom, read the signs '
           'and the interval).', '']
    md += table(['scale', 'budget', 'variant', 'final: change (nats)', 'final: %', 'final: seeds lower',
                 'final: p (Holm)', 'best: change (nats)', 'best: %', 'best: seeds lower',
                 'best: p (Holm)'],
                [[g['scale'], g['budget'], f"{g['variant']} vs {baseline(g['variant'])}",
                  *effect_cells(g.get('effect_final')), *effect_cells(g.get('effect_best'))]
                 for g in compared]) if compared else ['No variant has a baseline in this grid.', '']
    md += flip_section(flips)
    md += [f"## Screening rule: saturation > {opts['threshold']} -> helps, and a tokens-per-parameter "
           'baseline', '', RULE_NOTE.format(boot=opts['bootstrap']) + f' {PUBLISHED_RULE}.', '']
    md += rule_table(rule) if rule else ['No DyT or Derf cell with a LayerNorm baseline.', '']
    md += [f"Saturation after {next((r['screen_steps'] for r in rule), '-')} steps against saturation "
           f"at the end, over {link['n']} DyT and Derf runs: mean {fmt(link['mean_screen'], '.3f')} vs "
           f"{fmt(link['mean_final'], '.3f')}, Pearson r {fmt(link['pearson'], '.3f')}, same side of "
           f"the threshold in {fmt(link['same_side'], '.0%')}.", '']
    tested = [g for g in groups if g.get('test_final') is not None]
    if tested:
        md += ['## Held-out test split: final checkpoint and the best on val', '',
               'The loss on the test split (consecutive windows, every token predicted once) of the '
               'final checkpoint and of the one picked on val (best.pt): the best is reported on data '
               'it was not picked on. Changes against LayerNorm over the seeds both have, in % (paired '
               '95% interval).', '']
        md += table(['scale', 'budget', 'variant', 'n', 'test loss, final', 'test loss, best on val',
                     'change, final', 'change, best on val'],
                    [[g['scale'], g['budget'], g['variant'], g['n'],
                      pm(g['test_final'], g['test_final_std']), pm(g['test_best'], g['test_best_std'])]
                     + [effect_cells(g.get(f'effect_{k}'))[1] for k in ('test_final', 'test_best')]
                     for g in tested])
    elif any(r.get('test_error') for r in rows):
        md += ['## Held-out test split', '', 'None here: ' + next(r['test_error'] for r in rows
                                                                    if r.get('test_error')).split(';')[0]
               + '. The best on val is reported on val only.', '']
    analysed = [g for g in groups if g.get('htsr_alpha') is not None or g.get('erank') is not None]
    if analysed:
        md += ['## Weight spectra and activation rank (final checkpoints, analyze.py)', '']
        md += table(['scale', 'budget', 'variant', 'mean HTSR alpha', 'activation effective rank'],
                    [[g['scale'], g['budget'], g['variant'], fmt(g['htsr_alpha'], '.2f'),
                      fmt(g['erank'], '.1f')] for g in analysed])
    md += ['## The study\'s published figures (Verma 2026, final checkpoint, mean of 3 seeds) beside '
           'ours', '']
    md += table(['figure', 'scale', 'budget', 'variant', 'published', 'ours', 'difference', 'protocol',
                 'notes'],
                [[p['figure'], p['scale'], p['budget'], p['variant'], f"{p['published']:g}",
                  fmt(p['ours'], '.4g'), fmt(p['difference'], '+.4g'), p['protocol'],
                  '; '.join(p['notes']) or '-'] for p in pub]) if pub else \
        ['No cell of this grid has a published counterpart (the study: GPT-2 64m-3.78b on '
         'WikiText-103).', '']
    md += ['## Runs not averaged, or flagged', '']
    md += [f"- {r['name']}: **{'near unigram' if r.get('near_unigram') else r['status']}**"
           + (f" ({r['reason']})" if r.get('reason') else '')
           + (f"; {r['log_problem']}" if r.get('log_problem') else '')
           for r in rows if r['status'] != 'finished' or r.get('near_unigram')
           or r.get('log_problem')] or ['None.']
    return '\n'.join(md) + '\n'


def flip_section(flips):
    """The sign flip's table: by intention to treat, seed by seed, and per protocol beside it."""
    if not flips:
        return []
    md = ['## The sign flip', '',
          'Better than LayerNorm at the smallest budget AND worse at the largest (final '
          "checkpoint), at the scale's smallest and largest budgets. By intention to treat, seed "
          'by seed over the seeds whose runs ended on both sides: a collapsed or diverged run is '
          'the worse side (a collapse is not "better"). Per protocol, over the finished seeds '
          'paired with LayerNorm: '
          'the change in % (paired 95% interval), the seeds that flip, and the intersection-union '
          f'test (each one-sided paired t at level alpha, p = the larger; from {MIN_SEEDS_FOR_P} '
          'seeds; not corrected across rows); "-" where a budget has no paired seeds.', '']
    return md + table(
        ['scale', 'variant', 'budgets', 'ITT: better at the smallest', 'ITT: worse at the largest',
         'ITT: seeds that flip', 'per protocol: smallest %', 'per protocol: largest %',
         'per protocol: seeds that flip', 'per protocol: IUT p'],
        [[f['scale'], f['variant'], f"{f['small']}, {f['large']}",
          f"{f['itt_better']} of {f['itt_small_n']}", f"{f['itt_worse']} of {f['itt_large_n']}",
          f"{f['itt_flipped']} of {f['itt_seeds']}", signed_pct(f['small_pct'], f['small_ci']),
          signed_pct(f['large_pct'], f['large_ci']), f"{f['flipped']} of {f['seeds']}",
          fmt(f['p'], '.3f') if f['n'] >= MIN_SEEDS_FOR_P else '-'] for f in flips])


def signed_pct(pct, ci):
    return '-' if pct is None else f"{pct:+.1f}%{interval(ci, '+.1f')}"


def plots(report_dir, groups, opts):
    plt, names = pyplot(), []
    if plt is None:
        return names

    def save(fig, name):
        save_png(fig, os.path.join(report_dir, name))
        names.append(name)

    arms = dict.fromkeys((g['scale'], g['variant']) for g in groups)
    colors = {k: f'C{i % 10}' for i, k in enumerate(arms)}  # an arm has one color in every panel

    def lines(cells):  # one line per (scale, variant), along tokens per parameter
        for scale, variant in dict.fromkeys((g['scale'], g['variant']) for g in cells):
            yield (f'{scale} {variant}', colors[scale, variant],
                   sorted((g for g in cells if (g['scale'], g['variant']) == (scale, variant)),
                          key=lambda g: g['tokens_per_param']))
    compared = [g for g in groups if g.get('change_final') is not None and g['tokens_per_param']]
    if compared:  # token budgets (a ViT grid has none)
        fig, axes = plt.subplots(1, 3, figsize=(16, 4))
        for ax, key in zip(axes, ('final', 'best')):
            for name, color, line in lines([g for g in compared if g[f'effect_{key}']]):
                x = [g['tokens_per_param'] for g in line]
                y = [g[f'change_{key}'] for g in line]
                err = error_bars(y, [g[f'effect_{key}']['pct_ci'] for g in line])
                ax.errorbar(x, y, yerr=err, fmt='o-', capsize=3, label=name, color=color)
                for g in line:
                    ax.annotate(g['budget'], (g['tokens_per_param'], g[f'change_{key}']), fontsize=7,
                                xytext=(3, 3), textcoords='offset points')
            ax.axhline(0, c='gray', lw=0.8)
            ax.set(xscale='log', xlabel='training tokens per parameter (seen)',
                   ylabel='val loss change vs LayerNorm (%, paired 95% CI)', title=f'{key} checkpoint')
        axes[0].plot([tokens / 63.5e6 for tokens in (1e6, 10e6, 50e6, 118e6)],  # 63.5M parameters
                     [PUBLISHED['change_%']['64m', b, 'dyt'] for b in BUDGETS], 'k--', alpha=0.4,
                     label='Verma 2026, 64m dyt (published)')  # its final step
        axes[0].legend(fontsize=8)
        for name, color, line in lines([g for g in groups
                                        if g['final'] is not None and g['tokens_per_param']]):
            axes[2].plot([g['tokens_per_param'] for g in line], [g['final'] for g in line], 'o-',
                         label=name, color=color)
        for k, scale in enumerate(dict.fromkeys(g['scale'] for g in groups)):  # one line per scale
            ref = sorted({(g['tokens_per_param'], g['val_unigram']) for g in groups
                          if g['scale'] == scale and g['val_unigram'] and g['tokens_per_param']})
            if ref:
                axes[2].plot(*zip(*ref), 'kx:', label=None if k else 'unigram level on val')
        axes[2].set(xscale='log', xlabel='training tokens per parameter (seen)', ylabel='final val loss',
                    title='val loss and the unigram level')
        axes[2].legend(fontsize=7)
        fig.suptitle('The sign flip: below 0, the variant beats LayerNorm')
        save(fig, 'signflip.png')
    if len({g['scale'] for g in compared if g['n_params']}) > 1:
        capacity_plot(plt, capacity_lines(compared), save)
    pointwise = [g for g in groups if g['norm'] in POINTWISE and g.get('change_final') is not None
                 and g['sat'] is not None]
    if pointwise:
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, marker, what in (('sat', 'o', 'end of run'), ('screen_sat', 's', 'screen step')):
            pts = [(g[key], g['change_final'], f"{g['scale']} {g['budget']} {g['variant']}")
                   for g in pointwise if g[key] is not None]
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker,
                       label=f'saturation at {what}')
            for x, y, name in pts:
                ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords='offset points')
        ax.axvline(opts['threshold'], ls=':', c='gray', label=f"threshold {opts['threshold']}")
        ax.axhline(0, c='gray', lw=0.8)
        ax.set(xlabel='saturation (fraction of |f| > tanh(2) of its bound)',
               ylabel='change vs LayerNorm, final (%)', title='Does saturation predict the change?')
        ax.legend(fontsize=8)
        save(fig, 'saturation.png')
    return names


def error_bars(values, cis):  # matplotlib's yerr (2 x n, below and above) of intervals or None
    return np.array([[v - (ci or [v, v])[0], (ci or [v, v])[1] - v]
                     for v, ci in zip(values, cis)]).T


def capacity_lines(compared):
    """{(budget, variant): [(parameters, change %, its paired 95% CI or None, scale)]} at the final
    and the best checkpoint, by parameters: the study's "the penalty grows with capacity", one line
    per budget and variant across the scales."""
    lines = {key: {} for key in ('final', 'best')}
    for g in sorted(compared, key=lambda g: g['n_params'] or 0):
        for key in lines:
            if g['n_params'] and g[f'effect_{key}']:
                effect = g[f'effect_{key}']
                point = (g['n_params'], g[f'change_{key}'], effect['pct_ci'], g['scale'])
                lines[key].setdefault((g['budget'], g['variant']), []).append(point)
    return lines


def capacity_plot(plt, lines, save):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, (key, cells) in zip(axes, lines.items()):
        for (budget, variant), points in cells.items():
            x, y, cis, _ = zip(*points)
            ax.errorbar(x, y, yerr=error_bars(y, cis), fmt='o-', capsize=3,
                        label=f'{variant} at {budget}')
            for point in points:
                ax.annotate(point[3], point[:2], fontsize=7, xytext=(3, 3),
                            textcoords='offset points')
        ax.axhline(0, c='gray', lw=0.8)
        ax.set(xscale='log', xlabel='parameters', title=f'{key} checkpoint',
               ylabel='val loss change vs LayerNorm (%, paired 95% CI)')
        ax.legend(fontsize=7)
    fig.suptitle('Does the change grow with capacity? One line per budget, across the scales')
    save(fig, 'capacity.png')


def paper_cells(source):
    """The study's 12 cells as Items, as one of its two artifacts records them."""
    other = source == 'crossover_predictor.json'
    cells = [(s, b, tp, PAPER_CELLS_OTHER.get((s, b), {}).get('sat', sat) if other else sat,
              PAPER_CELLS_OTHER.get((s, b), {}).get('change', change) if other else change)
             for s, b, tp, sat, change in PAPER_CELLS]
    return [Item(s, sat, None, tp, change < 0) for s, b, tp, sat, change in cells]


def published_rule(opts):
    """The rule and its baseline on the study's own 12 cells, as each of its two artifacts has them."""
    out, md = {}, ['# The screening rule on the study\'s 12 cells (Verma 2026)', '',
                   'Saturation at the end of the run against DyT\'s change vs LayerNorm at the final '
                   'checkpoint, as the study scored its rule; beside it "helps iff tokens per parameter '
                   'is below t", t fitted on the cells, and the study\'s own figure T/P < 0.0855 '
                   '(between 124m/10M at 0.081 and 1.3b/all at 0.090); and saturation > 0.467, the '
                   'threshold crossover_predictor.json refitted. '
                   + RULE_NOTE.format(boot=opts['bootstrap']).split('. ', 1)[1], '']
    for source in ('predictor_validation.json', 'crossover_predictor.json'):
        items = paper_cells(source)
        rows = score_rule(items, opts)
        for predictor, scored, threshold in (
                ('tokens/param (stated)', [(i.scale, -i.tokens_per_param, i.helps) for i in items],
                 -0.0855),
                ('saturation (its refit)', [(i.scale, i.sat, i.helps) for i in items], 0.467)):
            rows.append(dict(rule_stats(scored, threshold), predictor=predictor,
                             intervals=bootstrap_rule(scored, opts['bootstrap'], opts['seed'],
                                                      threshold)))
        for r in rows:
            r['analysis'] = "the study's"
        out[source] = rows
        md += [f'## The cells as in {source}', ''] + rule_table(rows)
    md += ['The study reports 75% in-sample and AUC 0.75 for saturation > 0.43 on these cells, and '
           'crossover_predictor.json a refitted threshold 0.467 at 67%.', '']
    return out, '\n'.join(md) + '\n'


def finite(obj):
    """obj with every float that is not finite as None: JSON has no NaN or infinity (json.dumps
    would write NaN, which strict readers refuse)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def main(argv):
    """The report on the grid folder in argv (and --key=value options): what report.json holds."""
    # `report --published` reads as the issue of a flag, not a path: the one bare flag taken
    opts, rest = command_line(OPTIONS, ['--published=True' if a == '--published' else a for a in argv])
    if opts['published']:
        res, md = published_rule(opts)
        print(md)
        return res
    if len(rest) != 1:
        raise SystemExit('usage: python annex/study.py report GRID_OUT_DIR (the out_dir of '
                         '`python annex/study.py run`), or report --published')
    if not os.path.isdir(rest[0]):
        raise SystemExit(f'error: {rest[0]} is missing (or not a folder): give the out_dir of a grid '
                         'that `python annex/study.py run` wrote, e.g. out/grid_mini')
    rows = collect(rest[0], opts)
    if opts['analysis']:
        spectra_and_rank(rows, opts)
    if opts['test']:
        test_losses(rows, opts)
    groups = summarize(rows)
    flips = sign_flips(groups)
    rule, link = screening(groups, rows, opts)
    pub = beside_published(groups)
    md = markdown(rest[0], rows, groups, flips, rule, link, pub, opts)
    result = dict(runs=rows, groups=groups, sign_flips=flips, rule=rule, screen_vs_final=link,
                  published=pub)
    write_json(os.path.join(rest[0], 'report.json'),
               finite(dict(schema='nanonorm-study-report/2', options=opts, **result,
                           # what `screen` reads our accuracy of the rule from: reports of its data
                           # and shape
                           datasets=sorted({r['dataset'] for r in rows if 'dataset' in r}),
                           shapes=sorted({tuple(r['shape']) for r in rows if 'shape' in r}))))
    atomic_write(os.path.join(rest[0], 'report.md'), lambda f: f.write(md.encode()))
    names = plots(rest[0], groups, opts)
    print(md + f"\nwrote {rest[0]}/report.md, report.json" + ''.join(f', {n}' for n in names))
    return result


if __name__ == '__main__':
    main(sys.argv[1:])
