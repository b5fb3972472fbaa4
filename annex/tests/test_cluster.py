"""annex/cluster.py: train.py over several processes (torchrun's DDP and FSDP2, HSDP, Slurm's srun) gives
the single process's run, and build_sharded the single process's weights."""
import json
import math
import os
import socket
import shutil
import subprocess
import sys
import threading
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
        '--eval_samples=8', '--log_interval=1', '--learning_rate=1e-2', '--warmup_iters=2',
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
    ckpt = torch.load(cluster.export(out_dir), weights_only=True)
    return ckpt['model'], ckpt['optimizer']['state']


@pytest.mark.parametrize('mode', list(MODES))
def test_sharded_runs_match_one_process_and_resume_exactly(data_dir, tmp_path, mode):
    """24 sequences per step (6 micro-batches of 4 for one process; 3 of 4 per process on 2; 2 of 3 on 4,
    so HSDP all-reduces once after two): the single process's losses and weights (1e-5). Each run saves
    shards (ckpt.dcp/); stopped by a signal to one process after step 3 and resumed from them with the same
    command, a run ends bitwise where an uninterrupted one does, weights and AdamW state. Saves are
    asynchronous (async_save=True): written in the background as the steps go on."""
    nproc, micro, options = MODES[mode]
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--gradient_accumulation_steps=6',
            '--max_iters=6', '--eval_interval=3', '--norm=dyt', '--dyt_alpha=2.0', '--embed_scale=True',
            '--shard_checkpoints_above=0', '--async_save=True',
            *options]  # embed_scale: FSDP2 cannot shard a 0-dim parameter
    one, whole, part = (str(tmp_path / name) for name in ('one', 'whole', 'part'))
    train.main(args[:len(args) - len(options)] + ['--shard_checkpoints_above=1e9', f'--out_dir={one}'])
    assert all(r['background'] for r in records(one, 'saved'))
    (tmp_path / 'stop_at.py').write_text(STOP_AT.format(it=3, rank=1, sig='SIGUSR1'))
    runs = [('train.py', whole, 0), (str(tmp_path / 'stop_at.py'), part, 1), ('train.py', part, 0)]
    for script, out, status in runs:
        proc = torchrun(nproc, script, *args, f'--out_dir={out}', '--init_from=auto', TORCH_LOGS='recompiles')
        assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr[-3000:]  # torchrun: 4 -> 1
        assert (f'global batch: 24 sequences x 16 tokens = 384 tokens/step ({nproc} process(es) x {micro} '
                'micro-batch(es)') in proc.stdout
        assert 'recompile_limit' not in proc.stderr and 'cache_size_limit' not in proc.stderr
    assert [r['iter'] for r in records(part, 'stopped')] == [4]
    assert {r['background'] for r in records(whole, 'saved')} == {mode != 'ddp'}  # DDP's shards: now
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
    assert cluster.export(out, 'best') == os.path.join(out, 'export', 'best-4.pt')
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
    shutil.copy(os.path.join(out, 'export', 'ckpt-4.pt'), os.path.join(out, 'ckpt.pt'))
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
    assert '(2 process(es) x 1 micro-batch(es) of 2)' in outputs[0]
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
    assert (os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_PORT']) == ('3', '16', '14321')
    with pytest.raises(SystemExit, match="launcher='torchrun': use 'srun' or None"):
        train.main(args + [f'--out_dir={tmp_path / "bad"}', '--launcher=torchrun'])


FULL_DISK = """
import sys

import annex.cluster
import checkpoint
import train


def save_checkpoint(state, out_dir, best=False):  # rank 0's disk is full at the first save (step 2)
    raise OSError(28, 'No space left on device')


checkpoint.save_checkpoint = annex.cluster.save_checkpoint = save_checkpoint  # in the background too
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.parametrize('background', [False, True])
def test_a_failed_save_ends_every_process_at_once(data_dir, tmp_path, background):
    """Rank 0's checkpoint write raises: both processes exit with status 1 within seconds (not after an
    hour in a barrier), each saying why. In the background (FSDP: the next save gathers the weights
    collectively), the failure is shared before the next save's first collective."""
    (tmp_path / 'full_disk.py').write_text(FULL_DISK)
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--max_iters=4', '--eval_interval=2',
            f'--out_dir={tmp_path / "out"}', '--launcher=srun']
    if background:
        args += ['--async_save=True', '--fsdp=True']
    status, outputs, seconds = srun(str(tmp_path / 'full_disk.py'), args, free_port())
    assert status == [1, 1], outputs
    what = 'checkpoint at iter 2 not saved (OSError: [Errno 28] No space left on device)'
    if background:
        what = ('the last checkpoint not saved (RuntimeError: the save of iter 2, in the background, '
                'failed: [Errno 28] No space left on device)')
    assert what in outputs[0]
    assert f"{what.split(' (')[0]} (on another process)" in outputs[1]
    assert seconds < 30  # startup included (about 5 s here)


RSS = """
import ctypes, gc, json, sys
from types import SimpleNamespace

import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from annex.cluster import build_sharded, save_run
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
                      groups=[None], ddp=True, sharded=True)
args = dict(block_size=64, vocab_size=4096, n_layer=4, n_head=4, n_embd=384, bias=False)
cfg = SimpleNamespace(seed=0, compile=False, fsdp_shard=0, fsdp_bf16=False, init_from='scratch',
                      out_dir=sys.argv[1], async_save=False, keep_last=0)
raw = build_sharded(args, cfg, env)
optimizer = raw.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
get_optimizer_state_dict(raw, optimizer)  # AdamW's moments made, as after a step


def whole_file():  # as train.py saves a small run: gathered to rank 0, one file
    state = training_state(raw, optimizer, model_args=args)
    if rank == 0:
        save_checkpoint(state, sys.argv[1])


sharded = added_peak(lambda: save_run(raw, optimizer, dict(model_args=args, iter_num=0), cfg, env))
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
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from annex.cluster import build_sharded

dist.init_process_group('gloo', timeout=timedelta(seconds=60))  # the mesh's groups would inherit it
rank, world = dist.get_rank(), dist.get_world_size()
for case, (model_args, fsdp_shard) in enumerate({cases!r}):
    torch.manual_seed(1000 + rank)  # no generator may matter but the one build_sharded seeds on rank 0
    cfg = SimpleNamespace(seed=21, compile=False, fsdp_shard=fsdp_shard, fsdp_bf16=False,
                          init_from='scratch')
    env = SimpleNamespace(device='cpu', device_type='cpu', world=world, master=rank == 0, groups=[None],
                          ddp=True)
    raw = build_sharded(model_args, cfg, env)
    weights = get_model_state_dict(raw, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    tied = not hasattr(raw, 'lm_head') or raw.lm_head.weight is raw.transformer.wte.weight
    timeouts = [g._get_backend(torch.device('cpu')).options._timeout.total_seconds()
                for g in env.groups[1:]]  # HSDP's mesh: the long timeout until the first step
    torch.save(dict(weights=weights, buffers=dict(raw.named_buffers()), tied=tied, timeouts=timeouts,
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
    a single process builds from the same seed. HSDP's groups wait an hour until the first step."""
    cases = [(GPT_ARGS, 0), (GPT_ARGS, 1), (VIT_ARGS, 0)]
    (tmp_path / 'sharded.py').write_text(SHARDED.format(cases=cases))
    proc = torchrun(2, str(tmp_path / 'sharded.py'), str(tmp_path / 'case'))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for case, (model_args, fsdp_shard) in enumerate(cases):
        torch.manual_seed(21)
        whole = build_model(model_args)
        want = whole.state_dict()
        for rank in (0, 1):
            got = torch.load(tmp_path / f'case{case}_{rank}', weights_only=True)
            assert got['tied'] and got['params'] == [n for n, _ in whole.named_parameters()]
            assert got['timeouts'] == ([3600.0, 3600.0] if fsdp_shard else [])  # not the group's 60
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


# ------------------------------------------------------------------------------------------------------
# saves that never lose work: one latest checkpoint, kept steps, background saves, kills, failures

def test_the_format_saved_last_is_the_run_s_latest(data_dir, tmp_path, capsys):
    """Sharded on 2 processes to iter 4, exported, sharded on to 6: a reader of the run reads the export
    and says it is older. One process goes on to 8 from the shards and writes ckpt.pt, which removes
    ckpt.dcp/, so the next start resumes at 8, not 6. A torn state.pt is refused before it is read."""
    out = str(tmp_path / 'run')
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--eval_interval=2', f'--out_dir={out}',
            '--init_from=auto']
    for steps in (4, 6):
        proc = torchrun(2, 'train.py', *args, f'--max_iters={steps}', '--shard_checkpoints_above=0')
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        if steps == 4:
            assert cluster.export(out) == os.path.join(out, 'export', 'ckpt-4.pt')
    shutil.copytree(os.path.join(out, 'ckpt.dcp'), tmp_path / 'torn.dcp')
    capsys.readouterr()
    _, ckpt = load_checkpoint(out)
    assert ckpt['iter_num'] == 4
    assert (f'reading {out}/export/ckpt-4.pt (iter 4), exported from {out}/ckpt.dcp (iter 6); export '
            'again for iter 6') in capsys.readouterr().out
    assert train.main(args + ['--max_iters=8']) == 0
    assert 'resuming at iter 6' in capsys.readouterr().out
    assert sorted(n for n in os.listdir(out) if n.startswith(('ckpt', 'best'))) == ['best.pt', 'ckpt.pt']
    assert train.main(args + ['--max_iters=10']) == 0
    assert 'resuming at iter 8' in capsys.readouterr().out
    state = tmp_path / 'torn.dcp' / 'state.pt'
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(ValueError, match='torn.dcp/state.pt fails its CRC-32 check'):
        cluster.read_fields(str(tmp_path / 'torn.dcp'))
    (tmp_path / 'torn.dcp' / '__1_0.distcp').unlink()  # a copy cut short: named, not a traceback
    assert cluster.damaged(str(tmp_path / 'torn.dcp')) == ['__1_0.distcp (unreadable)', 'state.pt']
    for name in ('new', 'final', 'final.old'):  # a stale .old (a file held open on NFS) is no obstacle
        (tmp_path / name).mkdir()
        (tmp_path / name / 'shard').write_text(name)
    cluster.swap_in(str(tmp_path / 'new'), str(tmp_path / 'final'))
    assert (tmp_path / 'final' / 'shard').read_text() == 'new' and not (tmp_path / 'final.old').exists()


def test_kept_and_background_saves_write_what_a_synchronous_run_does(data_dir, tmp_path, monkeypatch):
    """keep_last=2 keeps exactly the last two steps' checkpoints (hard links to what ckpt.pt was);
    async_save=True writes in another thread the bytes the synchronous run writes, its wait logged."""
    args = ['--max_iters=8', '--eval_interval=2', '--dropout=0.1']
    base = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, *args]
    threads, real_save = [], cluster.save_checkpoint
    monkeypatch.setattr(cluster, 'save_checkpoint', lambda *a: threads.append(
        threading.current_thread() is threading.main_thread()) or real_save(*a))
    for name, extra in (('sync', ['--keep_last=1']), ('async', ['--async_save=True', '--keep_last=2'])):
        assert train.main(base + [f'--out_dir={tmp_path / name}', *extra]) == 0
    assert threads == [True] * 4 + [False] * 4  # in the loop's thread, then in the background's
    run = tmp_path / 'async'
    assert sorted(n for n in os.listdir(run) if n.startswith('ckpt')) == ['ckpt-6.pt', 'ckpt-8.pt',
                                                                          'ckpt.pt']
    assert os.stat(run / 'ckpt-8.pt').st_ino == os.stat(run / 'ckpt.pt').st_ino
    assert torch.load(run / 'ckpt-6.pt', weights_only=True)['iter_num'] == 6
    a, b = (torch.load(tmp_path / name / 'ckpt.pt', weights_only=True) for name in ('sync', 'async'))
    assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'])
    saved = records(run, 'saved')
    assert [r['iter'] for r in saved] == [2, 4, 6, 8] and all(r['background'] for r in saved)
    assert all(0 <= r['seconds'] < 60 for r in saved)


KILL_AT = """
import os, signal, sys
import torch
import annex.cluster as cluster
import checkpoint
import train

phase, calls = sys.argv.pop(1), []


def kill(*args, **kwargs):  # at the second save (iter 4): the first (iter 2) is on disk
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)


if phase == 'copying':  # the state copied off the model, in the loop's thread
    from types import SimpleNamespace
    real_copy = cluster.copy.deepcopy  # the module's own, not what torch uses
    cluster.copy = SimpleNamespace(deepcopy=lambda state: kill() or real_copy(state))
elif phase == 'writing':  # half the file written, in the save's thread
    real_save = torch.save
    def half_save(state, f, *a, **k):
        if hasattr(f, 'write') and len(calls) == 1:
            f.write(b'PK\\x03\\x04' + bytes(1000))
        kill()
        real_save(state, f, *a, **k)
    checkpoint.torch.save = half_save
else:  # swapping: the file whole, before its rename
    real_replace = os.replace
    def replace(src, dst):
        if dst.endswith('ckpt.pt'):
            kill()
        real_replace(src, dst)
    checkpoint.os.replace = replace
    import data.common
    data.common.os.replace = replace
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.parametrize('phase', ['copying', 'writing', 'swapping'])
def test_a_kill_during_a_background_save_keeps_the_previous_one(data_dir, tmp_path, phase):
    """kill -9 at each phase of an asynchronous save: the previous checkpoint loads, and the next start
    clears what the kill left and resumes from it."""
    (tmp_path / 'kill_at.py').write_text(KILL_AT)
    out = str(tmp_path / 'run')
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--max_iters=6', '--eval_interval=2',
            f'--out_dir={out}', '--async_save=True', '--init_from=auto']
    proc = subprocess.run([sys.executable, str(tmp_path / 'kill_at.py'), phase, *args], cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stdout[-2000:] + proc.stderr[-2000:]
    _, ckpt = load_checkpoint(out)
    assert ckpt['iter_num'] == 2
    left = [n for n in os.listdir(out) if '.tmp' in n]
    assert left or phase == 'copying'
    proc = subprocess.run([sys.executable, 'train.py', *args], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert 'resuming at iter 2' in proc.stdout
    assert all(f'removing {out}/{name}: left by an interrupted save' in proc.stdout for name in left)
    assert not [n for n in os.listdir(out) if '.tmp' in n]
    assert load_checkpoint(out)[1]['iter_num'] == 6


SHARD_FAILS = """
import sys

import annex.cluster as cluster
import train
real_write = cluster.ShardWriter.write_data


def write_data(self, plan, planner):  # rank 1's disk fills once its shard is written
    written = real_write(self, plan, planner)
    if self.rank == 1:
        raise OSError(28, 'No space left on device')
    return written


cluster.ShardWriter.write_data = write_data
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.parametrize('background', [False, True])
def test_a_rank_failing_after_its_shard_write_ends_every_process(data_dir, tmp_path, background):
    """A sharded save (now under DDP, or in the background under FSDP) that fails on rank 1 after its
    write: DCP's last step carries the error to both processes, which exit with status 1 within
    seconds; the shards are not swapped in."""
    (tmp_path / 'fails.py').write_text(SHARD_FAILS)
    out = tmp_path / 'out'
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--max_iters=4', '--eval_interval=2',
            f'--out_dir={out}', '--launcher=srun', '--shard_checkpoints_above=0',
            f'--async_save={background}', f'--fsdp={background}']  # DDP's sharded saves: now only
    status, outputs, seconds = srun(str(tmp_path / 'fails.py'), args, free_port())
    assert status == [1, 1], outputs
    later = 'the save of iter 2, in the background, failed: ' if background else ''
    assert all(f'not saved (RuntimeError: {later}torch.distributed.checkpoint failed on rank 1: OSError: '
               '[Errno 28] No space left on device)' in o for o in outputs), outputs
    assert seconds < 40
    assert not (out / 'ckpt.dcp').exists()


def test_ddp_gets_the_one_gpu_a_slurm_task_sees(data_dir, tmp_path, monkeypatch):
    """srun with one GPU per task: rank 3 sees one device, cuda:0; setup puts it there and DDP wraps
    the model on it (no device_ids of another ordinal), and the process group is bound to it
    (device_id: NCCL's communicator made at once, on that GPU). CUDA mocked: none here."""
    monkeypatch.setattr(os, 'environ', dict(os.environ, RANK='3', LOCAL_RANK='3', WORLD_SIZE='4'))
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    chosen, wrapped, moved, groups = [], [], [], []
    monkeypatch.setattr(torch.cuda, 'set_device', chosen.append)
    monkeypatch.setattr(train.dist, 'init_process_group', lambda **kw: groups.append(kw))
    monkeypatch.setattr(torch.nn.Module, 'to', lambda self, device: moved.append(device) or self)
    monkeypatch.setattr(torch.nn.parallel, 'DistributedDataParallel',
                        lambda module, **kw: wrapped.append(kw) or module)
    cfg = train.SimpleNamespace(**configure(train.DEFAULTS, [
        '--device=cuda', '--dtype=float32', f'--out_dir={tmp_path}', '--dataset=tiny',
        f'--data_dir={data_dir}', *TINY], train.OPTIONAL_TYPES))
    env = train.setup(cfg, ())
    assert env.device == 'cuda:0' and chosen == ['cuda:0'] and env.world == 4 and env.rank == 3
    assert [(g['device_id'], g['backend']) for g in groups] == [(torch.device('cuda', 0), 'nccl')]
    train.build(cfg, env, dict(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64))
    assert moved == ['cuda:0'] and len(wrapped) == 1 and wrapped[0].get('device_ids') in (None, [0])


READS = """
import json, sys
from types import SimpleNamespace

import torch.distributed as dist

from annex.cluster import load_sharded, read_shards, save_run
from checkpoint import build_model


def read_bytes(load):  # bytes this process reads through system calls while it loads
    rchar = lambda: int(next(l.split()[1] for l in open('/proc/self/io') if l.startswith('rchar')))
    before = rchar()
    load()
    return rchar() - before


dist.init_process_group('gloo')
rank, world = dist.get_rank(), dist.get_world_size()
env = SimpleNamespace(device='cpu', device_type='cpu', world=world, rank=rank, master=rank == 0,
                      groups=[None], ddp=True, fsdp=False, sharded=True)
args = dict(block_size=64, vocab_size=4096, n_layer=4, n_head=4, n_embd=256, bias=False)
raw = build_model(args)
optimizer = raw.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
cfg = SimpleNamespace(out_dir=sys.argv[1], async_save=False, keep_last=0)
save_run(raw, optimizer, dict(model_args=args, iter_num=0), cfg, env)
folder = sys.argv[1] + '/ckpt.dcp'
every = read_bytes(lambda: read_shards(raw, optimizer, folder, no_dist=False))  # each its own copy
once = read_bytes(lambda: load_sharded(raw, optimizer, folder, env))
reads = [None] * world
dist.all_gather_object(reads, dict(every=every, once=once))
if rank == 0:
    json.dump(reads, open(sys.argv[1] + '/reads.json', 'w'))
dist.destroy_process_group()
"""


@pytest.mark.skipif(not os.path.exists('/proc/self/io'), reason="needs Linux's /proc/self/io")
def test_a_ddp_resume_reads_the_shards_once(tmp_path):
    """DDP on 2 processes resuming a sharded checkpoint (51 MB): rank 0 reads it and broadcasts it; the
    other process reads only its half of the CRC-32 check, not the whole as each did before."""
    (tmp_path / 'reads.py').write_text(READS)
    (tmp_path / 'out').mkdir()
    proc = torchrun(2, str(tmp_path / 'reads.py'), str(tmp_path / 'out'))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    size = sum(f.stat().st_size for f in (tmp_path / 'out' / 'ckpt.dcp').iterdir())
    rank0, rank1 = json.load(open(tmp_path / 'out' / 'reads.json'))
    print(f'checkpoint {size:,} bytes; read per rank, each its own copy: {rank0["every"]:,} / '
          f'{rank1["every"]:,}; once and broadcast: {rank0["once"]:,} / {rank1["once"]:,}')
    assert rank0['every'] > 0.95 * size and rank1['every'] > 0.95 * size
    assert rank0['once'] > size  # all of it, and its half of the check
    assert 0.3 * size < rank1['once'] < 0.7 * size  # its half of the check only


def test_a_weights_only_bf16_export_is_read_everywhere(data_dir, tmp_path, capsys):
    """export --weights_only=True --dtype=bfloat16 of a single-file run: the weights in bf16, no AdamW
    state; sample.py, analyze.py and init_from read it; train.py does not resume it."""
    out = str(tmp_path / 'run')
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--eval_interval=2', '--vocab_size=320']
    assert train.main(args + ['--max_iters=4', f'--out_dir={out}']) == 0
    proc = subprocess.run([sys.executable, 'annex/cluster.py', 'export', out, '--weights_only=True',
                           '--dtype=bfloat16'], cwd=REPO, env=ENV, capture_output=True, text=True)
    path = os.path.join(out, 'export', 'ckpt-4.pt')
    assert proc.returncode == 0 and proc.stdout.strip() == f'wrote {path}', proc.stderr
    full, light = (torch.load(p, weights_only=True) for p in (os.path.join(out, 'ckpt.pt'), path))
    assert 'optimizer' not in light and light['iter_num'] == 4
    tied = light['model']['lm_head.weight'], light['model']['transformer.wte.weight']
    assert tied[0].data_ptr() == tied[1].data_ptr()  # one tensor, written once
    assert all(light['model'][k].dtype == torch.bfloat16 and torch.equal(
        light['model'][k], full['model'][k].bfloat16()) for k in full['model'])
    assert os.path.getsize(path) < 0.25 * os.path.getsize(os.path.join(out, 'ckpt.pt'))
    sample.main([f'--ckpt={path}', '--max_new_tokens=3', '--num_samples=1'])
    analyze.main(['saturation', path])
    assert train.main(args + ['--max_iters=0', f'--init_from={path}', f'--out_dir={tmp_path / "b"}']) == 0
    weights = torch.load(tmp_path / 'b' / 'ckpt.pt', weights_only=True)['model']
    assert all(torch.equal(weights[k], full['model'][k].bfloat16().float()) for k in weights)
    shutil.copy(path, os.path.join(out, 'ckpt.pt'))
    with pytest.raises(SystemExit, match='lacks optimizer: not this train.py'):
        train.main(args + ['--max_iters=6', f'--out_dir={out}', '--init_from=resume'])


KILL_SHARDS = """
import os, signal, sys
import annex.cluster as cluster
import train
real_replace = os.replace


def replace(src, dst):  # rank 0, at the second sharded save (iter 4): between swap_in's two renames
    if str(dst).endswith('ckpt.dcp.old'):
        real_replace(src, dst)
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)


cluster.os.replace = replace
sys.exit(train.main(sys.argv[1:]))
"""


def test_a_kill_while_swapping_shards_in_resumes_from_the_whole_new_ones(data_dir, tmp_path):
    """kill -9 of rank 0 in the background sharded save at iter 4, the old ckpt.dcp/ renamed away and
    the new, whole one (its checksums.json written) not yet in: the next start puts the new one in, the
    old one goes, and the run resumes from iter 4."""
    (tmp_path / 'kill.py').write_text(KILL_SHARDS)
    out = str(tmp_path / 'run')
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--max_iters=6', '--eval_interval=2',
            f'--out_dir={out}', '--async_save=True', '--shard_checkpoints_above=0', '--init_from=auto']
    proc = torchrun(2, str(tmp_path / 'kill.py'), *args)
    assert proc.returncode != 0 and 'Signal 9 (SIGKILL)' in proc.stderr, proc.stderr[-3000:]
    assert sorted(n for n in os.listdir(out) if 'dcp' in n) == ['best.dcp', 'ckpt.dcp.old', 'ckpt.dcp.tmp']
    proc = torchrun(2, 'train.py', *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (f'putting in {out}/ckpt.dcp.tmp as ckpt.dcp: a whole save cut short before its swap'
            in proc.stdout)
    assert 'resuming at iter 4' in proc.stdout and not os.path.exists(os.path.join(out, 'ckpt.dcp.old'))
    assert cluster.read_fields(os.path.join(out, 'ckpt.dcp'))['iter_num'] == 6


SLOW_SAVE = """
import os, sys, time
import annex.cluster
import train
real_save = annex.cluster.save_checkpoint


def save_checkpoint(state, out_dir, best=False):  # a slow filesystem: longer than step_timeout
    time.sleep(4)
    real_save(state, out_dir, best)


annex.cluster.save_checkpoint = save_checkpoint
sys.exit(train.main(sys.argv[1:]))
"""


def test_the_wait_for_a_background_save_outlasts_the_step_timeout(data_dir, tmp_path):
    """Rank 0 writes for 4 s in the background while the other process waits for it at the end of the
    run: with step_timeout=1 that wait is under the long timeout, so both finish."""
    (tmp_path / 'slow.py').write_text(SLOW_SAVE)
    out = tmp_path / 'out'
    args = ['--dataset=tiny', f'--data_dir={data_dir}', *TINY, '--max_iters=4', '--eval_interval=2',
            f'--out_dir={out}', '--launcher=srun', '--async_save=True', '--step_timeout=1']
    status, outputs, _ = srun(str(tmp_path / 'slow.py'), args, free_port())
    assert status == [0, 0], outputs
    assert torch.load(out / 'ckpt.pt', weights_only=True)['iter_num'] == 4
