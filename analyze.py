"""Measure what the study's explanation rests on (Verma 2026; docs/analysis.md), runs side by side:
  saturation  fraction of |f| > tanh(t) per point-wise norm layer (DyT: |alpha x| > t), and
              each norm layer's input std, on train.py's first train eval windows
  spectra     HTSR per 2-D weight: WeightWatcher's alpha of W^T W's ESD, alpha_weighted, stable rank
  rank        effective rank (Roy & Vetterli) of each block's output and each weight
  alpha       learned DyT/Derf alpha against 1 / input std, their Pearson r (annex/alpha.py)
  scurve      the DyT paper's S-curves: each norm layer's input against its output before the
              affine, fits of a*tanh(b*x) and a line, R^2, b against 1/std (annex/scurve.py)
  all         each of them: one forward pass (scurve: its own), one eigendecomposition per matrix
  python analyze.py saturation out-dyt  # a directory means its ckpt.pt
  python analyze.py all out-ln out-dyt --ckpt=best --json=cmp.json --plot=figs
Options: train_tokens (-1 = the model's budget, 0 = all), block_size (0 = the model's), max_n
(skip weights with a longer side), json=FILE (docs/analysis.md), plot=DIR."""
import difflib
import math
import sys
from pathlib import Path

import numpy as np
import torch

import norm_stats
from checkpoint import checkpoint_file, load_checkpoint
from configurator import annex, configure, split_args
from data.common import (DataError, data_budget, entropy_of, load_meta, load_split, random_windows,
                         write_json)
from distributed import pick_device

MEASURES = ("saturation", "spectra", "rank", "alpha", "scurve")
SECTIONS = dict({m: (m,) for m in MEASURES}, all=MEASURES)  # each command's measures
DEFAULTS = dict(ckpt="latest", windows=50, seed=1337, block_size=0, batch_size=10, device="auto",
                min_evals=50, max_evals=5000, max_n=50000, dataset="", data_dir="",
                train_tokens=-1, json="", plot="", scurve_tokens=256)
HEADLINE_T = 2.0  # the study's headline t: tanh(2) is 96% of the bound
EVALS_THRESH = 1e-5  # WeightWatcher's: eigenvalues <= this are zeros


def fit_powerlaw(evals):  # WeightWatcher's fit of an ESD's tail (Clauset et al. 2009): least KS D
    x = np.sort(np.asarray(evals, dtype=np.float64))
    x = x[x > EVALS_THRESH]
    N = len(x)
    if N < 3:
        return None
    logx = np.log(x)
    n = np.arange(N, 1, -1, dtype=np.float64)  # the tail's size for each candidate xmin x[c]
    tail_log_sum = np.cumsum(logx[::-1])[::-1][:-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        alphas = 1 + n / (tail_log_sum - n * logx[:-1])
    Ds = np.ones(N - 1)  # a tail of equal values has no fit: D stays 1
    for c in np.flatnonzero(np.isfinite(alphas) & (alphas > 1)):
        cdf = 1 - np.exp((1 - alphas[c]) * (logx[c:] - logx[c]))  # the fit's, from xmin = x[c] up
        Ds[c] = np.abs(cdf - np.arange(N - c) / n[c]).max()  # against the empirical CDF: k/n
    b = int(np.argmin(Ds))
    return dict(alpha=float(alphas[b]), xmin=float(x[b]), D=float(Ds[b]), num_tail=int(n[b]))


def effective_rank(s):  # Roy & Vetterli (2007): exp(entropy of the normalised singular values)
    return float(np.exp(entropy_of(np.asarray(s, dtype=np.float64))))


def float64_device(device):  # float64 work's: the device, but not MPS (no float64)
    device = torch.device(device)
    return torch.device("cpu") if device.type == "mps" else device


def eigenvalues(mats):  # W^T W's, ascending: eigvalsh of the smaller Gram, ~10x an SVD's speed
    out = {}
    for name, W in mats.items():
        W = W.to(float64_device(W.device)).double()
        gram = W @ W.T if W.shape[0] <= W.shape[1] else W.T @ W
        out[name] = torch.linalg.eigvalsh(gram).clamp(min=0).cpu().numpy()
    return out


def spectra(mats, evals, skipped):
    layers = {}
    for name, ev in evals.items():
        fit = fit_powerlaw(ev)
        if fit is None:
            skipped[name] = "fewer than 3 nonzero eigenvalues"
            continue
        lmax = float(ev.max())
        layers[name] = dict(shape=list(mats[name].shape), num_evals=len(ev), **fit, lambda_max=lmax,
                            alpha_weighted=fit["alpha"] * math.log10(lmax),
                            stable_rank=float(ev.sum() / lmax))
    res = dict(layers=layers, skipped=skipped)
    for key, stat, field in (("mean_alpha", np.mean, "alpha"), ("median_alpha", np.median, "alpha"),
                             ("mean_alpha_weighted", np.mean, "alpha_weighted"),
                             ("mean_stable_rank", np.mean, "stable_rank")):
        res[key] = float(stat([v[field] for v in layers.values()])) if layers else None
    return res


def weight_matrices(model, min_evals, max_evals, max_n):
    """The 2-D weights (a tied one once), filtered as WeightWatcher's min/max_evals and max_N."""
    keep, skipped = {}, {}
    for name, p in model.named_parameters():
        if p.dim() != 2:
            continue
        name, m, big = name.removesuffix(".weight"), min(p.shape), max(p.shape)
        if m < min_evals:
            skipped[name] = f"{m} eigenvalues < min_evals={min_evals}"
        elif m > max_evals:
            skipped[name] = f"{m} eigenvalues > max_evals={max_evals}"
        elif big > max_n:
            skipped[name] = f"long side {big} > max_n={max_n}"
        else:
            keep[name] = p.detach()
    return keep, skipped


def sample_windows(data, count, block_size, seed):  # train.py's eval windows' first tokens
    starts = random_windows(len(data), count, block_size + 1, seed)
    return torch.from_numpy(np.stack([data[s:s + block_size] for s in starts]).astype(np.int64))


@torch.no_grad()
def forward_stats(model, windows, batch_size=10, block_ranks=False):
    """norm_stats.read's figures and, with block_ranks, each block output's effective rank."""
    device = next(model.parameters()).device
    grams = {}  # block: sum of A^T A (float64), A's spectrum without A

    def accumulate(block, inputs, out):
        a = out.reshape(-1, out.shape[-1]).to(float64_device(device)).double()
        grams[block] = grams.get(block, 0) + a.T @ a
    handles = [b.register_forward_hook(accumulate) for b in model.transformer.h if block_ranks]
    was_training = model.training
    model.eval()
    norm_stats.record(model)
    try:
        for k in range(0, len(windows), batch_size):
            model(windows[k:k + batch_size].to(device))
        stats = norm_stats.read(model)
    finally:
        norm_stats.record(model, False)
        model.train(was_training)
        for h in handles:
            h.remove()
    ranks = [effective_rank(torch.linalg.eigvalsh(g).clamp(min=0).sqrt().cpu().numpy())
             for g in grams.values()]  # in the order the blocks ran
    return dict(norm=stats, block_ranks=ranks or None)


def measurement_windows(model, ckpt, opts):
    """(dataset, windows, tokens): the first of train.py's train eval windows, in its budget."""
    cfg = ckpt.get("config", {})
    dataset = opts["dataset"] or cfg.get("dataset")
    if not dataset:
        raise SystemExit("analyze.py: the checkpoint names no dataset; pass --dataset=NAME")
    data_dir = opts["data_dir"] or (None if opts["dataset"] else cfg.get("data_dir"))
    block_size = opts["block_size"] or model.config.block_size
    own = opts["train_tokens"] < 0  # the model's budget (a prefix, or documents)
    try:
        if "patch_size" in ckpt["model_args"]:
            vit = annex("vit", "a ViT checkpoint")
            return (dataset, *vit.analysis_images(dataset, data_dir, opts["windows"], opts["seed"]))
        if block_size > model.config.block_size:
            raise SystemExit(f"analyze.py: --block_size={block_size} exceeds the model's "
                             f"{model.config.block_size}")
        data = data_budget(load_split(dataset, "train", data_dir),
                           cfg.get("train_tokens") if own else opts["train_tokens"] or None,
                           cfg.get("budget_docs") if own else None, load_meta(dataset, data_dir))
        windows = sample_windows(data, opts["windows"], block_size, opts["seed"])
    except DataError as e:
        raise SystemExit(f"analyze.py: {e}\n(--block_size=N, --train_tokens=0 for the whole split, "
                         "--dataset=NAME / --data_dir=DIR for other data)") from None
    if int(windows.max()) >= model.config.vocab_size:
        raise SystemExit(f"analyze.py: dataset '{dataset}' has token ids >= the model's vocab_size "
                         f"{model.config.vocab_size}: not its training data; pass --dataset=NAME")
    return dataset, windows, len(data)


def analyze(path, command, opts):  # its figures (the JSON), eigenvalues and S-curve points (plots)
    try:
        model, ckpt = load_checkpoint(path, device=opts["device"])
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"analyze.py: {e}") from None
    want = set(SECTIONS[command])
    alpha = annex("alpha", "analyze.py alpha" if command == "alpha" else None)
    scurve = annex("scurve", "analyze.py scurve" if command == "scurve" else None)
    res = dict(path=str(path), iter_num=ckpt.get("iter_num"),
               dataset=ckpt.get("config", {}).get("dataset"), norm=model.config.norm,
               model_args=ckpt["model_args"])
    if want - {"spectra"}:  # the others need a forward pass
        res["dataset"], windows, tokens = measurement_windows(model, ckpt, opts)
        T = model.config.block_size if windows.dim() == 4 else windows.shape[1]  # images: patches
        res["windows"] = dict(count=len(windows), block_size=T, seed=opts["seed"], split="train",
                              tokens=tokens)
        fs = forward_stats(model, windows, opts["batch_size"], block_ranks="rank" in want)
        ns = fs["norm"]
    if "saturation" in want:
        at_2 = ns["saturation"][norm_stats.AT_2] if ns["saturation"] else None
        res["saturation"] = {"thresholds": ns["thresholds"], "global": ns["saturation"],
                             "layers": ns["layers"], "global_at_2": at_2}
    if "alpha" in want and alpha:  # the DyT paper's check; `all` without annex/alpha.py skips it
        res["alpha"] = alpha.alpha_vs_std(ns)
    plot_data = dict(esds={}, pairs=None)
    if "scurve" in want and scurve:  # the same
        res["scurve"], plot_data["pairs"] = scurve.measure(model, windows, opts)
    if want & {"spectra", "rank"}:
        mats, skipped = weight_matrices(model, opts["min_evals"], opts["max_evals"], opts["max_n"])
        evals = eigenvalues(mats)
        if "spectra" in want:
            res["spectra"] = spectra(mats, evals, skipped)
            plot_data["esds"] = evals
    if "rank" in want:
        w = {name: effective_rank(np.sqrt(ev)) for name, ev in evals.items()}
        res["rank"] = dict(blocks=fs["block_ranks"], mean_blocks=float(np.mean(fs["block_ranks"])),
                           weights=w, mean_weights=float(np.mean(list(w.values()))) if w else None)
    return res, plot_data


def fmt(v, spec=".4g"):
    return "-" if v is None else format(v, spec)


def print_table(title, labels, rows, fields=("",)):
    """rows: (name, [cell per checkpoint]), a cell a string per field or one ("-") for them all."""
    rows = [(name, [c if isinstance(c, tuple) else (c,) * len(fields) for c in cells])
            for name, cells in rows]
    if any(fields):  # their names over the sub-columns
        rows.insert(0, ("", [fields] * len(labels)))
    columns = []
    for k, lab in enumerate(labels):  # its label over its cells, right-aligned
        cells = [r[1][k] for r in rows]
        ws = [max(map(len, sub)) for sub in zip(*cells)]
        col = [lab] + ["  ".join(c.rjust(w) for c, w in zip(cell, ws)) for cell in cells]
        width = max(map(len, col))
        columns.append([s.rjust(width) for s in col])
    w0 = max([len(name) for name, _ in rows] + [8])
    print(f"\n{title}")
    for name, *groups in zip([""] + [name for name, _ in rows], *columns):
        print("    ".join([name.ljust(w0)] + groups).rstrip())


def rows_by_name(tables, cell):  # a row per name in any table; "-" where a checkpoint lacks it
    names = dict.fromkeys(n for t in tables for n in t)
    return [(n, [cell(t[n]) if n in t else "-" for t in tables]) for n in names]


def report(results, labels):
    sat, sp, rk, al, sc = ([r.get(s) for r in results] for s in MEASURES)
    if sat[0]:
        w, layers = results[0]["windows"], [s["layers"] for s in sat]
        lacking = [s["global"] is None for s in sat]
        print_notes(labels, lacking, "saturation", "; input std per layer follows")
        if not all(lacking):
            th = sat[0]["thresholds"]
            rows = rows_by_name([dict(zip([f"global t={t:g}" for t in th], s["global"] or ()))
                                 for s in sat], lambda v: fmt(v, ".3f"))
            rows += rows_by_name(layers, lambda l: fmt(l["saturation"][norm_stats.AT_2], ".3f")
                                 if l["saturation"] else "-")
            print_table(f"saturation: fraction of |alpha*x| > t, Derf's |erf| > tanh(t) (layers at "
                        f"t={HEADLINE_T:g}); {w['count']} train windows of {w['block_size']} "
                        f"tokens, seed {w['seed']}", labels, rows)
        print_table("input std per norm layer", labels,
                    rows_by_name(layers, lambda l: fmt(l["input_std"])))
    if sp[0]:
        rows = rows_by_name([s["layers"] for s in sp], lambda l: (
            f"{l['alpha']:.2f}", f"{l['alpha_weighted']:.2f}", f"{l['stable_rank']:.1f}"))
        rows += [("mean", [(fmt(s["mean_alpha"], ".2f"), fmt(s["mean_alpha_weighted"], ".2f"),
                            fmt(s["mean_stable_rank"], ".1f")) for s in sp]),
                 ("median", [(fmt(s["median_alpha"], ".2f"), "", "") for s in sp]),
                 ("layers fitted/skipped", [(f"{len(s['layers'])}/{len(s['skipped'])}", "", "")
                                            for s in sp])]
        print_table("HTSR spectra per weight: power-law alpha (2-4 well trained, 4-6 weak, > 6 "
                    "random-like, < 2 over-trained),\nalpha_w = alpha_weighted = alpha "
                    "log10(lambda_max), stable_rank = sum(lambda) / lambda_max", labels, rows,
                    fields=("alpha", "alpha_w", "stable_rank"))
    if rk[0]:
        blocks = [{f"block {i} output": v for i, v in enumerate(k["blocks"])} for k in rk]
        rows = rows_by_name(blocks, lambda v: fmt(v, ".1f"))
        rows += [("mean over blocks", [fmt(k["mean_blocks"], ".1f") for k in rk])]
        rows += rows_by_name([k["weights"] for k in rk], lambda v: fmt(v, ".1f"))
        rows += [("mean over weights", [fmt(k["mean_weights"], ".1f") for k in rk])]
        print_table("effective rank (Roy & Vetterli) of activations and weights", labels, rows)
    if al[0]:
        annex("alpha").print_alpha(results, labels)
    if sc[0]:
        annex("scurve").print_scurve(results, labels)


def print_notes(labels, lacking, measure, then=""):  # for the checkpoints without such a layer
    notes = [f"{lab}: no DyT/Derf layer: {measure} is defined for point-wise norm layers only{then}"
             for lab, no in zip(labels, lacking) if no]
    if notes:
        print("\n" + "\n".join(notes))


def label(path):  # its run folder, and the file's stem unless ckpt.pt
    if not path.parent.name:
        return path.stem
    return path.parent.name if path.name == "ckpt.pt" else f"{path.parent.name}/{path.stem}"


def main(argv):
    pos, options = split_args(argv)
    opts = configure(DEFAULTS, options, doc=__doc__)
    if pos and pos[0] not in SECTIONS:
        close = difflib.get_close_matches(pos[0], SECTIONS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise SystemExit(f"analyze.py: unknown command {pos[0]!r}{hint}; choose one of "
                         f"{', '.join(SECTIONS)}")
    if len(pos) < 2:
        raise SystemExit(f"usage: python analyze.py <{'|'.join(SECTIONS)}> <ckpt.pt | out_dir> "
                         "[more ...] [--key=value ...]")
    if opts["windows"] < 1 or opts["batch_size"] < 1:
        raise SystemExit("analyze.py: --windows and --batch_size must be positive")
    command = pos[0]
    try:
        opts["device"] = pick_device(opts["device"])
        paths = [Path(checkpoint_file(p, opts["ckpt"])) for p in pos[1:]]
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"analyze.py: {e}") from None
    plots = annex("plots", "--plot") if opts["plot"] else None  # its error before measuring
    labels = [label(p) for p in paths]
    labels = [lab if labels.count(lab) == 1 else f"{lab}#{k}" for k, lab in enumerate(labels)]
    out = [analyze(p, command, opts) for p in paths]
    results = [dict(label=lab, **r) for lab, (r, _) in zip(labels, out)]
    report(results, labels)
    if opts["json"]:
        Path(opts["json"]).resolve().parent.mkdir(parents=True, exist_ok=True)
        write_json(opts["json"], dict(schema="nanonorm-analysis/1", command=command, settings=opts,
                                      checkpoints=results))
        print(f"\nwrote {opts['json']}")
    if plots:
        plots.analysis_plots(results, labels, [p for _, p in out], opts["plot"])
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
