"""
Forward+backward throughput of each norm and attention variant at one small shared shape, next to a plain
nanoGPT-style GPT of the same size (the bar the LayerNorm baseline must meet). Device, dtype, TF32 and
torch.compile are set as train.py sets them, so that the figures mean what training runs.

    python annex/bench.py                 # the shape below, on cuda, else mps, else cpu
    python annex/bench.py --device=cpu --steps=15
    python annex/bench.py --device=cuda --n_layer=12 --n_embd=768 --n_head=12 --block_size=1024 \\
        --compile=True
    python annex/bench.py --vit=True --batch_size=128  # config/vision.py's ViT, in images/s
    python annex/bench.py --help          # this text, then the keys and their defaults
"""
import os
import sys
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as annex/bench.py
from annex.vit import ViT, ViTConfig  # noqa: E402
from configurator import config_keys, configure, pick_device, precision  # noqa: E402
from model import GPT, NORMS, GPTConfig  # noqa: E402

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
device: str | None = None  # None = cuda if available, else mps, else cpu (configurator.pick_device)
dtype: str | None = None  # 'float32' or 'bfloat16' (autocast); None = bfloat16 on CUDA when supported
compile = False  # torch.compile each model before timing
# True: the study's ViT (6 layers, 4 heads, width 256, 4x4 patches of 32x32 images) per norm instead
vit = False
# -------------------------------------------------------------------------------------------------------
DEFAULTS, OPTIONAL_TYPES = config_keys(globals())
ATTNS = ('standard', 'diff')


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


def main(argv):
    cfg = configure(DEFAULTS, argv, OPTIONAL_TYPES, __doc__)
    shape = {k: cfg[k] for k in ('n_layer', 'n_head', 'n_embd', 'block_size', 'vocab_size', 'bias')}
    try:
        dev = pick_device(cfg['device'])
        GPTConfig(**shape)  # the architecture's own checks, with their messages
    except ValueError as e:
        raise SystemExit(f'error: {e}') from None
    if cfg['dtype'] not in (None, 'float32', 'bfloat16'):
        raise SystemExit(f"error: dtype={cfg['dtype']!r} is not known; use 'float32' or 'bfloat16'")
    dtype, ctx = precision(dev, cfg['dtype'])  # as train.py runs: bf16 autocast on CUDA, TF32
    if min(cfg['batch_size'], cfg['steps']) < 1 or cfg['warmup'] < 0:
        raise SystemExit('error: batch_size and steps must be positive, warmup >= 0')
    if cfg['compile'] and cfg['warmup'] < 1:
        raise SystemExit('error: compile=True needs warmup >= 1: the first step compiles, and must not '
                         'be timed')
    # GPU kernels run asynchronously: wait for them before reading the clock
    sync = {'cuda': torch.cuda.synchronize, 'mps': torch.mps.synchronize}.get(torch.device(dev).type,
                                                                             lambda: None)

    torch.manual_seed(0)
    B, T = cfg['batch_size'], cfg['block_size']
    if cfg['vit']:
        variants = {f'ViT norm={norm}': ViT(ViTConfig(n_layer=6, n_head=4, n_embd=256, bias=True,
                                                      norm=norm))
                    for norm in NORMS}
        inputs, targets, unit, per_step = torch.randn(B, 3, 32, 32), torch.randint(10, (B,)), 'images', B
        shape = dict(n_layer=6, n_head=4, n_embd=256, patch_size=4)
    else:
        variants = {'plain nanoGPT-style (LayerNorm)': PlainGPT(**shape)}
        for attn in ATTNS:
            for norm in NORMS:
                variants[f"norm={norm} attn={attn}"] = GPT(GPTConfig(**shape, norm=norm, attn=attn))
        inputs = targets = torch.randint(0, cfg['vocab_size'], (B, T))
        unit, per_step = 'tokens', B * T
    variants = {name: model.to(dev).train() for name, model in variants.items()}
    if cfg['compile']:
        # The GPT variants share GPT.forward's code: each one is a recompile of it, and past the limit
        # (8 by default) dynamo runs the rest eager, with only a warning (newer PyTorch names the limit
        # recompile_limit)
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit,
                                                    len(variants))
        variants = {name: torch.compile(model) for name, model in variants.items()}

    # the previous step ended with sync(): the clock starts on an idle device
    def step_time(model, x, y):
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        with ctx:
            _, loss = model(x, y)
        loss.backward()
        sync()
        return time.perf_counter() - t0

    print(f"shape {shape}, batch {B}, device {dev}, dtype {dtype}, compile {cfg['compile']}, threads "
          f"{torch.get_num_threads()}; median of {cfg['steps']} steps after {cfg['warmup']} warm-up, "
          "the variants taking turns step by step")
    inputs, targets = inputs.to(dev), targets.to(dev)
    times = {name: [] for name in variants}
    # interleaved: a slow spell of the machine hits every variant alike
    for i in range(cfg['warmup'] + cfg['steps']):
        for name, model in variants.items():
            dt = step_time(model, inputs, targets)
            if i >= cfg['warmup']:
                times[name].append(dt)
    for name, ts in times.items():
        print(f"{name:34s} {per_step / sorted(ts)[len(ts) // 2]:12,.0f} {unit}/s")


if __name__ == '__main__':
    main(sys.argv[1:])
