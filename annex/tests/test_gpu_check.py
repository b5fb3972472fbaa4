"""annex/gpu_check.py on a CPU: its refusal without CUDA, its command runner (a cut, a stop), its
data fallback, and whole checks with every command faked: a part that fails, one cut at its limit,
one that raises, the report written after each part, and its clock."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from annex import gpu_check
from tests.common import needs_gpt2

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_it_refuses_a_machine_without_cuda_before_doing_anything(tmp_path):
    out = tmp_path / 'check'
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='')  # a GPU machine too looks like a CPU one
    r = subprocess.run([sys.executable, 'annex/gpu_check.py', f'--out={out}'], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == ('error: annex/gpu_check.py needs a CUDA GPU '
                                '(torch.cuda.is_available() is False); on a CPU run python -m '
                                'pytest instead')
    assert not out.exists()


def test_help_prints_the_usage(capsys):
    with pytest.raises(SystemExit) as e:
        gpu_check.main(['--help'])
    text = capsys.readouterr().out
    assert e.value.code == 0 and 'python annex/gpu_check.py --quick=True' in text
    assert "  out = 'gpu_check'\n" in text and '  limit_scale = 1.0\n' in text


@pytest.mark.skipif(not os.path.isdir('/proc'), reason='reads /proc')
def test_a_command_cut_at_its_limit_is_killed_with_what_it_started(tmp_path):
    # the child starts a grandchild in its session and one in a session of its own (as torchrun
    # starts its workers); the cut must end all three, and keep what was printed
    code = ('import subprocess, sys, time; sleep = [sys.executable, "-c", "import time; '
            'time.sleep(60)"]; p = subprocess.Popen(sleep); '
            'q = subprocess.Popen(sleep, start_new_session=True); '
            'print(p.pid, q.pid); print("started"); time.sleep(60)')
    log = tmp_path / 'cmd.log'
    rc, output = gpu_check.run_command([sys.executable, '-c', code], 2, str(log))
    assert rc is None and output.splitlines()[1] == 'started'
    assert all(ended(int(pid)) for pid in output.splitlines()[0].split())
    assert log.read_text().startswith(f'$ {sys.executable} -c ')  # its command line first


def ended(pid, wait=5.0):
    """Whether process pid ends (or is a zombie: killed, not yet reaped) within `wait` seconds."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            with open(f'/proc/{pid}/stat') as f:
                if f.read().rsplit(')', 1)[1].split()[0] == 'Z':
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_command_gets_sigterm_once_stop_when_says_so(tmp_path):
    code = ('import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(4)); '
            'print("ready", flush=True); time.sleep(60)')
    log = tmp_path / 'cmd.log'
    rc, output = gpu_check.run_command([sys.executable, '-c', code], 30, str(log),
                                       stop_when=lambda: log.read_text().endswith('ready\n'))
    assert (rc, output) == (4, 'ready\n')
    rc, output = gpu_check.run_command([sys.executable, '-c', 'print("again")'], 30, str(log))
    assert (rc, output) == (0, 'again\n')  # only this command's output, the log appended to


def test_training_data_falls_back_to_bytes_without_a_ranks_file(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, 'DATA_DIR', str(tmp_path / 'data'))  # no wikitext103 there
    monkeypatch.setenv('NANONORM_TIKTOKEN_FILE', str(tmp_path / 'missing.tiktoken'))
    args, what = gpu_check.training_data.__wrapped__(str(tmp_path / 'check'))
    assert args == ['--dataset=pydocs'] and what.startswith('pydocs in bytes')
    assert 'missing.tiktoken not found' in what
    (tmp_path / 'data' / 'wikitext103').mkdir(parents=True)
    (tmp_path / 'data' / 'wikitext103' / 'meta.json').write_text('{}')
    assert gpu_check.training_data.__wrapped__(str(tmp_path / 'check'))[0] == []  # the configs' own


@needs_gpt2
def test_training_data_is_pydocs_in_gpt2_bpe_with_a_ranks_file(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, 'DATA_DIR', str(tmp_path / 'data'))
    args, what = gpu_check.training_data.__wrapped__(str(tmp_path))
    folder = tmp_path / 'pydocs_gpt2'
    assert args == ['--dataset=pydocs', f'--data_dir={folder}'] and "GPT-2's BPE" in what
    meta = json.loads((folder / 'meta.json').read_text())
    assert (meta['tokenizer'], meta['vocab_size'], meta['eot']) == ('gpt2', 50257, 50256)
    assert os.path.getsize(folder / 'train.bin') == 2 * meta['train_tokens'] > 2 * 400_000


# What each faked command takes on the fake clock, in seconds, by its out_dir's (or log's) name
SECONDS = {'tests': 11.0, 'bench': 55.0, 'train_64m_ln': 33.0, 'cell_64m_ln': 4.5, 'ddp': 5.0,
           'fsdp': 6.0, 'stop': 7.0, 'resume': 8.0}
PYTEST_OUT = """tests/test_gpu.py::test_bf16_compiled_on_cuda_tracks_float32_on_cpu PASSED [ 25%]
tests/test_gpu.py::test_torchrun_ddp_and_fsdp_on_one_gpu[fsdp] FAILED    [ 50%]
tests/test_gpu.py::test_every_variant_runs_in_fused_attention_kernels[dyt-diff-rope-heads of 96] PASSED [ 75%]
tests/test_gpu.py::test_peak_memory_is_within_15_percent_of_the_plan[True] SKIPPED [100%]
FAILED tests/test_gpu.py::test_torchrun_ddp_and_fsdp_on_one_gpu[fsdp] - AssertionError
"""
ROWS = [dict(shape='64m (12x8x512, 8x512 tokens)', mode='eager', variant='DyT',
             tokens_per_s=512345.6, mfu=0.214, step_peak_gib=2.5, step_plan_gib=2.7),
        dict(shape='64m (12x8x512, 8x512 tokens)', mode='compiled', variant='DyT',
             tokens_per_s=901234.5, mfu=0.377, step_peak_gib=2.1, step_plan_gib=2.3)]


class FakeCommands:
    """run_command's stand-in: a command advances the clock by its SECONDS and leaves what the real
    one would (log.jsonl records, bench rows); the tests fail, the bench is cut at its limit, the
    first 300-step cell raises, FSDP's losses stray from part 3's."""

    def __init__(self, out):
        self.now, self.out, self.calls, self.parts_before_4 = 1000.0, out, {}, None

    def clock(self):
        return self.now

    def __call__(self, cmd, limit, log, stop_when=None, env=None):
        args = dict(a[2:].split('=', 1) for a in cmd if a.startswith('--') and '=' in a)
        name = os.path.basename(args.get('out_dir') or log[:-len('.log')])
        name = 'resume' if args.get('init_from') == 'auto' else name
        self.calls[name] = (limit, env, cmd)
        self.now += SECONDS[name]
        return getattr(self, name)(args, stop_when)

    def tests(self, args, stop_when):
        return 1, PYTEST_OUT

    def bench(self, args, stop_when):
        with open(args['report_json'], 'w') as f:
            f.write(''.join(json.dumps(row) + '\n' for row in ROWS))
        return None, 'compiling the 124m shape\n'

    def train_64m_ln(self, args, stop_when):
        write_log(args['out_dir'], standard_run(0.0))
        return 0, 'iter 0: loss 10.0\nRecompiling function forward in model.py\n' * 2

    def cell_64m_ln(self, args, stop_when):
        with open(os.path.join(self.out, 'report.json')) as f:
            self.parts_before_4 = list(json.load(f)['parts'])
        raise RuntimeError('CUDA error: an illegal memory access was encountered')

    def ddp(self, args, stop_when):
        write_log(args['out_dir'], standard_run(0.01))
        return 0, ''

    def fsdp(self, args, stop_when):
        write_log(args['out_dir'], standard_run(0.2))
        return 0, ''

    def stop(self, args, stop_when):  # stopped as soon as asked to, at iter 12
        assert not stop_when()
        steps = [dict(event='step', iter=i, loss=10.0, mfu=None, ms_per_iter=None)
                 for i in range(12)]
        write_log(args['out_dir'], steps)
        assert stop_when()
        write_log(args['out_dir'], [*steps, dict(event='stopped', iter=12, signal='SIGTERM')])
        return 1, 'stopped at iter 12 (SIGTERM); ckpt.pt is saved'

    def resume(self, args, stop_when):
        return 0, 'resuming at iter 12 (best val loss 9.5000)\n'


def standard_run(offset):
    """A 30-step run's log.jsonl: a step a line, four evals and three saves with their seconds."""
    return ([dict(event='step', iter=i, loss=10.0 - 0.1 * i + offset, mfu=0.3, ms_per_iter=40.0 + i)
             for i in range(30)]
            + [dict(event='eval', iter=i, train_loss=9 - i / 10, val_loss=9.5 - i / 10,
                    seconds=1 + i / 10) for i in (0, 10, 20, 30)]
            + [dict(event='saved', iter=i, seconds=i / 100, background=False)
               for i in (10, 20, 30)])


def write_log(out_dir, records):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, 'log.jsonl'), 'w') as f:
        f.write(''.join(json.dumps(r) + '\n' for r in records))


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """A machine with CUDA as far as gpu_check can tell, and its commands faked: (gpu_check's main
    with its folder, the fake commands, the folder)."""
    out = tmp_path / 'check'
    fake = FakeCommands(str(out))
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: 'NVIDIA H100 80GB HBM3')
    monkeypatch.setattr(gpu_check, 'run_command', fake)
    monkeypatch.setattr(gpu_check, 'monotonic', fake.clock)
    monkeypatch.setattr(gpu_check, 'training_data', lambda out: (['--dataset=pydocs'], 'faked'))
    return lambda *argv: gpu_check.main([f'--out={out}', *argv]), fake, out


def test_a_full_check_records_each_part_and_goes_on_past_failures(fake_gpus, monkeypatch):
    check, fake, out = fake_gpus
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    assert check('--limit_scale=2') == 1  # a part failed
    assert sorted(os.listdir(out)) == ['logs', 'report.json', 'report.md', 'runs']  # no temp files
    report = json.loads((out / 'report.json').read_text())
    parts = report['parts']
    assert list(parts) == ['tests', 'bench', 'train', 'cells', 'multi']
    assert (report['gpu'], report['gpus'], report['mode']) == ('NVIDIA H100 80GB HBM3', 2, 'full')
    assert report['torch'] == torch.__version__ and report['cuda'] == torch.version.cuda

    tests = parts['tests']
    assert tests['status'] == 'failed (exit status 1)'
    assert (tests['passed'], tests['failed'], tests['skipped'], tests['error']) == (2, 1, 1, 0)
    assert tests['failures'] == ['test_torchrun_ddp_and_fsdp_on_one_gpu[fsdp]']
    assert parts['bench']['status'] == 'timed out' and parts['bench']['rows'] == ROWS
    assert '--report_scales=64m,124m' in fake.calls['bench'][2]

    train = parts['train']
    assert train['status'] == 'failed: 2 recompiles, 1 expected'  # the forward's for grad mode only
    assert fake.calls['train_64m_ln'][1] == {'TORCH_LOGS': 'recompiles'}
    assert train['recompiles'] == 2 and train['save_seconds'] == [0.1, 0.2, 0.3]
    assert train['eval_seconds'] == [1.0, 2.0, 3.0, 4.0]
    assert (train['eval_iter'], train['train_loss'], train['val_loss']) == (30, 6.0, 6.5)
    assert train['ms_per_iter'] == (40 + 69) / 2 and train['mfu'] == 0.3
    assert train['losses'] == [10.0 - 0.1 * i for i in range(30)]

    cells = parts['cells']
    assert cells['status'] == 'error' and 'illegal memory access' in cells['error']
    assert fake.parts_before_4 == ['tests', 'bench', 'train']  # written after each part

    ddp, fsdp, stop = parts['multi']['runs']
    assert ddp['status'] == 'ok' and ddp['loss_diff_vs_part_3'] == pytest.approx(0.01)
    assert fsdp['status'].startswith('failed') and fsdp['loss_diff_vs_part_3'] == pytest.approx(0.2)
    assert parts['multi']['status'] == fsdp['status']
    assert (stop['status'], stop['stopped_at'], stop['resumed_at']) == ('ok', 12, 12)

    # the clock: each part's seconds are its commands', the total their sum
    want = {'tests': SECONDS['tests'], 'bench': SECONDS['bench'], 'train': SECONDS['train_64m_ln'],
            'cells': SECONDS['cell_64m_ln'],
            'multi': SECONDS['ddp'] + SECONDS['fsdp'] + SECONDS['stop'] + SECONDS['resume']}
    assert {name: part['seconds'] for name, part in parts.items()} == want
    assert report['total_seconds'] == sum(SECONDS.values()) == 129.5
    # limits doubled; part 5's shared: the time left over the runs left (DDP, FSDP, stop, resume)
    multi = 2 * gpu_check.LIMITS['multi'][1]
    assert fake.calls['tests'][0] == 2 * gpu_check.LIMITS['tests'][1] == parts['tests']['limit_s']
    assert [fake.calls[name][0] for name in ('ddp', 'fsdp', 'stop', 'resume')] == pytest.approx(
        [multi / 4, (multi - 5) / 3, (multi - 11) / 2, multi - 11 - 7])

    md = (out / 'report.md').read_text()
    assert '2 x NVIDIA H100 80GB HBM3' in md and '| total | | 129.5 | |' in md
    assert f"| tests | failed (exit status 1) | 11.0 | {2 * gpu_check.LIMITS['tests'][1]} |" in md
    assert '| 64m (12x8x512, 8x512 tokens) | compiled | DyT | 901,234 | 0.377 | 2.1 | 2.3 |' in md
    assert 'illegal memory access' in md and 'compiling the 124m shape' in md
    assert '- eval_seconds: 1, 2, 3, 4' in md


def test_a_quick_check_on_one_gpu_skips_parts_4_and_5(fake_gpus, monkeypatch):
    check, fake, out = fake_gpus
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    assert check('--quick=True') == 1
    parts = json.loads((out / 'report.json').read_text())['parts']
    assert parts['cells'] == {'status': 'skipped', 'why': 'quick=True', 'seconds': 0.0,
                              'limit_s': 0.0}
    assert parts['multi']['why'] == 'needs 2+ GPUs; this machine has 1'
    assert '--report_scales=64m' in fake.calls['bench'][2]
    assert sum(p['limit_s'] for p in parts.values() if p['status'] != 'skipped') <= 180  # 3 min
