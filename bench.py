"""
Forward+backward throughput of each norm and attention variant at one small shared shape, next to a plain
nanoGPT-style GPT of the same size (the bar the LayerNorm baseline must meet).

    python bench.py                       # CPU, the shape below
    python bench.py --device=cuda --n_layer=12 --n_embd=768 --n_head=12 --block_size=1024 --batch_size=8
"""
import sys
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

from model import GPT, GPTConfig

shape = dict(n_layer=4, n_head=8, n_embd=256, block_size=256, vocab_size=4096, bias=False)
batch_size, steps, warmup, device = 8, 10, 3, 'cpu'
for arg in sys.argv[1:]:  # --key=value for the names above
    key, _, value = arg.removeprefix('--').partition('=')
    if key in shape:
        shape[key] = type(shape[key])(value) if key != 'bias' else value == 'True'
    elif key in ('batch_size', 'steps', 'warmup'):
        globals()[key] = int(value)
    elif key == 'device':
        device = value
    else:
        raise SystemExit(f"unknown option --{key}; known: {sorted(shape) + ['batch_size', 'steps', 'warmup', 'device']}")


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


def step_time(model, idx):
    t0 = time.perf_counter()
    model.zero_grad(set_to_none=True)
    _, loss = model(idx, idx)
    loss.backward()
    if device.startswith('cuda'):
        torch.cuda.synchronize()
    return time.perf_counter() - t0


torch.manual_seed(0)
print(f"shape {shape}, batch {batch_size}, device {device}, threads {torch.get_num_threads()}; "
      f"median of {steps} steps after {warmup} warm-up, the variants taking turns step by step")
variants = {'plain nanoGPT-style (LayerNorm)': PlainGPT(**shape)}
for attn in ('standard', 'diff'):
    for norm in ('layernorm', 'rmsnorm', 'dyt', 'hardtanh'):
        variants[f"norm={norm} attn={attn}"] = GPT(GPTConfig(**shape, norm=norm, attn=attn))
idx = torch.randint(0, shape['vocab_size'], (batch_size, shape['block_size']), device=device)
times = {name: [] for name in variants}
for i in range(warmup + steps):  # interleaved, so a slow spell of the machine hits every variant alike
    for name, model in variants.items():
        dt = step_time(model.to(device).train(), idx)
        if i >= warmup:
            times[name].append(dt)
for name, ts in times.items():
    print(f"{name:34s} {batch_size * shape['block_size'] / sorted(ts)[len(ts) // 2]:10,.0f} tokens/s")
