"""The classroom fork: a copy of the core files alone (README), without annex/, trains the default
model, samples from it and analyzes it; an option that needs an annex fails at once, naming its file."""
import json
import os
import shutil
import sys

import pytest

from tests.common import run_side_by_side

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = ('model.py', 'train.py', 'sample.py', 'analyze.py', 'configurator.py', 'distributed.py',
        'checkpoint.py', 'run_files.py', 'evaluate.py', 'norm_stats.py', 'data/common.py',
        'data/prepare_tools.py', 'data/pydocs/prepare.py')
STEPS = 20


def run(fork, *commands):
    """python *args of each command in the fork, as a student runs it: no PYTHONPATH to lead back into
    this checkout. The commands run side by side: none may need another's output."""
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    return run_side_by_side([[sys.executable, *args] for args in commands], cwd=fork, env=env)


@pytest.fixture(scope='module')
def fork(tmp_path_factory):
    """(the fork's folder, its `python train.py` run): the default job for a few steps, the corpus built
    on first use in the fork's own data/pydocs/."""
    d = tmp_path_factory.mktemp('fork')
    for path in CORE:
        os.makedirs(d / os.path.dirname(path), exist_ok=True)
        shutil.copy(os.path.join(ROOT, path), d / path)
    (proc,) = run(d, ['train.py', f'--max_iters={STEPS}', '--eval_interval=10', '--eval_samples=32',
                      '--log_interval=5'])
    return d, proc


def test_readme_names_every_core_file():
    with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
        readme = f.read()
    assert [path for path in CORE if path not in readme] == []


def test_the_core_alone_trains_samples_and_analyzes(fork):
    d, train = fork
    assert not (d / 'annex').exists()
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert (d / 'data' / 'pydocs' / 'meta.json').exists()  # built here, on first use
    lines = train.stdout.splitlines()
    assert any(line.startswith('iter 0: loss ') for line in lines)
    assert any(line.startswith(f'step {STEPS}: train loss ') for line in lines)
    assert f'done: out at iter {STEPS}' in train.stdout
    summary = json.loads((d / 'out' / 'summary.json').read_text())
    assert summary['status'] == 'finished' and summary['final_iter'] == summary['iters'] == STEPS
    with open(d / 'out' / 'log.jsonl') as f:
        evals = [r for r in map(json.loads, f) if r['event'] == 'eval']
    assert [r['iter'] for r in evals] == [0, 10, STEPS]
    assert evals[-1]['val_loss'] < evals[0]['val_loss']  # it learns

    sample, analyze = run(d, ['sample.py'], ['analyze.py', 'all', 'out'])  # both read out/ckpt.pt
    assert sample.returncode == 0, sample.stderr[-3000:]
    samples = sample.stdout.split('---------------\n')
    assert len(samples) == 4 and samples[-1] == ''  # 3 samples, the default
    assert all(s.strip() for s in samples[:3])

    assert analyze.returncode == 0, analyze.stderr[-3000:]
    text = analyze.stdout
    assert 'out: no DyT/Derf layer: saturation is defined for point-wise norm layers only' in text
    for table in ('input std per norm layer', 'HTSR spectra per weight', 'block 0 output',
                  'effective rank (Roy & Vetterli)'):
        assert table in text
    assert any(line.split()[:1] == ['transformer.h.0.mlp.c_fc'] for line in text.splitlines())


def test_an_annex_option_names_the_file_it_needs(fork):
    d, train = fork
    assert train.returncode == 0
    (d / 'images').mkdir()
    (d / 'images' / 'meta.json').write_text(json.dumps({'kind': 'images'}))
    cases = ((['train.py', '--fsdp=True', '--out_dir=out_fsdp'], 'annex/cluster.py'),
             (['train.py', '--dataset=images', '--data_dir=images', '--out_dir=out_vit'], 'annex/vit.py'),
             (['analyze.py', 'all', 'out', '--plot=figs'], 'annex/plots.py'),
             (['analyze.py', 'alpha', 'out'], 'annex/alpha.py'),
             (['analyze.py', 'scurve', 'out'], 'annex/scurve.py'),
             (['train.py', '--wandb_log=True', '--out_dir=out_wandb'], 'annex/wandb_log.py'),
             (['train.py', '--async_save=True', '--out_dir=out_async'], 'annex/cluster.py'))
    for (args, needs), proc in zip(cases, run(d, *(args for args, _ in cases))):
        assert proc.returncode == 1, (args, proc.stdout[-2000:], proc.stderr[-2000:])
        assert needs in proc.stderr and 'Traceback' not in proc.stderr, (args, proc.stderr[-2000:])
    assert not any((d / name).exists() for name in ('out_fsdp', 'out_vit', 'figs', 'out_wandb',
                                                    'out_async'))  # nothing written
