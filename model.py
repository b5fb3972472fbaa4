"""One GPT for "when does removing LayerNorm help?"; each GPTConfig flag switches in one place:
norm in NORMS, attn in CausalSelfAttention, mlp in MLP, pos in apply_rope() and GPT.hidden.
nanoGPT's GPT-2 defaults and parameter names (its checkpoints load as is). Formulas: DyT (Zhu et al.
2025), Derf (Chen et al. 2025), microsoft/unilm's Diff-Transformer (Ye et al. 2025), Llama."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

# The norms, Norm(ndim, bias, eps, alpha0) each, using what it needs. DyT and Derf swap LayerNorm's
# statistics for a bounded f of each value, ONE learnable alpha per layer; HardTanh, the control,
# has no slope. For norm_stats.py: |f(u)| > tanh(t) iff |u| > cut(t), u = squashed(x)

class LayerNorm(nn.Module):
    def __init__(self, ndim, bias=False, eps=1e-5, alpha0=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    def __init__(self, ndim, bias=False, eps=1e-5, alpha0=None):  # no bias, as Llama's
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(ndim))

    def forward(self, x):
        xf = x.float()  # squares over/underflow in half precision
        y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return y.type_as(x)


class Identity(nn.Module):  # gamma * x + beta: the point-wise norms' f(x) is x (no squashing)
    def __init__(self, ndim, bias=False, eps=None, alpha0=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def f(self, x):
        return x

    def forward(self, x):
        y = self.f(x)
        return y * self.weight if self.bias is None else torch.addcmul(self.bias, y, self.weight)


class HardTanh(Identity):  # gamma * clip(x, -1, 1) + beta: the study's control, no slope
    def f(self, x):
        return x.clamp(-1.0, 1.0)


class DyT(Identity):  # Dynamic Tanh: gamma * tanh(alpha * x) + beta
    def __init__(self, ndim, bias=False, eps=None, alpha0=0.5):
        super().__init__(ndim, bias)
        self.alpha = nn.Parameter(torch.full((1,), float(alpha0)))

    def squashed(self, x):
        return self.alpha * x

    @staticmethod
    def cut(t):
        return t

    def f(self, x):
        return torch.tanh(self.squashed(x))


class Derf(DyT):  # Dynamic erf: gamma * erf(alpha * x + s) + beta
    def __init__(self, ndim, bias=False, eps=None, alpha0=0.5):
        super().__init__(ndim, bias, eps, alpha0)
        self.shift = nn.Parameter(torch.zeros(1))

    def squashed(self, x):
        return self.alpha * x + self.shift

    @staticmethod
    def cut(t):  # 1.483 at t = 2 (|u| > 2: 99.5% of the bound)
        return torch.erfinv(torch.tanh(torch.tensor(t, dtype=torch.float64))).item()

    def f(self, x):
        return torch.erf(self.squashed(x))


# The DyT paper's ablations (Zhu et al. 2025, section 6), with Identity: other f, alpha fixed

class Sigmoid(DyT):  # gamma * (2 sigmoid(alpha * x) - 1) + beta: tanh's range; = tanh(alpha x / 2)
    @staticmethod
    def cut(t):  # |2 sigmoid(u) - 1| = tanh(|u| / 2) > tanh(t) iff |u| > 2t
        return 2 * t

    def f(self, x):
        return 2 * torch.sigmoid(self.squashed(x)) - 1


class FrozenDyT(DyT):  # DyT with alpha fixed at alpha0: still in checkpoints, not trained
    def __init__(self, ndim, bias=False, eps=None, alpha0=0.5):
        super().__init__(ndim, bias, eps, alpha0)
        self.alpha.requires_grad_(False)


NORMS = {'layernorm': LayerNorm, 'rmsnorm': RMSNorm, 'dyt': DyT, 'derf': Derf, 'hardtanh': HardTanh,
         'identity': Identity, 'sigmoid': Sigmoid, 'dyt_frozen': FrozenDyT}


def make_norm(config, alpha0=None):
    alpha0 = config.dyt_alpha if alpha0 is None else alpha0
    return NORMS[config.norm](config.n_embd, config.bias, config.norm_eps, alpha0)


# Rotary position embedding, rotate-half: the pair (x[i], x[i + d/2]) turns by pos theta^(-2i/d)

def rope_angles(block_size, head_dim, theta):  # float32 cos, sin (T, head_dim/2)
    half = torch.arange(0, head_dim, 2, dtype=torch.float64, device='cpu')  # MPS has no float64
    inv_freq = theta ** (-half / head_dim)
    angles = torch.outer(torch.arange(block_size, dtype=torch.float64, device='cpu'), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    x1, x2 = x.float().chunk(2, dim=-1)  # x: (B, H, T, head_dim); cos, sin: (T, head_dim/2)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


class CausalSelfAttention(nn.Module):
    """Multi-head attention (grouped-query: n_kv_head), or Differential Attention (attn='diff') in
    the baseline's shapes: diff head i, from q heads 2i, 2i+1 and a V head of 2*head_dim, is
    RMSNorm((softmax(q_2i k^T s) - lambda softmax(q_2i+1 k^T s)) v_i) x (1 - lambda_init)."""
    def __init__(self, config, layer_idx, causal=True):  # causal=False: annex/vit.py's ViT
        super().__init__()
        self.causal, self.dropout = causal, config.dropout
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head or config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.kv_dim = self.n_kv_head * self.head_dim
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * self.kv_dim, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.diff = config.attn == 'diff'
        if self.diff:
            self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer_idx)  # layer_idx from 0
            for name in ('lambda_q1', 'lambda_k1', 'lambda_q2', 'lambda_k2'):
                setattr(self, name, nn.Parameter(torch.randn(self.head_dim) * 0.1))
            self.subln = RMSNorm(2 * self.head_dim, eps=1e-5)

    def forward(self, x, rope=None):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split([C, self.kv_dim, self.kv_dim], dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        gqa = self.n_kv_head < self.n_head  # SDPA reads KV head i // rep for query head i: no copy
        p = self.dropout if self.training else 0.0
        if not self.diff:
            v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal,
                                               enable_gqa=gqa)
        else:
            # diff head i: its maps s = 0, 1 from q heads 2i+s and key 2m+s, value head m = i // rep
            # (flashdiff's); V's halves apart, as flashdiff (flash kernels want equal head sizes);
            # each draws its own dropout mask (the reference has none)
            v = v.view(B, T, self.n_kv_head // 2, 2 * self.head_dim).transpose(1, 2)
            maps = []
            for s in (0, 1):
                halves = [F.scaled_dot_product_attention(q[:, s::2], k[:, s::2], vh, dropout_p=p,
                                                         is_causal=self.causal, enable_gqa=gqa)
                          for vh in v.split(self.head_dim, dim=-1)]
                maps.append(torch.cat(halves, dim=-1))
            lam = (torch.exp(torch.dot(self.lambda_q1.float(), self.lambda_k1.float()))
                   - torch.exp(torch.dot(self.lambda_q2.float(), self.lambda_k2.float()))
                   + self.lambda_init)
            y = self.subln(maps[0] - lam.type_as(maps[0]) * maps[1]) * (1 - self.lambda_init)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


def mlp_hidden(config):  # SwiGLU's as Llama's
    if config.mlp == 'swiglu':
        return 256 * math.ceil(2 / 3 * 4 * config.n_embd / 256)
    return 4 * config.n_embd


class MLP(nn.Module):  # GELU (GPT-2), or SwiGLU: c_proj(silu(c_fc x) * c_up x) (Llama)
    def __init__(self, config):
        super().__init__()
        self.swiglu = config.mlp == 'swiglu'
        self.c_fc = nn.Linear(config.n_embd, mlp_hidden(config), bias=config.bias)
        if self.swiglu:
            self.c_up = nn.Linear(config.n_embd, mlp_hidden(config), bias=config.bias)
        self.c_proj = nn.Linear(mlp_hidden(config), config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        h = F.silu(self.c_fc(x)) * self.c_up(x) if self.swiglu else F.gelu(self.c_fc(x))
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


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257, padded to a multiple of 64
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_kv_head: int | None = None  # grouped-query attention; None = n_head
    dropout: float = 0.0
    bias: bool = True
    norm: str = 'layernorm'
    norm_eps: float = 1e-5
    dyt_alpha: float = 0.5  # alpha0 of DyT, Derf (both papers'); the study's: 2.0
    dyt_alpha_attn: float | None = None  # per place (DyT's LLM rule); None = dyt_alpha
    dyt_alpha_ffn: float | None = None
    dyt_alpha_final: float | None = None
    embed_scale: bool = False  # a learnable scalar on the embeddings
    emb_init_std: float = 0.02  # GPT-2's; small DyT models collapse (docs/collapse.md)
    attn: str = 'standard'
    mlp: str = 'gelu'
    pos: str = 'learned'
    rope_theta: float = 10000.0

    def __post_init__(self):
        for key, allowed in dict(norm=tuple(NORMS), attn=('standard', 'diff'),
                                 mlp=('gelu', 'swiglu'), pos=('learned', 'rope')).items():
            value = getattr(self, key)
            if value not in allowed:
                raise ValueError(f"{key}={value!r} is not known; choose one of {allowed}")
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
            raise ValueError(f"attn='diff' pairs heads, so n_head ({self.n_head}) and n_kv_head "
                             f"({n_kv_head}) must be even; use the baseline's (it halves them)")
        head_size = self.n_embd // self.n_head
        if self.pos == 'rope' and head_size % 2:
            raise ValueError(f"pos='rope' needs an even head size, got n_embd/n_head={head_size}")


class GPT(nn.Module):
    no_decay = ()  # >= 2-D parameters not decayed (a ViT's)

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=make_norm(config, config.dyt_alpha_final),
        ))
        if config.pos == 'learned':
            self.transformer.wpe = nn.Embedding(config.block_size, config.n_embd)
        else:  # not saved: made from the config (also on meta)
            device = self.transformer.wte.weight.device
            for name, table in zip(('rope_cos', 'rope_sin'), rope_angles(
                    config.block_size, config.n_embd // config.n_head, config.rope_theta)):
                self.register_buffer(name, table.to(device), persistent=False)
        scale = torch.full((1,), math.sqrt(config.n_embd))  # not 0-dim: FSDP2 cannot shard that
        self.embed_scale = nn.Parameter(scale) if config.embed_scale else None
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled residual projections
            if name.endswith('c_proj.weight'):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):  # nanoGPT's; wte at emb_init_std; norms, lambdas as built
        if isinstance(module, nn.Linear) and module is not self.lm_head:
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=self.config.emb_init_std)

    def get_num_params(self, non_embedding=True):  # wpe not counted by default; wte is: tied
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.config.pos == 'learned':
            n -= self.transformer.wpe.weight.numel()
        return n

    def describe(self):
        c = self.config
        return (f'{self.get_num_params():,} parameters ({c.norm}, {c.attn} attention, {c.mlp} MLP, '
                f'{c.pos} positions)')

    def hidden(self, idx):  # ln_f's output (B, T, n_embd), lm_head's input
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} exceeds block_size={self.config.block_size}")
        x = self.transformer.wte(idx)
        if self.config.pos == 'learned':
            x = x + self.transformer.wpe(torch.arange(T, device=idx.device))
        rope = (self.rope_cos[:T], self.rope_sin[:T]) if self.config.pos == 'rope' else None
        if self.embed_scale is not None:  # after wpe, as Derf's nanoGPT patch
            x = x * self.embed_scale
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x, rope)
        return self.transformer.ln_f(x)

    def forward(self, idx, targets=None, all_logits=False):
        x = self.hidden(idx)
        if targets is None:  # generation needs only the last position
            return self.lm_head(x if all_logits else x[:, [-1], :]), None
        return self.head_loss(x, targets)

    def head_loss(self, x, targets):  # apart: FSDP compiles it alone (annex/cluster.py)
        logits = self.lm_head(x)
        wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fsdp_bf16's: fp32 loss
        loss = F.cross_entropy(wide.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW, decaying >= 2-D weights only: not gains, alphas, lambdas, biases."""
        named = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        decay = [p for n, p in named if p.dim() >= 2 and n not in self.no_decay]
        rest = [p for n, p in named if p.dim() < 2 or n in self.no_decay]
        groups = [{'params': decay, 'weight_decay': weight_decay},
                  {'params': rest, 'weight_decay': 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == 'cuda')

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak):  # PaLM, appendix B
        if not peak:
            return None
        cfg = self.config
        attention = 12 * cfg.n_layer * cfg.n_embd * cfg.block_size  # QK^T and AV, forward, backward
        if cfg.attn == 'diff':  # each head's two maps read V of twice the head size: AV's work x 2
            attention = attention * 3 // 2
        flops_per_token = 6 * self.get_num_params() + attention
        return flops_per_token * cfg.block_size * fwdbwd_per_iter / dt / peak

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):  # temperature 0: argmax
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.config.block_size:])[0][:, -1, :]
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
