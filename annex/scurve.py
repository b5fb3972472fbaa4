"""
LayerNorm's S-curves (Zhu et al. 2025, "Tanh-like mappings with layer normalization"), as
analyze.py's `scurve` measure. Per token a LayerNorm is linear, (x - mean) / std; tokens of
different spread together trace an S, which is why DyT puts a tanh in its place. For every norm
layer, on sampled tokens of analyze.py's windows: the (input, output before the affine) pairs;
least-squares fits of a*tanh(b*x) and of a line, the R^2 of each; the fit's b against 1/std of the
input (DyT's alpha tracks it); the fraction of inputs on the curve's flat part, |b x| > 2 (tanh(2)
is 96% of the bound: saturation's headline t), and a DyT or Derf layer's own saturation on the same
tokens. An annex: analyze.py imports it for `scurve`, and for `all` when this file is here.
"""
import functools
import math
import os

import numpy as np
import torch

import norm_stats
from analyze import HEADLINE_T, fmt, print_table, rows_by_name

LOG_C = np.linspace(math.log(1e-2), math.log(1e2), 81)  # b * std searched first: 1/100 to 100
GOLDEN = (math.sqrt(5) - 1) / 2


def pre_affine(layer, x):  # the layer's output with gain 1 and bias 0: its own function of x
    unit = {"weight": torch.ones_like(layer.weight)}
    if getattr(layer, "bias", None) is not None:
        unit["bias"] = torch.zeros_like(layer.bias)
    return torch.func.functional_call(layer, unit, (x,))


def keep_rows(store, name, layer, args):  # a forward pre-hook: (x, f(x)) of the sampled rows
    if store["inside"]:  # pre_affine's own call of the layer
        return
    x = args[0].reshape(-1, args[0].shape[-1])
    if store["pick"] is None:  # the batch's first norm layer picks its rows for every layer
        store["pick"] = torch.randperm(len(x), generator=store["gen"])[:store["per_batch"]]
    x = x[store["pick"].to(x.device)]
    store["inside"] = True
    y = pre_affine(layer, x)
    store["inside"] = False
    store["pairs"][name].append((x.double().cpu(), y.double().cpu()))


@torch.no_grad()
def sample_pairs(model, windows, batch_size, tokens, seed):
    """{layer: (x, y)}: float64 arrays (tokens, n_embd), the same token positions in every layer."""
    device = next(model.parameters()).device
    starts = range(0, len(windows), batch_size)
    store = dict(pick=None, inside=False, gen=torch.Generator().manual_seed(seed),
                 per_batch=-(-tokens // len(starts)), pairs={})
    handles = []
    for name, layer in norm_stats.norm_layers(model):
        store["pairs"][name] = []
        handles.append(layer.register_forward_pre_hook(functools.partial(keep_rows, store, name)))
    was_training = model.training
    model.eval()
    try:
        for k in starts:
            store["pick"] = None
            model(windows[k:k + batch_size].to(device))
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return {name: tuple(torch.cat(p)[:tokens].numpy() for p in zip(*pairs))
            for name, pairs in store["pairs"].items()}


def tanh_loss(log_b, x, y):  # the least squares of y ~ a tanh(b x) at its best a, for this b
    t = np.tanh(math.exp(log_b) * x)
    tt = t @ t
    return y @ y - (y @ t) ** 2 / tt if tt > 0 else y @ y


def fit_tanh(x, y):
    """(a, b, R^2) of the least-squares a*tanh(b*x): a in closed form for each b, b > 0 by a grid of
    b * std, then golden-section search between the best point's neighbours."""
    x, y = np.ravel(x), np.ravel(y)
    std = x.std() or 1.0
    grid = LOG_C - math.log(std)
    losses = [tanh_loss(g, x, y) for g in grid]
    k = int(np.argmin(losses))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    m1, m2 = hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo)
    f1, f2 = tanh_loss(m1, x, y), tanh_loss(m2, x, y)
    while hi - lo > 1e-7:  # in log b: b to 1e-7 relative; one new loss a step, the other kept
        if f1 < f2:
            hi, m2, f2 = m2, m1, f1
            m1 = hi - GOLDEN * (hi - lo)
            f1 = tanh_loss(m1, x, y)
        else:
            lo, m1, f1 = m1, m2, f2
            m2 = lo + GOLDEN * (hi - lo)
            f2 = tanh_loss(m2, x, y)
    b = math.exp((lo + hi) / 2)
    t = np.tanh(b * x)
    a = float(y @ t / (t @ t))
    return a, b, r_squared(y, a * t)


def fit_line(x, y):  # (slope, intercept, R^2) of ordinary least squares
    x, y = np.ravel(x), np.ravel(y)
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept), r_squared(y, slope * x + intercept)


def r_squared(y, fitted):
    total = ((y - y.mean()) ** 2).sum()
    return float(1 - ((y - fitted) ** 2).sum() / total) if total > 0 else None


def layer_curve(model, name, x, y, depth):
    """One layer's figures: its fits, b against 1/std, the flat part, its own saturation."""
    layer = model.get_submodule(name)
    a, b, r2 = fit_tanh(x, y)
    std = float(x.std())
    sat = None
    if hasattr(layer, "squashed"):  # DyT, Derf: |f(u)| > tanh(2), as norm_stats counts it
        with torch.no_grad():
            u = layer.squashed(torch.from_numpy(x).to(layer.weight))
        sat = float((u.abs() > layer.cut(HEADLINE_T)).double().mean())
    alpha = getattr(layer, "alpha", None)
    inv_std = 1 / std if std else None
    return dict(depth=depth, kind=model.config.norm, input_std=std, inv_std=inv_std,
                a=a, b=b, b_std=b * std, r2_tanh=r2, r2_line=fit_line(x, y)[2],
                flat=float((np.abs(b * x) > HEADLINE_T).mean()), saturation=sat,
                alpha=None if alpha is None else alpha.item())


def measure(model, windows, opts):
    """(figures, points): every norm layer's S-curve figures and, for --plot, its pairs."""
    pairs = sample_pairs(model, windows, opts["batch_size"], opts["scurve_tokens"], opts["seed"])
    layers = {}
    for name, (x, y) in pairs.items():
        block = name.split(".")[-2]  # transformer.h.3.ln_1: block 3; ln_f after the last
        depth = int(block) if block.isdigit() else model.config.n_layer
        layers[name] = layer_curve(model, name, x, y, depth)
    b, inv = (np.array([v[k] for v in layers.values()]) for k in ("b", "inv_std"))
    r = float(np.corrcoef(b, inv)[0, 1]) if len(b) > 1 and b.std() > 0 and inv.std() > 0 else None
    first = next(iter(pairs.values()))[0]
    return dict(tokens=len(first), flat_t=HEADLINE_T, layers=layers, pearson_b_inv_std=r), pairs


def print_scurve(results, labels):
    """The table of analyze.py's report, the checkpoints side by side."""
    sc = [r["scurve"] for r in results]
    rows = rows_by_name([s["layers"] for s in sc], lambda l: (
        fmt(l["r2_tanh"], ".3f"), fmt(l["r2_line"], ".3f"), f"{l['b']:.3g}", f"{l['inv_std']:.3g}",
        f"{l['flat']:.3f}", fmt(l["saturation"], ".3f")))
    rows += [("pearson r (b, 1/std)", [(fmt(s["pearson_b_inv_std"], ".3f"),) + ("",) * 5
                                       for s in sc])]
    print_table(f"S-curves: output before the affine against input, {sc[0]['tokens']} sampled "
                f"tokens; fits of a*tanh(b*x) and a line (R^2), flat = |b x| > {HEADLINE_T:g}, sat "
                "= DyT/Derf's own saturation", labels, rows,
                fields=("R2_tanh", "R2_line", "b", "1/std", "flat", "sat"))


def plot_scurves(plt, results, points, labels, outdir, save):
    """scurve_<label>.png per checkpoint: a panel per norm layer, 64 tokens' points colored by
    token (a token's points lie on one line in a LayerNorm), the tanh fit drawn."""
    for lab, r, pairs in zip(labels, results, points):
        names = list(pairs)
        cols = min(len(names), 5)
        rows = -(-len(names) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.9 * rows), squeeze=False)
        for ax, name in zip(axes.flat, names):
            x, y = (v[:64, :256] for v in pairs[name])
            colors = np.repeat(np.arange(len(x)), x.shape[1])
            ax.scatter(x.ravel(), y.ravel(), c=colors, cmap="viridis", s=1, alpha=0.5)
            f = r["scurve"]["layers"][name]
            grid = np.linspace(x.min(), x.max(), 200)
            ax.plot(grid, f["a"] * np.tanh(f["b"] * grid), "r-", lw=1)
            ax.set_title(f"{name.removeprefix('transformer.')}: R2 tanh {fmt(f['r2_tanh'], '.2f')}"
                         f", line {fmt(f['r2_line'], '.2f')}", fontsize=8)
        for ax in axes.flat[len(names):]:
            ax.axis("off")
        fig.suptitle(f"{lab}: input (x) against output before the affine (y)")
        save(fig, f"scurve_{lab.replace(os.sep, '_')}.png")
