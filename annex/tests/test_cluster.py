"""annex/cluster.py: train.py over several processes (torchrun's DDP and FSDP2, HSDP, Slurm's srun) gives
the single process's run, and build_sharded the single process's weights."""
import json
import math
import os
import socket
import shutil
import subprocess
import sys
import time

import pytest
import torch

import analyze
import annex.cluster as cluster
import annex.eval as eval_annex
import sample
import train
from checkpoint import build_model, load_checkpoint
from configurator import configure
from distributed import check_train_config
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


def torchrun(nproc, script, *args, **env):
    return subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                           f'--nproc_per_node={nproc}', script, *args], cwd=REPO, env=dict(ENV, **env),
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


MODES = {  # processes, micro-batches per step, options
    'ddp': (2, 3, []),
    'fsdp': (2, 3, ['--fsdp=True']),
    'hsdp': (4, 2, ['--fsdp=True', '--fsdp_shard=2']),  # a 2 x 2 mesh: pairs shard, and replicate
}


def exported(out_dir):  # the sharded checkpoint as one file: (weights, AdamW state)
    cluster.export(out_dir)
    ckpt = torch.load(os.path.join(out_dir, 'ckpt.pt'), weights_only=True)
    return ckpt['model'], ckpt['optimizer']['state']


@pytest.mark.parametrize('mode', list(MODES))
def test_sharded_runs_match_one_process_and_resume_exactly(data_dir, tmp_path, mode):
    """24 sequences per step (6 micro-batches of 4 for one process; 3 of 4 per process on 2; 2 of 3 on 4,
    so HSDP all-reduces once after two): the single process's losses and weights (1e-5). Each run saves
    shards (ckpt.dcp/); stopped by a signal to one process after step 3 and resumed from them with the same
    command, a run ends bitwise where an uninterrupted one does, weights and AdamW state."""
    nproc, micro, options = MODES[mode]
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--gradient_accumulation_steps=6',
            '--max_iters=6', '--eval_interval=3', '--norm=dyt', '--dyt_alpha=2.0', '--embed_scale=True',
            '--shard_checkpoints_above=0', *options]  # embed_scale: FSDP2 cannot shard a 0-dim parameter
    one, whole, part = (str(tmp_path / name) for name in ('one', 'whole', 'part'))
    train.main(args[:len(args) - len(options)] + ['--shard_checkpoints_above=1e9', f'--out_dir={one}'])
    (tmp_path / 'stop_at.py').write_text(STOP_AT.format(it=3, rank=1, sig='SIGUSR1'))
    runs = [('train.py', whole, 0), (str(tmp_path / 'stop_at.py'), part, 1), ('train.py', part, 0)]
    for script, out, status in runs:
        proc = torchrun(nproc, script, *args, f'--out_dir={out}', '--init_from=auto', TORCH_LOGS='recompiles')
        assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr[-3000:]  # torchrun: 4 -> 1
        assert (f'global batch: 24 sequences x 16 tokens = 384 tokens/step ({nproc} process(es) x {micro} '
                'micro-batch(es)') in proc.stdout
        assert 'recompile_limit' not in proc.stderr and 'cache_size_limit' not in proc.stderr
    assert [r['iter'] for r in records(part, 'stopped')] == [4]
    assert not os.path.exists(os.path.join(part, 'ckpt.pt'))  # shards only: ckpt.dcp/
    for event, key in (('step', 'loss'), ('eval', 'val_loss'), ('eval', 'train_loss')):
        a, b, c = records(one, event), records(whole, event), records(part, event)
        assert len(a) == len(b) == len(c) > 0
        assert [r[key] for r in b] == [r[key] for r in c]
        assert [r[key] for r in a] == pytest.approx([r[key] for r in b], abs=1e-5)
    sat1, sat2 = records(one, 'eval')[-1]['saturation'], records(whole, 'eval')[-1]['saturation']
    assert sat1 == pytest.approx(sat2, abs=1e-6)
    (w_whole, adam_whole), (w_part, adam_part) = exported(whole), exported(part)
    assert w_whole.keys() == w_part.keys() and all(torch.equal(w_whole[k], w_part[k]) for k in w_whole)
    assert adam_whole.keys() == adam_part.keys() and all(
        torch.equal(adam_whole[k][m], adam_part[k][m]) for k in adam_whole for m in adam_whole[k])
    w1 = torch.load(os.path.join(one, 'ckpt.pt'), weights_only=True)['model']
    assert w1.keys() == w_whole.keys() and all(torch.allclose(w1[k], w_whole[k], atol=1e-5) for k in w1)


def test_fsdp_compiled_matches_one_process_and_its_shards_export(data_dir, tmp_path):
    """FSDP on 2 processes with each block compiled (eval included): the single eager process's losses
    and weights (1e-5), within torch.compile's recompile limit (TORCH_LOGS=recompiles: each block has a
    graph for training and two for eval, with and without the norm statistics). Its shards export to the
    file a single-process run writes: sample.py, analyze.py and annex/eval.py read it, and train.py resumes
    from it as from the shards. A byte changed in one shard is refused."""
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--max_iters=4', '--eval_interval=2',
            '--norm=dyt', '--embed_scale=True',
            '--vocab_size=320']  # every byte id has an embedding: annex/eval.py requires it
    one, out, copy = str(tmp_path / 'one'), str(tmp_path / 'run'), str(tmp_path / 'copy')
    train.main(args + [f'--out_dir={one}'])
    proc = torchrun(2, 'train.py', *args, '--fsdp=True', '--compile=True', '--shard_checkpoints_above=0',
                    f'--out_dir={out}', TORCH_LOGS='recompiles')
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'Recompiling function forward' in proc.stderr  # the log is on
    assert 'recompile_limit' not in proc.stderr and 'cache_size_limit' not in proc.stderr
    for event, key in (('step', 'loss'), ('eval', 'val_loss'), ('eval', 'train_loss')):
        a, b = records(one, event), records(out, event)
        assert len(a) == len(b) > 0 and [r[key] for r in a] == pytest.approx([r[key] for r in b], abs=1e-5)
    best, latest = (os.stat(os.path.join(out, name, '__0_0.distcp')) for name in ('best.dcp', 'ckpt.dcp'))
    assert best.st_ino == latest.st_ino  # the last eval improved: best.dcp/ links to its files, no copy
    shutil.copytree(out, copy)
    with pytest.raises(FileNotFoundError, match='export it first: python annex/cluster.py export .*best'):
        load_checkpoint(out, which='best')
    with pytest.raises(FileNotFoundError, match=r'export .* --which=best$'):  # sample.py's, analyze's
        load_checkpoint(os.path.join(out, 'best.pt'))
    assert cluster.export(out, 'best') == os.path.join(out, 'best.pt')
    weights, _ = exported(out)
    w1 = torch.load(os.path.join(one, 'ckpt.pt'), weights_only=True)['model']
    assert w1.keys() == weights.keys() and all(torch.allclose(w1[k], weights[k], atol=1e-5) for k in w1)
    model, ckpt = load_checkpoint(out)
    assert ckpt['iter_num'] == 4 and ckpt['config']['shard_checkpoints_above'] == 0
    sample.main([f'--out_dir={out}', '--max_new_tokens=3', '--num_samples=1'])
    analyze.main(['saturation', out])
    [result] = eval_annex.main([out, '--tasks=val'])
    assert math.isfinite(result['tasks']['val']['ppl'])
    # resumed from the exported file in one process: the shards' weights
    shutil.rmtree(os.path.join(out, 'ckpt.dcp'))
    assert train.main(args + [f'--out_dir={out}', '--max_iters=5', '--init_from=resume']) == 0
    shard = os.path.join(copy, 'ckpt.dcp', '__1_0.distcp')
    data = bytearray(open(shard, 'rb').read())
    data[len(data) // 2] ^= 1
    open(shard, 'wb').write(bytes(data))
    with pytest.raises(SystemExit, match='ckpt.dcp is damaged: __1_0.distcp fail'):
        cluster.export(copy)


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def srun(script, args, port, **env):
    """Two processes started as srun starts them (no torchrun: no agent that ends the others when one
    fails), with a job step's Slurm variables: (status, output) of each, and the seconds until both ended."""
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, script, *args], cwd=REPO, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT,
                              env=dict(ENV, SLURM_NTASKS='16', SLURM_STEP_NUM_TASKS='2', SLURM_JOB_ID='4321',
                                       SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank),
                                       MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), **env))
             for rank in (0, 1)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    return [p.returncode for p in procs], outputs, time.time() - t0


def test_srun_starts_one_process_per_task(data_dir, tmp_path):
    """launcher='srun' (docs/cluster.md's Slurm script): rank and world from the job step's variables
    (SLURM_STEP_NUM_TASKS=2, not the allocation's SLURM_NTASKS=16)."""
    out = str(tmp_path / 'srun')
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--max_iters=2', '--eval_interval=2',
            f'--out_dir={out}', '--launcher=srun']
    status, outputs, _ = srun('train.py', args, free_port())
    assert status == [0, 0], outputs
    assert '(2 process(es) x 1 micro-batch(es) of <= 4)' in outputs[0]
    assert 'global batch' not in outputs[1]
    assert json.load(open(os.path.join(out, 'summary.json')))['status'] == 'finished'


def test_an_allocation_s_variables_alone_start_one_process(data_dir, tmp_path, monkeypatch):
    """A plain `python train.py` inside a 16-task allocation (sbatch, salloc, a study.py child) trains
    alone at once: it does not wait for 15 peers. launcher='srun' outside a job step says what is missing,
    and the port comes from the job id when none is given."""
    monkeypatch.setattr(os, 'environ', dict(os.environ, SLURM_NTASKS='16', SLURM_PROCID='3',
                                            SLURM_LOCALID='3', SLURM_JOB_ID='4321', MASTER_ADDR='127.0.0.1'))
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_PORT'):
        os.environ.pop(key, None)
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--max_iters=1', '--eval_interval=1']
    assert train.main(args + [f'--out_dir={tmp_path / "alone"}']) == 0
    assert json.load(open(tmp_path / 'alone' / 'summary.json'))['status'] == 'finished'
    with pytest.raises(SystemExit, match="launcher='srun', but SLURM_STEP_NUM_TASKS is not set"):
        train.main(args + [f'--out_dir={tmp_path / "srun"}', '--launcher=srun'])
    os.environ['SLURM_STEP_NUM_TASKS'] = '16'
    cluster.srun_environment()
    assert (os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_PORT']) == ('3', '16', '24321')
    with pytest.raises(SystemExit, match="launcher='torchrun': use 'srun' or None"):
        train.main(args + [f'--out_dir={tmp_path / "bad"}', '--launcher=torchrun'])


FULL_DISK = """
import sys

import checkpoint
import train


def save_checkpoint(state, out_dir, best=False):  # rank 0's disk is full at the first save (step 2)
    raise OSError(28, 'No space left on device')


checkpoint.save_checkpoint = save_checkpoint
sys.exit(train.main(sys.argv[1:]))
"""


def test_a_failed_save_ends_every_process_at_once(data_dir, tmp_path):
    """Rank 0's checkpoint write raises: both processes exit with status 1 within seconds (not after an
    hour in a barrier), each saying why."""
    (tmp_path / 'full_disk.py').write_text(FULL_DISK)
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--max_iters=4', '--eval_interval=2',
            f'--out_dir={tmp_path / "out"}', '--launcher=srun']
    status, outputs, seconds = srun(str(tmp_path / 'full_disk.py'), args, free_port())
    assert status == [1, 1], outputs
    assert 'checkpoint at iter 2 not saved (OSError: [Errno 28] No space left on device)' in outputs[0]
    assert 'checkpoint at iter 2 not saved (on another process)' in outputs[1]
    assert seconds < 30  # startup included (about 5 s here)


RSS = """
import ctypes, gc, json, sys
from types import SimpleNamespace

import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from annex.cluster import build_sharded, save_sharded
from checkpoint import save_checkpoint, training_state


def added_peak(save):  # bytes of resident memory a save adds at its peak, from Linux's VmHWM
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)  # freed pages back to the OS: none reused unseen by the peak
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')  # the peak reset to the present
    status = lambda key: next(int(line.split()[1]) * 1024 for line in open('/proc/self/status')
                              if line.startswith(key))
    before = status('VmRSS')
    save()
    return status('VmHWM') - before


dist.init_process_group('gloo')
rank, world = dist.get_rank(), dist.get_world_size()
env = SimpleNamespace(device='cpu', device_type='cpu', world=world, rank=rank, master=rank == 0,
                      groups=[None], ddp=True)
args = dict(block_size=64, vocab_size=4096, n_layer=4, n_head=4, n_embd=384, bias=False)
raw = build_sharded(args, SimpleNamespace(seed=0, compile=False, fsdp_shard=0, fsdp_bf16=False), env)
optimizer = raw.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
get_optimizer_state_dict(raw, optimizer)  # AdamW's moments made, as after a step


def whole_file():  # as train.py saves a small run: gathered to rank 0, one file
    state = training_state(raw, optimizer, model_args=args)
    if rank == 0:
        save_checkpoint(state, sys.argv[1])


sharded = added_peak(lambda: save_sharded(raw, optimizer, dict(model_args=args), sys.argv[1], False, env))
whole = added_peak(whole_file)
if rank == 0:
    state_bytes = 12 * sum(p.numel() for p in raw.parameters())
    json.dump(dict(whole=whole, sharded=sharded, state=state_bytes), open(sys.argv[1] + '/rss.json', 'w'))
del raw, optimizer
gc.collect()
dist.destroy_process_group()
"""


@pytest.mark.skipif(not os.path.exists('/proc/self/clear_refs'), reason="needs Linux's /proc (VmHWM)")
def test_a_sharded_save_needs_a_share_of_rank_0_s_memory(tmp_path):
    """FSDP on 2 processes, a 104 MB training state (8.7M parameters: fp32 weights and AdamW's two
    moments): gathered into one file, rank 0's resident memory peaks at about the whole state above what
    it held; writing its shards, at about half of it."""
    (tmp_path / 'rss.py').write_text(RSS)
    (tmp_path / 'out').mkdir()
    proc = torchrun(2, str(tmp_path / 'rss.py'), str(tmp_path / 'out'))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rss = json.load(open(tmp_path / 'out' / 'rss.json'))
    assert 0.9 * rss['state'] < rss['whole'] < 1.3 * rss['state']
    assert rss['sharded'] < 0.6 * rss['whole']  # 1/2, and what DCP adds; measured 0.02-0.04 (2 processes)


def test_fsdp_shard_must_divide_the_processes(tmp_path):
    cfg = configure(train.DEFAULTS, ['--fsdp=True', '--fsdp_shard=3', f'--out_dir={tmp_path / "check"}'],
                    train.OPTIONAL_TYPES)
    with pytest.raises(SystemExit, match="fsdp_shard=3 needs fsdp=True and must divide the 4 processes "
                                         "\\(a node's GPUs\\)"):
        check_train_config(train.SimpleNamespace(**cfg), 4)


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
for case, (model_args, fsdp_shard) in enumerate({cases!r}):
    torch.manual_seed(1000 + rank)  # no generator may matter but the one build_sharded seeds on rank 0
    cfg = SimpleNamespace(seed=21, compile=False, fsdp_shard=fsdp_shard, fsdp_bf16=False)
    env = SimpleNamespace(device='cpu', device_type='cpu', world=world, master=rank == 0, groups=[None])
    raw = build_sharded(model_args, cfg, env)
    weights = get_model_state_dict(raw, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    tied = not hasattr(raw, 'lm_head') or raw.lm_head.weight is raw.transformer.wte.weight
    torch.save(dict(weights=weights, buffers=dict(raw.named_buffers()), tied=tied,
                    params=[n for n, _ in raw.named_parameters()]), f'{{sys.argv[1]}}{{case}}_{{rank}}')
    del raw, weights
gc.collect()  # the sharded model freed before its process group: else gloo can abort at exit (1 run in 3)
dist.destroy_process_group()
"""
GPT_ARGS = dict(vars(tiny(bias=True, norm='dyt', attn='diff', mlp='swiglu', pos='rope', n_kv_head=2,
                          embed_scale=True, dyt_alpha_final=1.5)))
VIT_ARGS = dict(n_layer=2, n_head=2, n_embd=32, image_size=8, patch_size=4, bias=True, norm='dyt')


def test_sharded_model_has_the_single_process_weights(tmp_path):
    """build_sharded builds on the meta device and shards (a GPT; HSDP's 2-D mesh with fsdp_shard=1; a
    ViT); gathered whole, its weights, and each process's buffers (RoPE's tables), are those of the model
    a single process builds from the same seed."""
    cases = [(GPT_ARGS, 0), (GPT_ARGS, 1), (VIT_ARGS, 0)]
    (tmp_path / 'sharded.py').write_text(SHARDED.format(cases=cases))
    proc = torchrun(2, str(tmp_path / 'sharded.py'), str(tmp_path / 'case'))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for case, (model_args, _) in enumerate(cases):
        torch.manual_seed(21)
        whole = build_model(model_args)
        want = whole.state_dict()
        for rank in (0, 1):
            got = torch.load(tmp_path / f'case{case}_{rank}', weights_only=True)
            assert got['tied'] and got['params'] == [n for n, _ in whole.named_parameters()]
            assert got['buffers'].keys() == dict(whole.named_buffers()).keys()
            for name, buf in whole.named_buffers():
                assert torch.equal(got['buffers'][name], buf), (case, name)
        weights = torch.load(tmp_path / f'case{case}_0', weights_only=True)['weights']
        assert weights.keys() == want.keys()
        for k in want:
            assert torch.equal(weights[k], want[k]), (case, k)
        torch.manual_seed(22)  # the seed matters
        name = 'transformer.h.0.attn.c_attn.weight'
        assert not torch.equal(build_model(model_args).state_dict()[name], want[name])


def test_fsdp_bf16_gathers_track_fp32(data_dir, tmp_path):
    """fsdp_bf16=True (opt-in): FSDP gathers bf16 copies of the weights for forward and backward and
    reduces gradients in fp32; with no autocast (CPU, float32) the whole model then computes in bf16, and
    its losses stay within 5e-2 nats of the fp32 run's over 4 steps; the stored weights stay fp32."""
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--max_iters=4', '--eval_interval=4',
            '--fsdp=True', '--norm=dyt', '--embed_scale=True']
    one, mixed = str(tmp_path / 'one'), str(tmp_path / 'mixed')
    train.main(args + [f'--out_dir={one}'])
    proc = torchrun(2, 'train.py', *args, '--fsdp_bf16=True', f'--out_dir={mixed}')
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    a, b = [r['loss'] for r in records(one, 'step')], [r['loss'] for r in records(mixed, 'step')]
    assert len(a) == len(b) == 4 and a == pytest.approx(b, abs=5e-2) and a != pytest.approx(b, abs=1e-6)
    weights = torch.load(os.path.join(mixed, 'ckpt.pt'), weights_only=True)['model']
    assert all(w.dtype == torch.float32 for w in weights.values())
