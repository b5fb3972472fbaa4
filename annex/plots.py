"""
Plots, where matplotlib is installed (it is optional: tables and JSON never need it): analyze.py's
--plot=DIR, and the helpers the study's report draws with. An annex: without it, analyze.py --plot says
so.
"""
import os

import numpy as np

from analyze import EVALS_THRESH, HEADLINE_T, fmt
from data.common import atomic_write


def pyplot():
    """matplotlib.pyplot on a file-only backend, or None (with a note) when matplotlib is not
    installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: plots skipped (pip install matplotlib); tables and JSON are "
              "complete")
        return None
    return plt


def save_png(fig, path):
    """Write a figure atomically and free it."""
    import matplotlib.pyplot as plt
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110, bbox_inches="tight"))
    plt.close(fig)


def analysis_plots(results, labels, plot_data, outdir):
    """analyze.py --plot=DIR: saturation by threshold and by layer, each weight's ESD with its power-law
    fit, activation effective rank by block, alpha against 1/std, the S-curves (annex/scurve.py)."""
    plt = pyplot()
    if plt is None:
        return
    os.makedirs(outdir, exist_ok=True)
    esds = [p["esds"] for p in plot_data]

    def save(fig, name):
        save_png(fig, os.path.join(outdir, name))
    sat_runs = [(lab, r["saturation"]) for lab, r in zip(labels, results)
                if r.get("saturation", {}).get("global")]
    if sat_runs:
        fig, ax = plt.subplots(figsize=(7, 4))
        for lab, s in sat_runs:
            ax.plot(s["thresholds"], s["global"], "o-", label=lab)
        ax.axhline(0.43, ls=":", c="gray", label="screening rule 0.43")
        ax.set(xlabel="threshold t", ylabel="fraction |alpha*x| > t", title="global saturation")
        ax.legend()
        save(fig, "saturation_thresholds.png")
        fig, ax = plt.subplots(figsize=(10, 4))
        names = list(dict.fromkeys(n for _, s in sat_runs for n, l in s["layers"].items()
                                   if l["saturation"]))
        i, w = sat_runs[0][1]["thresholds"].index(HEADLINE_T), 0.8 / len(sat_runs)
        for k, (lab, s) in enumerate(sat_runs):
            ls = s["layers"]
            ax.bar(np.arange(len(names)) + (k - (len(sat_runs) - 1) / 2) * w,
                   [ls[n]["saturation"][i] if n in ls else 0 for n in names], width=w, label=lab)
        ax.set_xticks(np.arange(len(names)), names, rotation=90, fontsize=7)
        ax.set(ylabel=f"fraction |alpha*x| > {HEADLINE_T:g}", title="saturation per DyT/Derf layer")
        ax.legend()
        save(fig, "saturation_layers.png")
    for name in dict.fromkeys(n for e in esds for n in e):
        have = [(lab, r, e) for lab, r, e in zip(labels, results, esds)
                if name in e and name in r["spectra"]["layers"]]
        fig, axes = plt.subplots(1, len(have), figsize=(4.5 * len(have), 3.8), squeeze=False)
        for ax, (lab, r, e) in zip(axes[0], have):
            ev, f = e[name][e[name] > EVALS_THRESH], r["spectra"]["layers"][name]
            bins = np.logspace(np.log10(ev.min()), np.log10(ev.max()), 60)
            ax.hist(ev, bins=bins, density=True, alpha=0.6)
            # fitted density, scaled to the tail share
            tail = np.logspace(np.log10(f["xmin"]), np.log10(ev.max()), 50)
            ax.plot(tail, f["num_tail"] / len(ev) * (f["alpha"] - 1) / f["xmin"]
                    * (tail / f["xmin"]) ** -f["alpha"],
                    "r--", label=f"alpha={f['alpha']:.2f}, D={f['D']:.3f}")
            ax.axvline(f["xmin"], c="r", lw=0.8)
            ax.set(xscale="log", yscale="log", xlabel="eigenvalue", title=f"{lab}\n{name}")
            ax.legend(fontsize=8)
        save(fig, f"esd_{name}.png")
    if "rank" in results[0]:
        fig, ax = plt.subplots(figsize=(7, 4))
        for lab, r in zip(labels, results):
            ax.plot(r["rank"]["blocks"], "o-", label=lab)
        ax.set(xlabel="block", ylabel="effective rank of output", title="activation effective rank")
        ax.legend()
        save(fig, "erank_blocks.png")
    if "alpha" in results[0] and any(r["alpha"]["layers"] for r in results):
        fig, ax = plt.subplots(figsize=(5, 5))
        for lab, r in zip(labels, results):
            ls = r["alpha"]["layers"].values()
            ax.scatter([l["inv_std"] for l in ls], [l["alpha"] for l in ls],
                       label=f"{lab} r={fmt(r['alpha']['pearson'], '.2f')}")
        ax.set(xlabel="1 / input std", ylabel="learned alpha", title="DyT/Derf alpha vs 1/std")
        ax.legend()
        save(fig, "alpha_vs_inv_std.png")
    if "scurve" in results[0]:
        from annex.scurve import plot_scurves
        plot_scurves(plt, results, [p["pairs"] for p in plot_data], labels, outdir, save)
    print(f"plots written to {outdir}/")
