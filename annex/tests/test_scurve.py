"""annex/scurve.py: the DyT paper's S-curves. The tanh fit against a synthetic curve of known a and b and
a plain loop over b; R^2 and the line written out; the sampled pairs against each layer's whole inputs
and LayerNorm's formula; the flat part and DyT's saturation counted by loops; the plot."""
import importlib.util
import json
import math

import numpy as np
import pytest
import torch

import analyze
import norm_stats
from annex import scurve
from checkpoint import load_checkpoint
from tests.test_analyze import dataset, make_ckpt  # noqa: F401 (dataset is a fixture)


def loop_fit(x, y, bs):
    """The best (a, b, residual) over the b grid `bs`, a from its normal equation, sums by loops."""
    best = None
    for b in bs:
        t = [math.tanh(b * v) for v in x]
        a = sum(p * q for p, q in zip(y, t)) / sum(q * q for q in t)
        res = sum((p - a * q) ** 2 for p, q in zip(y, t))
        if best is None or res < best[2]:
            best = (a, b, res)
    return best


@pytest.mark.parametrize("a,b,std", [(1.7, 0.8, 2.0), (3.0, 0.05, 30.0), (0.6, 12.0, 0.1)])
def test_tanh_fit_recovers_a_known_curve_and_a_plain_loop(a, b, std):
    rng = np.random.default_rng(0)
    x = rng.normal(0, std, 4000)
    y = a * np.tanh(b * x) + rng.normal(0, 0.01 * a, len(x))
    got_a, got_b, r2 = scurve.fit_tanh(x, y)
    assert got_a == pytest.approx(a, rel=5e-3) and got_b == pytest.approx(b, rel=5e-3)
    la, lb, res = loop_fit(x.tolist(), y.tolist(), np.linspace(0.95 * b, 1.05 * b, 201))
    assert got_b == pytest.approx(lb, rel=6e-4) and got_a == pytest.approx(la, rel=1e-3)
    fitted = got_a * np.tanh(got_b * x)
    own = ((y - fitted) ** 2).sum()
    assert own <= res * (1 + 1e-9)  # at least as good as the loop's best grid point
    assert r2 == pytest.approx(1 - own / ((y - y.mean()) ** 2).sum(), rel=1e-12) and r2 > 0.99


def test_line_fit_and_r_squared_written_out():
    x = np.arange(10.0)
    slope, intercept, r2 = scurve.fit_line(x, 3 * x - 2)
    assert (slope, intercept, r2) == pytest.approx((3.0, -2.0, 1.0))
    y = np.array([0.0, 2, 1, 4, 3, 6, 5, 8, 7, 9])
    sxy = sum((p - x.mean()) * (q - y.mean()) for p, q in zip(x, y))
    sxx = sum((p - x.mean()) ** 2 for p in x)
    syy = sum((q - y.mean()) ** 2 for q in y)
    assert scurve.fit_line(x, y)[2] == pytest.approx(sxy ** 2 / (sxx * syy))  # r^2 of a line
    assert scurve.fit_line(x, y)[0] == pytest.approx(sxy / sxx)


def whole_inputs(model, windows):
    """{layer: every row it saw (rows, n_embd)}, by plain hooks, one forward of all windows."""
    seen = {n: [] for n, _ in norm_stats.norm_layers(model)}
    handles = [layer.register_forward_pre_hook(lambda m, args, n=n: seen[n].append(args[0]))
               for n, layer in norm_stats.norm_layers(model)]
    with torch.no_grad():
        model(windows)
    for h in handles:
        h.remove()
    return {n: torch.cat(v).reshape(-1, v[0].shape[-1]).double().numpy() for n, v in seen.items()}


def test_layernorm_pairs_are_sampled_rows_and_their_standardisation():
    torch.manual_seed(0)
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=50)).eval()
    windows = (16 * torch.arange(6)[:, None] + torch.arange(16)) % 50  # no row repeats a row
    pairs = scurve.sample_pairs(model, windows, batch_size=6, tokens=40, seed=3)
    whole = whole_inputs(model, windows)
    assert list(pairs) == list(whole) and len(pairs) == 5
    positions = []
    for name, (x, y) in pairs.items():
        assert x.shape == y.shape == (40, 32)
        # each sampled row is one of the layer's rows: where in the batch it was
        where = [int(np.flatnonzero((whole[name] == row).all(1))[0]) for row in x]
        positions.append(where)
        mu = x.mean(1, keepdims=True)
        want = (x - mu) / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + 1e-5)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    assert all(p == positions[0] for p in positions) and len(set(positions[0])) == 40
    again = scurve.sample_pairs(model, windows, batch_size=4, tokens=40, seed=3)
    assert len(again["transformer.ln_f"][0]) == 40  # 2 batches of 20 rows


def test_dyt_fit_is_its_alpha_and_fractions_equal_loops(tmp_path, dataset):  # noqa: F811
    out = make_ckpt(tmp_path, "dyt", dataset, norm="dyt", dyt_alpha=2.0)
    model, ck = load_checkpoint(out / "ckpt.pt")
    with torch.no_grad():  # inputs of order 1, so that part of each layer is flat
        model.transformer.wte.weight.mul_(50)
    torch.save(dict(ck, model=model.state_dict()), out / "ckpt.pt")
    js = tmp_path / "s.json"
    res = analyze.main(["scurve", str(out), "--windows=6", "--batch_size=3", "--scurve_tokens=30",
                        f"--json={js}"])[0]["scurve"]
    assert json.loads(js.read_text())["checkpoints"][0]["scurve"]["layers"] == res["layers"]
    windows = analyze.measurement_windows(model, ck, dict(analyze.DEFAULTS, windows=6))[1]
    pairs = scurve.sample_pairs(model, windows, 3, 30, 1337)
    fractions = []
    for name, layer in norm_stats.norm_layers(model):
        got, x = res["layers"][name], pairs[name][0]
        alpha = layer.alpha.item()
        assert got["alpha"] == pytest.approx(alpha) and got["b"] == pytest.approx(alpha, rel=1e-5)
        assert got["a"] == pytest.approx(1.0, rel=1e-5) and got["r2_tanh"] == pytest.approx(1.0)
        values = x.ravel().tolist()
        flat = sum(abs(got["b"] * v) > 2 for v in values) / len(values)
        sat = sum(abs(alpha * v) > 2 for v in values) / len(values)
        assert got["flat"] == pytest.approx(flat) and got["saturation"] == pytest.approx(sat)
        assert got["inv_std"] == pytest.approx(1 / np.std(values))
        assert got["depth"] == (2 if name == "transformer.ln_f" else int(name.split(".")[2]))
        fractions.append(sat)
    assert 0 < min(fractions) and max(fractions) < 1  # the counts are not degenerate
    names = list(res["layers"])
    b = [res["layers"][n]["b"] for n in names]
    inv = [res["layers"][n]["inv_std"] for n in names]
    assert res["pearson_b_inv_std"] == pytest.approx(np.corrcoef(b, inv)[0, 1])


def test_layernorm_table_and_plot(tmp_path, dataset, capsys):  # noqa: F811
    ln = make_ckpt(tmp_path, "run-ln", dataset, n_layer=1)
    res = analyze.main(["scurve", str(ln), "--windows=4", f"--plot={tmp_path / 'figs'}"])[0]
    text = capsys.readouterr().out
    layer = res["scurve"]["layers"]["transformer.h.0.ln_1"]
    assert layer["saturation"] is None and layer["alpha"] is None and layer["r2_line"] > 0.5
    row = next(line for line in text.splitlines() if line.startswith("transformer.h.0.ln_1 "))
    assert row.split()[1:] == [f"{layer['r2_tanh']:.3f}", f"{layer['r2_line']:.3f}",
                               f"{layer['b']:.3g}", f"{layer['inv_std']:.3g}",
                               f"{layer['flat']:.3f}", "-"]
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "figs" / "scurve_run-ln.png").stat().st_size > 10_000
