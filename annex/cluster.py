"""
train.py on a cluster: processes started by Slurm's srun, and FSDP2 sharding (fsdp=True; HSDP with
fsdp_shard). An annex: train.py imports it only for a run under srun or with fsdp=True (docs/cluster.md).
"""
import os

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import fully_shard

from checkpoint import build_model
from model import rope_angles


def srun_environment():
    """torchrun's variables from Slurm's, for a train.py started once per GPU by srun (no torchrun)."""
    if 'MASTER_ADDR' not in os.environ:
        raise SystemExit('error: under srun, export MASTER_ADDR (the first node) and MASTER_PORT '
                         '(docs/cluster.md)')
    os.environ.update(RANK=os.environ['SLURM_PROCID'], LOCAL_RANK=os.environ['SLURM_LOCALID'],
                      WORLD_SIZE=os.environ['SLURM_NTASKS'],
                      MASTER_PORT=os.environ.get('MASTER_PORT', '29500'))


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
    for block in raw.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(raw, mesh=mesh)
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
