"""
train.py on a cluster: processes started by Slurm's srun (launcher='srun'), FSDP2 sharding
(fsdp=True; HSDP with fsdp_shard), and sharded checkpoints (ckpt.dcp/: each process writes its part,
with torch.distributed.checkpoint), which `python annex/cluster.py export OUT_DIR [--which=best]` turns
into the ckpt.pt (best.pt) that sample.py, analyze.py and annex/eval.py read. An annex: train.py imports
it only for these (docs/cluster.md).
"""
import json
import os
import re
import shutil
import sys
import warnings
import zlib
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # as annex/cluster.py
from checkpoint import CHECKPOINTS, SHARDED, build_model, training_state  # noqa: E402
from configurator import configure  # noqa: E402
from data.common import atomic_write, write_json  # noqa: E402
from distributed import any_failed  # noqa: E402
from model import rope_angles  # noqa: E402


def srun_environment(launcher='srun'):
    """torchrun's variables from those srun gives each task of a job step (SLURM_STEP_NUM_TASKS: the
    step's, not the allocation's SLURM_NTASKS). The port, unless given, from the job id: two jobs on a
    node differ."""
    if launcher != 'srun':
        raise SystemExit(f"error: launcher={launcher!r}: use 'srun' or None (torchrun, or one process)")
    missing = [v for v in ('SLURM_PROCID', 'SLURM_LOCALID', 'SLURM_STEP_NUM_TASKS', 'MASTER_ADDR')
               if v not in os.environ]
    if missing:
        raise SystemExit(f"error: launcher='srun', but {', '.join(missing)} is not set: start train.py "
                         'with srun, and export MASTER_ADDR (the first node; docs/cluster.md)')
    port = 20000 + int(os.environ.get('SLURM_JOB_ID', 9500)) % 20000
    os.environ.update(RANK=os.environ['SLURM_PROCID'], LOCAL_RANK=os.environ['SLURM_LOCALID'],
                      WORLD_SIZE=os.environ['SLURM_STEP_NUM_TASKS'],
                      MASTER_PORT=os.environ.get('MASTER_PORT', str(port)))


def check_sharding(cfg, world):
    """train.py's FSDP keys: fsdp_shard needs fsdp=True and must divide the process count."""
    if world > 1 and cfg.fsdp_shard and not (cfg.fsdp and world % cfg.fsdp_shard == 0):
        raise SystemExit(f'error: fsdp_shard={cfg.fsdp_shard} needs fsdp=True and must divide the '
                         f"{world} processes (a node's GPUs)")


def build_sharded(model_args, cfg, env):
    """The model of model_args sharded with FSDP2 over every process (fsdp_shard: a 2-D mesh, sharded
    within groups of fsdp_shard processes, replicated across them), each block compiled with
    compile=True. No process but rank 0 holds the whole model: rank 0 builds it on the CPU from the seed
    train.py set, as a single process does, and its weights are broadcast into the shards, so every
    process count trains the same weights."""
    with torch.device('meta'):
        raw = build_model(model_args)
    # block by block, and the output layer with the loss: FSDP's hooks stay outside the graphs
    if cfg.compile:
        for block in raw.transformer.h:
            block.forward = torch.compile(block.forward)
        if hasattr(raw, 'head_loss'):  # a GPT's
            raw.head_loss = torch.compile(raw.head_loss)
    mesh = None
    if cfg.fsdp_shard:  # all-gathers stay inside a node; one gradient all-reduce crosses nodes
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(env.device_type, (env.world // cfg.fsdp_shard, cfg.fsdp_shard),
                                mesh_dim_names=('replicate', 'shard'))
        env.groups += [mesh.get_group('replicate'), mesh.get_group('shard')]  # for their timeouts
    # opt-in: weights gathered in bf16 (half the traffic), gradients reduced in fp32
    policy = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if cfg.fsdp_bf16 else \
        MixedPrecisionPolicy()
    last = len(raw.transformer.h) - 1
    for i, block in enumerate(raw.transformer.h):  # the last block's backward comes first: kept gathered
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=i < last)
    fully_shard(raw, mesh=mesh, mp_policy=policy)
    raw.to_empty(device=env.device)
    if 'wte' in raw.transformer:  # to_empty gave each reference to the tied weight its own tensor
        raw.transformer.wte.weight = raw.lm_head.weight
    if getattr(raw.config, 'pos', None) == 'rope':  # buffers are not broadcast: computed here
        cos, sin = rope_angles(raw.config.block_size, raw.config.n_embd // raw.config.n_head,
                               raw.config.rope_theta)
        raw.rope_cos.copy_(cos)
        raw.rope_sin.copy_(sin)
    if env.master:
        torch.manual_seed(cfg.seed)  # the single process's init
    whole = build_model(model_args).state_dict() if env.master else {}
    set_model_state_dict(raw, whole,
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return raw


# -------------------------------------------------------------------------------------------------------
# sharded checkpoints: out_dir/ckpt.dcp/ (and best.dcp/), one folder of per-process files each

def state_dicts(model, optimizer):
    """Each process's part of the weights and AdamW state (whole tensors without FSDP: DCP writes each
    replicated one once, spread over the processes). The tied output layer is the token embedding."""
    weights = get_model_state_dict(model)
    weights.pop('lm_head.weight', None)
    return {'model': weights, 'optimizer': get_optimizer_state_dict(model, optimizer)}


def crc32(path, chunk=1 << 20):
    value = 0
    with open(path, 'rb') as f:
        while block := f.read(chunk):
            value = zlib.crc32(block, value)
    return value


def save_sharded(model, optimizer, fields, out_dir, best, env):
    """ckpt.dcp/: every process writes its part, rank 0 the other fields (state.pt) and every file's
    CRC-32 (checksums.json). Written as ckpt.dcp.tmp/, then swapped in; best: best.dcp/ too, hard links
    to the same files."""
    final = os.path.join(out_dir, SHARDED['latest'])
    tmp = final + '.tmp'
    if env.master:
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    dcp.save(state_dicts(model, optimizer), checkpoint_id=tmp)
    mine = {name: crc32(os.path.join(tmp, name)) for name in os.listdir(tmp)
            if name.startswith(f'__{env.rank}_')}  # DCP's names: __<rank>_<n>.distcp
    checksums = [None] * env.world
    dist.all_gather_object(checksums, mine)
    if env.master:
        torch.save(fields, os.path.join(tmp, 'state.pt'))
        sums = {k: v for part in checksums for k, v in part.items()}
        sums.update({name: crc32(os.path.join(tmp, name)) for name in ('.metadata', 'state.pt')})
        write_json(os.path.join(tmp, 'checksums.json'), sums)
        swap_in(tmp, final)
        if best:
            links = os.path.join(out_dir, SHARDED['best']) + '.tmp'
            shutil.rmtree(links, ignore_errors=True)
            shutil.copytree(final, links, copy_function=link_or_copy)
            swap_in(links, os.path.join(out_dir, SHARDED['best']))


def link_or_copy(src, dst):  # the same bytes, no copy; a copy where links are not supported
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def swap_in(tmp, final):
    """Folder tmp renamed to final, the old final removed; a crash in between leaves final.old, which
    clear_stale puts back."""
    if os.path.exists(final):
        os.replace(final, final + '.old')
    os.replace(tmp, final)
    shutil.rmtree(final + '.old', ignore_errors=True)


def clear_stale(out_dir):
    """What an interrupted sharded save left removed (*.dcp.tmp/); a folder caught between swap_in's
    two renames (only *.dcp.old/ there) put back."""
    for name in os.listdir(out_dir):
        path = os.path.join(out_dir, name)
        if re.fullmatch(r'(ckpt|best)\.dcp\.tmp', name):
            print(f'removing {path}: left by an interrupted save')
            shutil.rmtree(path)
        elif re.fullmatch(r'(ckpt|best)\.dcp\.old', name):
            if os.path.exists(path[:-4]):  # the new one is whole
                shutil.rmtree(path)
            else:
                os.replace(path, path[:-4])


def read_fields(folder):
    """A sharded checkpoint's fields other than weights and optimizer state (model_args, config, the loop
    state...); 'sharded': its folder."""
    path = os.path.join(folder, 'state.pt')
    if not os.path.isfile(path):
        raise ValueError(f'{folder} is not a complete sharded checkpoint (no state.pt): an interrupted '
                         'save? Remove it to resume from ckpt.pt, or start a new run')
    return dict(torch.load(path, weights_only=True), sharded=folder)


def damaged(folder, rank=0, world=1):
    """The files of a sharded checkpoint (this process's share of them) that fail their CRC-32."""
    with open(os.path.join(folder, 'checksums.json')) as f:
        sums = sorted(json.load(f).items())
    return [name for name, crc in sums[rank::world] if crc32(os.path.join(folder, name)) != crc]


def load_sharded(model, optimizer, folder, env):
    """Weights and AdamW state of a sharded checkpoint, each process reading its part (any process
    count); its files' CRC-32s checked first, shared out over the processes."""
    bad = damaged(folder, env.rank, env.world)
    if any_failed(env, bad):
        raise SystemExit(f"error: {folder} is damaged: {', '.join(bad) or 'see the other processes'} "
                         'fail their CRC-32 check. Copy it again, or resume from another checkpoint')
    state = state_dicts(model, optimizer)  # AdamW's state made (a zero step at lr 0) for DCP to fill
    dcp.load(state, checkpoint_id=folder)
    set_model_state_dict(model, state['model'], options=StateDictOptions(strict=False))  # lm_head: tied
    set_optimizer_state_dict(model, optimizer, state['optimizer'])


def export(out_dir, which='latest'):
    """ckpt.pt (or best.pt) from ckpt.dcp/ (best.dcp/), in one process: what a single-file run writes."""
    if which not in SHARDED:
        raise SystemExit(f"error: --which={which!r}: use 'latest' (ckpt.dcp) or 'best' (best.dcp)")
    folder = os.path.join(out_dir, SHARDED[which])
    if not os.path.isdir(folder):
        raise SystemExit(f'error: no sharded checkpoint at {folder}')
    fields = read_fields(folder)
    del fields['sharded']
    model = build_model(fields['model_args'])
    cfg = fields['config']
    optimizer = model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'],
                                           (cfg['beta1'], cfg['beta2']), 'cpu')
    with warnings.catch_warnings():  # that one process reads it all is the point here
        warnings.filterwarnings('ignore', 'torch.distributed is disabled')
        load_sharded(model, optimizer, folder, SimpleNamespace(rank=0, world=1, ddp=False, device='cpu'))
    path = os.path.join(out_dir, CHECKPOINTS[which])
    state = training_state(model, optimizer, **fields)
    atomic_write(path, lambda f: torch.save(state, f))
    return path


if __name__ == '__main__':
    args = sys.argv[1:]
    usage = ('usage: python annex/cluster.py export OUT_DIR [--which=best]: a sharded checkpoint '
             '(OUT_DIR/ckpt.dcp, or best.dcp) as a ckpt.pt (best.pt)')
    if '--help' in args or '-h' in args:
        print(usage)
        raise SystemExit(0)
    if len(args) < 2 or args[0] != 'export':
        raise SystemExit(usage)
    opts = configure({'which': 'latest'}, args[2:])
    print(f'wrote {export(args[1], opts["which"])}')
