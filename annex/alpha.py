"""
The DyT paper's observation (Zhu et al. 2025) that a layer's learned alpha tracks 1/std of its input,
as analyze.py's `alpha` measure: per DyT/Derf layer, and their Pearson r. An annex, not one of the
study's measures: analyze.py imports it for `alpha`, and for `all` when this file is here.
"""
import numpy as np

from analyze import fmt, print_notes, print_table, rows_by_name


def alpha_vs_std(stats):
    """Each layer with an alpha (DyT, Derf), from norm_stats.read's figures: alpha, input std, 1/std."""
    layers = {name: dict(alpha=l["alpha"], input_std=l["input_std"], inv_std=1.0 / l["input_std"])
              for name, l in stats["layers"].items() if l["alpha"] is not None}
    a, b = (np.array([v[k] for v in layers.values()]) for k in ("alpha", "inv_std"))
    r = float(np.corrcoef(a, b)[0, 1]) if len(a) > 1 and a.std() > 0 and b.std() > 0 else None
    return dict(layers=layers, pearson=r)


def print_alpha(results, labels):
    """The table of analyze.py's report, the checkpoints side by side."""
    al = [r["alpha"] for r in results]
    lacking = [not a["layers"] for a in al]
    print_notes(labels, lacking, "alpha")
    if not all(lacking):
        rows = rows_by_name([a["layers"] for a in al], lambda l: (
            f"{l['alpha']:.3f}", f"{l['inv_std']:.3f}"))
        rows += [("pearson r", [(fmt(a["pearson"], ".3f"), "") for a in al])]
        print_table("DyT/Derf learned alpha against 1 / input std", labels, rows,
                    fields=("alpha", "1/std"))
