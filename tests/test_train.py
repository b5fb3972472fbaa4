"""train.py and sample.py on tiny models and a tiny synthetic dataset written to a temporary folder."""
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

import checkpoint
import sample
import train
from checkpoint import clear_stale, load_checkpoint, save_checkpoint
from configurator import configure
from distributed import check_train_config
from data.common import TokenData, largest_part, micro_batches, padded
from tests.common import run_side_by_side

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4',
        '--eval_samples=8', '--log_interval=1', '--learning_rate=1e-2', '--warmup_iters=2',
        '--lr_decay_iters=40', '--min_lr=1e-3', '--emb_init_std=0.02']  # GPT-2's init: losses ~ ln(64)


def run(data_dir, out_dir, *args):
    return train.main(['--dataset=tiny', f'--data_dir={data_dir}', f'--out_dir={out_dir}', *TINY, *args])


def train_cfg(*argv):
    """train.py's keys as configured from argv, before distributed.check_train_config completes them."""
    return train.SimpleNamespace(**configure(train.DEFAULTS, list(argv), train.OPTIONAL_TYPES))


def records(out_dir, event):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [r for r in map(json.loads, f) if r['event'] == event]


def test_lr_schedule_warmup_then_cosine():
    cfg = train.SimpleNamespace(decay_lr=True, learning_rate=1.0, min_lr=0.1, warmup_iters=4,
                                lr_decay_iters=14)
    assert train.get_lr(0, cfg) == pytest.approx(1 / 5)  # (it + 1) / (warmup + 1): never 0
    assert train.get_lr(3, cfg) == pytest.approx(4 / 5)
    assert train.get_lr(4, cfg) == pytest.approx(1.0)
    assert train.get_lr(9, cfg) == pytest.approx(0.1 + 0.9 * 0.5)  # half way: cos(pi/2) = 0
    assert train.get_lr(14, cfg) == pytest.approx(0.1)
    assert train.get_lr(100, cfg) == pytest.approx(0.1)
    cfg.decay_lr = False
    assert train.get_lr(0, cfg) == train.get_lr(100, cfg) == 1.0


def test_windows_stay_inside_the_budget():
    n, T = 40, 16
    data = np.arange(1000, dtype=np.uint16)  # token value = position
    tokens = TokenData(data[:n], data, T, eval_count=4, eval_seed=0)
    starts = torch.cat([tokens.draw(1337, it, 64) for it in range(200)])
    assert starts.min() >= 0 and starts.max() == n - T - 1  # the last target, token n-1, is reached
    x, y = tokens.batch('train', starts, 'cpu')
    assert y.max().item() == n - 1 and x.max().item() == n - 2
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(x[:, 0], starts)
    # the windows of a step depend on (seed, step) only
    assert torch.equal(tokens.draw(7, 3, 8), tokens.draw(7, 3, 8))
    assert not torch.equal(tokens.draw(7, 3, 8), tokens.draw(7, 4, 8))


@pytest.mark.parametrize('n,world,batch_size', [(64, 1, 8), (64, 2, 8), (64, 3, 8), (64, 8, 8),
                                                  (64, 16, 8), (12, 2, 4), (10, 4, 2), (400, 16, 8),
                                                  (400, 3, 8), (7, 7, 1)])
def test_micro_batches_split_a_step_over_any_process_count(n, world, batch_size):
    parts = [micro_batches(n, world, r, batch_size) for r in range(world)]
    covered = [i for p in parts for first, count in p for i in range(first, first + count)]
    assert covered == list(range(n))  # every sequence once, in order
    assert len({len(p) for p in parts}) == 1  # the same number of micro-batches on every process (FSDP)
    assert all(0 < count <= batch_size for p in parts for _, count in p)
    shares = [sum(count for _, count in p) for p in parts]
    assert max(shares) - min(shares) <= 1
    # no more micro-batches than the largest share needs
    assert len(parts[0]) == -(-(-(-n // world)) // batch_size)
    assert largest_part(n, world, batch_size) == max(c for p in parts for _, c in p)  # the one shape


def test_padded_rows_are_ignored_by_the_loss():
    x, y = torch.arange(6).view(2, 3), torch.arange(6).view(2, 3) + 1
    px, py = padded(x, y, 4)
    assert torch.equal(px[:2], x) and torch.equal(px[2:], x[:1].expand(2, 3))
    assert torch.equal(py[:2], y) and (py[2:] == -1).all()  # GPT's ignore_index
    assert padded(x, y, 2) == (x, y)


@pytest.mark.parametrize('config', ['config/gpt2_64m_dyt.py', 'config/gpt2_3.78b_dyt.py'])
def test_the_readmes_commands_run_on_1_2_8_and_16_processes(config, monkeypatch, tmp_path):
    """The study's batch (64 sequences: 64 x 1 at 64m, 8 x 8 at 3.78b) and eval windows (400) on the
    process counts of the README's commands: python train.py, a 2-GPU box, torchrun
    --nproc_per_node=8, two nodes of 8."""
    monkeypatch.chdir(REPO)
    for world in (1, 2, 8, 16):  # out_dir in tmp_path: a run in the config's out_dir must not matter
        cfg = train_cfg(config, '--device=cpu', f'--out_dir={tmp_path}')
        check_train_config(cfg, world)  # raises SystemExit if the batch or the windows cannot be split
        n = cfg.batch_size * cfg.gradient_accumulation_steps
        assert n == 64 and cfg.eval_samples == 400
        per_rank = [sum(c for _, c in micro_batches(n, world, r, cfg.batch_size)) for r in range(world)]
        assert per_rank == [64 // world] * world  # 64, 32, 8, 4 sequences each
        counts = {1: 8, 2: 4, 8: 1, 16: 1} if '3.78b' in config else {1: 1, 2: 1, 8: 1, 16: 1}
        assert len(micro_batches(n, world, 0, cfg.batch_size)) == counts[world]
    with pytest.raises(SystemExit, match=r'the 64 samples per step \(batch_size x gradient_accumulation'
                                         r'_steps\) are too few to give each of 100 processes'):
        check_train_config(cfg, 100)
    for key in ('eval_samples', 'eval_samples_warmup'):  # 5 windows for 8 processes: 3 would have none
        cfg = train_cfg(config, '--device=cpu', f'--out_dir={tmp_path}', f'--{key}=5')
        with pytest.raises(SystemExit, match=f'the 5 {key} are too few to give each of 8 processes'):
            check_train_config(cfg, 8)
    cfg = train_cfg(config, '--device=cpu', f'--out_dir={tmp_path}', '--eval_samples_warmup=401')
    with pytest.raises(SystemExit, match='eval_samples_warmup=401 must be <= eval_samples=400'):
        check_train_config(cfg, 1)


def test_configure_order_and_errors(tmp_path):
    defaults = {'lr': 1.0, 'n': 2, 'name': 'a', 'flag': False, 'opt': None}
    conf = tmp_path / 'c.py'
    conf.write_text("import math\n_helper = 3\nn = 5\nname = 'b'\n")
    cfg = configure(defaults, [str(conf), '--lr=3', '--opt=7', '--name=c'], {'opt': int})
    assert cfg == {'lr': 3.0, 'n': 5, 'name': 'c', 'flag': False, 'opt': 7} and type(cfg['lr']) is float
    with pytest.raises(SystemExit, match="unknown config key 'nn'.*did you mean n"):
        configure(defaults, ['--nn=3'])
    with pytest.raises(SystemExit, match="'n' .* must be int"):
        configure(defaults, ['--n=2.5'])
    with pytest.raises(SystemExit, match="'flag' .* must be bool"):
        configure(defaults, ['--flag=1'])
    with pytest.raises(SystemExit, match="'opt' .* must be int or None"):
        configure(defaults, ['--opt=abc'], {'opt': int})
    conf.write_text("lrr = 0.1\n")
    with pytest.raises(SystemExit, match="unknown config key 'lrr' \\(from .*c.py\\).*lr.*"
                                         "must start with '_', e.g. _lrr"):
        configure(defaults, [str(conf)])
    with pytest.raises(SystemExit,
                       match="expected --key=value, got '--flag'; for a flag write --flag=True"):
        configure(defaults, ['--flag'])
    with pytest.raises(SystemExit, match="expected --key=value, got '--n'$"):
        configure(defaults, ['--n'])
    # a string key keeps the text of a number-like value: a run name 2024, an out_dir 1e3
    assert configure(defaults, ['--name=2024'])['name'] == '2024'
    assert configure(defaults, ['--name=1e3', '--opt=None'])['name'] == '1e3'
    # a key listed in optional_types also takes None, whatever its default (sample.py's top_k)
    assert configure(defaults, ['--n=None'], {'n': int})['n'] is None
    with pytest.raises(SystemExit, match="'n' .* must be int, got None"):
        configure(defaults, ['--n=None'])


def test_help_prints_the_defaults(capsys):
    for main, first, lines in ((train.main, 'Train a GPT variant',
                                ["  out_dir = 'out'", '  dyt_alpha = 0.5']),
                               (sample.main, 'Sample from a trained model', ['  top_k = 200'])):
        with pytest.raises(SystemExit) as stop:
            main(['--n_layer=2', '--help'])  # --help wins over everything else
        assert stop.value.code == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith(first) and all(line in out for line in lines)


def test_train_config_errors(data_dir, tmp_path):
    out = tmp_path / 'o'
    for args, message in (
            (['--learning_rat=1e-3'], "unknown config key 'learning_rat'.*learning_rate"),
            (['--max_iters=1e3'], "'max_iters' .* must be int"),
            (['--norm=DyT'], "^error: norm='DyT' is not known; choose one of"),
            (['--n_head=3'], '^error: n_embd=32 must be divisible by n_head=3'),
            (['--vocab_size=50'],
             "^error: vocab_size=50 is smaller than the dataset's vocabulary \\(60"),
            (['--gradient_accumulation_steps=0'], '^error: gradient_accumulation_steps=0 must be >= 1$'),
            (['--max_iters=-1'], '^error: max_iters=-1 must be >= 0$'),
            (['--paper_val=-1'], '^error: paper_val=-1 must be >= 0$'),
            (['--train_tokens=10'], '^error: train_tokens=10 must be between')):
        with pytest.raises(SystemExit, match=message):
            run(data_dir, out, *args)
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit,
                           match="^error: device='cuda', but this machine has no cuda device"):
            run(data_dir, out, '--device=cuda')
    for sizes, bad in ((['--gradient_accumulation_steps=-1', '--batch_size=1'],  # -1 sample to share
                        'gradient_accumulation_steps=-1'),
                       (['--gradient_accumulation_steps=-1', '--batch_size=-4'],  # 4 in batches of -4
                        'batch_size=-4')):
        with pytest.raises(SystemExit, match=f'^error: {bad} must be >= 1$'):
            check_train_config(train_cfg(*sizes, f'--out_dir={out}'), 4)  # not a ZeroDivisionError
    assert not out.exists()  # every check comes before anything is written
    empty = tmp_path / 'empty'
    empty.mkdir()
    with pytest.raises(SystemExit,
                       match='meta.json not found. a data folder holds train.bin and val.bin'):
        train.main(['--dataset=nodata', f'--data_dir={empty}', f'--out_dir={tmp_path / "o"}'])
    # no folder given: data/nodata/
    with pytest.raises(SystemExit, match='python data/nodata/prepare.py'):
        train.main(['--dataset=nodata', f'--out_dir={tmp_path / "o"}'])
    (empty / 'meta.json').write_text('{}')  # every field checked before anything is written
    with pytest.raises(SystemExit, match="'tokenizer' must be"):
        train.main(['--dataset=nodata', f'--data_dir={empty}', f'--out_dir={tmp_path / "o"}'])
    if not importlib.util.find_spec('wandb'):
        with pytest.raises(SystemExit, match='wandb is not installed'):
            run(data_dir, out, '--wandb_log=True')
    assert not out.exists()


def test_out_dir_is_never_clobbered_and_resume_checks_the_checkpoint(data_dir, tmp_path, capsys):
    out = str(tmp_path / 'run')
    assert run(data_dir, out, '--max_iters=2', '--eval_interval=2') == 0
    with pytest.raises(SystemExit, match=f'^error: {out} already holds a run \\(ckpt.pt\\); pass '
                                         '--out_dir=NEW, --init_from=resume \\(or auto\\), or '
                                         '--overwrite=True$'):
        run(data_dir, out, '--max_iters=2', '--seed=42')
    assert run(data_dir, out, '--max_iters=1', '--eval_interval=1', '--overwrite=True') == 0
    assert [r['iter'] for r in records(out, 'eval')] == [0, 1]  # the old run's log is gone
    # dropout is not architecture: it may change on resume, as the dataset may, each said
    capsys.readouterr()
    assert run(data_dir, out, '--max_iters=2', '--eval_interval=1', '--init_from=resume',
               '--dropout=0.1', '--dataset=tiny2') == 0
    printed = capsys.readouterr().out
    assert ("warning: resuming with dataset 'tiny' -> 'tiny2', dropout 0.0 -> 0.1: not the "
            'uninterrupted run') in printed
    assert [r['iter'] for r in records(out, 'eval')] == [0, 1, 2]
    # a checkpoint that is missing, corrupt, or not written by train.py: a reason, not a traceback
    ckpt = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)
    del ckpt['sampler'], ckpt['best_iter']
    for name, content, message in (('none', None, 'no checkpoint at'),
                                   ('bad', b'PK\x03\x04 torn', 'cannot read checkpoint'),
                                   ('foreign', ckpt, 'lacks best_iter, sampler')):
        os.makedirs(tmp_path / name)
        if isinstance(content, bytes):
            (tmp_path / name / 'ckpt.pt').write_bytes(content)
        elif content is not None:
            torch.save(content, tmp_path / name / 'ckpt.pt')
        with pytest.raises(SystemExit, match=f'^error: .*{message}'):
            run(data_dir, tmp_path / name, '--init_from=resume')


def test_validation_is_the_same_for_every_data_budget(data_dir, tmp_path):
    """The study's confound, fixed: val loss must not depend on train_tokens. max_iters=0 logs the
    initial model's losses; the train-split windows are analyze.py's (numpy default_rng(1337) inside the
    budget)."""
    evals = {}
    for n in (5000, 20000):
        assert run(data_dir, tmp_path / str(n), '--max_iters=0', f'--train_tokens={n}') == 0
        evals[n] = records(tmp_path / str(n), 'eval')
    assert len(evals[5000]) == len(evals[20000]) == 1
    assert evals[5000][0]['val_loss'] == evals[20000][0]['val_loss']
    model, _ = load_checkpoint(tmp_path / '5000' / 'ckpt.pt')
    tokens = np.fromfile(os.path.join(data_dir, 'train.bin'), dtype=np.uint16).astype(np.int64)
    # eval_samples windows of 17 tokens: the last at 4999 at most
    starts = np.random.default_rng(1337).integers(0, 5000 - 16, size=2 * 4)
    x = torch.tensor(np.stack([tokens[s:s + 16] for s in starts]))
    y = torch.tensor(np.stack([tokens[s + 1:s + 17] for s in starts]))
    with torch.no_grad():
        assert evals[5000][0]['train_loss'] == pytest.approx(model(x, y)[1].item(), abs=1e-5)


def test_sample_errors_and_top_k_none(data_dir, tmp_path, capsys):
    out = str(tmp_path / 'run')
    assert run(data_dir, out, '--max_iters=0') == 0
    for arg, message in (('--start=FILE:/nope.txt', "cannot read the prompt file '/nope.txt'"),
                         ('--dtype=foo', "dtype='foo' is not known"),
                         (f'--ckpt={tmp_path}/none.pt', 'no checkpoint at')):
        with pytest.raises(SystemExit, match=f'^error: {message}'):
            sample.main([f'--out_dir={out}', arg])
    sample.main([f'--out_dir={out}', '--ckpt=latest', '--top_k=None', '--num_samples=1',
                 '--max_new_tokens=3'])
    assert capsys.readouterr().out.count('---------------') == 1


def test_tiny_run_learns_and_records_everything(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    assert run(data_dir, out, '--max_iters=40', '--eval_interval=20', '--norm=dyt', '--dyt_alpha=2.0',
               '--train_tokens=20000') == 0
    evals = records(out, 'eval')
    assert [r['iter'] for r in evals] == [0, 20, 40]
    assert evals[-1]['val_loss'] < evals[0]['val_loss'] - 1.0  # ln(64) ~ 4.16 at the start
    assert evals[-1]['train_loss'] < evals[0]['train_loss'] - 1.0
    for key in ('train_loss', 'val_loss', 'lr', 'tokens', 'epochs', 'saturation', 'norm_layers'):
        assert key in evals[-1]
    assert len(evals[-1]['saturation']) == 6 and 0 < evals[-1]['saturation'][0] <= 1
    layers = evals[-1]['norm_layers']
    assert len(layers) == 5 and all(s['alpha'] is not None for s in layers.values())
    steps = records(out, 'step')
    assert [r['iter'] for r in steps] == list(range(40))
    for key in ('loss', 'lr', 'grad_norm', 'tokens', 'epochs', 'tokens_per_sec', 'mfu'):
        assert key in steps[-1]
    assert steps[-1]['tokens'] == 40 * 4 * 16 and steps[-1]['epochs'] == pytest.approx(40 * 64 / 20000)
    summary = json.load(open(os.path.join(out, 'summary.json')))
    assert summary['final_iter'] == 40 and summary['final_val_loss'] == evals[-1]['val_loss']
    assert summary['best_val_loss'] == min(r['val_loss'] for r in evals)
    assert summary['best_iter'] == min(evals, key=lambda r: r['val_loss'])['iter']
    assert summary['final_train_loss'] == evals[-1]['train_loss']
    assert summary['tokens'] == 40 * 64 and summary['diverged'] is False and summary['wall_time_s'] > 0
    assert summary['layout'] == 'file'  # the tiny folder's meta.json has no "layout": a whole-file encode
    assert set(summary['alphas']) == set(layers) and len(summary['saturation_layers']) == 5
    assert summary['config']['train_tokens'] == 20000 and summary['n_params'] > 0
    # the budget's unigram entropy, written out: the loss of predicting its token frequencies alone
    counts = np.bincount(np.fromfile(os.path.join(data_dir, 'train.bin'), dtype=np.uint16)[:20000])
    p = counts[counts > 0] / 20000
    assert summary['unigram_entropy'] == pytest.approx(float(-(p * np.log(p)).sum()))
    assert summary['budget_tokens'] == 20000
    assert json.load(open(os.path.join(out, 'config.json')))['norm'] == 'dyt'
    for name in ('ckpt.pt', 'best.pt'):
        ckpt = torch.load(os.path.join(out, name), weights_only=True)
        for key in ('model', 'optimizer', 'model_args', 'config', 'iter_num', 'best_val_loss',
                    'best_iter', 'tokenizer', 'sampler'):
            assert key in ckpt
    assert torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)['iter_num'] == 40
    best = os.path.join(out, 'best.pt')
    assert torch.load(best, weights_only=True)['iter_num'] == summary['best_iter']
    # written once: best.pt is ckpt.pt's file when the last eval was the best, a later ckpt.pt is new
    assert os.path.samefile(os.path.join(out, 'ckpt.pt'), best) == (summary['best_iter'] == 40)
    # sample.py decodes a checkpoint with the run's tokenizer
    proc = subprocess.run([sys.executable, 'sample.py', f'--out_dir={out}', '--ckpt=best',
                           '--num_samples=2', '--max_new_tokens=5', '--start=!#'], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count('---------------') == 2 and proc.stdout.startswith('!#')


def test_resume_is_exact(data_dir, tmp_path):
    # dropout: its RNG is resumed too
    common = ['--dropout=0.1', '--eval_interval=4', '--norm=rmsnorm', '--embed_scale=True']
    full, part = str(tmp_path / 'full'), str(tmp_path / 'part')
    run(data_dir, full, '--max_iters=16', *common)
    run(data_dir, part, '--max_iters=8', *common)
    # as saved when embed_scale was 0-dim
    ckpt = torch.load(os.path.join(part, 'ckpt.pt'), weights_only=True)
    ckpt['model']['embed_scale'] = ckpt['model']['embed_scale'].reshape(())
    moments = ckpt['optimizer']['state']['embed_scale']
    moments.update(exp_avg=moments['exp_avg'].reshape(()),
                   exp_avg_sq=moments['exp_avg_sq'].reshape(()))
    # as saved before LoopState: the divergence guard's two loss EMAs in one dict
    ckpt['guard'] = {'ema': ckpt.pop('loss_ema'), 'best_ema': ckpt.pop('best_loss_ema')}
    torch.save(ckpt, os.path.join(part, 'ckpt.pt'))
    # lines of a crashed run after its last checkpoint
    with open(os.path.join(part, 'log.jsonl'), 'a') as f:
        f.write(json.dumps({'event': 'step', 'iter': 9, 'loss': 1.0}) + '\n{"event": "st')
    with pytest.raises(SystemExit, match=r'architecture.*n_layer \(checkpoint 2, config 3\)'):
        run(data_dir, part, '--max_iters=16', '--init_from=resume', '--n_layer=3', *common)
    run(data_dir, part, '--max_iters=16', '--init_from=resume', *common)

    with open(os.path.join(full, 'log.jsonl')) as f, open(os.path.join(part, 'log.jsonl')) as g:
        a, b = [json.loads(line) for line in f], [json.loads(line) for line in g]
    # nothing lost or doubled
    assert [(r['event'], r['iter']) for r in a] == [(r['event'], r['iter']) for r in b]
    assert [r.get('loss', r.get('val_loss')) for r in a] == [r.get('loss', r.get('val_loss'))
                                                              for r in b]
    wa = torch.load(os.path.join(full, 'ckpt.pt'), weights_only=True)
    wb = torch.load(os.path.join(part, 'ckpt.pt'), weights_only=True)
    assert wa['iter_num'] == wb['iter_num'] == 16 and 'guard' not in wb
    assert (wa['loss_ema'], wa['best_loss_ema']) == (wb['loss_ema'], wb['best_loss_ema'])
    for k in wa['model']:
        assert torch.equal(wa['model'][k], wb['model'][k]), k


def test_stop_signal_checkpoints_and_auto_resumes_exactly(data_dir, tmp_path, capsys, monkeypatch):
    common = ['--max_iters=12', '--eval_interval=4', '--dropout=0.1']
    full, part = str(tmp_path / 'full'), str(tmp_path / 'part')
    assert run(data_dir, full, *common) == 0
    real_get_lr, sent = train.get_lr, []

    def ctrl_c_at_step_5(it, cfg):  # get_lr: called once per step before its forward (and for evals)
        if it == 5 and not sent:
            sent.append(it)
            os.kill(os.getpid(), signal.SIGINT)
        return real_get_lr(it, cfg)
    monkeypatch.setattr(train, 'get_lr', ctrl_c_at_step_5)
    # Ctrl-C: no traceback
    assert run(data_dir, part, *common, '--init_from=auto') == train.EXIT_STOPPED == 4
    assert 'stopped at iter 6 (SIGINT); ckpt.pt is saved. Continue with' in capsys.readouterr().out
    assert records(part, 'stopped')[-1]['iter'] == 6
    assert not os.path.exists(os.path.join(part, 'summary.json'))
    assert torch.load(os.path.join(part, 'ckpt.pt'), weights_only=True)['iter_num'] == 6
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # main() gave the handlers back
    monkeypatch.undo()
    assert run(data_dir, part, *common, '--init_from=auto') == 0  # the same command goes on
    wa, wb = (torch.load(os.path.join(d, 'ckpt.pt'), weights_only=True) for d in (full, part))
    assert wa['iter_num'] == wb['iter_num'] == 12
    assert all(torch.equal(wa['model'][k], wb['model'][k]) for k in wa['model'])
    assert [r['loss'] for r in records(full, 'step')] == [r['loss'] for r in records(part, 'step')]
    summary = json.load(open(os.path.join(part, 'summary.json')))
    assert summary['status'] == 'finished' and summary['iters'] == 12
    # a finished run is left alone: a message, exit 0, nothing rewritten
    before = {name: open(os.path.join(part, name)).read()
              for name in ('summary.json', 'config.json', 'log.jsonl')}
    capsys.readouterr()
    assert run(data_dir, part, *common, '--init_from=auto') == 0
    assert ('already at max_iters=12 (iter 12): nothing to do; raise --max_iters to continue'
            in capsys.readouterr().out)
    assert before == {name: open(os.path.join(part, name)).read() for name in before}


def test_a_stop_signal_in_the_last_step_lets_the_run_finish(data_dir, tmp_path, monkeypatch):
    """The step after which max_iters is reached ends the run: a signal during it changes nothing."""
    real_get_lr, sent = train.get_lr, []

    def sigterm_at_the_last_step(it, cfg):
        if it == 5 and not sent:
            sent.append(it)
            os.kill(os.getpid(), signal.SIGTERM)
        return real_get_lr(it, cfg)
    monkeypatch.setattr(train, 'get_lr', sigterm_at_the_last_step)
    out = str(tmp_path / 'last')
    assert run(data_dir, out, '--max_iters=6', '--eval_interval=3') == 0
    assert sent == [5] and records(out, 'stopped') == []
    assert json.load(open(os.path.join(out, 'summary.json')))['status'] == 'finished'


def test_divergence_stops_cleanly(data_dir, tmp_path):
    out = str(tmp_path / 'div')
    assert run(data_dir, out, '--max_iters=4', '--eval_interval=4') == 0
    rc = run(data_dir, out, '--learning_rate=1e6', '--decay_lr=False', '--grad_clip=0.0',
             '--max_iters=50', '--eval_interval=50', '--init_from=resume')
    assert rc == train.EXIT_DIVERGED == 3
    summary = json.load(open(os.path.join(out, 'summary.json')))
    assert summary['status'] == 'diverged' and summary['diverged'] is True
    assert 'non-finite' in summary['diverged_reason']
    div = records(out, 'diverged')
    assert len(div) == 1 and div[0]['diverged'] is True
    assert div[0]['iter'] == summary['diverged_iter'] < 50
    model, ckpt = load_checkpoint(os.path.join(out, 'ckpt.pt'))  # the last good one
    assert ckpt['iter_num'] == 4 < summary['diverged_iter']
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # the optional spike rule: any loss above half the best smoothed loss counts as a spike here
    out2 = str(tmp_path / 'spike')
    assert run(data_dir, out2, '--max_iters=5', '--eval_interval=5', '--spike_factor=0.5') == 3
    assert 'spike' in json.load(open(os.path.join(out2, 'summary.json')))['diverged_reason']


def test_best_checkpoint_is_the_same_bytes_linked_or_copied(tmp_path, monkeypatch):
    state = {'model': {'w': torch.arange(10.0)}, 'iter_num': 3}
    save_checkpoint(state, str(tmp_path), best=True)
    ckpt, best = tmp_path / 'ckpt.pt', tmp_path / 'best.pt'
    assert os.stat(ckpt).st_ino == os.stat(best).st_ino  # one file, serialised once
    # a later ckpt.pt replaces the name, not best.pt's bytes
    save_checkpoint(dict(state, iter_num=4), str(tmp_path))
    assert torch.load(best, weights_only=True)['iter_num'] == 3
    assert torch.load(ckpt, weights_only=True)['iter_num'] == 4

    def no_links(src, dst):
        raise OSError('links not supported here')
    monkeypatch.setattr(os, 'link', no_links)
    save_checkpoint(dict(state, iter_num=5), str(tmp_path), best=True)
    assert os.stat(ckpt).st_ino != os.stat(best).st_ino and best.read_bytes() == ckpt.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ['best.pt', 'ckpt.pt']  # no temporary file left


def test_crash_while_checkpointing_keeps_previous(data_dir, tmp_path, monkeypatch):
    out = str(tmp_path / 'crash')
    run(data_dir, out, '--max_iters=4', '--eval_interval=4')
    before = open(os.path.join(out, 'ckpt.pt'), 'rb').read()

    def broken_save(obj, f):
        f.write(b'PK\x03\x04 half a checkpoint')
        raise OSError('disk full')
    monkeypatch.setattr(torch, 'save', broken_save)
    with pytest.raises(SystemExit, match='at iter 8 not saved .DataError: cannot write .*disk full'):
        run(data_dir, out, '--max_iters=8', '--eval_interval=4', '--init_from=resume')
    assert open(os.path.join(out, 'ckpt.pt'), 'rb').read() == before
    assert torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)['iter_num'] == 4
    assert sorted(os.listdir(out)) == ['best.pt', 'ckpt.pt', 'config.json', 'log.jsonl', 'summary.json']


def test_dyt_learns_below_the_unigram_loss_at_the_default_config(tmp_path):
    """`python train.py --norm=dyt` must learn, not collapse: with GPT-2's init (0.02, tied output layer)
    DyT's bounded features reach the unigram's logits only through a huge token-independent vector that
    saturates every later DyT layer, and the loss sticks at the unigram entropy (docs/collapse.md: "When DyT
    collapses"). The default init (0.3) learns; 0.02 collapses, and train.py warns of it."""
    from data.common import DATA_DIR
    if not os.path.exists(os.path.join(DATA_DIR, 'pydocs', 'meta.json')):
        from data.pydocs.prepare import prepare
        prepare()  # here, not by both runs at once
    runs = {0.3: 80, 0.02: 40}  # steps; the default corpus, model and schedule otherwise, side by side
    procs = run_side_by_side([[sys.executable, 'train.py', '--norm=dyt', f'--emb_init_std={std}',
                               f'--max_iters={steps}', f'--eval_interval={steps // 2}',
                               f'--out_dir={tmp_path / str(std)}'] for std, steps in runs.items()], cwd=REPO)
    assert [p.returncode for p in procs] == [0, 0], [p.stderr[-2000:] for p in procs]
    runs = {std: json.load(open(tmp_path / str(std) / 'summary.json')) for std in runs}
    counts = np.bincount(np.fromfile(os.path.join(DATA_DIR, 'pydocs', 'train.bin'), dtype=np.uint16))
    p = counts[counts > 0] / counts.sum()
    entropy = float(-(p * np.log(p)).sum())  # about 3.29 nats/byte
    assert runs[0.3]['final_train_loss'] < entropy - 0.3 and runs[0.3]['warnings'] == []
    assert runs[0.02]['final_train_loss'] > entropy - 0.1
    assert any('unigram level' in w for w in runs[0.02]['warnings'])
    assert any('norm layers saturated' in w for w in runs[0.02]['warnings'])


def test_evals_are_denser_until_warmup_ends(data_dir, tmp_path):
    """eval_interval_warmup: every 2 steps before step 6 (warmup), then every 4, and at the end."""
    assert run(data_dir, tmp_path / 'e', '--max_iters=10', '--warmup_iters=6', '--eval_interval=4',
               '--eval_interval_warmup=2') == 0
    assert [r['iter'] for r in records(tmp_path / 'e', 'eval')] == [0, 2, 4, 8, 10]
    for bad in (-1, 0):
        with pytest.raises(SystemExit, match=f'^error: eval_interval_warmup={bad} must be >= 1$'):
            run(data_dir, tmp_path / 'f', f'--eval_interval_warmup={bad}')


def test_no_checkpoint_at_step_0_and_stale_temporary_files_removed(data_dir, tmp_path, monkeypatch):
    """Step 0's weights are the seed's: not written. What interrupted saves left (their names change with
    every requeue) is removed at start, and a sharded checkpoint caught between its renames put back."""
    out = tmp_path / 'run'
    out.mkdir()
    for name in ('ckpt.pt.tmp4242', 'best.pt.tmp17'):
        (out / name).write_bytes(b'PK\x03\x04 half a checkpoint')
    (out / 'ckpt.dcp.tmp').mkdir()
    (out / 'notes.txt').write_text('mine')  # not train.py's: kept
    saved = []
    real_save = checkpoint.save_checkpoint
    monkeypatch.setattr(checkpoint, 'save_checkpoint', lambda state, *a, **k: saved.append(state['iter_num'])
                        or real_save(state, *a, **k))
    assert run(data_dir, str(out), '--max_iters=4', '--eval_interval=2') == 0
    assert saved == [2, 4]
    assert sorted(os.listdir(out)) == ['best.pt', 'ckpt.pt', 'config.json', 'log.jsonl', 'notes.txt',
                                       'summary.json']
    (out / 'ckpt.dcp.old').mkdir()  # a crash between swap_in's two renames: no ckpt.dcp
    (out / 'ckpt.dcp.old' / 'state.pt').write_bytes(b'')  # its last file, saved after ckpt.pt
    os.utime(out / 'ckpt.pt', (1, 1))
    clear_stale(str(out))
    assert (out / 'ckpt.dcp').is_dir() and not (out / 'ckpt.dcp.old').exists()
    assert not (out / 'ckpt.pt').exists()  # of the two, the older: the run's latest is the shards


def test_a_checkpoint_with_one_flipped_byte_is_refused(data_dir, tmp_path):
    out = tmp_path / 'run'
    assert run(data_dir, str(out), '--max_iters=2', '--eval_interval=2') == 0
    path = out / 'ckpt.pt'
    data = bytearray(path.read_bytes())
    load_checkpoint(str(path))  # intact
    data[len(data) // 2] ^= 0x10  # inside the weights' bytes: torch.load alone reads them silently
    path.write_bytes(bytes(data))
    assert torch.load(str(path), weights_only=True)['iter_num'] == 2
    with pytest.raises(ValueError, match=r'ckpt.pt is damaged: \S+ fails its CRC-32 check'):
        load_checkpoint(str(path))
    with pytest.raises(SystemExit, match='damaged'):
        run(data_dir, str(out), '--max_iters=4', '--init_from=resume')


def test_mfu_counts_the_samples_a_process_runs(data_dir, tmp_path, monkeypatch):
    """At 16 processes, 32 sequences per step are 2 per process: MFU counts those 2, not a whole
    micro-batch of 16 (which overstated it 8 times). Mocked: one process that believes it is rank 0 of 16."""
    real_setup = train.setup

    def rank_0_of_16(cfg, signals):
        env = real_setup(cfg, signals)
        env.world = 16
        return env
    monkeypatch.setattr(train, 'setup', rank_0_of_16)
    peak = 1e12
    assert run(data_dir, str(tmp_path / 'mfu'), '--batch_size=16', '--gradient_accumulation_steps=2',
               '--eval_samples=16', '--max_iters=3', '--eval_interval=3', f'--peak_flops={peak}') == 0
    n_params = json.load(open(tmp_path / 'mfu' / 'summary.json'))['n_params']
    L, C, T = 2, 32, 16
    for r in records(tmp_path / 'mfu', 'step')[1:]:  # the first step is not timed
        flops = (6 * n_params + 12 * L * C * T) * T * 2  # PaLM's per token, x tokens of 2 sequences
        assert r['mfu'] == pytest.approx(flops / (r['ms_per_iter'] / 1000) / peak, rel=1e-6)


def test_init_from_a_path_takes_its_weights_only(data_dir, tmp_path):
    """init_from=PATH: another run's weights (a run folder or its file), the optimizer and the loop fresh;
    shapes that do not fit name the tensor; a path that is not there says what init_from takes."""
    source, tuned = str(tmp_path / 'source'), str(tmp_path / 'tuned')
    run(data_dir, source, '--max_iters=4', '--eval_interval=2')
    assert run(data_dir, tuned, '--max_iters=0', f'--init_from={source}') == 0  # saved at iter 0
    a = torch.load(os.path.join(source, 'ckpt.pt'), weights_only=True)
    b = torch.load(os.path.join(tuned, 'ckpt.pt'), weights_only=True)
    assert a['model'].keys() == b['model'].keys()
    assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'])
    moments = b['optimizer']['state'].values()  # AdamW's fresh: zero moments, as made to be saved
    assert all(not m['exp_avg'].any() and not m['exp_avg_sq'].any() for m in moments)
    assert all(m['step'] == 4 for m in a['optimizer']['state'].values())
    assert (b['iter_num'], b['best_iter'], records(tuned, 'eval')[0]['val_loss']) == (
        0, 0, pytest.approx(records(source, 'eval')[-1]['val_loss'], abs=1e-6))
    with pytest.raises(SystemExit, match=r"do not fit the model.*size mismatch for "
                                         r"transformer\.wte\.weight"):
        run(data_dir, tmp_path / 'wide', '--n_embd=64', f"--init_from={source}/ckpt.pt")
    with pytest.raises(SystemExit, match="init_from='nowhere': use 'scratch', 'resume', 'auto' or"):
        run(data_dir, tmp_path / 'none', '--init_from=nowhere')


def test_deterministic_runs_repeat_bitwise(data_dir, tmp_path):
    """deterministic=True: PyTorch's deterministic algorithms (and cuBLAS's workspace on a GPU); two runs
    with dropout give the same bytes."""
    outs = [str(tmp_path / name) for name in ('a', 'b')]
    try:
        for out in outs:
            run(data_dir, out, '--max_iters=3', '--eval_interval=3', '--dropout=0.1',
                '--deterministic=True')
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
    a, b = (torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)['model'] for out in outs)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_micro_batch_changes_nothing_but_the_speed(data_dir, tmp_path):
    """64 sequences a step as 1 x 64 or 8 x 8 and 40 eval windows (one padded micro-batch of 64 rows,
    or 5 of 8): the same step and eval losses, accuracies, saturation and norm input spread (fp32
    sums in another order: 1e-5); 10 windows in warmup (spread over the 40), all 40 after."""
    args = ['--max_iters=4', '--eval_interval=2', '--warmup_iters=2', '--eval_samples=40',
            '--norm=dyt', '--dyt_alpha=2.0', '--emb_init_std=0.5']  # saturated in part
    logs = {}
    for batch, steps in ((64, 1), (8, 8)):
        out = str(tmp_path / f'{batch}x{steps}')
        assert run(data_dir, out, *args, f'--batch_size={batch}',
                   f'--gradient_accumulation_steps={steps}', '--eval_samples_warmup=10') == 0
        logs[batch] = records(out, 'step'), records(out, 'eval')
    (steps_a, evals_a), (steps_b, evals_b) = logs[64], logs[8]
    assert [r['loss'] for r in steps_a] == pytest.approx([r['loss'] for r in steps_b], abs=1e-5)
    for a, b in zip(evals_a, evals_b, strict=True):
        for key in ('train_loss', 'val_loss', 'train_acc', 'val_acc'):
            assert a[key] == pytest.approx(b[key], abs=1e-5)
        assert a['saturation'] == pytest.approx(b['saturation'], abs=1e-6) and a['saturation'][0] > 0.01
        for name, layer in a['norm_layers'].items():
            assert layer['input_std'] == pytest.approx(b['norm_layers'][name]['input_std'], rel=1e-5)
        assert a['seconds'] > 0
    full = str(tmp_path / 'full')  # no warmup subset: the same evals after warmup, not before
    assert run(data_dir, full, *args, '--batch_size=8', '--gradient_accumulation_steps=8') == 0
    (first, *later), (first_all, *later_all) = evals_b, records(full, 'eval')
    assert first['val_loss'] != pytest.approx(first_all['val_loss'], abs=1e-4)
    assert [r['val_loss'] for r in later] == pytest.approx([r['val_loss'] for r in later_all], abs=1e-6)


EAGER_COMPILE = """
import functools, sys
import torch
import train
torch.compile = functools.partial(torch.compile, backend='eager')  # dynamo's guards, no inductor
sys.exit(train.main(sys.argv[1:]))
"""


def test_compiled_ddp_builds_one_graph_for_training_and_one_for_eval(data_dir, tmp_path):
    """Static shapes: on 2 processes, 9 eval windows (shares of 4 and 5), 5 in warmup, 3 sequences a
    process a step: every forward runs 3 rows (padded; before, micro-batches of 2 and 3 made the
    batch size symbolic) and the norm statistics do not change the graph. TORCH_LOGS=recompiles: each
    compiled frame recompiles once, for grad mode (training after eval), and never again. The losses
    are one eager process's (1e-5). Dynamo's guards with its eager backend: inductor adds only time."""
    script = tmp_path / 'eager_compile.py'
    script.write_text(EAGER_COMPILE)
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--batch_size=3',
            '--gradient_accumulation_steps=2', '--eval_samples=9', '--eval_samples_warmup=5',
            '--max_iters=6', '--eval_interval=2', '--warmup_iters=3', '--norm=dyt']
    one, two = str(tmp_path / 'one'), str(tmp_path / 'two')
    assert train.main(args + [f'--out_dir={one}']) == 0
    proc = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                           '--nproc_per_node=2', str(script), *args, '--compile=True',
                           f'--out_dir={two}'], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=REPO,
                                   TORCH_LOGS='recompiles'))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        lines = [line for line in proc.stderr.splitlines() if line.startswith(f'[rank{rank}]')]
        frames = [line.split('Recompiling function ')[1].split()[0] for line in lines
                  if 'Recompiling function' in line]
        reasons = [line for line in lines if re.search(r'\] +- \d+/\d+: ', line)]
        assert 'forward' in frames and len(frames) == len(set(frames))  # each frame once
        assert len(reasons) == len(frames) and all('grad_mode' in r for r in reasons), reasons
    for event, key in (('step', 'loss'), ('eval', 'val_loss'), ('eval', 'train_loss')):
        a, b = records(one, event), records(two, event)
        assert len(a) == len(b) > 0 and [r[key] for r in a] == pytest.approx([r[key] for r in b],
                                                                             abs=1e-5)
