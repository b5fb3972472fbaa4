"""
The study as commands (Verma 2026, "When Does Removing LayerNorm Help?", arXiv 2604.23434), run from the
repository root:

  python annex/study.py screen config/gpt2_64m_dyt.py --train_tokens=1_000_000 [--compare=True]
      Train the DyT (or Derf) config for screen_steps (500) steps, read its saturation on the fixed
      train windows, and predict whether it will help (saturation > threshold 0.43) or hurt against
      LayerNorm at the end of the full run. --compare=True also trains LayerNorm for as many steps and
      prints the gap between them at that step. Writes out_screen/<config>_<budget>_s<seed>/screen.json
      (or into --screen_dir). --nproc=N trains under torchrun with N processes. Our own accuracy of the
      rule is read from the reports (--reports) with runs of the same dataset and model shape.
  python annex/study.py screen --norm=dyt --max_iters=500 --lr_decay_iters=500 --train_tokens=10_000 \\
                               --screen_steps=50 --compare=True
      The same on a CPU, in about 20 s on 2 cores: the first 50 steps of config/grid_mini.py's
      10K-token DyT and LayerNorm runs (train.py's tiny default model on the offline pydocs corpus).
  python annex/study.py run config/grid_64m.py [--shard=i/n] [--nproc=8] [--gpus=0-7] [--dry_run=True]
      Run every cell of a grid (scales x budgets x variants x seeds) with train.py, one out_dir per cell.
      Finished cells are skipped, interrupted ones resumed, diverged or failed ones recorded; rerun to
      continue. --gpus runs one cell per nproc of those GPUs at a time; --dry_run=True shows which cell
      goes to which GPUs with which command, and runs nothing.
  python annex/study.py report out/grid_64m          (annex/report.py; python annex/report.py DIR too)
      report.md, report.json and PNGs: final AND best val loss per cell, % change against LayerNorm with
      a paired t-test over seeds, the sign-flip plot, the screening rule's accuracy, HTSR alpha and
      effective rank, the study's published figures beside ours. Collapsed, diverged and failed runs are
      listed, never averaged.

A grid is a Python file of plain values (config/grid_64m.py documents the keys). Options are --key=value;
other --key=value and config files given to `screen` go to train.py. `python annex/study.py CMD --help`
lists the command's keys.
"""
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import fields

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # train.py runs here; grid paths too
sys.path.insert(0, REPO)  # run as python annex/study.py: the core's modules are at the repository root

import norm_stats
import train
from analyze import fmt
from configurator import configure, run_config_file, split_args
from data.common import write_json
from run_files import read_log
from model import GPTConfig

LLAMA = dict(pos='rope', mlp='swiglu', n_kv_head=4)
VARIANTS = {  # train.py overrides on top of a scale; alpha0 2.0 as in the study, except derf_ref's
    'ln': dict(norm='layernorm'), 'rmsnorm': dict(norm='rmsnorm'),
    'dyt': dict(norm='dyt', dyt_alpha=2.0), 'hardtanh': dict(norm='hardtanh'),
    'diff': dict(norm='layernorm', attn='diff'),
    'dyt_diff': dict(norm='dyt', dyt_alpha=2.0, attn='diff'),
    'llama_ln': dict(LLAMA, norm='layernorm'), 'llama_rmsnorm': dict(LLAMA, norm='rmsnorm'),
    'llama_dyt': dict(LLAMA, norm='dyt', dyt_alpha=2.0),
    'llama_dyt_gelu': dict(LLAMA, norm='dyt', dyt_alpha=2.0, mlp='gelu'),
    'derf': dict(norm='derf', dyt_alpha=2.0),  # matched to the study's DyT
    # the Derf paper's own recipe: alpha0 0.5 (its default; its GPT-2 patch's config has 1.0) and a
    # learnable scalar on the embeddings, init sqrt(n_embd)
    'derf_ref': dict(norm='derf', dyt_alpha=0.5, embed_scale=True)}
GRID_KEYS = dict(scales=dict, budgets=list, variants=list, seeds=list, overrides=dict,
                 budget_overrides=dict, custom_variants=dict, out_dir=str, screen_steps=int)
RUNNER_SETS = ('out_dir', 'train_tokens', 'seed', 'init_from', 'overwrite')  # a grid may not set these
THRESHOLD = 0.43  # the study's screening rule: DyT helps where its saturation at |alpha x| > 2 is above
SCREEN = dict(screen_steps=500, threshold=THRESHOLD, compare=False, screen_dir='', nproc=1,
              reports='out/*/report.json', poll=5.0)
RUN = dict(shard='0/1', nproc=1, gpus='', dry_run=False, max_attempts=2, poll=30.0)
PUBLISHED_RULE = ('published rule (Verma 2026): 75% in-sample on 12 cells (AUC 0.75), 64% with the '
                  '3.78b cells, 50% leave-one-scale-out, 3/3 on Llama; validated on END-of-run '
                  'saturation, never after 500 steps')


def command_line(defaults, argv, to_train=False):
    """(options, the rest) of a command: its --key=value options, read as configurator reads a script's
    keys (--help prints this file's usage and the keys), and its positional arguments. With to_train
    (screen), the --key=value options that are not the command's stay in the rest: train.py's keys."""
    if to_train:
        mine = [a for a in argv if a in ('-h', '--help') or a.startswith('--')
                and a[2:].partition('=')[0] in defaults]
        opts, rest = configure(defaults, mine, doc=__doc__), [a for a in argv if a not in mine]
        unknown = [a for a in rest if a.startswith('--')
                   and a[2:].partition('=')[0] not in train.DEFAULTS]
        configure(train.DEFAULTS | defaults, unknown)  # a typo: configurator names the closest of both
        return opts, rest
    positional, opts = split_args(argv)
    return configure(defaults, opts, doc=__doc__), positional


def flags(overrides):
    return [f'--{k}={v!r}' for k, v in overrides.items()]


def label(budget):
    """A data budget as cell names and tables write it: 10K, 1M, 'all' (None: the whole train split)."""
    if budget is None:
        return 'all'
    units = ((10**9, 'B'), (10**6, 'M'), (1000, 'K'))
    return next((f'{budget // u}{s}' for u, s in units if budget % u == 0), str(budget))


def check_train_args(args, where):
    """train.py's own checks on a cell's arguments (keys, types, architecture), before anything runs."""
    try:
        cfg = configure(train.DEFAULTS, args, train.OPTIONAL_TYPES)
        GPTConfig(**{f.name: cfg[f.name] for f in fields(GPTConfig)})
    except (SystemExit, ValueError) as e:
        raise SystemExit(f'{where}: {str(e).removeprefix("error: ")}') from None
    return cfg

# --------------------------------------------------------------------------------------- grids and cells


def load_grid(path):
    """The grid file's values, checked, and its cells: [{name, scale, budget, variant, seed, args}]."""
    namespace = run_config_file(path, what='grid file')
    grid = dict(overrides={}, budget_overrides={}, custom_variants={}, seeds=[1337], screen_steps=500,
                out_dir=os.path.join('out', os.path.splitext(os.path.basename(path))[0]))
    for key, value in namespace.items():
        if key.startswith('_') or type(value).__name__ in ('module', 'function', 'type',
                                                           'builtin_function_or_method'):
            continue
        if key not in GRID_KEYS:
            raise SystemExit(f"error: {path}: unknown grid key '{key}'; grid keys are "
                             f"{', '.join(GRID_KEYS)}")
        if not isinstance(value, GRID_KEYS[key]):
            raise SystemExit(f"error: {path}: '{key}' must be a {GRID_KEYS[key].__name__}, "
                             f"got {value!r}")
        grid[key] = value
    for key in ('scales', 'budgets', 'variants', 'seeds'):
        if not grid.get(key):
            raise SystemExit(f"error: {path}: '{key}' is missing or empty; every axis needs at least "
                             "one value")
    variants = VARIANTS | grid['custom_variants']
    for v in grid['variants']:
        if v not in variants:
            raise SystemExit(f"error: {path}: unknown variant '{v}'; known: {', '.join(variants)} "
                             "(or define it in custom_variants)")
    for b in grid['budgets']:
        if b is not None and (type(b) is not int or b <= 0):
            raise SystemExit(f'error: {path}: budgets must be positive ints (tokens) or None (all), '
                             f'got {b!r}')
    stray = [b for b in grid['budget_overrides'] if b not in grid['budgets']]
    if stray:
        raise SystemExit(f'error: {path}: budget_overrides names budgets that are not in budgets: '
                         f'{stray}')
    sources = [grid['overrides'], *grid['budget_overrides'].values(), *grid['scales'].values(),
               *variants.values()]
    fixed = sorted({k for d in sources if isinstance(d, dict) for k in RUNNER_SETS if k in d})
    if fixed:
        raise SystemExit(f'error: {path}: the runner sets {", ".join(fixed)} for each cell; remove them')
    cells = []
    for scale, spec in grid['scales'].items():
        if not isinstance(spec, (str, dict)):
            raise SystemExit(f"error: {path}: scale '{scale}' must be a config file (str) or a dict of "
                             "overrides")
        for budget in grid['budgets']:
            for variant in grid['variants']:
                for seed in grid['seeds']:
                    name = f'{scale}_{label(budget)}_{variant}_s{seed}'
                    args = ([os.path.join(REPO, spec)] if isinstance(spec, str) else flags(spec)) \
                        + flags(variants[variant]) + flags(grid['overrides']) \
                        + flags(grid['budget_overrides'].get(budget, {})) \
                        + flags(dict(train_tokens=budget, seed=seed))
                    check_train_args(args, f'error: {path}: cell {name}')
                    cells.append(dict(name=name, scale=scale, budget=budget, variant=variant, seed=seed,
                                      args=args, screen_steps=grid['screen_steps'], index=len(cells)))
    return grid, cells


def read_json(path):  # None when missing, unreadable or not valid JSON
    return load_json(path)[0]


def load_json(path):
    """(the file's JSON, None); (None, None) when it is missing; (None, what is wrong) when it
    cannot be read or is not valid JSON (a torn or cut write)."""
    try:
        with open(path) as f:
            return json.load(f), None
    except FileNotFoundError:
        return None, None
    except ValueError as e:  # UnicodeDecodeError too
        return None, f'{path} is not valid JSON ({e}): a torn or cut write'
    except OSError as e:
        return None, f'{path} cannot be read ({e.strerror})'


def status(cell_dir):
    """'finished' | 'diverged' (summary.json) | 'failed' (failed.json) | 'partial' (ckpt.pt) | 'new'."""
    summary = read_json(os.path.join(cell_dir, 'summary.json'))
    if isinstance(summary, dict) and summary:  # anything else is damage, which the report names
        return 'diverged' if summary.get('diverged') else 'finished'
    if os.path.exists(os.path.join(cell_dir, 'failed.json')):
        return 'failed'
    return 'partial' if has_checkpoint(cell_dir) else 'new'


def has_checkpoint(cell_dir):  # one file, or shards (a multi-process run over shard_checkpoints_above)
    return any(os.path.exists(os.path.join(cell_dir, name)) for name in ('ckpt.pt', 'ckpt.dcp'))


PROGRESS = dict(  # a log record as a progress line, in train.py's words: 'step N' (eval), 'iter N'
    eval=lambda r: f"step {r['iter']}, val loss {r['val_loss']:.4f}",
    step=lambda r: f"iter {r['iter']}, train loss {r['loss']:.4f}")


def cell_command(cell, cell_dir, nproc=1, extra=()):
    """A cell's train.py command line (torchrun's with nproc > 1), resuming from its checkpoint if any.
    torchrun --standalone binds its rendezvous to a free port: cells side by side do not collide."""
    resume = has_checkpoint(cell_dir)
    args = [*cell['args'], *extra, f'--out_dir={os.path.abspath(cell_dir)}'] + (
        ['--init_from=resume'] if resume else [])
    launcher = [sys.executable] if nproc == 1 else [sys.executable, '-m', 'torch.distributed.run',
                                                    '--standalone', f'--nproc_per_node={nproc}']
    return [*launcher, 'train.py', *args]


def shell_line(cmd, env=None):
    """A command as typed in a shell, its extra environment variables first."""
    return ' '.join([*(f'{k}={v}' for k, v in (env or {}).items()), shlex.join(cmd)])


class Children:
    """The train.py processes a runner started: on SIGTERM or Ctrl-C it stops them all (each writes
    its checkpoint, which resumes it on a rerun), and none starts after that."""

    def __init__(self):
        self.procs, self.stopping, self.lock = [], False, threading.Lock()

    def start(self, cmd, **popen):
        """The started process, or None once stopping."""
        with self.lock:  # a slot's thread cannot start a child while stop() runs
            if self.stopping:
                return None
            self.procs.append(subprocess.Popen(cmd, **popen))
            return self.procs[-1]

    def stop(self):
        with self.lock:
            self.stopping = True
            for proc in self.procs:
                if proc.poll() is None:
                    proc.terminate()


def run_cell(cell, cell_dir, nproc=1, poll=30.0, extra=(), event='eval', env=None, children=None):
    """Run (or resume) one cell with train.py, its output in train.out after the command line, `env`
    (variables set on top of ours: the runner's CUDA_VISIBLE_DEVICES) first; every `poll` seconds, the
    latest record of this `event` in log.jsonl ('eval': its val loss, 'step': its train loss), once each.
    Returns the cell's status afterwards, or 'stopped' when the runner stopped its `children`; a failure
    is written to failed.json with its attempt count and the end of its output."""
    os.makedirs(cell_dir, exist_ok=True)
    write_json(os.path.join(cell_dir, 'cell.json'), cell)
    attempts = (read_json(os.path.join(cell_dir, 'failed.json')) or {}).get('attempts', 0)
    cmd = cell_command(cell, cell_dir, nproc, extra)
    children = children or Children()  # run alone (the screen): its own
    out_path = os.path.join(cell_dir, 'train.out')
    with open(out_path, 'a') as out:
        out.write(f'$ {shell_line(cmd, env)}\n')
        out.flush()  # before train.py's output
        proc = children.start(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                              env=os.environ | env if env else None)
        if proc is None:
            return 'stopped'
        shown = None
        try:
            while proc.poll() is None:
                try:
                    proc.wait(timeout=poll)
                except subprocess.TimeoutExpired:
                    records = read_log(os.path.join(cell_dir, 'log.jsonl'),
                                       lambda r: r['event'] == event)
                    if records and records[-1]['iter'] != shown:
                        shown = records[-1]['iter']
                        print(f"    {cell['name']}: {PROGRESS[event](records[-1])}", flush=True)
        finally:
            if proc.poll() is None:  # interrupted: stop train.py too; its last checkpoint resumes it
                proc.terminate()
                proc.wait()
    st = status(cell_dir)
    if st in ('finished', 'diverged'):  # summary.json written (torchrun turns exit status 3 into 1)
        if os.path.exists(os.path.join(cell_dir, 'failed.json')):
            os.remove(os.path.join(cell_dir, 'failed.json'))
        return st
    if children.stopping:  # not a failure: its checkpoint resumes it on a rerun
        return 'stopped'
    tail = open(out_path, errors='replace').read()[-2000:]
    write_json(os.path.join(cell_dir, 'failed.json'),
               dict(attempts=attempts + 1, returncode=proc.returncode, output_tail=tail))
    return 'failed'


def last_error(cell_dir):
    """The failed child's own last error line in its train.out: train.py's `error: ...`, else an
    exception's last line (not torchrun's ChildFailedError, which wraps it), else its last line."""
    with open(os.path.join(cell_dir, 'train.out'), errors='replace') as f:
        lines = [re.sub(r'^\[rank\d+\]:', '', line).strip() for line in f if line.strip()]
    errors = [line for line in lines if line.startswith('error:')]
    if not errors:
        errors = [line for line in lines if re.match(r'[\w.]*(Error|Exception): ', line)
                  and 'ChildFailedError' not in line]
    return (errors or lines or ['(no output)'])[-1]


def shard_of(cells, shard):
    try:
        i, n = (int(x) for x in shard.split('/'))
        assert 0 <= i < n
    except (ValueError, AssertionError):
        raise SystemExit(f"error: --shard={shard!r} must be i/n with 0 <= i < n, e.g. --shard=0/4") \
            from None
    return cells[i::n]


def gpu_slots(gpus, nproc):
    """--gpus ('0-7', '0,2,5', '0-3,6') cut into slots of nproc GPUs, as each slot's extra environment;
    [None] without --gpus: one slot, on the GPUs train.py sees."""
    if not gpus:
        return [None]
    ids = []
    for part in gpus.split(','):
        ends = part.split('-')
        if len(ends) > 2 or not all(e.isdigit() for e in ends) or int(ends[0]) > int(ends[-1]):
            raise SystemExit(f'error: --gpus={gpus!r}: write GPU ids and ranges, e.g. --gpus=0-7, '
                             '--gpus=0,2,5 or --gpus=0-3,6')
        ids += range(int(ends[0]), int(ends[-1]) + 1)
    if len(set(ids)) < len(ids) or len(ids) % nproc:
        raise SystemExit(f'error: --gpus={gpus!r} names {len(ids)} GPUs; each must be named once, and '
                         f'their number must be a multiple of --nproc={nproc}')
    return [dict(CUDA_VISIBLE_DEVICES=','.join(map(str, ids[i:i + nproc])))
            for i in range(0, len(ids), nproc)]


def cmd_run(argv):
    opts, rest = command_line(RUN, argv)
    if len(rest) != 1:
        raise SystemExit('usage: python annex/study.py run GRID_FILE [--shard=i/n] [--nproc=N] '
                         '[--gpus=0-7] [--dry_run=True] [--max_attempts=N] [--poll=SECONDS]')
    grid, cells = load_grid(rest[0])
    slots = gpu_slots(opts['gpus'], opts['nproc'])
    mine = shard_of(cells, opts['shard'])
    dirs = {c['name']: os.path.join(grid['out_dir'], c['name']) for c in mine}

    def wanted(d):  # not yet run, interrupted, or failed fewer than max_attempts times
        st = status(d)
        return st in ('new', 'partial') or st == 'failed' and (
            read_json(f'{d}/failed.json') or {}).get('attempts', 0) < opts['max_attempts']
    todo = [c for c in mine if wanted(dirs[c['name']])]
    print(f"{rest[0]}: {len(cells)} cells, {len(mine)} in shard {opts['shard']}; "
          f"{len(mine) - len(todo)} already finished, diverged or given up; {len(todo)} to run -> "
          f"{grid['out_dir']}/" + (f", {len(slots)} at a time" if len(slots) > 1 else ''), flush=True)
    for c in mine:  # the grid file was edited after this cell ran: say so rather than mix settings
        old = read_json(os.path.join(dirs[c['name']], 'cell.json'))
        if old and old['args'] != c['args']:
            print(f"warning: {c['name']} was run with other arguments ({' '.join(old['args'])}); "
                  f"{'it resumes with the new ones' if c in todo else 'its results are kept'}: delete "
                  f"{dirs[c['name']]} to run it anew")
    # slot i runs its cells one after another, those --shard=i/n of todo would take
    plan = [(env, shard_of(todo, f'{i}/{len(slots)}')) for i, env in enumerate(slots)]
    if opts['dry_run']:
        for i, (env, cells_of_slot) in enumerate(plan):
            for c in cells_of_slot:
                print(f"slot {i}: {c['name']}: "
                      + shell_line(cell_command(c, dirs[c['name']], opts['nproc']), env))
        return 0
    lock, times, running, children = threading.Lock(), [], 0, Children()

    def run_slot(env, cells_of_slot):  # a slot's thread
        nonlocal running
        for cell in cells_of_slot:
            with lock:  # done / running / left, the ETA from the finished cells' mean time
                if children.stopping:
                    return
                running += 1
                k, left = len(times), len(todo) - len(times) - running
                n = running + left  # cells not done, len(slots) at a time
                eta = f", ETA {sum(times) / k * n / min(len(slots), n) / 60:.1f} min" if k else ''
                print(f"[{k}/{len(todo)} done, {running} running, {left} left{eta}] {cell['name']}"
                      + (f" on GPU {env['CUDA_VISIBLE_DEVICES']}" if env else ''), flush=True)
            t = time.time()
            st = run_cell(cell, dirs[cell['name']], opts['nproc'], opts['poll'], env=env,
                          children=children)
            if st == 'stopped':
                return
            s = read_json(os.path.join(dirs[cell['name']], 'summary.json')) or {}
            with lock:
                running -= 1
                times.append(time.time() - t)
                print(f"    {cell['name']}: {st} in {times[-1]:.0f} s" + (
                    f", final val {s['final_val_loss']:.4f}, best {s['best_val_loss']:.4f} @ "
                    f"{s['best_iter']}"
                    if st == 'finished' else f": {last_error(dirs[cell['name']])} (all of it: "
                    f"{dirs[cell['name']]}/train.out)"), flush=True)
    threads = [threading.Thread(target=run_slot, args=p) for p in plan if p[1]]
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # preempted: stop train.py too
    t0 = time.time()
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    finally:
        children.stop()  # SIGTERM or Ctrl-C: stop every train.py (when all ended, nothing to stop)
        for thread in threads:
            thread.join()
        signal.signal(signal.SIGTERM, previous)
    counts = {st: sum(status(d) == st for d in dirs.values())
              for st in ('finished', 'diverged', 'failed')}
    print(f"done in {(time.time() - t0) / 60:.1f} min: "
          + ', '.join(f'{n} {st}' for st, n in counts.items())
          + f" of {len(mine)}. Next: python annex/study.py report {grid['out_dir']}")
    return 1 if counts['failed'] else 0

# -------------------------------------------------------------------------------------------- the screen


def eval_at(cell_dir, step):
    """The eval record of a run at its last evaluation at or before `step` (None: none after 0)."""
    return last_eval(log_records(cell_dir)[0], step)


def last_eval(records, step):  # of a run's log records, as eval_at
    evals = [r for r in records if r['event'] == 'eval' and 0 < r['iter'] <= step]
    return evals[-1] if evals else None


def log_records(cell_dir):
    """A run's log.jsonl records (none when it is missing) and the numbers of its lines that are not
    a record (a torn write, or not train.py's: no event or iter), which are skipped."""
    records, torn = [], []
    try:
        with open(os.path.join(cell_dir, 'log.jsonl'), errors='replace') as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return records, torn
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and 'event' in record and 'iter' in record:
            records.append(record)
        else:
            torn.append(number)
    return records, torn


def cmd_screen(argv):
    opts, train_args = command_line(SCREEN, argv, to_train=True)
    train_args = [a if a.startswith('--') else os.path.abspath(a) for a in train_args]  # for cwd=REPO
    cfg = check_train_args(train_args, 'error')
    kind = cfg['norm']  # the screening run's norm; --compare=True adds LayerNorm
    if kind not in ('dyt', 'derf'):
        raise SystemExit("error: the screen trains a DyT or Derf configuration; this one has "
                         f"norm={kind!r}")
    # saturation as norm_stats counts it: as far from the bound for tanh and erf
    name, counted = {'dyt': ('DyT', '|alpha x| > 2'),
                     'derf': ('Derf', '|erf(alpha x + s)| > tanh(2)')}[kind]
    steps, th = opts['screen_steps'], opts['threshold']
    files = [a for a in train_args if not a.startswith('--')]
    stem = '_'.join(os.path.splitext(os.path.basename(a))[0] for a in files) or 'train'
    # beside out/, train.py's default out_dir, rather than in it: a screen is not part of that run
    root = opts['screen_dir'] or os.path.join(
        'out_screen', f"{stem}_{label(cfg['train_tokens'])}_s{cfg['seed']}")
    result = dict(config=train_args, steps=steps, threshold=th, train_tokens=cfg['train_tokens'],
                  seed=cfg['seed'])
    norms = [kind] + ['layernorm'] * opts['compare']
    for norm in norms:
        # the first `steps` steps of the full run exactly: data order and schedule ignore max_iters
        cell = dict(name=norm, args=train_args + [f'--norm={norm!r}', f'--max_iters={steps}',
                                                  f'--eval_interval={steps}'])
        d = os.path.join(root, norm)
        old = read_json(os.path.join(d, 'cell.json'))
        if old and old['args'] != cell['args']:
            raise SystemExit(f'error: {d} holds a screening run with other settings '
                             f'({" ".join(old["args"])}); pass --screen_dir=NEW or delete that folder')
        if status(d) == 'finished':
            print(f'{norm}: reusing the finished {steps}-step run in {d}', flush=True)
        else:
            print(f"{norm}: training {steps} steps in {d} (train.py's output: {d}/train.out)",
                  flush=True)
            if run_cell(cell, d, opts['nproc'], opts['poll'], event='step') != 'finished':
                raise SystemExit(f'error: the {norm} screening run did not finish: {last_error(d)} '
                                 f'(all of it: {d}/train.out)')
        result[norm] = eval_at(d, steps)
        if not result[norm] or result[norm]['iter'] != steps:
            raise SystemExit(f'error: {d}/log.jsonl has no evaluation at step {steps}; delete {d} and '
                             'screen again')
    screened = result[kind]
    sat = screened['saturation'][norm_stats.AT_2]
    result.update(saturation=sat, prediction='help' if sat > th else 'hurt')
    n_windows = cfg['eval_samples']
    print(f"\nscreen: {' '.join(train_args)}\n{name} after {steps} steps: saturation {sat:.3f} "
          f"(fraction of {counted} over every {name} layer, {n_windows} fixed train windows); "
          "per layer: "
          + ', '.join(f"{n.removeprefix('transformer.')} {v['saturation'][norm_stats.AT_2]:.2f}"
                      for n, v in screened['norm_layers'].items()))
    for norm in norms:  # train.py's signs of a collapse, otherwise only in train.out
        for r in read_log(os.path.join(root, norm, 'log.jsonl'), lambda e: e['event'] == 'eval'):
            for w in r.get('warnings', ()):
                print(f"warning ({norm} run, step {r['iter']}): {w}")
    print(f"prediction: saturation {'>' if sat > th else '<='} {th} -> {name} expected to "
          + ('HELP (lower val loss than LayerNorm)' if sat > th else
             'HURT (higher val loss than LayerNorm)')
          + f" at the end of the run, at this data budget\ntrust: {PUBLISHED_RULE}"
          + ('' if kind == 'dyt' else '; fitted on DyT, untested on Derf'))
    result['our_accuracy'], shape, other = {}, [cfg['n_layer'], cfg['n_head'], cfg['n_embd']], 0
    for path in sorted(glob.glob(opts['reports'])):
        report = read_json(path) or {}
        if cfg['dataset'] not in report.get('datasets', []) or shape not in report.get('shapes', []):
            other += 1  # the rule measured on other data or another model size says little here
            continue
        link = report.get('screen_vs_final') or {}
        # the report's row for this screen: this norm, step-N saturation, collapses counted as "hurts"
        rule = next((r for r in report.get('rule', []) if r.get('norm') == kind
                     and r['predictor'].startswith('saturation (step') and r['outcome'] == 'final'
                     and r['analysis'] == 'intention to treat'), None)
        if rule and rule.get('accuracy') is not None:
            result['our_accuracy'][path] = rule
            ci = rule.get('accuracy_ci') or [None, None]
            print(f"  ours ({path}): the rule on step-{rule['screen_steps']} saturation was right on "
                  f"{rule['correct']} of {rule['n']} {name} cells (exact 95% CI {fmt(ci[0], '.0%')}-"
                  f"{fmt(ci[1], '.0%')}; collapsed runs counted as 'hurts'), AUC "
                  f"{fmt(rule['auc'], '.2f')}; step-{rule['screen_steps']} against final saturation: "
                  f"r = {fmt(link.get('pearson'), '.2f')}, same side of the threshold in "
                  f"{fmt(link.get('same_side'), '.0%')} of {link.get('n')} runs")
    if other:
        print(f"  ours: {other} report(s) skipped, without this dataset ({cfg['dataset']}) or this "
              f"shape (n_layer, n_head, n_embd = {', '.join(map(str, shape))}) among their runs")
    if not result['our_accuracy']:
        print('  ours: no report found yet (run a grid and `python annex/study.py report`: it measures '
              'the rule)')
    if opts['compare']:
        ln = result['layernorm']
        result['early_gap_%'] = 100 * (screened['val_loss'] - ln['val_loss']) / ln['val_loss']
        warm = cfg['decay_lr'] and steps <= cfg['warmup_iters']  # train.py warms up only with decay_lr
        print(f"early gap at step {steps}: val loss {name} {screened['val_loss']:.4f} vs LayerNorm "
              f"{ln['val_loss']:.4f} ({result['early_gap_%']:+.1f}%); train loss "
              f"{screened['train_loss']:.4f} vs {ln['train_loss']:.4f}\n  This is the gap at step "
              f"{steps} of the run's {cfg['max_iters']}, "
              + (f"still in warmup ({cfg['warmup_iters']} steps)" if warm else 'past warmup')
              + ': not the end-of-run change that the prediction is about, and it may differ in sign.')
    write_json(os.path.join(root, 'screen.json'), result)
    print(f'wrote {root}/screen.json')
    return result


def main(argv):
    if not argv or argv[0] not in ('screen', 'run', 'report'):
        usage = __doc__.strip() + '\n\nusage: python annex/study.py {screen|run|report} ...'
        if argv[:1] in (['--help'], ['-h']):
            print(usage)
            return 0
        raise SystemExit(usage)
    if argv[0] == 'report':
        from annex import report  # here, not above: annex/report.py imports this file's helpers
        return report.main(argv[1:])
    return dict(screen=cmd_screen, run=cmd_run)[argv[0]](argv[1:])


if __name__ == '__main__':
    result = main(sys.argv[1:])
    sys.exit(result if isinstance(result, int) else 0)
