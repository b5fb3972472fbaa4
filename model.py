"""
One GPT for the question "when does removing LayerNorm help?".

Flags switch, each in one obvious place below:
  norm: 'layernorm' | 'rmsnorm' | 'dyt' | 'derf' | 'hardtanh'   -> make_norm()
  attn: 'standard' | 'diff' (Differential Attention)   -> CausalSelfAttention
  mlp:  'gelu' | 'swiglu'                              -> MLP
  pos:  'learned' | 'rope'                             -> GPT.forward / apply_rope()
ViT (end of the file) is the same blocks with non-causal attention, for the vision check on CIFAR-10.
The defaults are nanoGPT's GPT-2, and parameter names are nanoGPT's, so its checkpoints load as they are.
Formulas follow the DyT paper (Zhu et al. 2025), the Derf paper (Chen et al. 2025), microsoft/unilm's
Diff-Transformer (Ye et al. 2025) and Llama.
"""
import hashlib
import math
import re
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn import functional as F

SAT_THRESHOLDS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)  # |alpha*x| cut-offs of the saturation measure (Verma 2026)
NORMS = ('layernorm', 'rmsnorm', 'dyt', 'derf', 'hardtanh')  # the `norm` flag's values
POINTWISE = ('dyt', 'derf')  # norms that squash each value alone: they have an alpha and a saturation


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_kv_head: int | None = None  # grouped-query attention; None = n_head
    dropout: float = 0.0
    bias: bool = True
    norm: str = 'layernorm'
    norm_eps: float = 1e-5
    dyt_alpha: float = 0.5  # alpha init of DyT and Derf (both papers' default); the study uses 2.0 for DyT
    dyt_alpha_attn: float | None = None  # per-place inits (DyT paper, LLM rule); None = dyt_alpha
    dyt_alpha_ffn: float | None = None
    dyt_alpha_final: float | None = None
    embed_scale: bool = False  # learnable scalar on the (token + position) embeddings, init sqrt(n_embd)
    emb_init_std: float = 0.02  # token/position embedding init (and the tied output layer's): GPT-2's 0.02.
    # Small DyT models collapse with it (README, "When DyT collapses"); 0.3 or 1.0 (PyTorch's default) train.
    attn: str = 'standard'
    mlp: str = 'gelu'
    pos: str = 'learned'
    rope_theta: float = 10000.0

    def __post_init__(self):
        choices = dict(norm=NORMS, attn=('standard', 'diff'),
                       mlp=('gelu', 'swiglu'), pos=('learned', 'rope'))
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key}={getattr(self, key)!r} is not known; choose one of {allowed}")
        if self.n_kv_head is not None and self.n_kv_head < 1:
            raise ValueError(f"n_kv_head={self.n_kv_head} must be positive, or None for n_head")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")
        n_kv_head = self.n_kv_head or self.n_head
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.n_head % n_kv_head:
            raise ValueError(f"n_head={self.n_head} must be a multiple of n_kv_head={n_kv_head}")
        if self.attn == 'diff' and (self.n_head % 2 or n_kv_head % 2):
            raise ValueError(f"attn='diff' pairs heads, so n_head ({self.n_head}) and n_kv_head ({n_kv_head}) "
                             "must be even; use the baseline's head count (the model halves it)")
        if self.pos == 'rope' and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"pos='rope' needs an even head size, got n_embd/n_head={self.n_embd // self.n_head}")


# ----------------------------------------------------------------------------------------------------------
# Normalization layers. Each can record statistics of its input for analysis (off by default: one Python
# bool test per call). The statistics live in non-persistent buffers, so they follow .to(device), stay out
# of checkpoints, and torch.compile traces the in-place updates.

class Norm(nn.Module):
    kind = None

    def __init__(self):
        super().__init__()
        self.tracking = False
        self.register_buffer('stat_count', torch.zeros((), dtype=torch.long), persistent=False)
        for name in ('stat_sum', 'stat_sumsq'):
            self.register_buffer(name, torch.zeros(()), persistent=False)
        self.register_buffer('stat_sat', torch.zeros(len(SAT_THRESHOLDS), dtype=torch.long), persistent=False)

    @torch.no_grad()
    def observe(self, x, ax=None):
        x = x.float()  # sums of one call in float32; counts are exact integers
        self.stat_count += x.numel()
        self.stat_sum += x.sum()
        self.stat_sumsq += x.square().sum()
        if ax is not None:
            a = ax.detach().abs()
            self.stat_sat += torch.stack([(a > t).sum() for t in SAT_THRESHOLDS])

    def reset_stats(self):
        for buf in self.buffers():
            buf.zero_()

    def stats(self):
        n = self.stat_count.item()
        mean = self.stat_sum.item() / max(n, 1)
        std = math.sqrt(max(self.stat_sumsq.item() / max(n, 1) - mean * mean, 0.0)) if n else None
        alpha = getattr(self, 'alpha', None)
        if hasattr(alpha, 'full_tensor'):  # sharded by FSDP2: gather just this scalar
            alpha = alpha.full_tensor()
        return {'kind': self.kind, 'alpha': alpha.item() if alpha is not None else None,
                'input_std': std, 'count': int(n),
                'saturation': [c / n for c in self.stat_sat.tolist()] if self.kind in POINTWISE and n else None}


class LayerNorm(Norm):
    kind = 'layernorm'

    def __init__(self, ndim, bias, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        if self.tracking:
            self.observe(x)
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(Norm):
    kind = 'rmsnorm'

    def __init__(self, ndim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(ndim))

    def forward(self, x):
        if self.tracking:
            self.observe(x)
        xf = x.float()  # the mean of squares overflows/underflows in half precision
        return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps) * self.weight.float()).type_as(x)


class DyT(Norm):
    """Dynamic Tanh: gamma * tanh(alpha * x) + beta, with ONE learnable alpha for the layer."""
    kind = 'dyt'

    def __init__(self, ndim, bias, alpha0):
        super().__init__()
        self.alpha0 = alpha0
        self.alpha = nn.Parameter(torch.full((1,), float(alpha0)))
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        ax = self.alpha * x
        if self.tracking:
            self.observe(x, ax)
        y = torch.tanh(ax)
        return y * self.weight if self.bias is None else torch.addcmul(self.bias, y, self.weight)


class Derf(Norm):
    """Dynamic erf (Chen et al. 2025): gamma * erf(alpha * x + s) + beta, with ONE learnable alpha and ONE
    learnable shift s for the layer. Saturation is measured on erf's argument, |alpha * x + s|."""
    kind = 'derf'

    def __init__(self, ndim, bias, alpha0):
        super().__init__()
        self.alpha0 = alpha0
        self.alpha = nn.Parameter(torch.full((1,), float(alpha0)))
        self.shift = nn.Parameter(torch.zeros(1))
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        ax = self.alpha * x + self.shift
        if self.tracking:
            self.observe(x, ax)
        y = torch.erf(ax)
        return y * self.weight if self.bias is None else torch.addcmul(self.bias, y, self.weight)


class HardTanh(Norm):
    """The study's control: DyT's bound without its learnable slope, clip(x, -1, 1) * gamma + beta."""
    kind = 'hardtanh'

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        if self.tracking:
            self.observe(x)
        y = x.clamp(-1.0, 1.0) * self.weight
        return y if self.bias is None else y + self.bias


def make_norm(config, dyt_alpha=None):
    """The one place where the model chooses its normalization."""
    if config.norm == 'layernorm':
        return LayerNorm(config.n_embd, config.bias, config.norm_eps)
    if config.norm == 'rmsnorm':
        return RMSNorm(config.n_embd, config.norm_eps)
    alpha0 = config.dyt_alpha if dyt_alpha is None else dyt_alpha
    if config.norm == 'dyt':
        return DyT(config.n_embd, config.bias, alpha0)
    if config.norm == 'derf':
        return Derf(config.n_embd, config.bias, alpha0)
    return HardTanh(config.n_embd, config.bias)


# ----------------------------------------------------------------------------------------------------------
# Rotary position embedding, rotate-half layout: the pair (x[i], x[i + d/2]) turns by pos * theta^(-2i/d).

def rope_angles(block_size, head_dim, theta):
    """float32 cos and sin tables, computed in float64 on the CPU (Apple GPUs have no float64)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device='cpu') / head_dim)
    angles = torch.outer(torch.arange(block_size, dtype=torch.float64, device='cpu'), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    """x: (B, H, T, head_dim); cos, sin: (T, head_dim/2)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


class CausalSelfAttention(nn.Module):
    """Standard multi-head attention, or Differential Attention (Ye et al. 2025) with attn='diff'; causal (GPT) or,
    with causal=False, every position attending to every other (ViT).

    Differential Attention keeps the baseline's projection shapes: Q and K are read as n_head heads of
    head_dim and paired up (2i, 2i+1), V as n_head/2 heads of 2*head_dim. Diff head i outputs
    (softmax(q_2i k^T s) - lambda * softmax(q_2i+1 k^T s)) v_i, then a per-head RMSNorm and * (1 - lambda_init).
    """

    def __init__(self, config, layer_idx, causal=True):
        super().__init__()
        self.causal = causal
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head or config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.kv_dim = self.n_kv_head * self.head_dim
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * self.kv_dim, bias=config.bias)  # q, k, v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        self.diff = config.attn == 'diff'
        if self.diff:
            self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer_idx)  # layer_idx counted from 0
            for name in ('lambda_q1', 'lambda_k1', 'lambda_q2', 'lambda_k2'):
                setattr(self, name, nn.Parameter(torch.randn(self.head_dim) * 0.1))
            self.subln = RMSNorm(2 * self.head_dim, eps=1e-5)

    def forward(self, x, rope=None):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split([C, self.kv_dim, self.kv_dim], dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        rep = self.n_head // self.n_kv_head  # GQA: `rep` query heads share one key/value head
        dropout_p = self.dropout if self.training else 0.0
        if not self.diff:
            k = k.repeat_interleave(rep, dim=1)
            v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2).repeat_interleave(rep, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=self.causal)
        else:
            # Diff head i reads key pair (2m, 2m+1) and value head m, m = i // rep (GQA as in the flashdiff reference).
            k = k.view(B, self.n_kv_head // 2, 2, T, self.head_dim).repeat_interleave(rep, dim=1)
            k = k.view(B, self.n_head, T, self.head_dim)
            v = v.view(B, T, self.n_kv_head // 2, 2 * self.head_dim).transpose(1, 2)
            v = v.repeat_interleave(rep, dim=1).repeat_interleave(2, dim=1)  # both maps of diff head i read v_i
            # Fast kernels want equal q/k/v head sizes: attend to each half of V (the reference "flashdiff" form).
            # With dropout each half draws its own mask; the reference has no attention dropout at all.
            y = torch.cat([F.scaled_dot_product_attention(q, k, vh, dropout_p=dropout_p, is_causal=self.causal)
                           for vh in v.split(self.head_dim, dim=-1)], dim=-1)
            y = y.view(B, self.n_head // 2, 2, T, 2 * self.head_dim)
            lam = (torch.exp(torch.dot(self.lambda_q1.float(), self.lambda_k1.float()))
                   - torch.exp(torch.dot(self.lambda_q2.float(), self.lambda_k2.float())) + self.lambda_init)
            y = self.subln(y[:, :, 0] - lam.type_as(y) * y[:, :, 1]) * (1 - self.lambda_init)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


def mlp_hidden(config):
    """The MLP's hidden width: 4 x n_embd (GELU), or 2/3 of it rounded up to a multiple of 256 (SwiGLU, Llama)."""
    return 256 * math.ceil(2 / 3 * 4 * config.n_embd / 256) if config.mlp == 'swiglu' else 4 * config.n_embd


class MLP(nn.Module):
    """GELU 4x MLP (GPT-2), or SwiGLU c_proj(silu(c_fc x) * c_up x) with hidden a multiple of 256 (Llama)."""

    def __init__(self, config):
        super().__init__()
        self.swiglu = config.mlp == 'swiglu'
        hidden = mlp_hidden(config)
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        if self.swiglu:
            self.c_up = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        h = self.c_fc(x)
        h = F.silu(h) * self.c_up(x) if self.swiglu else F.gelu(h)
        return self.dropout(self.c_proj(h))


class Block(nn.Module):

    def __init__(self, config, layer_idx, causal=True):
        super().__init__()
        self.ln_1 = make_norm(config, config.dyt_alpha_attn)
        self.attn = CausalSelfAttention(config, layer_idx, causal)
        self.ln_2 = make_norm(config, config.dyt_alpha_ffn)
        self.mlp = MLP(config)

    def forward(self, x, rope=None):
        x = x + self.attn(self.ln_1(x), rope)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        # drawn first, from the CPU generator: the same draw whether the model is built here or on 'meta'
        self.init_seed = int(torch.randint(2 ** 62, (), device='cpu'))
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=make_norm(config, config.dyt_alpha_final),
        ))
        if config.pos == 'learned':
            self.transformer.wpe = nn.Embedding(config.block_size, config.n_embd)
        else:  # filled by init_weights
            for name in ('rope_cos', 'rope_sin'):
                self.register_buffer(name, torch.empty(config.block_size, config.n_embd // config.n_head // 2),
                                     persistent=False)
        # one element, not a 0-dim scalar: FSDP2 cannot shard a 0-dim parameter
        self.embed_scale = nn.Parameter(torch.full((1,), math.sqrt(config.n_embd))) if config.embed_scale else None
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        if self.lm_head.weight.device.type != 'meta':  # on 'meta', whoever materialises the model initialises it
            self.init_weights()

    def materialize(self, device):
        """Allocate a model built on 'meta' (sharded or not) on `device` and initialise it as if built there."""
        self.to_empty(device=device)
        if 'wte' in self.transformer:  # to_empty gave each reference to the tied weight its own tensor
            self.transformer.wte.weight = self.lm_head.weight
        self.init_weights()
        return self

    @torch.no_grad()
    def init_weights(self):
        """GPT-2's init: weights N(0, 0.02), residual projections (attention and MLP c_proj) N(0, 0.02/sqrt(2
        n_layer)), embeddings N(0, emb_init_std) (the tied output layer's too), biases 0, norm gains 1, DyT/Derf
        alpha = alpha0 and shift 0, Diff lambdas N(0, 0.1), embed_scale sqrt(n_embd); then the buffers (RoPE
        tables, norm statistics).
        A parameter's values come from a generator seeded by (init_seed, its name), so they do not depend on how
        it is stored: built on the meta device, sharded by FSDP2 and materialised (train.py), the model gets the
        weights it gets when built whole."""
        for name, p in self.named_parameters():
            value = self.initial_value(name, p.shape)
            if isinstance(p, DTensor):  # this process's shard of it
                value = distribute_tensor(value.to(p.device), p.device_mesh, p.placements)
            p.copy_(value)
        if self.config.pos == 'rope':
            for buf, table in zip((self.rope_cos, self.rope_sin), rope_angles(
                    self.config.block_size, self.config.n_embd // self.config.n_head, self.config.rope_theta)):
                buf.copy_(table)
        for module in self.modules():
            if isinstance(module, Norm):
                module.reset_stats()

    def initial_value(self, name, shape):
        owner, _, leaf = name.rpartition('.')
        module = self.get_submodule(owner)
        if leaf in ('bias', 'shift'):
            return torch.zeros(shape)
        if isinstance(module, Norm) or name == 'embed_scale':
            fill = math.sqrt(self.config.n_embd) if name == 'embed_scale' else module.alpha0 if leaf == 'alpha' else 1.0
            return torch.full(shape, float(fill))
        std = (self.config.emb_init_std if isinstance(module, nn.Embedding) else 0.1 if leaf.startswith('lambda_')
               else 0.02 / math.sqrt(2 * self.config.n_layer) if owner.endswith('c_proj') else 0.02)
        return torch.randn(shape, generator=self.generator(name)) * std

    def generator(self, name):
        """The generator of a parameter's initial values, seeded by (init_seed, its name)."""
        seed = int.from_bytes(hashlib.blake2b(f'{self.init_seed}/{name}'.encode(), digest_size=8).digest(), 'little')
        return torch.Generator().manual_seed(seed >> 1)

    def get_num_params(self, non_embedding=True):
        """Parameter count; by default without position embeddings (token embeddings count: tied to lm_head)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.config.pos == 'learned':
            n -= self.transformer.wpe.weight.numel()
        return n

    def hidden(self, idx):
        """The final norm's output (B, T, n_embd): what lm_head reads. eval.py applies lm_head where it scores."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than block_size={self.config.block_size}")
        x = self.transformer.wte(idx)
        rope = None
        if self.config.pos == 'learned':
            x = x + self.transformer.wpe(torch.arange(T, device=idx.device))
        else:
            rope = (self.rope_cos[:T], self.rope_sin[:T])
        if self.embed_scale is not None:  # after the position embeddings, as in Derf's nanoGPT patch
            x = x * self.embed_scale
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x, rope)
        return self.transformer.ln_f(x)

    def forward(self, idx, targets=None, all_logits=False):
        x = self.hidden(idx)
        if targets is not None:
            return self.head_loss(x, targets)
        return self.lm_head(x if all_logits else x[:, [-1], :]), None  # generation needs only the last position

    def head_loss(self, x, targets):
        """Logits and mean cross-entropy from the final norm's output (train.py compiles this on its own under
        FSDP, where the blocks are compiled one by one)."""
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    # ---- saturation and input statistics of the norm layers (analyze.py and train.py read these) ----
    def norm_layers(self):
        for i, block in enumerate(self.transformer.h):
            yield f'transformer.h.{i}.ln_1', block.ln_1
            yield f'transformer.h.{i}.ln_2', block.ln_2
        yield 'transformer.ln_f', self.transformer.ln_f

    def track_norm_stats(self, enabled=True):
        """Start (and reset) or stop accumulating input statistics in every norm layer."""
        for _, layer in self.norm_layers():
            layer.tracking = enabled
            if enabled:
                layer.reset_stats()

    def norm_stats(self):
        """{'thresholds': [...], 'saturation': pooled fraction of |alpha*x (+ s)| > t over all DyT/Derf layers (None
        without them), 'layers': {name: {'kind', 'alpha', 'input_std', 'count' (elements seen), 'saturation'}}}."""
        layers = {name: layer.stats() for name, layer in self.norm_layers()}
        sats = [s['saturation'] for s in layers.values() if s['saturation'] is not None]
        # Every DyT/Derf layer sees the same number of elements, so the pooled fraction is the mean over layers.
        pooled = [sum(col) / len(sats) for col in zip(*sats)] if sats else None
        return {'thresholds': list(SAT_THRESHOLDS), 'layers': layers, 'saturation': pooled}

    no_decay = ()  # >=2-D parameters exempt from weight decay by name (the ViT's)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW; weight decay only on >=2-D weights (never on norm/DyT parameters, lambdas, biases, scalars)."""
        named = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        decay = [p.dim() >= 2 and n not in self.no_decay for n, p in named]
        groups = [{'params': [p for (_, p), d in zip(named, decay) if d], 'weight_decay': weight_decay},
                  {'params': [p for (_, p), d in zip(named, decay) if not d], 'weight_decay': 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == 'cuda')

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak=None, dtype=torch.bfloat16):
        """Model FLOPs utilization (PaLM appendix B) against `peak` FLOP/s, by default the GPU's dense peak for
        `dtype` (peak_flops); None when it is unknown (e.g. on a CPU)."""
        if peak is None and torch.cuda.is_available():
            peak = peak_flops(torch.cuda.get_device_name(), dtype)
        if peak is None:
            return None
        cfg = self.config  # nanoGPT's count: Differential Attention's second softmax map is not counted
        flops_per_token = 6 * self.get_num_params() + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
        return flops_per_token * cfg.block_size * fwdbwd_per_iter / dt / peak

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Sample max_new_tokens continuations of idx (B, T); temperature 0 picks the argmax."""
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.config.block_size:])
            logits = logits[:, -1, :]
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, -float('inf'))
                next_id = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, next_id), dim=1)
        return idx


# ----------------------------------------------------------------------------------------------------------
# The vision check: a ViT (Dosovitskiy et al. 2021) of the same blocks, attention made non-causal

@dataclass
class ViTConfig(GPTConfig):
    """A GPTConfig for images: the block fields (norm, attn, mlp, dyt_alpha*, ...) mean the same; the sequence is
    the image's patches, plus a class token with pool='cls'."""
    image_size: int = 32
    channels: int = 3
    n_classes: int = 10
    patch_size: int = 4
    # 'cls': a learned class token, read out after the final norm (ViT, and DeiT, the DyT paper's vision models);
    # 'mean': the mean of the patches' outputs
    pool: str = 'cls'
    block_size: int = field(default=0, init=False)  # tokens per image, from the sizes
    vocab_size: int = field(default=0, init=False)  # no vocabulary

    def __post_init__(self):
        if self.pool not in ('cls', 'mean'):
            raise ValueError(f"pool={self.pool!r} is not known; choose 'cls' or 'mean'")
        if self.pos != 'learned':
            raise ValueError("a ViT needs pos='learned': this RoPE is 1-D, an image's patches are 2-D")
        if self.patch_size < 1 or self.image_size % self.patch_size:
            raise ValueError(f"patch_size={self.patch_size} must divide image_size={self.image_size}")
        self.block_size = (self.image_size // self.patch_size) ** 2 + (self.pool == 'cls')
        super().__post_init__()


class ViT(GPT):
    """Patches -> one linear layer (a convolution with stride = kernel = patch_size) (+ class token) + learned
    positions -> GPT's blocks, attention non-causal -> final norm -> class token or mean -> linear classifier.
    GPT's norm statistics, optimizer and MFU apply as they are; init and weight decay follow timm's ViT."""
    no_decay = ('transformer.wpe.weight', 'cls_token')  # timm's ViT exempts its position embeddings and class token

    def __init__(self, config):
        nn.Module.__init__(self)  # GPT's layers are not built: only the blocks and the final norm are shared
        self.config = config
        self.init_seed = int(torch.randint(2 ** 62, (), device='cpu'))  # as in GPT: drawn first
        self.transformer = nn.ModuleDict(dict(
            patch=nn.Linear(config.channels * config.patch_size ** 2, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i, causal=False) for i in range(config.n_layer)]),
            ln_f=make_norm(config, config.dyt_alpha_final),
        ))
        self.cls_token = nn.Parameter(torch.empty(config.n_embd)) if config.pool == 'cls' else None
        self.embed_scale = nn.Parameter(torch.full((1,), math.sqrt(config.n_embd))) if config.embed_scale else None
        self.head = nn.Linear(config.n_embd, config.n_classes)
        if self.head.weight.device.type != 'meta':
            self.init_weights()

    def initial_value(self, name, shape):
        """timm's ViT init (the DyT paper's vision models): the patch embedding keeps PyTorch's convolution default
        U(+-1/sqrt(fan_in)), the class token N(0, 1e-6), every linear layer N(0, 0.02), the residual projections too
        (no GPT-2 depth scaling); position embeddings N(0, emb_init_std), norms and other biases as in GPT."""
        if name.startswith('transformer.patch.'):
            bound = 1 / math.sqrt(self.config.channels * self.config.patch_size ** 2)
            return (2 * torch.rand(shape, generator=self.generator(name)) - 1) * bound
        if name == 'cls_token' or name.endswith('c_proj.weight'):
            return torch.randn(shape, generator=self.generator(name)) * (1e-6 if name == 'cls_token' else 0.02)
        return super().initial_value(name, shape)

    def hidden(self, images):
        """(B, channels, H, W) float images -> the final norm's output (B, tokens, n_embd), the class token first."""
        B, C, H, W = images.shape
        p = self.config.patch_size
        if (C, H, W) != (self.config.channels, self.config.image_size, self.config.image_size):
            raise ValueError(f"images of shape {(C, H, W)}; this ViT takes "
                             f"{(self.config.channels, self.config.image_size, self.config.image_size)}")
        # each patch flattened in (channel, row, column) order, like a convolution kernel, patches row by row
        x = images.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).reshape(B, -1, C * p * p)
        x = self.transformer.patch(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, 1, -1).to(x.dtype), x], dim=1)
        x = x + self.transformer.wpe.weight
        if self.embed_scale is not None:
            x = x * self.embed_scale
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x)

    def forward(self, images, targets=None):
        """-> (class logits (B, n_classes), mean cross-entropy or None)."""
        return self.head_loss(self.hidden(images), targets)

    def head_loss(self, x, targets):
        logits = self.head(x[:, 0] if self.cls_token is not None else x.mean(dim=1))
        return logits, None if targets is None else F.cross_entropy(logits, targets)


def build_model(model_args):
    """The model that a checkpoint's model_args describe: a ViT's have a patch_size, a GPT's do not."""
    return ViT(ViTConfig(**model_args)) if 'patch_size' in model_args else GPT(GPTConfig(**model_args))


# ----------------------------------------------------------------------------------------------------------
# The peak FLOP/s that MFU divides by

# Dense (no 2:4 sparsity) tensor-core peaks in TFLOP/s: (name pattern, bfloat16, float32). NVIDIA's datasheets
# print the sparse figure with a '*'; the dense one is half of it. float32 is the TF32 tensor-core peak, since
# train.py turns TF32 on; V100 and T4 have no TF32 (their float32 figure is the plain FP32 peak) and no bf16.
# A pattern matches whole words of torch.cuda.get_device_name(), ignoring case; the first match wins, so a
# form factor ('H100 PCIe') comes before its family ('H100', which is then the SXM part, 'NVIDIA H100 80GB HBM3').
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
    ('A10G', 70, 35),  # AWS's A10 variant: on no NVIDIA datasheet; approximate figures as AWS users report them
    ('A10', 125, 62.5),  # A10 datasheet: BF16 250*, TF32 125*
    ('L40S', 362.05, 183),  # L40S datasheet: BF16 733*, TF32 366*
    ('L40', 181.05, 90.5),  # L40 datasheet: BF16 362.1*, TF32 181*
    ('L4', 121, 60),  # L4 datasheet: BF16 242*, TF32 120*
    ('RTX A6000', 154.8, 77.4),  # GA102 whitepaper v2, appendix C: BF16 with FP32 accumulate 309.7*, TF32 154.8*
    ('RTX 4090', 165.2, 82.6),  # Ada whitepaper: BF16 with FP32 accumulate (GeForce: half the FP16-accumulate rate)
    ('RTX 3090', 71, 35.6),  # GA102 whitepaper, appendix A: BF16 with FP32 accumulate 142*, TF32 71*
    ('V100S', None, 16.4),  # V100S datasheet (PCIe): FP32
    ('V100-PCIE', None, 14),  # V100 datasheet, PCIe column: FP32
    ('V100', None, 15.7),  # V100 datasheet, SXM2 column: FP32
    ('T4', None, 8.1),  # T4 datasheet: FP32
)


def peak_flops(device_name, dtype):
    """Dense peak FLOP/s of the GPU called `device_name` (torch.cuda.get_device_name()) for matmuls in `dtype`
    (torch.bfloat16, or torch.float32 with TF32 on; their names work too); None for a GPU not in PEAK_TFLOPS or
    one without that dtype (V100 and T4 have no bf16): no MFU is better than one against the wrong peak."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"dtype={dtype} has no peak here; use torch.bfloat16 or torch.float32")
    for pattern, bf16, fp32 in PEAK_TFLOPS:
        if re.search(rf'\b{pattern}\b', device_name, re.IGNORECASE):
            tflops = bf16 if dtype == torch.bfloat16 else fp32
            return None if tflops is None else tflops * 1e12
    return None


def precision(device, dtype=None):
    """(dtype name, the context to run the model in) as train.py trains, shared by eval.py, sample.py and bench.py:
    dtype None = 'bfloat16' on a CUDA device that has it, else 'float32'; float32 runs without autocast, and on
    CUDA its matmuls use TF32."""
    kind = torch.device(device).type
    dtype = dtype or ('bfloat16' if kind == 'cuda' and torch.cuda.is_bf16_supported() else 'float32')
    if kind == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return dtype, nullcontext() if dtype == 'float32' else torch.autocast(kind, dtype=getattr(torch, dtype))


def pick_device(device=None):
    """The device asked for (an error if this machine lacks it), or by default cuda, else mps, else cpu."""
    if device in (None, 'auto'):
        return 'cuda' if torch.cuda.is_available() else 'mps' if torch.backends.mps.is_available() else 'cpu'
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ValueError(f"device={device!r} is not a device name; use 'cpu', 'cuda', 'cuda:1' or 'mps'") from None
    if (kind == 'cuda' and not torch.cuda.is_available()) or (kind == 'mps' and not torch.backends.mps.is_available()):
        raise ValueError(f"device={device!r}, but this machine has no {kind} device; use device='cpu'")
    return device
