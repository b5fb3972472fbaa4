"""
Forward+backward throughput of each norm and attention variant at one small shared shape, next to a plain
nanoGPT-style GPT of the same size (the bar the LayerNorm baseline must meet). Device, dtype, TF32 and
torch.compile are set as train.py sets them, so that the figures mean what training runs.

    python annex/bench.py                 # the shape below, on cuda, else mps, else cpu
    python annex/bench.py --device=cpu --steps=15
    python annex/bench.py --device=cuda --n_layer=12 --n_embd=768 --n_head=12 --block_size=1024 \\
        --compile=True
    python annex/bench.py --vit=True --batch_size=128  # config/vision.py's ViT, in images/s
    python annex/bench.py --gpu_report=True  # CUDA: tokens/s and MFU at the study's 64m and 124m shapes
    python annex/bench.py --gpu_report=True --report_eager=True --report_scales=64m \\
        --report_json=rows.jsonl  # eager rows too, the 64m shape only, each row also as JSON
    python annex/bench.py --help          # this text, then the keys and their defaults
"""
import gc
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # run as annex/bench.py
from annex.memory import gpu_peak_flops, memory_plan  # noqa: E402
from annex.vit import ViT, ViTConfig  # noqa: E402
from configurator import config_keys, configure, run_config_file  # noqa: E402
from distributed import pick_device, precision  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

# -------------------------------------------------------------------------------------------------------
n_layer = 4
n_head = 8
n_embd = 256
block_size = 256
vocab_size = 4096
bias = False
batch_size = 8
steps = 10  # timed steps of each variant; their median is reported
warmup = 3  # untimed steps first; with compile=True they include the compilation
device: str | None = None  # None = cuda if available, else mps, else cpu (distributed.pick_device)
dtype: str | None = None  # 'float32' or 'bfloat16' (autocast); None = bfloat16 on CUDA when supported
compile = False  # torch.compile each model before timing
# True: the study's ViT (6 layers, 4 heads, width 256, 4x4 patches of 32x32 images) per norm instead
vit = False
# True (CUDA only): REPORT_VARIANTS compiled, in tokens/s, MFU and a step's peak memory, at the
# shapes, block sizes and micro-batches of REPORT_CONFIGS (the shape keys above are not used)
gpu_report = False
report_scales = '64m,124m'  # gpu_report: these of REPORT_CONFIGS, comma-separated, in this order
report_eager = False  # gpu_report: each shape's variants eager too, before compiled
report_json: str | None = None  # gpu_report: each row also as a JSON line appended here
# -------------------------------------------------------------------------------------------------------
DEFAULTS, OPTIONAL_TYPES = config_keys(globals())
ATTNS = ('standard', 'diff')
STUDY_NORMS = ('layernorm', 'rmsnorm', 'dyt', 'derf', 'hardtanh')  # the ablations share their code
REPORT_CONFIGS = {'64m': 'config/gpt2_64m_ln.py', '124m': 'config/gpt2_124m_ln.py'}
REPORT_VARIANTS = {'LayerNorm': {}, 'DyT': dict(norm='dyt'), 'Derf': dict(norm='derf'),
                   'Diff attention (LayerNorm)': dict(attn='diff')}
DDP_VARIANT = 'LayerNorm, DDP then compile'  # train.py's order under torchrun (here one process)


class PlainBlock(nn.Module):
    """nanoGPT's block, written out plainly: the reference the LayerNorm variant is timed against."""

    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.c_attn, self.attn_proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.c_attn(self.ln_1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class PlainGPT(nn.Module):

    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size, bias):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([PlainBlock(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, bias=False)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def compiled(models):
    """torch.compile each model. The GPT variants share GPT.forward's code: each one is a recompile of
    it, and past the limit (8 by default) dynamo runs the rest eager, with only a warning (newer PyTorch
    names the limit recompile_limit)."""
    torch._dynamo.reset()  # a previous set's graphs count too
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, len(models))
    return {name: torch.compile(model) for name, model in models.items()}


def median_step_times(models, x, y, ctx, sync, steps, warmup):
    """Each model's median forward+backward time in seconds. The models take turns step by step, so
    that a slow spell of the machine hits each alike; each step ends with sync(), so the clock starts on
    an idle device."""
    times = {name: [] for name in models}
    for i in range(warmup + steps):
        for name, model in models.items():
            t0 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            with ctx:
                _, loss = model(x, y)
            loss.backward()
            sync()
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def step_peaks(models, x, y, ctx):
    """The bytes one forward+backward of each model adds at its peak, from a start where no model
    holds gradients: a step of each alone, after the timed ones (compiled and warmed up)."""
    for model in models.values():
        model.zero_grad(set_to_none=True)
    peaks = {}
    for name, model in models.items():
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        median_step_times({name: model}, x, y, ctx, torch.cuda.synchronize, 1, 0)
        peaks[name] = torch.cuda.max_memory_allocated() - base
        model.zero_grad(set_to_none=True)
    return peaks


def gpu_report_rows(cfg, dev, dtype, ctx, peak):
    """A dict per shape, mode and variant, as measured: tokens/s, MFU (against `peak` FLOP/s), and
    the GiB a step adds at its peak next to what annex/memory.py's memory_plan counts for it (its
    total less the weights, there before the step, and AdamW's moments: no optimizer here)."""
    gpu = torch.device(dev).index or 0  # 'cuda': the first GPU
    for scale in cfg['report_scales'].split(','):
        study = run_config_file(os.path.join(REPO, REPORT_CONFIGS[scale]))
        shape = {k: study[k] for k in ('n_layer', 'n_head', 'n_embd', 'block_size', 'bias')}
        B, T = study['batch_size'], study['block_size']
        label = f"{scale} ({shape['n_layer']}x{shape['n_head']}x{shape['n_embd']}, {B}x{T} tokens)"
        x, y = torch.randint(0, GPTConfig.vocab_size, (2, B, T), device=dev)
        configs = {name: GPTConfig(**shape, **kw) for name, kw in REPORT_VARIANTS.items()}
        configs[DDP_VARIANT] = GPTConfig(**shape)
        for compiling in (False, True) if cfg['report_eager'] else (True,):
            raw = {name: GPT(config).to(dev).train() for name, config in configs.items()}
            ddp = DDP(raw[DDP_VARIANT], device_ids=[gpu], broadcast_buffers=False)
            models = {**raw, DDP_VARIANT: ddp}
            if compiling:
                models = compiled(models)
            times = median_step_times(models, x, y, ctx, torch.cuda.synchronize, cfg['steps'],
                                      cfg['warmup'])
            peaks = step_peaks(models, x, y, ctx)
            for name, dt in times.items():
                plan = memory_plan(configs[name], B, 1, False, dtype, compiling)
                step_plan = plan['total'] - plan['parameters'] - plan['optimizer']
                yield dict(shape=label, mode='compiled' if compiling else 'eager', variant=name,
                           tokens_per_s=B * T / dt, mfu=raw[name].estimate_mfu(B, dt, peak),
                           step_peak_gib=peaks[name] / 2**30, step_plan_gib=step_plan / 2**30)
            del raw, models, ddp
            gc.collect()  # these models freed before the next set's, and before the process group
            torch.cuda.empty_cache()


def print_gpu_report(cfg, dev, dtype, ctx):
    """A markdown table of gpu_report_rows: REPORT_VARIANTS, and LayerNorm wrapped in DDP before
    compile, at each of REPORT_CONFIGS' shapes, with its block size, micro-batch and GPT-2's
    vocabulary."""
    torch.cuda.set_device(torch.device(dev).index or 0)  # NCCL's and DDP's
    dist.init_process_group('nccl', store=dist.HashStore(), rank=0, world_size=1)  # DDP of one process
    peak = gpu_peak_flops(dev, dtype)  # train.py's; None for a GPU not in annex/memory.py's table
    modes = 'eager, then compiled' if cfg['report_eager'] else 'compiled'
    print(f"{torch.cuda.get_device_name(dev)}, {dtype}, {modes}; median of {cfg['steps']} steps "
          f"after {cfg['warmup']} warm-up, the variants taking turns; MFU against "
          + (f'{peak / 1e12:,.0f} TFLOP/s' if peak else "no known peak (annex/memory.py's PEAK_TFLOPS)"))
    print('| shape | mode | variant | tokens/s | MFU | a step\'s peak / plan (GiB) |\n'
          '|---|---|---|---|---|---|')
    for row in gpu_report_rows(cfg, dev, dtype, ctx, peak):
        mfu = '-' if row['mfu'] is None else f"{row['mfu']:.1%}"
        print(f"| {row['shape']} | {row['mode']} | {row['variant']} | {row['tokens_per_s']:,.0f} | "
              f"{mfu} | {row['step_peak_gib']:.2f} / {row['step_plan_gib']:.2f} |", flush=True)
        if cfg['report_json']:
            with open(cfg['report_json'], 'a') as f:
                f.write(json.dumps(row) + '\n')
    dist.destroy_process_group()


def main(argv):
    cfg = configure(DEFAULTS, argv, OPTIONAL_TYPES, __doc__)
    shape = {k: cfg[k] for k in ('n_layer', 'n_head', 'n_embd', 'block_size', 'vocab_size', 'bias')}
    try:
        dev = pick_device(cfg['device'])
        GPTConfig(**shape)  # the architecture's own checks, with their messages
    except ValueError as e:
        raise SystemExit(f'error: {e}') from None
    unknown = set(cfg['report_scales'].split(',')) - set(REPORT_CONFIGS)
    if cfg['gpu_report'] and unknown:
        raise SystemExit(f"error: report_scales={cfg['report_scales']!r}: {sorted(unknown)} not in "
                         f"{', '.join(REPORT_CONFIGS)}")
    if cfg['gpu_report'] and torch.device(dev).type != 'cuda':
        raise SystemExit(f'error: gpu_report=True needs a CUDA GPU, and the device is {dev!r}; without '
                         'it, python annex/bench.py times the variants on this device')
    if cfg['dtype'] not in (None, 'float32', 'bfloat16'):
        raise SystemExit(f"error: dtype={cfg['dtype']!r} is not known; use 'float32' or 'bfloat16'")
    dtype, ctx = precision(dev, cfg['dtype'])  # as train.py runs: bf16 autocast on CUDA, TF32
    if min(cfg['batch_size'], cfg['steps']) < 1 or cfg['warmup'] < 0:
        raise SystemExit('error: batch_size and steps must be positive, warmup >= 0')
    compiling = 'gpu_report' if cfg['gpu_report'] else 'compile' if cfg['compile'] else None
    if compiling and cfg['warmup'] < 1:
        raise SystemExit(f'error: {compiling}=True needs warmup >= 1: the first step compiles, and must '
                         'not be timed')
    torch.manual_seed(0)
    if cfg['gpu_report']:
        return print_gpu_report(cfg, dev, dtype, ctx)
    # GPU kernels run asynchronously: wait for them before reading the clock
    sync = {'cuda': torch.cuda.synchronize, 'mps': torch.mps.synchronize}.get(torch.device(dev).type,
                                                                             lambda: None)
    B, T = cfg['batch_size'], cfg['block_size']
    if cfg['vit']:
        variants = {f'ViT norm={norm}': ViT(ViTConfig(n_layer=6, n_head=4, n_embd=256, bias=True,
                                                      norm=norm))
                    for norm in STUDY_NORMS}
        inputs, targets, unit, per_step = torch.randn(B, 3, 32, 32), torch.randint(10, (B,)), 'images', B
        shape = dict(n_layer=6, n_head=4, n_embd=256, patch_size=4)
    else:
        variants = {'plain nanoGPT-style (LayerNorm)': PlainGPT(**shape)}
        for attn in ATTNS:
            for norm in STUDY_NORMS:
                variants[f"norm={norm} attn={attn}"] = GPT(GPTConfig(**shape, norm=norm, attn=attn))
        inputs = targets = torch.randint(0, cfg['vocab_size'], (B, T))
        unit, per_step = 'tokens', B * T
    variants = {name: model.to(dev).train() for name, model in variants.items()}
    if cfg['compile']:
        variants = compiled(variants)
    print(f"shape {shape}, batch {B}, device {dev}, dtype {dtype}, compile {cfg['compile']}, threads "
          f"{torch.get_num_threads()}; median of {cfg['steps']} steps after {cfg['warmup']} warm-up, "
          "the variants taking turns step by step")
    times = median_step_times(variants, inputs.to(dev), targets.to(dev), ctx, sync, cfg['steps'],
                              cfg['warmup'])
    for name, dt in times.items():
        print(f"{name:34s} {per_step / dt:12,.0f} {unit}/s")


if __name__ == '__main__':
    main(sys.argv[1:])
