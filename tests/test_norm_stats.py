"""norm_stats.py: what every norm layer sees (train.py's eval records, analyze.py), against forward hooks
that keep each layer's inputs and compute the figures written out; saturation's definition (|f| > tanh(t) for
tanh and erf alike) against loops over elements; and the same under torch.compile.

The torch.compile test here is the only one of the model (inductor on CPU takes tens of seconds even
for a tiny model): the statistics are attached from outside model.py, so it checks both at once.
"""
import math
from types import SimpleNamespace

import pytest
import torch

import norm_stats
from model import GPT, Derf, DyT, Sigmoid
from tests.common import randomize, tiny

THRESHOLDS = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
NORM_NAMES = ['transformer.h.0.ln_1', 'transformer.h.0.ln_2', 'transformer.h.1.ln_1',
              'transformer.h.1.ln_2', 'transformer.ln_f']


def capture_norm_inputs(model, names=NORM_NAMES):
    """({name: [input of each call]}, hook handles) for the norm layers `names`."""
    captured = {n: [] for n in names}
    handles = [model.get_submodule(n).register_forward_hook(
        lambda mod, args, out, n=n: captured[n].append(args[0].detach().clone())) for n in names]
    return captured, handles


def hooked_saturation(model, name, xs):
    """Mean over forward calls of the fraction of outputs with |f| > tanh(t): DyT's |alpha x| > t, Derf's
    |erf(alpha x + s)| > tanh(t) (erf taken in float64)."""
    layer = model.get_submodule(name)
    alpha = layer.alpha.item()
    if isinstance(layer, Derf):
        def above(x, t):
            return torch.erf((alpha * x + layer.shift.item()).double()).abs() > math.tanh(t)
    else:
        def above(x, t):
            return (alpha * x).abs() > t
    return [sum(above(x, t).double().mean().item() for x in xs) / len(xs) for t in THRESHOLDS]


def layer_saturation(layer, *xs):
    """norm_stats' saturation of one point-wise layer called on each of xs: the layer alone in a model, as
    its ln_f."""
    model = torch.nn.Module()
    model.ln_f, model.config = layer, SimpleNamespace(norm=type(layer).__name__.lower())
    norm_stats.record(model)
    with torch.no_grad():
        for x in xs:
            layer(x)
    return norm_stats.read(model)['layers']['ln_f']['saturation']


def erf_inverse(y):
    """u with erf(u) = y, by bisection on math.erf (not torch.erfinv, which norm_stats uses)."""
    lo, hi = -6.0, 6.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erf(mid) < y else (lo, mid)
    return (lo + hi) / 2


def test_derf_and_dyt_saturate_alike_at_equal_outputs():
    """A Derf layer whose erf outputs equal a DyT layer's tanh outputs, element by element, has the same
    saturation at every threshold; erf's own argument above t would count far fewer (erf(2) is at 99.5% of
    its bound, tanh(2) at 96.4%)."""
    dyt, derf = DyT(1, False, alpha0=0.8), Derf(1, False, alpha0=1.7)
    with torch.no_grad():
        derf.shift.fill_(0.3)
    v = torch.arange(-3.995, 4.0, 0.01, dtype=torch.float64)  # tanh's argument, 0.005 or more from every t
    x1 = (v / 0.8).float()
    a, s = derf.alpha.item(), derf.shift.item()
    x2 = torch.tensor([(erf_inverse(math.tanh(dyt.alpha.item() * x)) - s) / a for x in x1.tolist()])
    with torch.no_grad():
        torch.testing.assert_close(derf(x2), dyt(x1), rtol=0, atol=1e-5)  # the outputs match
    got_dyt, got_derf = layer_saturation(dyt, x1), layer_saturation(derf, x2)
    assert got_derf == got_dyt == pytest.approx([(v.abs() > t).double().mean().item() for t in THRESHOLDS])
    assert (a * x2 + s).abs().gt(2.0).double().mean().item() < got_derf[norm_stats.AT_2] - 0.2


@pytest.mark.parametrize('kind', [DyT, Derf, Sigmoid])
def test_saturation_against_a_loop_over_elements(kind):
    """DyT: |alpha x| > t, the study's count; Derf: |erf(alpha x + s)| > tanh(t), as far from its bound;
    the sigmoid ablation: |2 / (1 + exp(-alpha x)) - 1| > tanh(t). Counted element by element with
    math.erf, math.exp and math.tanh, over two calls."""
    torch.manual_seed(3)
    layer = kind(8, False, alpha0=1.3)
    if kind is Derf:
        with torch.no_grad():
            layer.shift.fill_(-0.4)
    xs = [1.5 * torch.randn(4, 5, 8) for _ in range(2)]
    got = layer_saturation(layer, *xs)
    a, s = layer.alpha.item(), layer.shift.item() if kind is Derf else 0.0
    values = [v for x in xs for v in x.flatten().tolist()]
    if kind is Derf:
        def above(v, t):
            return abs(math.erf(a * v + s)) > math.tanh(t)
    elif kind is Sigmoid:
        def above(v, t):
            return abs(2 / (1 + math.exp(-a * v)) - 1) > math.tanh(t)
    else:
        def above(v, t):
            return abs(a * v) > t
    want = [sum(above(v, t) for v in values) / len(values) for t in THRESHOLDS]
    assert got == pytest.approx(want, abs=1e-12) and len(set(want)) == len(THRESHOLDS)


@pytest.mark.parametrize('norm', ['dyt', 'derf', 'layernorm', 'rmsnorm', 'hardtanh'])
def test_norm_stats_equal_hook_computation(norm):
    torch.manual_seed(9)
    model = randomize(GPT(tiny(norm=norm, dyt_alpha_attn=0.6, dyt_alpha_ffn=1.3, dyt_alpha_final=2.0)))
    assert norm_stats.instrument(model) is model
    assert [n for n, _ in norm_stats.norm_layers(model)] == NORM_NAMES  # module order; no Diff sub-norm
    captured, handles = capture_norm_inputs(model)
    norm_stats.record(model)
    with torch.no_grad():
        for _ in range(3):
            model(torch.randint(0, 64, (2, 16)))
    for h in handles:
        h.remove()
    stats = norm_stats.read(model)
    assert stats['thresholds'] == THRESHOLDS == list(norm_stats.THRESHOLDS)
    assert list(stats['layers']) == NORM_NAMES  # module order
    layer_sats = []
    for name in NORM_NAMES:
        got, xs = stats['layers'][name], captured[name]
        assert len(xs) == 3 and got['kind'] == norm
        assert got['count'] == sum(x.numel() for x in xs)
        allx = torch.cat([x.flatten() for x in xs]).double()
        assert got['input_std'] == pytest.approx(allx.std(correction=0).item(), rel=1e-4)
        if norm not in ('dyt', 'derf'):
            assert got['saturation'] is None and got['alpha'] is None
            continue
        assert got['alpha'] == pytest.approx(model.get_submodule(name).alpha.item())
        want = hooked_saturation(model, name, xs)
        assert got['saturation'] == pytest.approx(want, abs=1e-6)
        layer_sats.append(want)
    if norm in ('dyt', 'derf'):
        fractions = [f for s in layer_sats for f in s]
        assert min(fractions) < 0.99 and max(fractions) > 0.01  # not degenerate
        assert len(set(fractions)) > 10
        pooled = [sum(col) / len(col) for col in zip(*layer_sats)]
        assert stats['saturation'] == pytest.approx(pooled, abs=1e-6)
    else:
        assert stats['saturation'] is None


def test_norm_stats_off_by_default_reset_and_stop():
    torch.manual_seed(10)
    model = randomize(GPT(tiny(norm='dyt')))
    keys = set(model.state_dict())
    assert not any('stat' in k for k in keys)
    norm_stats.instrument(model)
    assert set(model.state_dict()) == keys  # the statistics add nothing to checkpoints
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        model(idx)
    layers = norm_stats.read(model)['layers'].values()
    assert all(s['count'] == 0 and s['saturation'] is None for s in layers)
    assert norm_stats.read(model)['saturation'] is None

    norm_stats.record(model)
    assert set(model.state_dict()) == keys  # recording adds nothing either
    with torch.no_grad():
        model(idx)
        model(idx)
        before = norm_stats.read(model)
        norm_stats.record(model, False)
        model(torch.randint(0, 64, (4, 16)))  # another batch while off: must not count
        assert norm_stats.read(model) == before
        norm_stats.instrument(model)  # a second time: no second hook (it would count twice)
        norm_stats.record(model, True)  # restarting resets
        model(idx[:1])
    assert all(s['count'] == 16 * 32 for s in norm_stats.read(model)['layers'].values())


def test_sums_are_the_buffers_read_reports():
    """train.py all-reduces norm_stats.sums(model) over processes: summing two processes that saw the
    same inputs must double every count and keep the std and the fractions (a missing sum would not)."""
    torch.manual_seed(11)
    model = norm_stats.instrument(randomize(GPT(tiny(norm='derf'))))
    norm_stats.record(model)
    with torch.no_grad():
        model(torch.randint(0, 64, (2, 16)))
    one = norm_stats.read(model)
    buffers = norm_stats.sums(model)
    assert len(buffers) == 4 * len(NORM_NAMES)
    layer_buffers = {id(b) for name in NORM_NAMES  # all but the count of rows to record
                     for n, b in model.get_submodule(name).named_buffers() if n != 'stat_rows'}
    assert {id(b) for b in buffers} == layer_buffers  # the sums themselves, not copies
    for b in buffers:  # what all_reduce does with two such processes
        b.add_(b.clone())
    two = norm_stats.read(model)
    for name in NORM_NAMES:
        a, b = one['layers'][name], two['layers'][name]
        assert b['count'] == 2 * a['count'] == 2 * 2 * 16 * 32
        assert b['input_std'] == pytest.approx(a['input_std'], rel=1e-6)
        assert b['saturation'] == pytest.approx(a['saturation'], abs=1e-12)
    assert two['saturation'] == pytest.approx(one['saturation'], abs=1e-12)


def test_compiled_model_matches_eager():
    """fullgraph=True: one graph, no silent fall-back to eager; the norm statistics (instrumented
    before compiling, as train.py does) and a training step (forward + backward) compile too and agree
    with eager and the hooks."""
    torch.manual_seed(13)
    cfg = tiny(norm='derf', attn='diff', pos='rope', n_layer=1, n_head=2, n_embd=16, block_size=8,
               vocab_size=32, embed_scale=True)
    model = norm_stats.instrument(randomize(GPT(cfg)))
    compiled = torch.compile(model, fullgraph=True)
    idx, targets = torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))
    captured, hooks = capture_norm_inputs(model, [n for n, _ in norm_stats.norm_layers(model)])
    model.eval()
    with torch.no_grad():
        norm_stats.record(model)  # the instrumentation must compile too, and count the same
        want = model(idx, all_logits=True)[0]
        want_stats = norm_stats.read(model)
        for h in hooks:
            h.remove()
        norm_stats.record(model)
        got = compiled(idx, all_logits=True)[0]
        got_stats = norm_stats.read(model)
        norm_stats.record(model, False)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got_stats['saturation'] is not None
    assert got_stats['layers'].keys() == want_stats['layers'].keys()
    for name, layer in want_stats['layers'].items():
        assert got_stats['layers'][name]['count'] == layer['count'] == 2 * 8 * 16
        assert got_stats['layers'][name]['saturation'] == pytest.approx(layer['saturation'], abs=1e-6)
        assert got_stats['layers'][name]['input_std'] == pytest.approx(layer['input_std'], rel=1e-4)
        assert got_stats['layers'][name]['saturation'] == pytest.approx(
            hooked_saturation(model, name, captured[name]), abs=1e-6)

    model.train()
    grads = []
    for forward in (model, compiled):
        model.zero_grad(set_to_none=True)
        _, loss = forward(idx, targets)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-5, msg=name)
