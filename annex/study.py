"""
The study as commands (Verma 2026, "When Does Removing LayerNorm Help?", arXiv 2604.23434):

  python study.py screen config/gpt2_64m_dyt.py --train_tokens=1_000_000 [--compare=True]
      Train the DyT config for screen_steps (500) steps, read its saturation on the fixed train windows, and
      predict whether DyT will help (saturation > threshold 0.43) or hurt against LayerNorm. Writes screen.json.
  python study.py run config/grid_64m.py [--shard=i/n] [--nproc=8]
      Run every cell of a grid (scales x budgets x variants x seeds) with train.py, one out_dir per cell.
      Finished cells are skipped, interrupted ones resumed, diverged or failed ones recorded; rerun to continue.
  python study.py report out/grid_64m
      report.md, report.json and PNGs: final AND best val loss per cell, % change against LayerNorm with a
      paired t-test over seeds, the sign-flip plot, the screening rule's accuracy, HTSR alpha and effective rank,
      the study's published figures beside ours. Collapsed, diverged and failed runs are listed, never averaged.

A grid is a Python file of plain values (config/grid_mini.py documents the keys). Options are --key=value;
other --key=value and config files given to `screen` go to train.py. `python study.py CMD --help` lists them.
"""
import functools
import glob
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import fields

import numpy as np

import train
from analyze import DEFAULTS as ANALYZE_DEFAULTS
from analyze import HEADLINE_T, analyze, fmt, pyplot, save_png
from configurator import configure, run_config_file
from data.common import DataError, atomic_write, load_split, read_log, unigram_entropy, write_json
from model import POINTWISE, SAT_THRESHOLDS, GPTConfig

REPO = os.path.dirname(os.path.abspath(__file__))
AT_2 = SAT_THRESHOLDS.index(HEADLINE_T)  # saturation at |alpha x| > 2, the study's headline figure
LLAMA = dict(pos='rope', mlp='swiglu', n_kv_head=4)
VARIANTS = {  # train.py overrides on top of a scale; alpha0 2.0 everywhere, as in the study
    'ln': dict(norm='layernorm'), 'rmsnorm': dict(norm='rmsnorm'), 'dyt': dict(norm='dyt', dyt_alpha=2.0),
    'hardtanh': dict(norm='hardtanh'), 'diff': dict(norm='layernorm', attn='diff'),
    'dyt_diff': dict(norm='dyt', dyt_alpha=2.0, attn='diff'), 'llama_ln': dict(LLAMA, norm='layernorm'),
    'llama_rmsnorm': dict(LLAMA, norm='rmsnorm'), 'llama_dyt': dict(LLAMA, norm='dyt', dyt_alpha=2.0),
    'llama_dyt_gelu': dict(LLAMA, norm='dyt', dyt_alpha=2.0, mlp='gelu'), 'derf': dict(norm='derf', dyt_alpha=2.0)}
GRID_KEYS = dict(scales=dict, budgets=list, variants=list, seeds=list, overrides=dict, custom_variants=dict,
                 out_dir=str, screen_steps=int)
RUNNER_SETS = ('out_dir', 'train_tokens', 'seed', 'init_from', 'overwrite')  # a grid may not override these
OPTIONS = dict(screen=dict(screen_steps=500, threshold=0.43, compare=False, screen_dir='', reports='out/*/report.json'),
               run=dict(shard='0/1', nproc=1, max_attempts=2, poll=30.0),
               report=dict(threshold=0.43, screen_steps=0, collapse_margin=0.1, bootstrap=2000, seed=0,
                           analysis=True, device='cpu'))
# Verma 2026 (arXiv 2604.23434), 64m unless noted; 'all' = all of WikiText-103 train (the paper's "118M").
PUBLISHED = {
    'val_loss': {('64m', b, v): x for v, row in (('ln', (9.384, 4.260, 3.666, 3.631)), ('dyt', (6.819, 4.510, 4.386,
                 4.313)), ('diff', (9.490, 3.706, 3.380, 3.359))) for b, x in zip(('1M', '10M', '50M', 'all'), row)}
    | {('64m', '1M', 'rmsnorm'): 9.317, ('64m', 'all', 'rmsnorm'): 3.635, ('64m', '1M', 'hardtanh'): 6.246,
       ('64m', '10M', 'hardtanh'): 4.660, ('64m', 'all', 'hardtanh'): 4.562, ('64m', 'all', 'llama_ln'): 3.537,
       ('64m', 'all', 'llama_dyt'): 5.626, ('64m', 'all', 'llama_dyt_gelu'): 4.476},
    'change_%': {(s, b, 'dyt'): x for s, row in (('64m', (-27.3, 5.9, 19.7, 18.8)), ('124m', (-9.6, -12.3, None, 12.8)),
                 ('354m', (4.3, -24.1, None, 13.4)), ('1.3b', (2.1, -1.8, None, 10.4)), ('3.78b', (1.7, None, None, 27.9)))
                 for b, x in zip(('1M', '10M', '50M', 'all'), row) if x is not None},
    'saturation': {('64m', b, 'dyt'): x for b, x in zip(('1M', '10M', '50M', 'all'), (.493, .414, .237, .234))},
    'htsr_alpha': {('64m', '1M', 'ln'): 5.37, ('64m', '1M', 'dyt'): 3.14, ('64m', 'all', 'ln'): 4.18,
                   ('64m', 'all', 'dyt'): 2.76},
    'erank': {('64m', '1M', 'ln'): 426, ('64m', '1M', 'dyt'): 167, ('64m', 'all', 'ln'): 357, ('64m', 'all', 'dyt'): 198}}
PUBLISHED_RULE = ('published rule (Verma 2026): 75% in-sample on 12 cells (AUC 0.75), 64% with the 3.78b cells, '
                  '50% leave-one-scale-out, 3/3 on Llama; validated on END-of-run saturation, never after 500 steps')


def options(command, argv):
    """Split argv into this command's --key=value options and the rest (train.py's config files and keys)."""
    mine = [a for a in argv if a.startswith('--') and a[2:].partition('=')[0] in OPTIONS[command] or a in ('-h', '--help')]
    return configure(OPTIONS[command], mine, doc=__doc__), [a for a in argv if a not in mine]


def flags(overrides):
    return [f'--{k}={v!r}' for k, v in overrides.items()]


def label(budget):
    return 'all' if budget is None else next((f'{budget // u}{s}' for u, s in ((10**9, 'B'), (10**6, 'M'), (1000, 'K'))
                                              if budget % u == 0), str(budget))


def check_train_args(args, where):
    """train.py's own checks on a cell's arguments (keys, types, architecture), before anything runs."""
    try:
        cfg = configure(train.DEFAULTS, args, train.OPTIONAL_TYPES)
        GPTConfig(**{f.name: cfg[f.name] for f in fields(GPTConfig)})
    except (SystemExit, ValueError) as e:
        raise SystemExit(f'{where}: {str(e).removeprefix("error: ")}') from None
    return cfg

# ------------------------------------------------------------------------------------------ grids and cells


def load_grid(path):
    """The grid file's values, checked, and its cells: [{name, scale, budget, variant, seed, args}]."""
    namespace = run_config_file(path, what='grid file')
    grid = dict(overrides={}, custom_variants={}, seeds=[1337], screen_steps=500,
                out_dir=os.path.join('out', os.path.splitext(os.path.basename(path))[0]))
    for key, value in namespace.items():
        if key.startswith('_') or type(value).__name__ in ('module', 'function', 'type', 'builtin_function_or_method'):
            continue
        if key not in GRID_KEYS:
            raise SystemExit(f"error: {path}: unknown grid key '{key}'; grid keys are {', '.join(GRID_KEYS)}")
        if not isinstance(value, GRID_KEYS[key]):
            raise SystemExit(f"error: {path}: '{key}' must be a {GRID_KEYS[key].__name__}, got {value!r}")
        grid[key] = value
    for key in ('scales', 'budgets', 'variants', 'seeds'):
        if not grid.get(key):
            raise SystemExit(f"error: {path}: '{key}' is missing or empty; every axis needs at least one value")
    variants = VARIANTS | grid['custom_variants']
    for v in grid['variants']:
        if v not in variants:
            raise SystemExit(f"error: {path}: unknown variant '{v}'; known: {', '.join(variants)} "
                             "(or define it in custom_variants)")
    for b in grid['budgets']:
        if b is not None and (type(b) is not int or b <= 0):
            raise SystemExit(f'error: {path}: budgets must be positive ints (tokens) or None (all), got {b!r}')
    sources = [grid['overrides'], *grid['scales'].values(), *variants.values()]
    fixed = sorted({k for d in sources if isinstance(d, dict) for k in RUNNER_SETS if k in d})
    if fixed:
        raise SystemExit(f'error: {path}: the runner sets {", ".join(fixed)} for each cell; remove them')
    cells = []
    for scale, spec in grid['scales'].items():
        if not isinstance(spec, (str, dict)):
            raise SystemExit(f"error: {path}: scale '{scale}' must be a config file (str) or a dict of overrides")
        for budget in grid['budgets']:
            for variant in grid['variants']:
                for seed in grid['seeds']:
                    name = f'{scale}_{label(budget)}_{variant}_s{seed}'
                    args = ([os.path.join(REPO, spec)] if isinstance(spec, str) else flags(spec)) + flags(variants[variant]) \
                        + flags(grid['overrides']) + flags(dict(train_tokens=budget, seed=seed))
                    check_train_args(args, f'error: {path}: cell {name}')
                    cells.append(dict(name=name, scale=scale, budget=budget, variant=variant, seed=seed, args=args,
                                      screen_steps=grid['screen_steps'], index=len(cells)))
    return grid, cells


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def status(cell_dir):
    """'finished' | 'diverged' (summary.json) | 'failed' (failed.json) | 'partial' (ckpt.pt) | 'new'."""
    summary = read_json(os.path.join(cell_dir, 'summary.json'))
    if summary:
        return 'diverged' if summary.get('diverged') else 'finished'
    if os.path.exists(os.path.join(cell_dir, 'failed.json')):
        return 'failed'
    return 'partial' if os.path.exists(os.path.join(cell_dir, 'ckpt.pt')) else 'new'


def run_cell(cell, cell_dir, nproc=1, poll=30.0, extra=()):
    """Run (or resume) one cell with train.py, its output in train.out. Returns the cell's status afterwards;
    a failure is written to failed.json with its attempt count and the end of its output."""
    os.makedirs(cell_dir, exist_ok=True)
    write_json(os.path.join(cell_dir, 'cell.json'), cell)
    attempts = (read_json(os.path.join(cell_dir, 'failed.json')) or {}).get('attempts', 0)
    resume = os.path.exists(os.path.join(cell_dir, 'ckpt.pt'))
    args = [*cell['args'], *extra, f'--out_dir={os.path.abspath(cell_dir)}'] + (['--init_from=resume'] if resume else [])
    launcher = [sys.executable] if nproc == 1 else [sys.executable, '-m', 'torch.distributed.run', '--standalone',
                                                    f'--nproc_per_node={nproc}']
    out_path = os.path.join(cell_dir, 'train.out')
    with open(out_path, 'a') as out:
        proc = subprocess.Popen([*launcher, 'train.py', *args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        shown = None
        try:
            while proc.poll() is None:
                try:
                    proc.wait(timeout=poll)
                except subprocess.TimeoutExpired:  # progress: the cell's latest evaluation, once each
                    evals = read_log(os.path.join(cell_dir, 'log.jsonl'), lambda r: r['event'] == 'eval')
                    if evals and evals[-1]['iter'] != shown:
                        shown = evals[-1]['iter']
                        print(f"    {cell['name']}: step {shown}, val loss {evals[-1]['val_loss']:.4f}", flush=True)
        finally:
            if proc.poll() is None:  # interrupted: stop train.py too; its last checkpoint resumes the cell
                proc.terminate()
                proc.wait()
    st = status(cell_dir)
    if st in ('finished', 'diverged'):  # summary.json written (torchrun turns exit status 3 into 1)
        if os.path.exists(os.path.join(cell_dir, 'failed.json')):
            os.remove(os.path.join(cell_dir, 'failed.json'))
        return st
    tail = open(out_path, errors='replace').read()[-2000:]
    write_json(os.path.join(cell_dir, 'failed.json'),
               dict(attempts=attempts + 1, returncode=proc.returncode, output_tail=tail))
    return 'failed'


def shard_of(cells, shard):
    try:
        i, n = (int(x) for x in shard.split('/'))
        assert 0 <= i < n
    except (ValueError, AssertionError):
        raise SystemExit(f"error: --shard={shard!r} must be i/n with 0 <= i < n, e.g. --shard=0/4") from None
    return cells[i::n]


def cmd_run(argv):
    opts, rest = options('run', argv)
    if len(rest) != 1:
        raise SystemExit('usage: python study.py run GRID_FILE [--shard=i/n] [--nproc=N] [--max_attempts=N]')
    grid, cells = load_grid(rest[0])
    mine = shard_of(cells, opts['shard'])
    dirs = {c['name']: os.path.join(grid['out_dir'], c['name']) for c in mine}

    def wanted(d):  # not yet run, interrupted, or failed fewer than max_attempts times
        st = status(d)
        return st in ('new', 'partial') or st == 'failed' and (read_json(f'{d}/failed.json') or {}).get('attempts', 0) \
            < opts['max_attempts']
    todo = [c for c in mine if wanted(dirs[c['name']])]
    print(f"{rest[0]}: {len(cells)} cells, {len(mine)} in shard {opts['shard']}; {len(mine) - len(todo)} already "
          f"finished, diverged or given up; {len(todo)} to run -> {grid['out_dir']}/", flush=True)
    for c in mine:  # the grid file was edited after this cell ran: say so rather than mix settings silently
        old = read_json(os.path.join(dirs[c['name']], 'cell.json'))
        if old and old['args'] != c['args']:
            print(f"warning: {c['name']} was run with other arguments ({' '.join(old['args'])}); "
                  f"{'it resumes with the new ones' if c in todo else 'its results are kept'}: delete "
                  f"{dirs[c['name']]} to run it anew")
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # preemption: stop train.py, keep its checkpoint
    t0 = time.time()
    try:
        for k, cell in enumerate(todo):
            print(f"[{k}/{len(todo)} done, 1 running, {len(todo) - k - 1} left"
                  + (f", ETA {(time.time() - t0) / k * (len(todo) - k) / 60:.1f} min" if k else '')
                  + f"] {cell['name']}", flush=True)
            t = time.time()
            st = run_cell(cell, dirs[cell['name']], opts['nproc'], opts['poll'])
            s = read_json(os.path.join(dirs[cell['name']], 'summary.json')) or {}
            print(f"    {cell['name']}: {st} in {time.time() - t:.0f} s" + (
                f", final val {s['final_val_loss']:.4f}, best {s['best_val_loss']:.4f} @ {s['best_iter']}"
                if st == 'finished' else f" (see {dirs[cell['name']]}/train.out)"), flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    counts = {st: sum(status(d) == st for d in dirs.values()) for st in ('finished', 'diverged', 'failed')}
    print(f"done in {(time.time() - t0) / 60:.1f} min: " + ', '.join(f'{n} {st}' for st, n in counts.items())
          + f" of {len(mine)}. Next: python study.py report {grid['out_dir']}")
    return 1 if counts['failed'] else 0

# ------------------------------------------------------------------------------------------ the screen


def eval_at(cell_dir, step):
    """The eval record of a run at the last evaluation at or before `step` (None if there is none after 0)."""
    evals = read_log(os.path.join(cell_dir, 'log.jsonl'), lambda r: r['event'] == 'eval' and 0 < r['iter'] <= step)
    return evals[-1] if evals else None


def cmd_screen(argv):
    opts, train_args = options('screen', argv)
    train_args = [a if a.startswith('--') else os.path.abspath(a) for a in train_args]  # train.py runs in the repo
    cfg = check_train_args(train_args, 'error')
    if cfg['norm'] != 'dyt':
        raise SystemExit(f"error: the screen trains a DyT configuration; this one has norm={cfg['norm']!r}")
    steps, th = opts['screen_steps'], opts['threshold']
    stem = '_'.join(os.path.splitext(os.path.basename(a))[0] for a in train_args if not a.startswith('--')) or 'train'
    root = opts['screen_dir'] or os.path.join('out', 'screen', f"{stem}_{label(cfg['train_tokens'])}_s{cfg['seed']}")
    result = dict(config=train_args, steps=steps, threshold=th, train_tokens=cfg['train_tokens'], seed=cfg['seed'])
    for norm in ['dyt'] + ['layernorm'] * opts['compare']:
        # the first `steps` steps of the full run, exactly: the data order and schedule do not depend on max_iters
        cell = dict(name=norm, args=train_args + [f'--norm={norm!r}', f'--max_iters={steps}', f'--eval_interval={steps}'])
        d = os.path.join(root, norm)
        old = read_json(os.path.join(d, 'cell.json'))
        if old and old['args'] != cell['args']:
            raise SystemExit(f'error: {d} holds a screening run with other settings ({" ".join(old["args"])}); '
                             'pass --screen_dir=NEW or delete that folder')
        if status(d) != 'finished' and run_cell(cell, d, poll=1e9) != 'finished':
            raise SystemExit(f'error: the {norm} screening run did not finish; see {d}/train.out')
        result[norm] = eval_at(d, steps)
        if not result[norm] or result[norm]['iter'] != steps:
            raise SystemExit(f'error: {d}/log.jsonl has no evaluation at step {steps}; delete {d} and screen again')
    dyt = result['dyt']
    sat = dyt['saturation'][AT_2]
    result.update(saturation=sat, prediction='help' if sat > th else 'hurt')
    n_windows = cfg['eval_iters'] * cfg['batch_size']
    print(f"\nscreen: {' '.join(train_args)}\nDyT after {steps} steps: saturation {sat:.3f} (fraction of |alpha x| > 2 "
          f"over every DyT layer, {n_windows} fixed train windows); per layer: "
          + ', '.join(f"{n.removeprefix('transformer.')} {v['saturation'][AT_2]:.2f}" for n, v in dyt['norm_layers'].items()))
    print(f"prediction: saturation {'>' if sat > th else '<='} {th} -> DyT expected to "
          f"{'HELP (lower val loss than LayerNorm)' if sat > th else 'HURT (higher val loss than LayerNorm)'} at this "
          f"data budget\ntrust: {PUBLISHED_RULE}")
    result['our_accuracy'] = {}
    for path in sorted(glob.glob(opts['reports'])):
        report = read_json(path) or {}
        rule, link = report.get('rule', {}).get('screen_sat/final'), report.get('screen_vs_final') or {}
        if rule and rule.get('accuracy') is not None:
            result['our_accuracy'][path] = rule
            ci = rule.get('accuracy_ci') or [None, None]
            print(f"  ours ({path}): the rule on step-{rule['screen_steps']} saturation was right on "
                  f"{rule['accuracy']:.0%} of {rule['n']} cells (95% CI {fmt(ci[0], '.0%')}-{fmt(ci[1], '.0%')}), "
                  f"AUC {fmt(rule['auc'], '.2f')}; step-{rule['screen_steps']} against "
                  f"final saturation: r = {fmt(link.get('pearson'), '.2f')}, same side of the threshold in "
                  f"{fmt(link.get('same_side'), '.0%')} of {link.get('n')} runs")
    if not result['our_accuracy']:
        print('  ours: no report found yet (run a grid and `python study.py report`: it measures the rule)')
    if opts['compare']:
        ln = result['layernorm']
        result['early_gap_%'] = 100 * (dyt['val_loss'] - ln['val_loss']) / ln['val_loss']
        print(f"early gap at step {steps}: val loss DyT {dyt['val_loss']:.4f} vs LayerNorm {ln['val_loss']:.4f} "
              f"({result['early_gap_%']:+.1f}%); train loss {dyt['train_loss']:.4f} vs {ln['train_loss']:.4f}")
    write_json(os.path.join(root, 'screen.json'), result)
    print(f'wrote {root}/screen.json')
    return result

# ------------------------------------------------------------------------------------------ statistics


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
    """Paired t-test of a - b over seeds: mean difference, t and two-sided p (None with fewer than 2 pairs)."""
    d = np.asarray(a, float) - np.asarray(b, float)
    if len(d) < 2 or d.std(ddof=1) == 0:
        return dict(n=len(d), mean_diff=float(d.mean()) if len(d) else None, t=None, p=None)
    t = float(d.mean() / (d.std(ddof=1) / math.sqrt(len(d))))
    return dict(n=len(d), mean_diff=float(d.mean()), t=t, p=t_pvalue(t, len(d) - 1))


def auc(scores, positive):
    """P(score of a positive > score of a negative), ties counting half (Mann-Whitney); None without both."""
    pos = [s for s, y in zip(scores, positive) if y]
    neg = [s for s, y in zip(scores, positive) if not y]
    if not pos or not neg:
        return None
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


def fit_threshold(sats, helps, prior):
    """The threshold with the best accuracy on these items (ties: the one closest to the published `prior`).
    Candidates: the prior, the midpoints between distinct saturations, and one below and one above them all."""
    s = sorted(set(sats))
    cands = [prior, s[0] - 1] + [(x + y) / 2 for x, y in zip(s, s[1:])] + [s[-1] + 1]
    return max(cands, key=lambda t: (sum((x > t) == h for x, h in zip(sats, helps)), -abs(t - prior)))


def rule_stats(items, threshold):
    """items: [(scale, saturation, helps)]. Accuracy, balanced accuracy, AUC of saturation for "DyT helps",
    and leave-one-scale-out accuracy (threshold fitted on the other scales; None with one scale)."""
    sats, helps = [i[1] for i in items], [i[2] for i in items]
    pred = [x > threshold for x in sats]
    rates = [np.mean([p == h for p, h in zip(pred, helps) if h == cls]) for cls in (True, False) if cls in helps]
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
                balanced_accuracy=float(np.mean(rates)) if len(rates) == 2 else None, auc=auc(sats, helps), loso=loso)


def bootstrap_rule(items, threshold, n_boot, seed):
    """rule_stats plus a 95% percentile interval for each statistic: items resampled with replacement
    (rng = numpy default_rng(seed); one rng.integers(0, n, n) per resample); undefined resamples are dropped."""
    res = rule_stats(items, threshold)
    rng, draws = np.random.default_rng(seed), []
    for _ in range(n_boot):
        draws.append(rule_stats([items[i] for i in rng.integers(0, len(items), len(items))], threshold))
    for key in ('accuracy', 'balanced_accuracy', 'auc', 'loso'):
        vals = [d[key] for d in draws if d[key] is not None]
        res[f'{key}_ci'] = [float(v) for v in np.percentile(vals, [2.5, 97.5])] if vals else None
    return res

# ------------------------------------------------------------------------------------------ the report


@functools.lru_cache(maxsize=None)
def budget_entropy(dataset, data_dir, train_tokens):
    """(unigram entropy of a train budget, its token count), from the data; None when the data is not here."""
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
        row = dict(name=cell['name'], scale=cell['scale'], budget=label(cell['budget']), variant=cell['variant'],
                   seed=cell['seed'], dir=d, status=status(d), budget_tokens=cell['budget'], index=cell.get('index', 0))
        s = read_json(os.path.join(d, 'summary.json'))
        if row['status'] == 'failed':
            row['reason'] = f"train.py exited with {read_json(os.path.join(d, 'failed.json'))['returncode']}"
        if s:
            cfg = s['config']
            entropy, n_train = (budget_entropy(cfg['dataset'], cfg['data_dir'], cfg['train_tokens'])
                                or (s.get('unigram_entropy'), s.get('budget_tokens')))
            steps = opts['screen_steps'] or cell.get('screen_steps', 500)
            early = eval_at(d, steps)
            early = early if early and early['iter'] == steps else None  # an evaluation at exactly that step
            row.update(norm=cfg['norm'], n_params=s['n_params'], final=s['final_val_loss'], best=s['best_val_loss'],
                       best_iter=s['best_iter'], acc=s.get('final_val_acc'),
                       final_iter=s['final_iter'], train_loss=s['final_train_loss'], unigram_entropy=entropy,
                       tokens_per_param=n_train / s['n_params'] if n_train else None,
                       sat=s['saturation'][AT_2] if s['saturation'] else None,
                       screen_sat=early['saturation'][AT_2] if early and early['saturation'] else None,
                       screen_iter=early and early['iter'])
            if row['status'] == 'diverged':
                row['reason'] = s['diverged_reason']
            elif entropy is not None and s['final_train_loss'] > entropy - opts['collapse_margin']:
                row['status'] = 'collapsed'
                row['reason'] = (f"train loss {s['final_train_loss']:.3f} is at the unigram level of its budget "
                                 f"({entropy:.3f} nats): it predicts token frequencies only")
        rows.append(row)
    if not rows:
        raise SystemExit(f'error: no cell folders (*/cell.json) under {grid_dir}; run a grid first '
                         '(python study.py run config/grid_mini.py)')
    size = {}  # scales from the smallest model up, then budgets from the smallest, then the grid's order
    for r in rows:
        size[r['scale']] = min(size.get(r['scale'], math.inf), r.get('n_params') or math.inf)
    return sorted(rows, key=lambda r: (size[r['scale']], r['scale'], r['budget_tokens'] or math.inf, r['index'],
                                       r['variant'] != baseline(r['variant']), r['name']))


def baseline(variant):
    """The variant a change is measured against: the same architecture with LayerNorm."""
    return 'llama_ln' if variant.startswith('llama') else 'diff' if variant == 'dyt_diff' else 'ln'


def summarize(rows):
    """Per (scale, budget, variant): mean and std over seeds of the finished runs, and the change against the
    baseline variant in % at the final and at the best checkpoint, with a paired t-test over common seeds."""
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
        base = {r['seed']: r for r in groups.get((scale, budget, baseline(variant)), []) if r['status'] == 'finished'}
        if variant != baseline(variant) and ok and base:
            common = sorted(set(ok) & set(base))
            for key in ('final', 'best'):
                b = np.mean([r[key] for r in base.values()])
                g[f'change_{key}'] = float(100 * (g[key] - b) / b)
                g[f'seed_change_{key}'] = [100 * (ok[s][key] - base[s][key]) / base[s][key] for s in common]
                g[f'paired_{key}'] = paired_t([ok[s][key] for s in common], [base[s][key] for s in common])
        out.append(g)
    return out


def screening(groups, runs, opts):
    """The rule 'saturation > threshold -> DyT helps' scored on every DyT cell (scale x budget, seed means), with
    saturation at the end of the run (as the study did) and after the screen's steps, against the change at the
    final and at the best checkpoint; and how step-N saturation relates to final saturation, run by run."""
    dyt = [g for g in groups if g['norm'] == 'dyt' and g.get('change_final') is not None]
    rule = {}
    for sat, name in (('sat', 'final_sat'), ('screen_sat', 'screen_sat')):
        for outcome in ('final', 'best'):
            items = [(g['scale'], g[sat], g[f'change_{outcome}'] < 0) for g in dyt if g[sat] is not None]
            if items:
                rule[f'{name}/{outcome}'] = dict(
                    bootstrap_rule(items, opts['threshold'], opts['bootstrap'], opts['seed']),
                    screen_steps=next((r['screen_iter'] for r in runs if r.get('screen_iter')), None))
    pairs = [(r['screen_sat'], r['sat']) for r in runs if r['status'] == 'finished' and r.get('norm') == 'dyt'
             and r.get('screen_sat') is not None and r.get('sat') is not None]  # the rule is DyT's: Derf saturates otherwise
    a, b = np.array(pairs).T if pairs else ([], [])
    link = dict(n=len(pairs), pearson=float(np.corrcoef(a, b)[0, 1]) if len(pairs) > 2 and a.std() and b.std() else None,
                same_side=float(np.mean([(x > opts['threshold']) == (y > opts['threshold']) for x, y in pairs]))
                if pairs else None, mean_screen=float(np.mean(a)) if pairs else None,
                mean_final=float(np.mean(b)) if pairs else None)
    return rule, link


def spectra_and_rank(runs, opts):
    """Mean HTSR alpha and activation effective rank of each finished LN/DyT run's final checkpoint, with
    analyze.py's functions; cached in the cell folder as analysis.json."""
    for r in runs:
        if r['status'] != 'finished' or r['variant'] != baseline(r['variant']) and r['norm'] not in POINTWISE:
            continue
        cache = os.path.join(r['dir'], 'analysis.json')
        res = read_json(cache)
        if not res or res.get('final_iter') != r['final_iter']:
            try:
                a, _ = analyze(os.path.join(r['dir'], 'ckpt.pt'), 'all', dict(ANALYZE_DEFAULTS, device=opts['device']))
                res = dict(final_iter=r['final_iter'], htsr_alpha=a['spectra']['mean_alpha'],
                           erank=a['rank']['mean_blocks'])
            except SystemExit as e:
                res = dict(final_iter=r['final_iter'], error=str(e))
            write_json(cache, res)
        r.update(htsr_alpha=res.get('htsr_alpha'), erank=res.get('erank'), analysis_error=res.get('error'))



def pm(mean, std):
    return '-' if mean is None else fmt(mean, '.4f') + ('' if std is None else f' ± {fmt(std, ".4f")}')


def change_cell(g, key):
    if g.get(f'change_{key}') is None:
        return '-'
    p = g[f'paired_{key}']['p']
    seeds = ', '.join(f'{c:+.1f}' for c in g[f'seed_change_{key}'])
    return f"{g[f'change_{key}']:+.1f}% ({seeds}; p={fmt(p, '.3f')})"


def beside_published(groups):
    """Every published figure that has a counterpart among our cells (same scale, budget label and variant)."""
    ours = dict(val_loss='final', saturation='sat', htsr_alpha='htsr_alpha', erank='erank', **{'change_%': 'change_final'})
    return [dict(figure=what, scale=g['scale'], budget=g['budget'], variant=g['variant'], published=x,
                 ours=g.get(ours[what]), difference=None if g.get(ours[what]) is None else g[ours[what]] - x)
            for what, table in PUBLISHED.items() for g in groups for key, x in table.items()
            if key == (g['scale'], g['budget'], g['variant'])]


def table(header, rows):
    """A markdown table: the header's cells, then one list of cells per row."""
    return ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)] + ['| ' + ' | '.join(map(str, r)) + ' |'
                                                                            for r in rows] + ['']


def markdown(grid_dir, rows, groups, rule, link, pub, opts):
    counts = {st: sum(r['status'] == st for r in rows) for st in ('finished', 'collapsed', 'diverged', 'failed',
                                                                  'partial', 'new')}
    md = [f'# Study report: {grid_dir}', '', 'Runs: ' + ', '.join(f'{n} {st}' for st, n in counts.items() if n)
          + '. Means are over finished runs only; collapsed, diverged, failed and unfinished runs are listed below, '
          'never averaged in. Change = (variant - baseline) / baseline over seed means; in brackets each seed\'s '
          'paired change and the paired t-test p-value over seeds. Val accuracy is next-token accuracy for language '
          'runs, test-set accuracy for a ViT.', '', '## Validation loss: final and best checkpoint', '']
    md += table(['scale', 'budget', 'tokens/param', 'variant', 'n', 'final val loss', 'best val loss (mean step)',
                 'change, final', 'change, best', 'final val accuracy', 'saturation, end / screen'],
                [[g['scale'], g['budget'], fmt(g['tokens_per_param'], '.3g'), g['variant'], g['n'],
                  pm(g['final'], g['final_std']), f"{pm(g['best'], g['best_std'])} ({fmt(g['best_iter'], '.0f')})",
                  change_cell(g, 'final'), change_cell(g, 'best'), pm(g['acc'], g['acc_std']),
                  f"{fmt(g['sat'], '.3f')} / {fmt(g['screen_sat'], '.3f')}"]
                 for g in groups])

    def with_ci(s, k):
        return fmt(s[k], '.2f') + (f" [{', '.join(fmt(v, '.2f') for v in s[k + '_ci'])}]" if s[k + '_ci'] else '')
    md += [f"## Screening rule: saturation > {opts['threshold']} -> DyT helps", '',
           f'Items: DyT cells (scale x budget, seed means). Leave-one-scale-out fits the threshold on the other scales. '
           f"95% bootstrap intervals ({opts['bootstrap']} resamples of the items). {PUBLISHED_RULE}.", '']
    md += table(['saturation at / outcome at', 'n', 'accuracy', 'balanced accuracy', 'AUC', 'leave-one-scale-out'],
                [[key.replace('screen_sat', f"step {s['screen_steps']}"), s['n']]
                 + [with_ci(s, k) for k in ('accuracy', 'balanced_accuracy', 'auc', 'loso')] for key, s in rule.items()])
    md += [f"Saturation after {next((s['screen_steps'] for s in rule.values()), '-')} steps against saturation at the "
           f"end, over {link['n']} DyT runs: mean {fmt(link['mean_screen'], '.3f')} vs {fmt(link['mean_final'], '.3f')}, "
           f"Pearson r {fmt(link['pearson'], '.3f')}, same side of the threshold in {fmt(link['same_side'], '.0%')}.", '']
    analysed = [g for g in groups if g.get('htsr_alpha') is not None or g.get('erank') is not None]
    if analysed:
        md += ['## Weight spectra and activation rank (final checkpoints, analyze.py)', '']
        md += table(['scale', 'budget', 'variant', 'mean HTSR alpha', 'activation effective rank'],
                    [[g['scale'], g['budget'], g['variant'], fmt(g['htsr_alpha'], '.2f'), fmt(g['erank'], '.1f')]
                     for g in analysed])
    md += ['## The study\'s published figures (Verma 2026, final checkpoint, mean of 3 seeds) beside ours', '']
    md += table(['figure', 'scale', 'budget', 'variant', 'published', 'ours', 'difference'],
                [[p['figure'], p['scale'], p['budget'], p['variant'], f"{p['published']:g}", fmt(p['ours'], '.4g'),
                  fmt(p['difference'], '+.4g')] for p in pub]) if pub else \
        ['No cell of this grid has a published counterpart (the study: GPT-2 64m-3.78b on WikiText-103).', '']
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
                              if (g['scale'], g['variant']) == (scale, variant) and g['tokens_per_param'])
                ax.plot([x for x, _, _ in line], [y for _, y, _ in line], 'o-', label=f'{scale} {variant}')
                for x, y, b in line:
                    ax.annotate(b, (x, y), fontsize=7, xytext=(3, 3), textcoords='offset points')
            ax.axhline(0, c='gray', lw=0.8)
            ax.set(xscale='log', xlabel='training tokens per parameter', title=f'{key} checkpoint')
        study_64m = [(b, PUBLISHED['change_%']['64m', b, 'dyt']) for b in ('1M', '10M', '50M', 'all')]
        axes[0].plot([tokens / 63.5e6 for tokens in (1e6, 10e6, 50e6, 118e6)], [x for _, x in study_64m], 'k--', alpha=0.4,
                     label='Verma 2026, 64m dyt (published)')  # its final step; 63.5M parameters
        axes[0].set_ylabel('val loss change vs LayerNorm (%)')
        axes[0].legend(fontsize=8)
        fig.suptitle('The sign flip: below 0, the variant beats LayerNorm')
        save(fig, 'signflip.png')
    dyt = [g for g in compared if g['norm'] == 'dyt' and g['sat'] is not None]
    if dyt:
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, marker, what in (('sat', 'o', 'end of run'), ('screen_sat', 's', 'screen step')):
            pts = [(g[key], g['change_final'], f"{g['scale']} {g['budget']}") for g in dyt if g[key] is not None]
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=f'saturation at {what}')
            for x, y, name in pts:
                ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords='offset points')
        ax.axvline(opts['threshold'], ls=':', c='gray', label=f"threshold {opts['threshold']}")
        ax.axhline(0, c='gray', lw=0.8)
        ax.set(xlabel='saturation (fraction |alpha x| > 2)', ylabel='DyT change, final (%)', title='Does saturation predict the change?')
        ax.legend(fontsize=8)
        save(fig, 'saturation.png')
    return names


def cmd_report(argv):
    opts, rest = options('report', argv)
    if len(rest) != 1 or not os.path.isdir(rest[0]):
        raise SystemExit('usage: python study.py report GRID_OUT_DIR (the out_dir of `python study.py run`)')
    rows = collect(rest[0], opts)
    if opts['analysis']:
        spectra_and_rank(rows, opts)
    groups = summarize(rows)
    rule, link = screening(groups, rows, opts)
    pub = beside_published(groups)
    md = markdown(rest[0], rows, groups, rule, link, pub, opts)
    write_json(os.path.join(rest[0], 'report.json'), dict(schema='nanonorm-study-report/1', options=opts, runs=rows,
                                                          groups=groups, rule=rule, screen_vs_final=link, published=pub))
    atomic_write(os.path.join(rest[0], 'report.md'), lambda f: f.write(md.encode()))
    names = plots(rest[0], groups, opts)
    print(md + f"\nwrote {rest[0]}/report.md, report.json" + ''.join(f', {n}' for n in names))
    return dict(runs=rows, groups=groups, rule=rule, screen_vs_final=link, published=pub)


def main(argv):
    commands = dict(screen=cmd_screen, run=cmd_run, report=cmd_report)
    if not argv or argv[0] not in commands:
        raise SystemExit(__doc__.strip() + f"\n\nusage: python study.py {{{'|'.join(commands)}}} ...")
    return commands[argv[0]](argv[1:])


if __name__ == '__main__':
    result = main(sys.argv[1:])
    sys.exit(result if isinstance(result, int) else 0)
