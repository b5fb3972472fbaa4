"""annex/alpha.py: the DyT paper's alpha against 1/std of each layer's input (moved with the code from
tests/test_analyze.py; analyze.py's alpha command is tested there, with this annex present)."""
import pytest

from annex import alpha
from tests.test_analyze import pearson


def test_alpha_against_inverse_std_pearson():
    # every layer with an alpha counts, whatever its kind (DyT, Derf); layers without one do not
    stats = {"layers": {"a": dict(kind="dyt", alpha=1.0, input_std=1.0),
                        "b": dict(kind="dyt", alpha=2.0, input_std=0.25),
                        "c": dict(kind="derf", alpha=4.0, input_std=0.5),
                        "n": dict(kind="layernorm", alpha=None, input_std=3.0)}}
    got = alpha.alpha_vs_std(stats)
    assert list(got["layers"]) == ["a", "b", "c"] and got["layers"]["b"]["inv_std"] == 4.0
    assert got["pearson"] == pytest.approx(pearson([1.0, 2.0, 4.0], [1.0, 4.0, 2.0]))
