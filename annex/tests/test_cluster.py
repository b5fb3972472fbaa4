"""annex/cluster.py: train.py over several processes (torchrun's DDP and FSDP2, HSDP, Slurm's srun) gives
the single process's run, and build_sharded the single process's weights."""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

import train
from checkpoint import build_model
from configurator import configure
from tests.common import tiny

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4',
        '--eval_iters=2', '--log_interval=1', '--learning_rate=1e-2', '--warmup_iters=2',
        '--lr_decay_iters=40', '--min_lr=1e-3',
        '--emb_init_std=0.02']  # GPT-2's init: losses near ln(64), so 1 and 2 processes agree to 1e-5
ENV = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=REPO)


def records(out_dir, event):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [r for r in map(json.loads, f) if r['event'] == event]


def torchrun(nproc, script, *args):
    return subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                           f'--nproc_per_node={nproc}', script, *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=300)


STOP_AT = """
import os, signal, sys
import train
real_get_lr, sent = train.get_lr, []


def get_lr(it, cfg):  # before each step's forward: as a scheduler would, a signal to one process mid-run
    if it == {it} and os.environ['RANK'] == '{rank}' and not sent:  # once: an eval's record reads it too
        sent.append(it)
        os.kill(os.getpid(), signal.{sig})
    return real_get_lr(it, cfg)


train.get_lr = get_lr
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.parametrize('fsdp', [False, True])
def test_torchrun_two_processes_match_one(data_dir, tmp_path, fsdp):
    # 3 micro-batches of 4 = 12 sequences per step: 6 per process, as 2 micro-batches of 3 each
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--gradient_accumulation_steps=3',
            '--max_iters=6', '--eval_interval=3', '--norm=dyt', '--dyt_alpha=2.0', f'--fsdp={fsdp}',
            '--embed_scale=True']  # a 1-element parameter: FSDP2 refuses to shard a 0-dim one
    one, two = str(tmp_path / 'one'), str(tmp_path / 'two')
    train.main(args + [f'--out_dir={one}'])
    (tmp_path / 'stop_at.py').write_text(STOP_AT.format(it=3, rank=1, sig='SIGUSR1'))
    # FSDP is also stopped by a signal to one process after step 3, and resumes exactly with the same
    # command (the optimizer state is gathered, written, read on rank 0, broadcast and re-sharded).
    # DDP runs compiled (wrapped, then compiled: its all-reduce overlaps the backward) against the eager
    # single process
    stop = [(str(tmp_path / 'stop_at.py'), 1)] if fsdp else []
    for script, status in stop + [('train.py', 0)]:
        proc = torchrun(2, script, *args, f'--out_dir={two}', '--init_from=auto',
                        f'--compile={not fsdp}')
        assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr[-3000:]  # torchrun: 4 -> 1
        assert ('global batch: 12 sequences x 16 tokens = 192 tokens/step (2 process(es) x 2 '
                'micro-batch(es)') in proc.stdout
    if fsdp:
        assert [r['iter'] for r in records(two, 'stopped')] == [4]
    for event, key in (('step', 'loss'), ('eval', 'val_loss'), ('eval', 'train_loss')):
        a, b = records(one, event), records(two, event)
        assert len(a) == len(b) > 0
        assert [r[key] for r in a] == pytest.approx([r[key] for r in b], abs=1e-5)
    sat1, sat2 = records(one, 'eval')[-1]['saturation'], records(two, 'eval')[-1]['saturation']
    assert sat1 == pytest.approx(sat2, abs=1e-6)
    alphas1, alphas2 = (json.load(open(os.path.join(d, 'summary.json')))['alphas'] for d in (one, two))
    assert alphas1 == pytest.approx(alphas2, abs=1e-6)
    w1, w2 = (torch.load(os.path.join(d, 'ckpt.pt'), weights_only=True)['model'] for d in (one, two))
    assert w1.keys() == w2.keys() and all(torch.allclose(w1[k], w2[k], atol=1e-5) for k in w1)


def test_hsdp_on_four_processes_matches_one(data_dir, tmp_path):
    """HSDP (fsdp_shard=2: a 2 x 2 mesh, sharded within pairs, replicated across them), stopped by a
    signal to one process after step 3 and resumed with the same command: the single process's losses and
    final weights."""
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--max_iters=6', '--eval_interval=3',
            '--norm=dyt', '--fsdp=True', '--fsdp_shard=2']
    one, four = str(tmp_path / 'one'), str(tmp_path / 'four')
    train.main(args + [f'--out_dir={one}'])
    (tmp_path / 'stop_at.py').write_text(STOP_AT.format(it=3, rank=2, sig='SIGTERM'))
    for script, status in ((str(tmp_path / 'stop_at.py'), 1), ('train.py', 0)):
        proc = torchrun(4, script, *args, f'--out_dir={four}', '--init_from=auto')
        assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [r['iter'] for r in records(four, 'stopped')] == [4]
    for event, key in (('step', 'loss'), ('eval', 'val_loss')):
        losses = [r[key] for r in records(four, event)]
        assert [r[key] for r in records(one, event)] == pytest.approx(losses, abs=1e-5)
    w1, w4 = (torch.load(os.path.join(d, 'ckpt.pt'), weights_only=True)['model'] for d in (one, four))
    assert w1.keys() == w4.keys() and all(torch.allclose(w1[k], w4[k], atol=1e-5) for k in w1)
    # out_dir in tmp_path: not the out/ of `python train.py`
    cfg = configure(train.DEFAULTS, ['--fsdp=True', '--fsdp_shard=3', f'--out_dir={tmp_path / "check"}'],
                    train.OPTIONAL_TYPES)
    with pytest.raises(SystemExit, match="fsdp_shard=3 needs fsdp=True and must divide the 4 processes "
                                         "\\(a node's GPUs\\)"):
        train.resolve(train.SimpleNamespace(**cfg), 4)


def test_srun_starts_one_process_per_task(data_dir, tmp_path):
    """Under srun (docs/cluster.md's Slurm script) there is no torchrun: train.py takes rank and world
    from Slurm."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    out = str(tmp_path / 'srun')
    procs = [subprocess.Popen([sys.executable, 'train.py', '--dataset=tiny', f'--data_dir={data_dir}',
                               *TINY, '--max_iters=2', '--eval_interval=2', f'--out_dir={out}'],
                              cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=dict(ENV, SLURM_NTASKS='2', SLURM_PROCID=str(rank),
                                       SLURM_LOCALID=str(rank), MASTER_ADDR='127.0.0.1',
                                       MASTER_PORT=str(port)))
             for rank in (0, 1)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert '(2 process(es) x 1 micro-batch(es) of <= 4)' in outputs[0]
    assert 'global batch' not in outputs[1]
    assert json.load(open(os.path.join(out, 'summary.json')))['status'] == 'finished'


SHARDED = """
import gc
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from annex.cluster import build_sharded

dist.init_process_group('gloo')
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1000 + rank)  # no generator may matter but the one build_sharded seeds on rank 0
cfg = SimpleNamespace(seed={seed}, compile=False, fsdp_shard={fsdp_shard})
env = SimpleNamespace(device='cpu', device_type='cpu', world=world, master=rank == 0)
raw = build_sharded({model_args!r}, cfg, env)
weights = get_model_state_dict(raw, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
tied = not hasattr(raw, 'lm_head') or raw.lm_head.weight is raw.transformer.wte.weight
torch.save(dict(weights=weights, buffers=dict(raw.named_buffers()), tied=tied,
                params=[n for n, _ in raw.named_parameters()]), sys.argv[1] + str(rank))
del raw, weights
gc.collect()  # the sharded model freed before its process group: else gloo can abort at exit (1 run in 3)
dist.destroy_process_group()
"""
GPT_ARGS = dict(vars(tiny(bias=True, norm='dyt', attn='diff', mlp='swiglu', pos='rope', n_kv_head=2,
                          embed_scale=True, dyt_alpha_final=1.5)))
VIT_ARGS = dict(n_layer=2, n_head=2, n_embd=32, image_size=8, patch_size=4, bias=True, norm='dyt')


@pytest.mark.parametrize('model_args,fsdp_shard', [(GPT_ARGS, 0), (GPT_ARGS, 1), (VIT_ARGS, 0)],
                         ids=['gpt', 'gpt-hsdp', 'vit'])
def test_sharded_model_has_the_single_process_weights(tmp_path, model_args, fsdp_shard):
    """build_sharded builds on the meta device and shards (fsdp_shard=1: HSDP's 2-D mesh); gathered
    whole, its weights, and each process's buffers (RoPE's tables), are those of the model a single
    process builds from the same seed."""
    script = SHARDED.format(seed=21, fsdp_shard=fsdp_shard, model_args=model_args)
    (tmp_path / 'sharded.py').write_text(script)
    proc = torchrun(2, str(tmp_path / 'sharded.py'), str(tmp_path / 'rank'))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    torch.manual_seed(21)
    whole = build_model(model_args)
    want = whole.state_dict()
    for rank in (0, 1):
        got = torch.load(tmp_path / f'rank{rank}', weights_only=True)
        assert got['tied'] and got['params'] == [n for n, _ in whole.named_parameters()]
        assert got['buffers'].keys() == dict(whole.named_buffers()).keys()
        for name, buf in whole.named_buffers():
            assert torch.equal(got['buffers'][name], buf), name
    weights = torch.load(tmp_path / 'rank0', weights_only=True)['weights']
    assert weights.keys() == want.keys()
    for k in want:
        assert torch.equal(weights[k], want[k]), k
    torch.manual_seed(22)  # the seed matters
    name = 'transformer.h.0.attn.c_attn.weight'
    assert not torch.equal(build_model(model_args).state_dict()[name], want[name])
