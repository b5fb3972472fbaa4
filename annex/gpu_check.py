"""
The prepared GPU check: what no CPU can show, in one command on a machine with a CUDA GPU. It writes
OUT/report.md and OUT/report.json after each part, so that a crash or a part cut at its time limit
still leaves what was measured and the error; each command's output is in OUT/logs/.

    python annex/gpu_check.py --out=gpu_check  # full: 6 minutes at most on one GPU
    python annex/gpu_check.py --quick=True     # 3 minutes on one GPU: no part 4, part 2 at 64m only

Each part runs in processes of its own, under its own time limit (LIMITS, times limit_scale):
1 tests  python -m pytest tests/test_gpu.py: passed, failed, skipped, the failures by name
2 bench  annex/bench.py --gpu_report=True: tokens/s, MFU and a step's peak memory against
         annex/memory.py's plan; LayerNorm, DyT, Derf, Differential Attention (and LayerNorm in
         DDP), eager and compiled, bf16, at the 64m and 124m configs' micro-batch
3 train  30 steps of config/gpt2_64m_ln.py, compiled, an eval every 10: the evals' and saves'
         seconds and dynamo's recompiles (TORCH_LOGS=recompiles)
4 cells  full only: 300 steps of config/gpt2_64m_ln.py and gpt2_64m_dyt.py, their last losses
5 multi  2+ GPUs only: part 3's run under DDP and FSDP on 2 processes, against part 3's losses; a
         run stopped by SIGTERM, then resumed with --init_from=auto at the iter it saved
Parts 3-5 train on data/wikitext103 if prepared (the study's; a GPU machine may have no internet
to fetch it), else on the offline pydocs corpus in GPT-2's BPE given a ranks file
(NANONORM_TIKTOKEN_FILE, or tiktoken's cache), else in bytes; each says which. Exit status: 0 all
passed (or were skipped), 1 a part failed, errored or was cut, 2 no CUDA GPU.
"""
import contextlib
import functools
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from datetime import datetime, timezone
from time import monotonic

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # run as annex/gpu_check.py
from configurator import config_keys, configure  # noqa: E402
from data.common import DATA_DIR, DataError, atomic_write, write_json  # noqa: E402
from data.pydocs.prepare import prepare  # noqa: E402
from run_files import read_log  # noqa: E402

# -------------------------------------------------------------------------------------------------
out = 'gpu_check'  # report.md, report.json, logs/ and runs/ go here
quick = False  # True: parts 1-3 (and 5), part 2 at the 64m shape only
# every part's time limit times this: 1.5 for a machine's first check, which compiles every graph
# afresh (inductor's caches, in /tmp/torchinductor_$USER, make later checks faster)
limit_scale = 1.0
# -------------------------------------------------------------------------------------------------
DEFAULTS, OPTIONAL_TYPES = config_keys(globals())
# seconds a part may take, (quick, full): 175 and 350 in all on one GPU, where part 5 is skipped
LIMITS = {'tests': (90, 110), 'bench': (55, 125), 'train': (30, 45), 'cells': (0, 70),
          'multi': (150, 150)}
NO_CUDA = ('error: annex/gpu_check.py needs a CUDA GPU (torch.cuda.is_available() is False); on a '
           'CPU run python -m pytest instead')
SHORT = ['config/gpt2_64m_ln.py', '--max_iters=30', '--eval_interval=10', '--log_interval=1']
TORCHRUN = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
BF16_TOL = 0.05  # nats: tests/test_gpu.py's margin between runs whose kernels round differently


def run_command(cmd, limit, log, stop_when=None, env=None):
    """(exit status, or None if cut at `limit` seconds; its output) of cmd, run from the repository
    root, its output appended to the file `log` after its command line. It runs in a session of its
    own, so that a cut kills what it started too (torchrun's workers, the tests' runs); once
    stop_when() is true the session gets SIGTERM (train.py saves, then stops)."""
    deadline = monotonic() + limit
    with open(log, 'ab') as f:  # a file, not a pipe: a full pipe cannot block it while we poll
        f.write(f'$ {shlex.join(cmd)}\n'.encode())
        f.flush()
        start = f.tell()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED='1', **(env or {})),
                                start_new_session=True)  # unbuffered: a cut keeps all it printed
    try:
        while proc.poll() is None and monotonic() < deadline:
            if stop_when and stop_when():
                os.killpg(proc.pid, signal.SIGTERM)
                stop_when = None
            time.sleep(0.2)
    finally:
        cut = proc.poll() is None
        if cut:  # at the limit, or the check itself stopped (Ctrl-C does not reach the session)
            started = descendants(proc.pid)  # torchrun's workers: sessions of their own
            os.killpg(proc.pid, signal.SIGKILL)
            for pid in started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        proc.wait()
    with open(log, 'rb') as f:
        f.seek(start)
        return None if cut else proc.returncode, f.read().decode(errors='replace')


def descendants(pid):
    """Every process pid started and its children started, by the parent links in /proc."""
    children = {}
    for entry in filter(str.isdigit, os.listdir('/proc')):
        with contextlib.suppress(OSError):
            with open(f'/proc/{entry}/stat') as f:  # 'pid (name) state ppid ...'
                parent = int(f.read().rsplit(')', 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def command(cfg, name, cmd, limit, **how):
    """run_command into OUT/logs/name.log: (its status, with the end of its output unless it
    passed; its output)."""
    rc, output = run_command(cmd, limit, os.path.join(cfg['out'], 'logs', f'{name}.log'), **how)
    if rc == 0:
        return {'status': 'ok'}, output
    status = 'timed out' if rc is None else f'failed (exit status {rc})'
    return {'status': status, 'output_tail': output[-1500:]}, output


@functools.cache
def training_data(out):
    """(train.py's data keys, what they are) for parts 3-5."""
    if os.path.exists(os.path.join(DATA_DIR, 'wikitext103', 'meta.json')):
        return [], "wikitext103 (data/wikitext103, the study's data)"
    folder = os.path.join(out, 'pydocs_gpt2')
    try:
        prepare(out_dir=folder, tokenizer='gpt2')
        return ['--dataset=pydocs', f'--data_dir={folder}'], f"pydocs in GPT-2's BPE ({folder})"
    except DataError as e:
        return ['--dataset=pydocs'], (f'pydocs in bytes (no GPT-2 BPE: {e}): a vocabulary of 320, '
                                      'so 64m has 38M parameters')


def train_run(cfg, name, args, limit, launcher=(sys.executable,), **how):
    """train.py on args and parts 3-5's data into OUT/runs/name: (its outcome, with its last eval's
    losses and its median step time and MFU; its output; its log.jsonl's records). how:
    run_command's stop_when and env."""
    out_dir, t0 = os.path.join(cfg['out'], 'runs', name), monotonic()
    cmd = [*launcher, 'train.py', *args, *training_data(cfg['out'])[0], f'--out_dir={out_dir}',
           '--overwrite=True']  # the data built on first use, within the limit
    result, output = command(cfg, name, cmd, limit - (monotonic() - t0), **how)
    records = read_log(os.path.join(out_dir, 'log.jsonl'), lambda r: True)
    last = ([r for r in records if r['event'] == 'eval'] or [{}])[-1]
    timed = [r['ms_per_iter'] for r in records if r['event'] == 'step' and r['ms_per_iter']]
    mfus = [r['mfu'] for r in records if r['event'] == 'step' and r['mfu'] is not None]
    result.update(eval_iter=last.get('iter'), train_loss=last.get('train_loss'),
                  val_loss=last.get('val_loss'),
                  ms_per_iter=statistics.median(timed) if timed else None,
                  mfu=statistics.median(mfus) if mfus else None)
    return result, output, records


def losses(records):
    return [r['loss'] for r in records if r['event'] == 'step']


def part_tests(cfg, limit, done):
    """tests/test_gpu.py, a line a test (-vv): a cut run still says which passed."""
    result, output = command(cfg, 'tests', [sys.executable, '-m', 'pytest', '-vv',
                                            'tests/test_gpu.py'], limit)
    found = re.findall(r'^tests/test_gpu\.py::(.+?) (PASSED|FAILED|ERROR|SKIPPED)\b', output,
                       re.M)  # ids may hold spaces: 'heads of 64'
    outcomes = [outcome for _, outcome in found]
    counts = {k.lower(): outcomes.count(k) for k in ('PASSED', 'FAILED', 'ERROR', 'SKIPPED')}
    return {**result, **counts,
            'failures': [name for name, outcome in found if outcome in ('FAILED', 'ERROR')]}


def part_bench(cfg, limit, done):
    """annex/bench.py's GPU report; its rows as each was measured (a cut keeps those done)."""
    rows = os.path.join(cfg['out'], 'logs', 'bench_rows.jsonl')
    if os.path.exists(rows):
        os.remove(rows)  # an earlier check's
    scales = '64m' if cfg['quick'] else '64m,124m'
    result = command(cfg, 'bench', [sys.executable, 'annex/bench.py', '--gpu_report=True',
                                    '--report_eager=True', f'--report_scales={scales}',
                                    f'--report_json={rows}'], limit)[0]
    return {**result, 'rows': read_log(rows, lambda row: True)}


def part_train(cfg, limit, done):
    """A short compiled run: its evals' and saves' seconds, its recompiles (one expected: the
    forward, trained after the first eval compiled it without grad), its losses (part 5's
    reference)."""
    result, output, records = train_run(cfg, 'train_64m_ln', SHORT, limit,
                                        env={'TORCH_LOGS': 'recompiles'})
    recompiles = [line for line in output.splitlines() if 'Recompiling function' in line]
    if result['status'] == 'ok' and len(recompiles) > 1:  # a shape or a guard that changes
        result['status'] = f'failed: {len(recompiles)} recompiles, 1 expected'
    return {**result, 'data': training_data(cfg['out'])[1],
            'eval_seconds': [r['seconds'] for r in records if r['event'] == 'eval'],
            'save_seconds': [r['seconds'] for r in records if r['event'] == 'saved'],
            'recompiles': len(recompiles), 'recompiled': recompiles[:5], 'losses': losses(records)}


def part_cells(cfg, limit, done):
    """300 steps of LayerNorm, then of DyT, at the study's protocol (full only)."""
    if cfg['quick']:
        return {'status': 'skipped', 'why': 'quick=True'}
    deadline, runs = monotonic() + limit, []
    for k, norm in enumerate(('ln', 'dyt')):
        share = (deadline - monotonic()) / (2 - k)  # the time left, shared by the cells left
        result = train_run(cfg, f'cell_64m_{norm}', [f'config/gpt2_64m_{norm}.py',
                                                     '--max_iters=300'], share)[0]
        runs.append({'run': f'64m {norm}', **result})
    return several(cfg, runs)


def several(cfg, runs):  # a part of several runs: the first that did not pass gives its status
    return {'status': next((r['status'] for r in runs if r['status'] != 'ok'), 'ok'),
            'data': training_data(cfg['out'])[1], 'runs': runs}


def part_multi(cfg, limit, done):
    """2+ GPUs: part 3's run under DDP, then FSDP, on 2 processes, against part 3's losses; then a
    run sent SIGTERM once it has logged step 10, run again with --init_from=auto."""
    gpus = torch.cuda.device_count()
    if gpus < 2:
        return {'status': 'skipped', 'why': f'needs 2+ GPUs; this machine has {gpus}'}
    deadline, runs, one = monotonic() + limit, [], done.get('train', {}).get('losses', [])
    for k, fsdp in enumerate((False, True)):
        share = (deadline - monotonic()) / (4 - k)  # the stop and the resume: two runs more
        result, _, records = train_run(cfg, 'fsdp' if fsdp else 'ddp', [*SHORT, f'--fsdp={fsdp}'],
                                       share, TORCHRUN)
        diff = max((abs(a - b) for a, b in zip(losses(records), one)), default=None)
        runs.append({'run': 'FSDP' if fsdp else 'DDP', **result, 'loss_diff_vs_part_3': diff})
        if result['status'] == 'ok' and diff is None:
            runs[-1]['status'] = "failed: no losses to compare with part 3's"
        elif result['status'] == 'ok' and diff > BF16_TOL:
            runs[-1]['status'] = f"failed: losses up to {diff:.3f} from part 3's"
    out_dir = os.path.join(cfg['out'], 'runs', 'stop')
    shutil.rmtree(out_dir, ignore_errors=True)  # an earlier check's log would stop it at once
    args = ['config/gpt2_64m_ln.py', '--max_iters=40', '--compile=False', '--log_interval=1',
            '--eval_interval=1000']
    stepped = functools.partial(read_log, os.path.join(out_dir, 'log.jsonl'),
                                lambda r: r['event'] == 'step' and r['iter'] >= 10)
    records = train_run(cfg, 'stop', args, (deadline - monotonic()) / 2, TORCHRUN,
                        stop_when=stepped)[2]
    stopped = next((r['iter'] for r in records if r['event'] == 'stopped'), None)
    result, output, _ = train_run(cfg, 'stop', [*args, '--init_from=auto'], deadline - monotonic(),
                                  TORCHRUN)
    found = re.search(r'resuming at iter (\d+)', output)
    resumed = int(found[1]) if found else None
    runs.append({'run': 'SIGTERM, then --init_from=auto', **result, 'stopped_at': stopped,
                 'resumed_at': resumed})
    if result['status'] == 'ok' and (stopped is None or resumed != stopped):
        runs[-1]['status'] = 'failed: it did not go on from the iter it stopped at'
    return several(cfg, runs)


def fmt(v):
    if isinstance(v, float):
        return f'{v:,.0f}' if abs(v) >= 1000 else f'{v:.4g}'
    if isinstance(v, list):  # the first few
        more = f', ... ({len(v)} in all)' if len(v) > 6 else ''
        return ', '.join(map(fmt, v[:6])) + more if v else '-'
    return 'n/a' if v is None else str(v)


def markdown(report):
    """report.md: the machine, each part's time, then each part's figures, its rows or runs as a
    table, and the end of the output of what did not pass."""
    lines = [f"# GPU check ({report['mode']}), {report['date']}", '',
             f"{report['gpus']} x {report['gpu']}; torch {report['torch']}, CUDA {report['cuda']}",
             '', '| part | status | seconds | limit (s) |', '|---|---|---|---|']
    lines += [f"| {name} | {p['status']} | {p['seconds']:.1f} | {p['limit_s']:.0f} |"
              for name, p in report['parts'].items()]
    lines.append(f"| total | | {report['total_seconds']:.1f} | |")
    for name, part in report['parts'].items():
        lines += ['', f"## {name}: {part['status']}", '']
        tails = [part.get('output_tail'), part.get('error')]
        for key, value in part.items():
            if isinstance(value, list) and value and isinstance(value[0], dict):
                keys = list(dict.fromkeys(k for row in value for k in row if k != 'output_tail'))
                lines += ['', '| ' + ' | '.join(keys) + ' |', '|' + '---|' * len(keys)]
                lines += ['| ' + ' | '.join(fmt(row.get(k)) for k in keys) + ' |' for row in value]
                tails += [row.get('output_tail') for row in value]
            elif key not in ('status', 'seconds', 'limit_s', 'output_tail', 'error', 'losses'):
                lines.append(f'- {key}: {fmt(value)}')
        lines += [f'\n```\n{tail.strip()}\n```' for tail in tails if tail]
    return '\n'.join(lines) + '\n'


def write_report(out, report):
    """report.json and report.md, each atomically: a temporary name, then a rename."""
    write_json(os.path.join(out, 'report.json'), report)
    atomic_write(os.path.join(out, 'report.md'), lambda f: f.write(markdown(report).encode()))


PARTS = {'tests': part_tests, 'bench': part_bench, 'train': part_train, 'cells': part_cells,
         'multi': part_multi}


def main(argv):
    cfg = configure(DEFAULTS, argv, OPTIONAL_TYPES, __doc__)
    if not torch.cuda.is_available():
        print(NO_CUDA, file=sys.stderr)
        return 2
    cfg['out'] = os.path.abspath(cfg['out'])  # the commands run from the repository root
    os.makedirs(os.path.join(cfg['out'], 'logs'), exist_ok=True)
    report = {'mode': 'quick' if cfg['quick'] else 'full', 'gpu': torch.cuda.get_device_name(0),
              'gpus': torch.cuda.device_count(), 'torch': torch.__version__,
              'cuda': torch.version.cuda, 'parts': {},
              'date': datetime.now(timezone.utc).isoformat(' ', 'seconds')}
    start = monotonic()
    for k, (name, part) in enumerate(PARTS.items(), 1):
        limit, t0 = LIMITS[name][0 if cfg['quick'] else 1] * cfg['limit_scale'], monotonic()
        try:
            result = part(cfg, limit, report['parts'])
        except Exception:  # recorded, and on to the next part
            result = {'status': 'error', 'error': traceback.format_exc(limit=-4)}
        report['parts'][name] = {**result, 'seconds': monotonic() - t0, 'limit_s': limit}
        report['total_seconds'] = monotonic() - start
        write_report(cfg['out'], report)
        print(f"gpu_check: part {k} ({name}) {result['status']} in "
              f"{report['parts'][name]['seconds']:.0f} s", flush=True)
    print(f"gpu_check: {os.path.join(cfg['out'], 'report.md')}, {report['total_seconds']:.0f} s")
    return 0 if all(p['status'] in ('ok', 'skipped') for p in report['parts'].values()) else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
