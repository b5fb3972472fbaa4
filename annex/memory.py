"""
The GPU memory a training run needs, by what holds it (train.py prints it before a run starts, on a GPU
or for a run over 1 GiB; docs/memory.md has the study's scales), the size of its checkpoints, whether
the disk and host RAM have room for them (checked before the first step), and the peak FLOP/s of known
GPUs that MFU divides by. An annex: train.py runs without it (no plan, no room check, no MFU on a
GPU). The formulas are checked in annex/tests/test_memory.py against the model and the storages autograd
keeps.

Sizes are in bytes; "per token" means per position of one sequence (a micro-batch has batch_size x
block_size).
"""
import os
import re
import shutil

import torch
import torch.nn as nn

from checkpoint import CHECKPOINTS, SHARDED
from data.common import largest_part
from model import GPT, NORMS, GPTConfig, mlp_hidden

# -------------------------------------------------------------------------------------------------------
# Parameter counts, read off the model itself built on the meta device (no memory, no second copy of its
# shapes)

def param_counts(config):
    """(all parameters with the tied embedding once, one block's, the root's: what is outside the blocks,
    which FSDP wraps in the root module; the weights of every linear layer: what autocast copies to
    bf16)."""
    with torch.device('meta'):
        model = GPT(config)
    n = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.transformer.h[0].parameters())
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return n, block, n - config.n_layer * block, matmul


def eager_copies(config):
    """How many input-sized tensors an eager point-wise norm keeps for its backward, counted from
    its class (model.NORMS) on a small CPU forward: DyT's and HardTanh's 2, Derf's 3 (erf keeps its
    argument, tanh its output)."""
    layer = NORMS[config.norm](8, config.bias, config.norm_eps, 1.0)
    x = torch.linspace(-2, 2, 32).view(4, 8).requires_grad_()  # no random draw: the seed is train.py's
    kept = set()

    def pack(t):  # each input-sized storage saved for backward, once
        if t.numel() == x.numel():
            kept.add(t.data_ptr())
        return t
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return len(kept)


def param_count(config):
    return param_counts(config)[0]


# -------------------------------------------------------------------------------------------------------
# Activations: the tensors autograd keeps from the forward pass for the backward pass

def activation_bytes(config, batch_size, dtype=torch.bfloat16, bf16_weights=False, compile=False):
    """Bytes of the tensors kept for backward by one training forward pass of batch_size x block_size
    tokens.

    Counted tensor by tensor from what each op of model.py saves (PyTorch's autograd formulas), checked
    in annex/tests/test_memory.py against the storages that autograd actually keeps on CPU. Assumptions:
    - Attention runs in a flash / memory-efficient SDPA kernel: it keeps q, k, v, its output and the
      logsumexp (H floats per token), never the T x T matrix; its dropout mask is regenerated, not kept.
    - dtype=torch.bfloat16 is autocast: matmul inputs/outputs are bf16 (2 bytes); layer_norm and the
      cross entropy run in float32. float32 weights (train.py, DDP and FSDP alike) make the residual
      stream float32 (the embeddings are float32, and a float32 + bf16 sum is float32); bf16_weights=True
      (FSDP with MixedPrecisionPolicy(param_dtype=torch.bfloat16)) makes it bf16. torch.float32 (TF32
      matmuls): 4 bytes.
    - A linear layer keeps its input in the compute dtype: when a norm's output is float32, each reader
      casts its own copy (SwiGLU's c_fc and c_up: two).
    - compile=True (inductor) recomputes pointwise ops in the backward instead of keeping their outputs:
      a norm keeps its input, statistics and one output copy, not tanh/erf/clamp outputs nor RMSNorm's
      normalised input; SwiGLU keeps three hidden-wide tensors, not four; the loss keeps bf16 logits and
      two floats per row instead of float32 log-probabilities. (Measured with the CPU inductor of
      PyTorch 2.13.)
    - Dropout (dropout > 0) keeps a 1-byte mask per element on CUDA after the embedding and both residual
      branches. Activation checkpointing is not used.
    Not counted: what is kept once per layer rather than per token (bf16 weight copies: see
    memory_plan)."""
    C, H, V, T = config.n_embd, config.n_head, config.vocab_size, config.block_size
    kv = (config.n_kv_head or H) * (C // H)
    hidden = mlp_hidden(config)
    act = 2 if dtype == torch.bfloat16 else 4  # matmul inputs and outputs
    res = act if bf16_weights else 4  # the residual stream follows the weights' dtype
    f32 = 4
    mask = C if config.dropout > 0 else 0

    def norm(readers):
        """A norm layer's kept bytes per token, its output included as the linear layers reading it
        keep it."""
        if config.norm == 'layernorm':
            # input (in float32 under autocast), rstd, (eager) mean; output in float32
            own, out = f32 * C + f32 * (1 if compile else 2), f32
        elif config.norm == 'rmsnorm':  # float32 input, 1/rms, and (eager) the normalised input
            own, out = f32 * C + f32 + (0 if compile else f32 * C), res
        else:  # point-wise: its input; eager also keeps tanh / erf / clamp's output (and erf's argument)
            own, out = res * C * (1 if compile else eager_copies(config)), res
        copies = 1 if out == act or compile else readers  # inductor casts once for all readers
        return own + copies * act * C

    def attention():
        qkv = act * (C + 2 * kv)
        # q, k and v are views of qkv, which keeps it whole (v does even when RoPE turned q and k into
        # new tensors); the rotation itself keeps nothing: cos and sin need no gradient. SDPA reads
        # grouped K and V heads in place (enable_gqa): no copies. It puts its output in (B, T, H, hd)
        # layout when q is a view of qkv, so c_proj's input is the same storage; for a rotated q it is
        # a copy.
        rotated = act * (C + kv) if config.pos == 'rope' else 0
        c_proj_in = act * C if config.pos == 'rope' else 0
        if config.attn == 'standard':  # output, lse
            return qkv + rotated + act * C + f32 * H + c_proj_in
        # Differential: four SDPA outputs (each map's two halves of V: 2C) and their lse's, the second
        # map (C, kept for lambda's gradient); subln keeps its float32 input and normalised input
        # (eager only) and 1/rms (H/2 per token); c_proj reads a contiguous copy (C)
        subln = (0 if compile else 2 * f32 * C) + f32 * H // 2
        return qkv + rotated + 2 * (act * C + f32 * H) + act * C + subln + act * C

    mlp = (3 if compile else 4) * act * hidden if config.mlp == 'swiglu' else 2 * act * hidden
    layer = norm(1) + attention() + mask + norm(2 if config.mlp == 'swiglu' else 1) + mlp + mask
    loss = act * V + 2 * f32 if compile else f32 * V
    outside = (8 + 8  # token ids kept by the embedding, targets by the loss
               + (res * C if config.embed_scale else 0) + mask + norm(1) + loss)
    positions = 8 * T if config.pos == 'learned' else 0  # the position ids, shared by the batch
    return batch_size * T * (config.n_layer * layer + outside) + positions


# -------------------------------------------------------------------------------------------------------
# The memory plan of a run, and the size of its checkpoints

def memory_plan(config, batch_size, world_size, fsdp, dtype, compile=False,
                fsdp_param_dtype=torch.float32):
    """GPU memory of one train.py process, in bytes, by what holds it (a dict; 'total' adds them all up).

    Conventions of train.py: float32 master weights, float32 gradients, fused AdamW (two float32 moments
    per parameter), one micro-batch of batch_size x block_size tokens at a time (activations:
    activation_bytes).
    - DDP: every process holds all weights, gradients and moments, plus DDP's gradient buckets, one more
      copy of the gradients (train.py leaves gradient_as_bucket_view off). A single process has no DDP.
    - FSDP2 (fully_shard per block, then the root): weights, gradients and moments are sharded
      1/world_size each. All-gathered weights, in fsdp_param_dtype: the root's (tied embedding,
      positions, final norm) from the forward to the end of the backward (FSDP2 does not reshard the root
      after forward), and two blocks' (the one computing and the one prefetched). Unsharded gradients
      wait for their reduce-scatter (after every micro-step): the root's, whose tied-embedding gradient
      starts at lm_head and ends at the embedding, and one block's; in fsdp_param_dtype, plus a float32
      copy (reduce_dtype) when that is bf16.
    - bf16 autocast with float32 weights (DDP, and FSDP as train.py runs it) casts each matmul weight to
      bf16, and autograd keeps the copy until that layer's backward: 2 bytes per matmul weight of the
      whole model, not sharded by FSDP (compiled graphs keep them too: measured on CPU). With
      fsdp_param_dtype=torch.bfloat16 (MixedPrecisionPolicy) the gathered weights are already bf16: no
      copies, and a bf16 residual stream.
    - 'logits': the loss's backward on top of the activations: train.py's `_` still holds the logits, and
      the backward makes float32 gradients of the log-probabilities and of the logits (eager), or two
      compute-dtype sized buffers (inductor; measured on CPU).
    The total adds everything as if all of it were alive at once (the peak is at the start of the
    backward, when the first micro-step's gradients do not exist yet), so it is an upper bound by a few
    transient terms.
    Not counted: the CUDA context, NCCL's buffers, the compiler's workspace and the allocator's
    fragmentation (together often 1-3 GiB): keep the total well under the GPU's memory."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    act = 2 if dtype == torch.bfloat16 else 4
    bf16_weights = fsdp and fsdp_param_dtype == torch.bfloat16
    if bf16_weights and act == 4:
        raise ValueError("fsdp_param_dtype=torch.bfloat16 needs dtype=torch.bfloat16 (autocast)")
    (n, block, root, matmul), shard = param_counts(config), world_size if fsdp else 1
    fsdp_buffers = 0
    if fsdp:
        gathered = 2 if bf16_weights else 4
        fsdp_buffers = gathered * (root + 2 * block) + (gathered + 4 * bf16_weights) * (root + block)
    V = config.vocab_size
    plan = {
        'parameters': 4 * n / shard,
        'gradients': 4 * n / shard,
        'optimizer': 8 * n / shard,
        'ddp_buckets': 4 * n if not fsdp and world_size > 1 else 0,
        'fsdp_buffers': fsdp_buffers,
        'weight_copies': 2 * matmul if act == 2 and not bf16_weights else 0,
        'activations': activation_bytes(config, batch_size, dtype, bf16_weights, compile),
        'logits': batch_size * config.block_size * V * (2 * act if compile else act + 8),
    }
    plan['total'] = sum(plan.values())
    return plan


PLAN_LABELS = {
    'parameters': 'weights (float32)',
    'gradients': 'gradients (float32)',
    'optimizer': 'AdamW moments (float32)',
    'ddp_buckets': 'DDP gradient buckets',
    'fsdp_buffers': 'FSDP gathered weights, unsharded gradients',
    'weight_copies': 'autocast bf16 weight copies',
    'activations': 'activations (one micro-batch)',
    'logits': 'loss backward (logits, gradients)',
}


def format_memory_plan(plan, device_memory=None):
    """Printable lines of a memory_plan, in GiB; with device_memory (bytes, as
    torch.cuda.get_device_properties(d).total_memory gives it), the share of it and a warning line when
    the plan does not fit (a note when it fills more than 90%: what the plan leaves out needs room
    too)."""
    gib = 2 ** 30
    lines = ['memory per process (estimate; on a GPU, its memory):']
    lines += [f'  {PLAN_LABELS[k]:<44}{v / gib:8.2f} GiB' for k, v in plan.items()
              if k in PLAN_LABELS and v]
    total = plan['total']
    of = f' of {device_memory / gib:.2f} GiB ({total / device_memory:.0%})' if device_memory else ''
    lines.append(f'  {"total":<44}{total / gib:8.2f} GiB{of}')
    if device_memory and total > device_memory:
        lines.append(f'warning: this run needs about {total / gib:.1f} GiB per GPU, more than the '
                     f'{device_memory / gib:.1f} GiB it has: shard it (fsdp=True), use more GPUs, or '
                     'lower batch_size and raise gradient_accumulation_steps')
    elif device_memory and total > 0.9 * device_memory:
        lines.append('note: over 90% of the GPU\'s memory; the CUDA context, NCCL and fragmentation '
                     '(not counted) need room too')
    return lines


def print_plan(model_args, cfg, env, micro_batch):
    """What train.py prints of its run's plan before it builds the model (told before it runs out of
    memory): the plan and its share of the GPU on CUDA; on other devices only a run big enough to matter
    (over 1 GiB). A language model's only: a ViT (model_args with a patch_size) has no plan."""
    if 'patch_size' in model_args:
        return
    config = GPTConfig(**model_args)
    shards = min(cfg.fsdp_shard or env.world, env.world)  # the processes a parameter is sharded over
    plan = memory_plan(config, micro_batch, shards, env.fsdp, env.ptdtype, cfg.compile)
    capacity = (torch.cuda.get_device_properties(env.device).total_memory if env.device_type == 'cuda'
                else None)
    if capacity or plan['total'] > 2 ** 30:
        print('\n'.join(format_memory_plan(plan, capacity)))
    if not capacity:
        return
    best = largest_micro_batch(config, cfg, env, shards, capacity)
    if best and best[2] > micro_batch:
        size, steps, rows = best
        print(f'note: micro-batches of up to {rows} fit in 85% of this GPU by the plan: '
              f'--batch_size={size} --gradient_accumulation_steps={steps} trains the same '
              f'{size * steps} sequences a step in fewer, faster micro-steps')


def largest_micro_batch(config, cfg, env, shards, memory):
    """(batch_size, gradient_accumulation_steps, rows a micro-batch) of the fewest micro-batches
    that keep a step's sequences (batch_size divides them) and whose plan fills at most 85% of
    `memory` bytes (the rest: what the plan leaves out); None if none does."""
    samples = cfg.batch_size * cfg.gradient_accumulation_steps
    for size in range(samples, 0, -1):
        if samples % size:
            continue
        rows = largest_part(samples, env.world, size)  # a process's rows: its share at most
        plan = memory_plan(config, rows, shards, env.fsdp, env.ptdtype, cfg.compile)
        if plan['total'] <= 0.85 * memory:
            return size, samples // size, rows
    return None


def checkpoint_bytes(config):
    """Size of a train.py checkpoint (ckpt.pt, best.pt) by part, in bytes: the float32 weights ('model',
    the tied embedding once: checkpoint.training_state re-ties the two copies that gathering makes) and
    AdamW's two float32 moments ('optimizer'); the step counters and the pickled metadata add a few KB.
    Rank 0 holds all of it in host RAM while torch.save streams it to the file: the host RAM a save needs
    is about 'total'."""
    n = param_count(config)
    return {'model': 4 * n, 'optimizer': 8 * n, 'total': 12 * n}


# -------------------------------------------------------------------------------------------------------
# The peak FLOP/s that MFU divides by (train.py: --peak_flops overrides it)

# Dense (no 2:4 sparsity) tensor-core peaks in TFLOP/s: (name pattern, bfloat16, float32). NVIDIA's
# datasheets print the sparse figure with a '*'; the dense one is half of it. float32 is the TF32
# tensor-core peak, since train.py turns TF32 on; V100 and T4 have no TF32 (their float32 figure is the
# plain FP32 peak) and no bf16. A pattern matches whole words of torch.cuda.get_device_name(), ignoring
# case; the first match wins, so a form factor ('H100 PCIe') comes before its family ('H100', which is
# then the SXM part, 'NVIDIA H100 80GB HBM3').
PEAK_TFLOPS = (
    ('H100 PCIe', 756, 378),  # H100 datasheet, PCIe column: BF16 1,513*, TF32 756*
    ('H100 NVL', 835, 418),  # H100 NVL datasheet, per GPU: BF16 1,671*, TF32 835*
    ('H100', 989.4, 494.7),  # H100 datasheet, SXM column: BF16 1,979*, TF32 989*
    ('GH200', 989.4, 494.7),  # GH200 Grace Hopper Superchip datasheet: the H100 SXM figures
    ('H200 NVL', 835, 418),  # H200 datasheet, NVL column: BF16 1,671*, TF32 835*
    ('H200', 989.4, 494.7),  # H200 datasheet, SXM column: BF16 1,979*, TF32 989*
    ('GB200', 2500, 1250),  # GB200 NVL72 datasheet, per GPU: FP16/BF16 5 PF*, TF32 2.5 PF*
    ('B200', 2250, 1100),  # HGX B200 datasheet, per GPU: FP16/BF16 4.5 PF*, TF32 2.2 PF*
    ('A100', 312, 156),  # A100 datasheet, SXM4 and PCIe alike: BF16 624*, TF32 312*
    # AWS's A10 variant: on no NVIDIA datasheet; approximate figures as AWS users report them
    ('A10G', 70, 35),
    ('A10', 125, 62.5),  # A10 datasheet: BF16 250*, TF32 125*
    ('L40S', 362.05, 183),  # L40S datasheet: BF16 733*, TF32 366*
    ('L40', 181.05, 90.5),  # L40 datasheet: BF16 362.1*, TF32 181*
    ('L4', 121, 60),  # L4 datasheet: BF16 242*, TF32 120*
    # GA102 whitepaper v2, appendix C: BF16 with FP32 accumulate 309.7*, TF32 154.8*
    ('RTX A6000', 154.8, 77.4),
    # Ada whitepaper: BF16 with FP32 accumulate (GeForce: half the FP16-accumulate rate)
    ('RTX 4090', 165.2, 82.6),
    ('RTX 3090', 71, 35.6),  # GA102 whitepaper, appendix A: BF16 with FP32 accumulate 142*, TF32 71*
    ('V100S', None, 16.4),  # V100S datasheet (PCIe): FP32
    ('V100-PCIE', None, 14),  # V100 datasheet, PCIe column: FP32
    ('V100', None, 15.7),  # V100 datasheet, SXM2 column: FP32
    ('T4', None, 8.1),  # T4 datasheet: FP32
)


def peak_flops(device_name, dtype):
    """Dense peak FLOP/s of the GPU called `device_name` (torch.cuda.get_device_name()) for matmuls in
    `dtype` (torch.bfloat16, or torch.float32 with TF32 on; their names work too); None for a GPU not in
    PEAK_TFLOPS or one without that dtype (V100 and T4 have no bf16): no MFU is better than one against
    the wrong peak."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"dtype={dtype} has no peak here; use torch.bfloat16 or torch.float32")
    for pattern, bf16, fp32 in PEAK_TFLOPS:
        if re.search(rf'\b{pattern}\b', device_name, re.IGNORECASE):
            tflops = bf16 if dtype == torch.bfloat16 else fp32
            return None if tflops is None else tflops * 1e12
    return None


def gpu_peak_flops(device, dtype):
    """train.py's peak for MFU: the CUDA device's, by its name; None on other devices."""
    return (peak_flops(torch.cuda.get_device_name(device), dtype) if str(device).startswith('cuda')
            else None)


def check_room(out_dir, n_bytes, gathered):
    """Why saving a checkpoint of n_bytes would fail, or None: too little free disk for three (best,
    latest and the one being written), or, when gathered into one process, too little host RAM
    (Linux's MemAvailable) to hold it."""
    have = sum(os.path.exists(os.path.join(out_dir, n))
               for n in (*CHECKPOINTS.values(), *SHARDED.values()))
    free, need = shutil.disk_usage(out_dir).free, (3 - have) * n_bytes
    if free < need:
        return (f'{out_dir} has {free / 2**30:.1f} GiB free; its checkpoints need '
                f'{need / 2**30:.1f} GiB more ({n_bytes / 2**30:.1f} GiB each: best, latest and the '
                'next). Free space or choose another out_dir')
    if gathered and os.path.exists('/proc/meminfo'):
        with open('/proc/meminfo') as f:
            available = next((int(line.split()[1]) * 1024 for line in f
                              if line.startswith('MemAvailable:')), None)
        if available is not None and available < n_bytes:
            return (f'rank 0 has {available / 2**30:.1f} GiB of host RAM available, too little to '
                    f'gather a {n_bytes / 2**30:.1f} GiB checkpoint; free memory, or save shards: '
                    '--shard_checkpoints_above=0')
    return None
