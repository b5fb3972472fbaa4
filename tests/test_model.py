"""Tests of model.py (issue 2).

Every expected value is computed independently here: formulas written out, naive per-head loops with
explicit softmax matrices in float64, closed-form parameter counts, expectations built from parameter
names. The code under test is never asked for its own expectation.
Elsewhere: the norm statistics (section 12) and the torch.compile test in tests/test_norm_stats.py, the
meta-device (FSDP) init in annex/tests/test_cluster.py.
"""
import math
import re
from dataclasses import asdict

import pytest
import torch

from checkpoint import load_checkpoint
from model import GPT, NORMS, GPTConfig, apply_rope, rope_angles
from tests.common import randomize, tiny

VARIANTS = [(n, a, m, p) for n in NORMS for a in ('standard', 'diff') for m in ('gelu', 'swiglu')
            for p in ('learned', 'rope')]


def variant(norm, attn, mlp, pos, **kw):
    """One of the 64 variants. RoPE variants also use GQA, learned ones biases, DyT ones embed_scale, so
    the 64 combinations cover those options too."""
    return tiny(norm=norm, attn=attn, mlp=mlp, pos=pos, bias=pos == 'learned',
                n_kv_head=2 if pos == 'rope' else None, embed_scale=norm == 'dyt', **kw)


# -------------------------------------------------------------------------------------------------------
# Independent reference implementation (float64, explicit loops). It reads the weights by nanoGPT names.

def softmax_rows(s):
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def causal_softmax(q, k):
    """The explicit attention matrix of one head: q, k (T, d) -> softmax(q k^T / sqrt(d)), future
    masked."""
    T, d = q.shape
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    return softmax_rows((q @ k.T / math.sqrt(d)).masked_fill(future, float('-inf')))


def rope_ref(x, theta):
    """Rotate-half RoPE of one head x (T, d): at position p the pair (x[i], x[i + d/2]) turns by
    p*theta^(-2i/d)."""
    T, d = x.shape
    out = x.clone()
    pos = torch.arange(T, dtype=torch.float64)
    for i in range(d // 2):
        ang = pos * theta ** (-2 * i / d)
        a, b = x[:, i], x[:, i + d // 2]
        out[:, i] = a * torch.cos(ang) - b * torch.sin(ang)
        out[:, i + d // 2] = a * torch.sin(ang) + b * torch.cos(ang)
    return out


def linear(x, sd, prefix):
    y = x @ sd[prefix + '.weight'].T
    return y + sd[prefix + '.bias'] if prefix + '.bias' in sd else y


def rms(x, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def ref_attention(cfg, sd, prefix, x, layer_idx):
    """Naive causal self-attention of one layer, one batch row and one head at a time.

    Standard: query head j reads key/value head j // (n_head / n_kv_head).
    Differential (microsoft/unilm Diff-Transformer, multihead_flashdiff_*.py): h = n_head/2 diff heads,
    g = n_kv_head/2; Q = 2h heads of head_dim, K = 2g heads of head_dim, V = g heads of 2*head_dim; with
    n_rep = h/g, diff head i reads the key pair (2m, 2m+1) and value head m, m = i // n_rep (for
    n_rep = 1 this equals multihead_diffattn.py); diff head i = (A_2i - lambda A_2i+1) V, sub-RMSNorm
    (eps 1e-5, weight), times (1 - lambda_init), lambda_init = 0.8 - 0.6 exp(-0.3 layer_idx)."""
    B, T, C = x.shape
    H = cfg.n_head
    KV = cfg.n_kv_head or H
    hd = C // H
    qkv = linear(x, sd, prefix + '.c_attn')
    q, k, v = qkv[..., :C], qkv[..., C:C + KV * hd], qkv[..., C + KV * hd:]
    assert v.shape[-1] == KV * hd

    def rot(t):
        return rope_ref(t, cfg.rope_theta) if cfg.pos == 'rope' else t

    def head(t, j, size):
        return t[:, j * size:(j + 1) * size]

    out = torch.zeros(B, T, C, dtype=x.dtype)
    for b in range(B):
        if cfg.attn == 'standard':
            rep = H // KV
            for j in range(H):
                A = causal_softmax(rot(head(q[b], j, hd)), rot(head(k[b], j // rep, hd)))
                out[b, :, j * hd:(j + 1) * hd] = A @ head(v[b], j // rep, hd)
        else:
            h, g = H // 2, KV // 2
            n_rep = h // g
            lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer_idx)
            lam = (torch.exp((sd[prefix + '.lambda_q1'] * sd[prefix + '.lambda_k1']).sum())
                   - torch.exp((sd[prefix + '.lambda_q2'] * sd[prefix + '.lambda_k2']).sum())
                   + lambda_init)
            for i in range(h):
                A1, A2 = (causal_softmax(rot(head(q[b], j, hd)),
                                         rot(head(k[b], 2 * (i // n_rep) + j % 2, hd)))
                          for j in (2 * i, 2 * i + 1))
                o = (A1 - lam * A2) @ head(v[b], i // n_rep, 2 * hd)
                o = rms(o, 1e-5) * sd[prefix + '.subln.weight']
                out[b, :, i * 2 * hd:(i + 1) * 2 * hd] = o * (1 - lambda_init)
    return linear(out, sd, prefix + '.c_proj')


def ref_norm(cfg, sd, prefix, x):
    w = sd[prefix + '.weight']
    if cfg.norm == 'layernorm':
        mu = x.mean(-1, keepdim=True)
        y = (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + cfg.norm_eps) * w
    elif cfg.norm == 'rmsnorm':
        y = rms(x, cfg.norm_eps) * w
    elif cfg.norm == 'dyt':
        y = torch.tanh(sd[prefix + '.alpha'] * x) * w
    elif cfg.norm == 'derf':
        y = erf(sd[prefix + '.alpha'] * x + sd[prefix + '.shift']) * w
    else:
        y = torch.clamp(x, -1.0, 1.0) * w
    return y + sd[prefix + '.bias'] if prefix + '.bias' in sd else y


def erf(z):
    """The error function value by value from Python's math module: not torch's kernel."""
    return torch.tensor([math.erf(v) for v in z.flatten().tolist()], dtype=z.dtype).view(z.shape)


def ref_mlp(cfg, sd, prefix, x):
    a = linear(x, sd, prefix + '.c_fc')
    if cfg.mlp == 'gelu':
        h = 0.5 * a * (1 + torch.erf(a / math.sqrt(2)))
    else:  # SwiGLU: w2(silu(w1 x) * w3 x) with w1 = c_fc, w3 = c_up, w2 = c_proj
        h = a / (1 + torch.exp(-a)) * linear(x, sd, prefix + '.c_up')
    return linear(h, sd, prefix + '.c_proj')


def ref_logits(model, idx):
    """Pre-norm GPT: (token (+ position) embeddings) (* embed_scale), blocks, final norm, head tied to
    wte."""
    cfg = model.config
    sd = {k: v.double() for k, v in model.state_dict().items()}
    T = idx.shape[1]
    x = sd['transformer.wte.weight'][idx]
    if cfg.pos == 'learned':
        x = x + sd['transformer.wpe.weight'][:T]
    if cfg.embed_scale:  # Derf's nanoGPT patch: the sum of both embeddings is scaled
        x = x * sd['embed_scale']
    for layer in range(cfg.n_layer):
        p = f'transformer.h.{layer}'
        x = x + ref_attention(cfg, sd, p + '.attn', ref_norm(cfg, sd, p + '.ln_1', x), layer)
        x = x + ref_mlp(cfg, sd, p + '.mlp', ref_norm(cfg, sd, p + '.ln_2', x))
    return ref_norm(cfg, sd, 'transformer.ln_f', x) @ sd['transformer.wte.weight'].T


# -------------------------------------------------------------------------------------------------------
# 1-2. Every variant trains and is causal

@pytest.mark.parametrize('norm,attn,mlp,pos', VARIANTS)
def test_every_variant_forward_backward(norm, attn, mlp, pos):
    torch.manual_seed(0)
    cfg = variant(norm, attn, mlp, pos)
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.block_size))
    targets = torch.randint(0, cfg.vocab_size, (2, cfg.block_size))
    logits, loss = model(idx, targets)
    assert logits.shape == (2, cfg.block_size, cfg.vocab_size)
    assert torch.isfinite(loss)
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.2  # small init: near-uniform predictions
    loss.backward()
    for name, p in model.named_parameters():
        if not p.requires_grad:  # dyt_frozen's alpha
            assert p.grad is None and name.endswith('alpha'), name
            continue
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient (unused?)"


@pytest.mark.parametrize('norm,attn,mlp,pos', VARIANTS)
def test_every_variant_is_causal(norm, attn, mlp, pos):
    torch.manual_seed(1)
    cfg = variant(norm, attn, mlp, pos)
    model = randomize(GPT(cfg)).double().eval()
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.block_size))
    base = model(idx, all_logits=True)[0]
    for t in (0, 7, cfg.block_size - 2):
        changed = idx.clone()
        shift = torch.randint(1, cfg.vocab_size, idx[:, t + 1:].shape)
        changed[:, t + 1:] = (idx[:, t + 1:] + shift) % cfg.vocab_size
        out = model(changed, all_logits=True)[0]
        torch.testing.assert_close(out[:, :t + 1], base[:, :t + 1], rtol=0, atol=1e-10)
        assert (out[:, t + 1:] - base[:, t + 1:]).abs().max() > 1e-4  # the change is visible after t


# -------------------------------------------------------------------------------------------------------
# 3. Norm layers equal their formulas

NORM_PARAMS = {'layernorm': {'weight'}, 'rmsnorm': {'weight'}, 'dyt': {'alpha', 'weight'},
               'derf': {'alpha', 'shift', 'weight'}, 'hardtanh': {'weight'}, 'identity': {'weight'},
               'sigmoid': {'alpha', 'weight'}, 'dyt_frozen': {'alpha', 'weight'}}


@pytest.mark.parametrize('bias', [False, True])
@pytest.mark.parametrize('norm', NORMS)
def test_norm_layer_formula(norm, bias):
    torch.manual_seed(2)
    model = randomize(GPT(tiny(norm=norm, bias=bias)))
    ln = model.transformer.h[0].ln_1
    expected_params = NORM_PARAMS[norm] | ({'bias'} if bias and norm != 'rmsnorm' else set())
    assert {n for n, _ in ln.named_parameters()} == expected_params
    w = ln.weight.detach()
    b = ln.bias.detach() if 'bias' in expected_params else 0.0
    x = 2.0 * torch.randn(3, 5, 32)
    if norm == 'layernorm':
        mu = x.mean(-1, keepdim=True)
        want = (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5) * w + b
    elif norm == 'rmsnorm':
        want = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-5) * w
    elif norm in ('dyt', 'dyt_frozen'):
        assert ln.alpha.numel() == 1  # ONE scalar per layer
        assert ln.alpha.requires_grad == (norm == 'dyt')
        want = w * torch.tanh(ln.alpha.item() * x) + b
    elif norm == 'sigmoid':  # the logistic function, rescaled to (-1, 1)
        want = w * (2 / (1 + torch.exp(-ln.alpha.item() * x)) - 1) + b
    elif norm == 'identity':
        want = w * x + b
    elif norm == 'derf':
        assert ln.alpha.numel() == ln.shift.numel() == 1  # ONE alpha and ONE shift per layer
        z = ln.alpha.item() * x + ln.shift.item()
        assert (z.abs() > 2).any() and (z.abs() < 0.5).any()  # the flat and the linear part of erf
        want = w * erf(z) + b
    else:
        want = torch.where(x > 1, 1.0, torch.where(x < -1, -1.0, x)) * w + b
        assert (x.abs() > 1).any() and (x.abs() < 1).any()  # both sides of the clip are exercised
    torch.testing.assert_close(ln(x), want, rtol=1e-5, atol=1e-5)


def test_dyt_frozen_keeps_alpha0_while_dyt_learns_it():
    """The DyT paper's ablation: alpha stays at alpha0 through AdamW's steps, outside its groups, and
    is saved with the weights; the same steps move DyT's own alpha."""
    alphas = {}
    for norm in ('dyt', 'dyt_frozen'):
        torch.manual_seed(4)
        model = GPT(tiny(norm=norm, dyt_alpha=1.5))
        opt = model.configure_optimizers(0.1, 1e-2, (0.9, 0.95), 'cpu')
        in_groups = {id(p) for g in opt.param_groups for p in g['params']}
        for _ in range(3):
            idx = torch.randint(0, 64, (2, 16))
            model(idx, idx)[1].backward()
            opt.step()
            opt.zero_grad()
        named = dict(model.named_parameters())
        alphas[norm] = [p.item() for n, p in named.items() if n.endswith('alpha')]
        assert all((id(p) in in_groups) == (norm == 'dyt') for n, p in named.items()
                   if n.endswith('alpha'))
        assert 'transformer.ln_f.alpha' in model.state_dict()
    assert alphas['dyt_frozen'] == [1.5] * 5
    assert all(abs(a - 1.5) > 1e-3 for a in alphas['dyt'])


def test_dyt_alpha_per_place():
    model = GPT(tiny(norm='dyt', n_layer=3, dyt_alpha=2.0, dyt_alpha_attn=1.0, dyt_alpha_ffn=0.5,
                     dyt_alpha_final=0.25))
    for block in model.transformer.h:
        assert block.ln_1.alpha.tolist() == [1.0] and block.ln_2.alpha.tolist() == [0.5]
    assert model.transformer.ln_f.alpha.tolist() == [0.25]
    model = GPT(tiny(norm='dyt', dyt_alpha=2.0))  # unset places fall back to dyt_alpha
    alphas = [p.tolist() for n, p in model.named_parameters() if n.endswith('alpha')]
    assert alphas == [[2.0]] * (2 * 2 + 1)
    model = GPT(tiny(norm='derf', dyt_alpha=0.5, dyt_alpha_final=1.0))  # DyT's alpha0 keys, shift0 = 0
    named = list(model.named_parameters())
    assert [p.tolist() for n, p in named if n.endswith('alpha')] == [[0.5]] * 4 + [[1.0]]
    assert [p.tolist() for n, p in named if n.endswith('shift')] == [[0.0]] * 5


# -------------------------------------------------------------------------------------------------------
# 4. Attention equals the naive reference (float64)

ATTN_CASES = {
    'diff': dict(attn='diff'),
    'diff_rope': dict(attn='diff', pos='rope'),
    'diff_gqa': dict(attn='diff', n_head=8, n_kv_head=4, n_embd=64),  # h=4, g=2, n_rep=2
    'diff_rope_gqa': dict(attn='diff', pos='rope', n_head=8, n_kv_head=2, n_embd=64,
                          bias=True),  # n_rep=4
    'diff_deep': dict(attn='diff', pos='rope', n_head=8, n_kv_head=4, n_embd=64,
                      n_layer=4),  # layer_idx 3
    'standard': dict(),
    'standard_rope_gqa': dict(pos='rope', n_head=8, n_kv_head=2, n_embd=64, bias=True),
    'standard_mqa': dict(n_kv_head=1),
}


@pytest.mark.parametrize('case', list(ATTN_CASES))
def test_attention_matches_naive_reference(case, monkeypatch):
    """Grouped-query heads reach K and V through SDPA's enable_gqa: no repeated copy of them."""
    def copy(*args, **kwargs):
        raise AssertionError('K or V copied with repeat_interleave')
    monkeypatch.setattr(torch.Tensor, 'repeat_interleave', copy)
    monkeypatch.setattr(torch, 'repeat_interleave', copy)
    torch.manual_seed(3)
    cfg = tiny(**ATTN_CASES[case])
    model = randomize(GPT(cfg)).double()
    layer = cfg.n_layer - 1
    attn = model.transformer.h[layer].attn
    x = torch.randn(2, cfg.block_size, cfg.n_embd, dtype=torch.float64)
    T = x.shape[1]
    # what GPT.forward passes
    rope = (model.rope_cos[:T], model.rope_sin[:T]) if cfg.pos == 'rope' else None
    sd = {k: v.double() for k, v in model.state_dict().items()}
    want = ref_attention(cfg, sd, f'transformer.h.{layer}.attn', x, layer)
    torch.testing.assert_close(attn(x, rope), want, rtol=1e-6, atol=1e-6)


FULL_CASES = {
    'gpt2': dict(bias=True),
    'llama': dict(norm='rmsnorm', mlp='swiglu', pos='rope', n_kv_head=2),
    'dyt_diff_llama': dict(norm='dyt', attn='diff', mlp='swiglu', pos='rope', n_head=8, n_kv_head=4,
                           n_embd=64, n_layer=3, embed_scale=True, bias=True),
    'hardtanh_diff': dict(norm='hardtanh', attn='diff'),
    'derf_gpt2': dict(norm='derf', bias=True, embed_scale=True),  # the scale after position embeddings
}


@pytest.mark.parametrize('case', list(FULL_CASES))
def test_full_model_matches_naive_reference(case):
    torch.manual_seed(4)
    model = randomize(GPT(tiny(**FULL_CASES[case]))).double().eval()
    idx = torch.randint(0, model.config.vocab_size, (2, model.config.block_size))
    torch.testing.assert_close(model(idx, all_logits=True)[0], ref_logits(model, idx), rtol=1e-5,
                               atol=1e-5)


# -------------------------------------------------------------------------------------------------------
# 5. RoPE

def test_rope_matches_formula_and_is_relative():
    hd, theta = 16, 10000.0
    cos, sin = rope_angles(64, hd, theta)
    torch.manual_seed(5)
    x = torch.randn(1, 2, 64, hd, dtype=torch.float64)
    rotated = apply_rope(x, cos, sin)
    for h in range(2):
        torch.testing.assert_close(rotated[0, h], rope_ref(x[0, h], theta), rtol=1e-5, atol=1e-5)

    q, k = torch.randn(hd), torch.randn(hd)

    def at(v, pos):
        return apply_rope(v.view(1, 1, 1, hd), cos[pos:pos + 1], sin[pos:pos + 1]).view(hd)

    for m, n in [(0, 0), (3, 1), (5, 9), (20, 2)]:
        dot = at(q, m) @ at(k, n)
        for s in (1, 7, 30):
            assert abs((at(q, m + s) @ at(k, n + s)) - dot) < 1e-4
    offsets = [(at(q, 10) @ at(k, 10 - d)).item() for d in range(5)]
    assert max(offsets) - min(offsets) > 1e-2  # ... and it does depend on the offset
    assert abs(at(q, 13).norm() - q.norm()) < 1e-5  # a rotation


def test_float64_work_stays_on_the_cpu():
    """Apple GPUs have no float64: a RoPE model built on another device ('meta' stands in for 'mps')
    makes its float64 angle tables on the CPU, and holds float32 tables on its own device."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    made = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            made.update((t.device.type, t.dtype) for t in tree_leaves(out)
                        if isinstance(t, torch.Tensor))
            return out

    with Record(), torch.device('meta'):
        model = GPT(tiny(pos='rope'))  # the tables are made in __init__, as on 'mps'
    assert (model.rope_cos.device.type, model.rope_cos.dtype) == ('meta', torch.float32)
    assert ('cpu', torch.float64) in made and ('meta', torch.float64) not in made


# -------------------------------------------------------------------------------------------------------
# 6-7. Parameter counts

def n_params(model):
    return sum(p.numel() for p in model.parameters())  # tied wte/lm_head counted once


@pytest.mark.parametrize('kw', [dict(), dict(n_head=8, n_kv_head=4, n_embd=64), dict(bias=True),
                                dict(norm='dyt', mlp='swiglu', pos='rope', n_layer=3, bias=True)])
def test_diff_attention_adds_only_lambdas_and_subnorm(kw):
    std, diff = GPT(tiny(**kw)), GPT(tiny(attn='diff', **kw))
    cfg = std.config
    head_dim = cfg.n_embd // cfg.n_head
    assert n_params(diff) == n_params(std) + cfg.n_layer * (4 * head_dim + 2 * head_dim)
    for a, b in zip(std.transformer.h, diff.transformer.h):  # projection shapes equal the baseline's
        assert a.attn.c_attn.weight.shape == b.attn.c_attn.weight.shape
        assert a.attn.c_proj.weight.shape == b.attn.c_proj.weight.shape


VOCAB, BLOCK = 50304, 512
# the study's scales: name -> (n_layer, n_head, n_embd, nominal count without position embeddings)
SCALES = {
    '64m': (12, 8, 512, 63.5e6), '124m': (12, 12, 768, 124e6), '162m': (16, 14, 896, 162e6),
    '354m': (24, 16, 1024, 354e6), '1.3b': (24, 32, 2048, 1.3e9), '3.78b': (32, 32, 3072, 3.78e9)}


@pytest.mark.parametrize('scale', list(SCALES))
def test_study_scale_param_counts(scale):
    L, H, d, nominal = SCALES[scale]
    # per block: attention 4 d^2 (q, k, v, out), MLP 8 d^2, two LayerNorm weights (bias=False); plus the
    # tied token embedding/head V*d and the final LayerNorm weight. Position embeddings excluded.
    formula = L * (12 * d * d + 2 * d) + VOCAB * d + d
    with torch.device('meta'):
        model = GPT(GPTConfig(block_size=BLOCK, vocab_size=VOCAB, n_layer=L, n_head=H, n_embd=d,
                              bias=False))
    assert model.get_num_params() == formula
    assert model.get_num_params(non_embedding=False) == formula + BLOCK * d
    if scale == '162m':
        # The study calls this shape "162m", but 16 layers x 896 wide has 199.2M parameters (the lead
        # measured the same); the study's label does not match its shape. We assert the true count, not
        # the label.
        assert formula == 199_242_624
    else:
        assert abs(formula - nominal) / nominal < 0.01


# -------------------------------------------------------------------------------------------------------
# 8. Weight-decay groups

DECAYED = re.compile(r'^(transformer\.wte|transformer\.wpe|transformer\.h\.\d+\.'
                     r'(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_up|mlp\.c_proj))\.weight$')
NOT_DECAYED = re.compile(r'(\.(ln_1|ln_2|ln_f|subln)\.(weight|bias)|\.alpha|\.lambda_[qk][12]|\.bias)$'
                         r'|^embed_scale$')


@pytest.mark.parametrize('kw', [dict(norm='dyt', attn='diff', mlp='swiglu', pos='rope', n_kv_head=2,
                                     embed_scale=True, bias=True),
                                dict(bias=True), dict(norm='rmsnorm', bias=False)])
def test_weight_decay_groups(kw):
    model = GPT(tiny(**kw))
    assert model.lm_head.weight is model.transformer.wte.weight  # tied
    named = dict(model.named_parameters())  # the tied weight appears once
    want_decay = {n for n in named if DECAYED.search(n)}
    want_plain = set(named) - want_decay
    unknown = [n for n in want_plain if not NOT_DECAYED.search(n)]
    assert not unknown, f"parameters of no known kind: {unknown}"
    if kw.get('attn') == 'diff':
        assert {'embed_scale', 'transformer.h.0.attn.lambda_q1', 'transformer.h.0.attn.subln.weight',
                'transformer.h.0.ln_1.alpha', 'transformer.h.0.ln_1.bias',
                'transformer.h.0.mlp.c_up.bias'} <= want_plain
        assert 'transformer.h.1.mlp.c_up.weight' in want_decay

    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=6e-4, betas=(0.9, 0.95),
                                     device_type='cpu')
    assert isinstance(opt, torch.optim.AdamW)
    ids_by_wd = {0.1: [], 0.0: []}
    for group in opt.param_groups:
        assert group['lr'] == 6e-4 and group['betas'] == (0.9, 0.95)
        ids_by_wd[group['weight_decay']].extend(id(p) for p in group['params'])
    all_ids = ids_by_wd[0.1] + ids_by_wd[0.0]
    assert len(all_ids) == len(set(all_ids)) == len(named)  # a partition: no duplicates, nothing left
    assert set(ids_by_wd[0.1]) == {id(named[n]) for n in want_decay}
    assert set(ids_by_wd[0.0]) == {id(named[n]) for n in want_plain}


# -------------------------------------------------------------------------------------------------------
# 9. Initialization

def test_init_distribution():
    torch.manual_seed(6)
    L = 4
    model = GPT(GPTConfig(block_size=64, vocab_size=512, n_layer=L, n_head=4, n_embd=256, bias=True,
                          norm='dyt', dyt_alpha=0.7, attn='diff', mlp='swiglu'))
    p = dict(model.named_parameters())

    def check_normal(t, std):
        t = t.detach().flatten().double()
        n = t.numel()
        assert abs(t.mean()) < 5 * std / math.sqrt(n)
        assert abs(t.std() / std - 1) < 5 / math.sqrt(2 * n) + 0.005
        # Gaussian, not uniform (0.577 within 1 sd)
        assert abs((t.abs() < std).double().mean() - 0.6827) < 0.02

    check_normal(p['transformer.wte.weight'], 0.02)
    check_normal(p['transformer.wpe.weight'], 0.02)
    resid = 0.02 / math.sqrt(2 * L)
    for i in range(L):
        b = f'transformer.h.{i}.'
        check_normal(p[b + 'attn.c_attn.weight'], 0.02)
        check_normal(p[b + 'mlp.c_fc.weight'], 0.02)
        check_normal(p[b + 'mlp.c_up.weight'], 0.02)  # SwiGLU's up projection is not a residual output
        check_normal(p[b + 'attn.c_proj.weight'], resid)
        check_normal(p[b + 'mlp.c_proj.weight'], resid)
        assert p[b + 'attn.subln.weight'].eq(1).all()
    lambdas = torch.cat([t for n, t in p.items() if 'lambda_' in n])
    assert lambdas.numel() == 4 * L * 64
    assert abs(lambdas.std().item() / 0.1 - 1) < 0.15 and abs(lambdas.mean().item()) < 0.02
    biases = [n for n in p if n.endswith('.bias')]
    assert len(biases) == L * 7 + 1  # ln_1, attn c_attn/c_proj, ln_2, c_fc/c_up/c_proj per block + ln_f
    assert all(p[n].eq(0).all() for n in biases)
    dyts = [m for n, m in model.named_modules() if re.search(r'ln_[12f]$', n)]
    assert len(dyts) == 2 * L + 1
    for m in dyts:
        assert m.weight.eq(1).all() and m.bias.eq(0).all() and m.alpha.tolist() == [pytest.approx(0.7)]

    wide = GPT(tiny(emb_init_std=1.0, n_embd=256, block_size=64, vocab_size=512))
    check_normal(wide.transformer.wte.weight, 1.0)  # and the tied output layer, which is the same tensor
    check_normal(wide.transformer.wpe.weight, 1.0)
    check_normal(wide.transformer.h[0].attn.c_attn.weight, 0.02)
    assert wide.lm_head.weight is wide.transformer.wte.weight

    ln = GPT(tiny(bias=True))
    for n, t in ln.named_parameters():
        if re.search(r'ln_[12f]\.weight$', n):
            assert t.eq(1).all()
        if n.endswith('.bias'):
            assert t.eq(0).all()


# -------------------------------------------------------------------------------------------------------
# 10-11. Determinism, forward outputs, generate

def first_losses(seed, cfg):
    torch.manual_seed(seed)
    model = GPT(cfg)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
    g = torch.Generator().manual_seed(123)  # the same data for every seed
    losses = []
    for _ in range(3):
        idx = torch.randint(0, cfg.vocab_size, (4, cfg.block_size), generator=g)
        _, loss = model(idx, torch.roll(idx, -1, dims=1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize('kw', [dict(dropout=0.1),
                                dict(norm='dyt', attn='diff', pos='rope', dropout=0.1)])
def test_same_seed_same_losses(kw):
    cfg = tiny(**kw)
    a, b, c = first_losses(1337, cfg), first_losses(1337, cfg), first_losses(42, cfg)
    assert a == b
    assert a != c


def test_forward_outputs_and_loss():
    torch.manual_seed(7)
    cfg = tiny(norm='dyt', pos='rope')
    model = randomize(GPT(cfg)).double().eval()
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.block_size))
    everything, none = model(idx, all_logits=True)
    assert none is None and everything.shape == (2, cfg.block_size, cfg.vocab_size)
    last, loss = model(idx)
    assert loss is None and last.shape == (2, 1, cfg.vocab_size)
    torch.testing.assert_close(last, everything[:, -1:], rtol=0, atol=1e-12)

    targets = torch.randint(0, cfg.vocab_size, (2, cfg.block_size))
    targets[0, :5] = -1  # ignored positions
    logits, loss = model(idx, targets)
    torch.testing.assert_close(logits, everything, rtol=0, atol=1e-12)
    nll = []
    for b in range(2):
        for t in range(cfg.block_size):
            if targets[b, t] >= 0:
                row = everything[b, t]
                log_z = math.log(torch.exp(row - row.max()).sum().item()) + row.max().item()
                nll.append(log_z - row[targets[b, t]].item())
    assert loss.item() == pytest.approx(sum(nll) / len(nll), rel=1e-9)


@pytest.mark.parametrize('pos', ['learned', 'rope'])
def test_generate(pos):
    torch.manual_seed(8)
    cfg = tiny(pos=pos)
    model = randomize(GPT(cfg)).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 10))
    out = model.generate(idx, 12, temperature=0)  # 22 tokens > block_size 16: the context is cropped
    assert out.shape == (2, 22) and torch.equal(out[:, :10], idx)
    greedy = idx
    with torch.no_grad():
        for _ in range(12):
            logits = model(greedy[:, -cfg.block_size:], all_logits=True)[0][:, -1]
            greedy = torch.cat([greedy, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, greedy)
    # top-1 sampling is greedy
    assert torch.equal(model.generate(idx, 12, temperature=0.8, top_k=1), greedy)
    sampled = model.generate(idx, 12, temperature=1.0, top_k=5)
    assert sampled.shape == (2, 22) and sampled.min() >= 0 and sampled.max() < cfg.vocab_size


# -------------------------------------------------------------------------------------------------------
# 13. SwiGLU size and embed_scale

@pytest.mark.parametrize('d', [32, 64, 512, 768, 896, 1024])
def test_swiglu_hidden_size(d):
    hidden = 256 * -(-8 * d // (3 * 256))  # 256 * ceil((2/3 * 4d) / 256), in integers
    assert {512: 1536, 768: 2048}.get(d, hidden) == hidden
    with torch.device('meta'):
        cfg = GPTConfig(block_size=8, vocab_size=64, n_layer=1, n_head=4, n_embd=d, mlp='swiglu')
        mlp = GPT(cfg).transformer.h[0].mlp
    assert mlp.c_fc.weight.shape == mlp.c_up.weight.shape == (hidden, d)
    assert mlp.c_proj.weight.shape == (d, hidden)


@pytest.mark.parametrize('pos', ['learned', 'rope'])
def test_embed_scale(pos):
    torch.manual_seed(11)
    assert 'embed_scale' not in dict(GPT(tiny(pos=pos)).named_parameters())
    model = GPT(tiny(pos=pos, embed_scale=True))
    assert model.embed_scale.shape == (1,)  # not 0-dim: FSDP2 shards 1-element parameters, not scalars
    assert model.embed_scale.item() == pytest.approx(math.sqrt(32))
    with torch.no_grad():
        model.embed_scale.fill_(3.0)
    seen = []
    model.transformer.h[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach()))
    idx = torch.randint(0, 64, (2, 16))
    model(idx)
    want = model.transformer.wte.weight.detach()[idx]
    if pos == 'learned':
        want = want + model.transformer.wpe.weight.detach()[:16]
    torch.testing.assert_close(seen[0], 3.0 * want)  # (token + position) * scale: Derf's nanoGPT patch


def test_estimate_mfu():
    model = GPT(tiny())
    N = n_params(model) - 16 * 32  # without position embeddings
    flops = (6 * N + 12 * 2 * 32 * 16) * 16 * 4  # PaLM: 6N + 12 L d T per token; T tokens x 4 sequences
    assert model.estimate_mfu(4, 0.5, peak=1e9) == pytest.approx(flops / 0.5 / 1e9)
    assert model.estimate_mfu(4, 0.5, None) is None  # unknown peak (a CPU, or no annex/memory.py)
    # Differential Attention, a layer's forward FLOPs: its n_head maps (2 a diff head) cost the
    # standard's QK^T (2 T^2 C), but each map reads V of twice the head size: AV is 4 T^2 C, not
    # 2 T^2 C. Per token, with the backward (x 3): 18 L C T, not 12 L C T
    diff = GPT(tiny(attn='diff'))
    flops = (6 * (n_params(diff) - 16 * 32) + 18 * 2 * 32 * 16) * 16 * 4
    assert diff.estimate_mfu(4, 0.5, peak=1e9) == pytest.approx(flops / 0.5 / 1e9)


# -------------------------------------------------------------------------------------------------------
# 14. Clear errors

def test_clear_errors():
    with pytest.raises(ValueError, match='n_head'):
        GPT(tiny(n_head=3, n_embd=48, attn='diff'))
    with pytest.raises(ValueError, match='norm') as e:
        GPT(tiny(norm='batchnorm'))
    assert 'layernorm' in str(e.value)  # says what would be accepted
    with pytest.raises(ValueError, match='divisible'):
        GPT(tiny(n_embd=30, n_head=4))
    with pytest.raises(ValueError, match='block_size'):
        GPT(tiny())(torch.zeros(1, 17, dtype=torch.long))


# -------------------------------------------------------------------------------------------------------
# 15. load_checkpoint

def test_load_checkpoint(tmp_path):
    torch.manual_seed(12)
    cfg = tiny(norm='dyt', attn='diff', pos='rope', embed_scale=True)
    model = randomize(GPT(cfg)).eval()
    idx = torch.randint(0, 64, (2, 16))
    want = model(idx, all_logits=True)[0]

    plain = tmp_path / 'ckpt.pt'
    torch.save({'model': model.state_dict(), 'model_args': asdict(cfg), 'iter_num': 7}, plain)
    loaded, ckpt = load_checkpoint(plain)
    assert not loaded.training and ckpt['iter_num'] == 7
    torch.testing.assert_close(loaded(idx, all_logits=True)[0], want, rtol=0, atol=0)
    loaded, _ = load_checkpoint(tmp_path)  # a run directory means its ckpt.pt
    torch.testing.assert_close(loaded(idx, all_logits=True)[0], want, rtol=0, atol=0)

    # saved from a compiled model, from DDP around it, from a compiled DDP model
    for prefix in ('_orig_mod.', 'module._orig_mod.', '_orig_mod.module.'):
        wrapped = tmp_path / 'wrapped.pt'
        torch.save({'model': {prefix + k: v for k, v in model.state_dict().items()},
                    'model_args': asdict(cfg)}, wrapped)
        torch.testing.assert_close(load_checkpoint(wrapped)[0](idx, all_logits=True)[0], want, rtol=0,
                                   atol=0)
    old = tmp_path / 'old.pt'  # written when embed_scale was a 0-dim parameter
    state = dict(model.state_dict(), embed_scale=model.embed_scale.detach().reshape(()))
    torch.save({'model': state, 'model_args': asdict(cfg)}, old)
    torch.testing.assert_close(load_checkpoint(old)[0](idx, all_logits=True)[0], want, rtol=0, atol=0)
    best = tmp_path / 'best.pt'
    torch.save({'model': model.state_dict(), 'model_args': asdict(cfg), 'iter_num': 3}, best)
    assert load_checkpoint(tmp_path, which='best')[1]['iter_num'] == 3
    with pytest.raises(ValueError, match='is not a checkpoint choice; use latest .* or best'):
        load_checkpoint(tmp_path, which='ckpt')

    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / 'missing.pt')
    corrupt = tmp_path / 'corrupt.pt'
    corrupt.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    with pytest.raises(ValueError, match='not a complete checkpoint archive') as e:
        load_checkpoint(corrupt)
    assert '_use_new_zipfile_serialization' not in str(e.value)  # PyTorch's advice does not apply
    truncated = tmp_path / 'truncated.pt'
    truncated.write_bytes(plain.read_bytes()[:-100])
    with pytest.raises(ValueError, match='not a complete checkpoint archive'):
        load_checkpoint(truncated)
    other = tmp_path / 'other.pt'
    wider = tiny(norm='dyt', attn='diff', pos='rope', embed_scale=True, n_embd=64)
    torch.save({'model': model.state_dict(), 'model_args': asdict(wider)}, other)
    mismatch = 'do not fit the model .*size mismatch for transformer.wte.weight'
    with pytest.raises(ValueError, match=mismatch) as e:
        load_checkpoint(other)
    assert len(str(e.value)) < 1000  # a few tensors named, not every one
    not_ckpt = tmp_path / 'weights.pt'
    torch.save(model.state_dict(), not_ckpt)
    with pytest.raises(ValueError):
        load_checkpoint(not_ckpt)


# -------------------------------------------------------------------------------------------------------
# 16. bfloat16 autocast on the CPU: train.py's default on CUDA runs the same code paths

@pytest.mark.parametrize('kw', [dict(), dict(norm='dyt', attn='diff', pos='rope', n_kv_head=2),
                                dict(norm='derf', mlp='swiglu', embed_scale=True, bias=True),
                                dict(norm='rmsnorm', mlp='swiglu', pos='rope')])
def test_bf16_autocast_forward_backward_close_to_fp32(kw):
    torch.manual_seed(14)
    model = GPT(tiny(**kw))
    idx, targets = torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16))

    def loss_and_grads(autocast):
        model.zero_grad(set_to_none=True)
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
            _, loss = model(idx, targets)
        loss.backward()
        return loss.float(), torch.cat([p.grad.flatten() for p in model.parameters()])

    loss32, grad32 = loss_and_grads(False)
    loss16, grad16 = loss_and_grads(True)
    assert torch.isfinite(loss16) and torch.isfinite(grad16).all()
    # autocast casts copies, never the weights
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert abs(loss16 - loss32) < 0.02 * loss32  # bf16 keeps 8 bits of mantissa: ~3 significant digits
    cosine = (grad16 @ grad32) / (grad16.norm() * grad32.norm())
    assert cosine > 0.99 and abs(grad16.norm() / grad32.norm() - 1) < 0.05
