"""analyze.py: power-law fit, effective rank, spectra, saturation, and every command end to end on tiny
checkpoints (--plot draws with annex/plots.py)."""
import importlib.util
import json
import math
import re

import numpy as np
import pytest
import torch

import analyze
import model as M
import norm_stats
from checkpoint import load_checkpoint
from data.common import random_windows


# ----------------------------------------------------------------------------------------- power-law fit

@pytest.mark.parametrize("alpha", [2.0, 3.0, 4.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pareto_exponent_recovered(alpha, seed):
    # p(x) ~ x^-alpha for x >= 1. Stated tolerance: 0.1 * (alpha - 1), about 4 standard errors of the MLE
    # at this size (measured over 50 seeds: sd = 0.023 * (alpha - 1)).
    x = np.random.default_rng(seed).pareto(alpha - 1, 4000) + 1
    fit = analyze.fit_powerlaw(x)
    assert abs(fit["alpha"] - alpha) <= 0.1 * (alpha - 1)


def test_tail_found_above_a_bulk():
    # A bulk in [0.05, 0.95] under a Pareto tail starting at 1: xmin must land at the tail's start.
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(0.05, 0.95, 3000), rng.pareto(1.5, 1000) + 1])
    fit = analyze.fit_powerlaw(x)
    assert 0.95 <= fit["xmin"] <= 1.2
    assert abs(fit["alpha"] - 2.5) <= 0.15
    assert fit["num_tail"] == np.sum(x >= fit["xmin"])


def test_chosen_xmin_minimises_ks_distance_brute_force():
    rng = np.random.default_rng(3)
    x = np.sort(np.concatenate([rng.lognormal(0, 0.5, 150), rng.pareto(2.0, 60) + 2]))
    best = None
    for i in range(len(x) - 1):                      # every point but the largest is a candidate xmin
        xmin, tail = x[i], x[i:]
        n = len(tail)
        alpha = 1 + n / sum(math.log(t / xmin) for t in tail)
        D = 0.0
        for k, t in enumerate(tail):  # empirical CDF of the k-th tail point (k from 0): k / n
            D = max(D, abs((1 - (t / xmin) ** (1 - alpha)) - k / n))
        if best is None or D < best[0]:
            best = (D, xmin, alpha, n)
    fit = analyze.fit_powerlaw(x)
    assert fit["xmin"] == best[1] and fit["num_tail"] == best[3]
    assert fit["D"] == pytest.approx(best[0], rel=1e-9)
    assert fit["alpha"] == pytest.approx(best[2], rel=1e-9)


def test_fit_ignores_zero_eigenvalues_and_rejects_too_few():
    x = np.random.default_rng(0).pareto(2.0, 500) + 1
    assert analyze.fit_powerlaw(np.concatenate([x, np.zeros(100)])) == analyze.fit_powerlaw(x)
    assert analyze.fit_powerlaw([0.0, 0.0, 1.0, 2.0]) is None


# ---------------------------------------------------------------------------------------- effective rank

def test_effective_rank_identity_rank1_and_closed_form():
    n = 37
    eye = torch.eye(n, dtype=torch.float64)
    assert analyze.effective_rank(torch.linalg.svdvals(eye)) == pytest.approx(n)
    u, v = torch.randn(40, 1, dtype=torch.float64), torch.randn(1, 30, dtype=torch.float64)
    assert analyze.effective_rank(torch.linalg.svdvals(u @ v)) == pytest.approx(1.0, abs=1e-6)
    # Singular values (3, 1): p = (3/4, 1/4), entropy = ln 4 - (3/4) ln 3, so erank = 4 / 3^(3/4).
    q1, _ = torch.linalg.qr(torch.randn(20, 20, dtype=torch.float64))
    q2, _ = torch.linalg.qr(torch.randn(10, 10, dtype=torch.float64))
    W = q1[:, :2] @ torch.diag(torch.tensor([3.0, 1.0], dtype=torch.float64)) @ q2[:2, :]
    assert analyze.effective_rank(torch.linalg.svdvals(W)) == pytest.approx(4 / 3 ** 0.75, rel=1e-9)


# ---------------------------------------------------------------------------------------------- spectra

def test_eigenvalues_and_spectra_figures():
    g = torch.Generator().manual_seed(0)
    mats = {"a": torch.randn(60, 80, generator=g), "b": torch.randn(60, 80, generator=g),
            "c": torch.randn(100, 70, generator=g), "d": torch.randn(50, 50, generator=g) ** 3}
    evals = analyze.eigenvalues(mats)
    assert list(evals) == ["a", "b", "c", "d"]
    for name, W in mats.items():   # eigenvalues of W^T W = squared singular values, min(N, M) of them
        ref = np.sort(np.linalg.svd(W.double().numpy(), compute_uv=False) ** 2)
        np.testing.assert_allclose(evals[name], ref, rtol=1e-9, atol=1e-12 * ref.max())
    sp = analyze.spectra(mats, evals, {})
    for name, W in mats.items():
        w = W.double().numpy()
        lay = sp["layers"][name]
        assert lay["num_evals"] == min(W.shape) and lay["shape"] == list(W.shape)
        assert lay["lambda_max"] == pytest.approx(np.linalg.norm(w, 2) ** 2, rel=1e-9)
        top = np.linalg.norm(w, 2) ** 2
        assert lay["stable_rank"] == pytest.approx(np.linalg.norm(w, "fro") ** 2 / top, rel=1e-9)
        assert lay["alpha_weighted"] == pytest.approx(lay["alpha"] * math.log10(top), rel=1e-9)
    alphas = sorted(sp["layers"][n]["alpha"] for n in mats)
    assert sp["mean_alpha"] == pytest.approx(sum(alphas) / 4)
    assert sp["median_alpha"] == pytest.approx((alphas[1] + alphas[2]) / 2)


def test_float64_work_goes_to_the_cpu_for_apple_gpus(monkeypatch):
    # MPS has no float64: its tensors are moved to the CPU before .double(); CPU and CUDA keep theirs.
    assert analyze.float64_device("mps") == analyze.float64_device("mps:0") == torch.device("cpu")
    assert analyze.float64_device("cuda:1") == torch.device("cuda:1")
    assert analyze.float64_device(torch.device("cpu")) == torch.device("cpu")
    # No MPS here: check that both float64 paths (spectra, block-output Grams) ask where to work, with
    # the model's device, and compute there.
    asked = []

    def spy(device):
        asked.append(torch.device(device))
        return torch.device("cpu")
    monkeypatch.setattr(analyze, "float64_device", spy)
    model = M.GPT(M.GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=8, vocab_size=64))
    analyze.eigenvalues({"w": model.transformer.h[0].mlp.c_fc.weight.detach()})
    assert asked == [torch.device("cpu")]
    ranks = analyze.forward_stats(model, torch.randint(0, 64, (2, 8)), block_ranks=True)["block_ranks"]
    assert len(asked) == 2 and 1 <= ranks[0] <= 32


def test_weight_filters_follow_eigenvalue_count():
    model = M.GPT(M.GPTConfig(n_layer=1, n_head=2, n_embd=64, block_size=16, vocab_size=300))
    keep, skipped = analyze.weight_matrices(model, min_evals=50, max_evals=5000, max_n=256)
    # wte (300 x 64, tied with lm_head: listed once) has 64 eigenvalues but a long side > max_n;
    # wpe (16 x 64) has only 16 eigenvalues.
    assert set(keep) == {"transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj",
                         "transformer.h.0.mlp.c_fc", "transformer.h.0.mlp.c_proj"}
    assert set(skipped) == {"transformer.wte", "transformer.wpe"}
    keep, _ = analyze.weight_matrices(model, min_evals=50, max_evals=60, max_n=10 ** 6)
    assert keep == {}


# -------------------------------------------------------------------------------------------- saturation

THRESHOLDS = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]


def hooked_saturation(model, windows, batch_size):
    """The study's definition, computed independently: hook every DyT layer and record alpha*x; per
    batch, pool all layers and take the fraction above t; mean over (equal-sized) batches. Per layer: its
    pooled fraction."""
    assert len(windows) % batch_size == 0
    seen = {}
    dyts = [(n, m) for n, m in model.named_modules() if isinstance(m, M.DyT)]
    hooks = [m.register_forward_hook(
        lambda m, i, o, n=n: seen.setdefault(n, []).append((m.alpha * i[0]).detach())) for n, m in dyts]
    with torch.no_grad():
        for k in range(0, len(windows), batch_size):
            model(windows[k:k + batch_size])
    for h in hooks:
        h.remove()
    batches = len(windows) // batch_size
    per_batch = [[np.mean(np.concatenate([seen[n][b].abs().flatten().numpy() for n, _ in dyts]) > t)
                  for t in THRESHOLDS] for b in range(batches)]
    layers = {n: [np.mean(np.concatenate([a.abs().flatten().numpy() for a in seen[n]]) > t)
                  for t in THRESHOLDS] for n, _ in dyts}
    return np.mean(per_batch, axis=0), layers


def pearson(x, y):
    """Pearson r written out: cov / (sd_x sd_y)."""
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return (sum((a - mx) * (b - my) for a, b in zip(x, y))
            / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y)))


def test_saturation_equals_hooked_alpha_x():
    torch.manual_seed(0)
    model = M.GPT(M.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, norm="dyt",
                              dyt_alpha=2.0))
    with torch.no_grad():  # inputs of order 1 and an alpha per layer, so that the fractions differ
        model.transformer.wte.weight.mul_(50)
        for k, (_, layer) in enumerate(norm_stats.norm_layers(model)):
            layer.alpha.fill_(0.5 + 0.5 * k)
    windows = analyze.sample_windows(np.arange(1000, dtype=np.uint16) % 64, 6, 16, seed=5)
    want_global, want_layers = hooked_saturation(model, windows, batch_size=3)
    stats = analyze.forward_stats(model, windows, batch_size=3)["norm"]
    np.testing.assert_allclose(stats["saturation"], want_global, atol=1e-6)
    assert len(want_layers) == 5
    for n, want in want_layers.items():
        np.testing.assert_allclose(stats["layers"][n]["saturation"], want, atol=1e-6)
    assert 0.05 < want_global[3] < 0.95 and len({round(w[3], 4) for w in want_layers.values()}) > 2


def test_block_output_effective_rank_matches_direct_svd():
    torch.manual_seed(1)
    model = M.GPT(M.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64,
                              norm="rmsnorm"))
    windows = analyze.sample_windows(np.arange(500, dtype=np.uint16) % 64, 5, 16, seed=0)
    outs = {}
    hooks = [b.register_forward_hook(lambda m, i, o, k=k: outs.setdefault(k, []).append(o.detach()))
             for k, b in enumerate(model.transformer.h)]
    with torch.no_grad():
        model(windows)
    for h in hooks:
        h.remove()
    got = analyze.forward_stats(model, windows, batch_size=2, block_ranks=True)["block_ranks"]
    for k in range(2):
        s = np.linalg.svd(torch.cat(outs[k]).reshape(-1, 32).double().numpy(), compute_uv=False)
        p = s / s.sum()
        assert got[k] == pytest.approx(math.exp(-sum(pi * math.log(pi) for pi in p)), rel=1e-6)


# ------------------------------------------------------------------------------------------ command line

VOCAB = 300


@pytest.fixture
def dataset(tmp_path):
    d = tmp_path / "tiny"
    d.mkdir()
    np.random.default_rng(0).integers(0, VOCAB, 4000).astype(np.uint16).tofile(d / "train.bin")
    meta = {"tokenizer": "byte", "vocab_size": VOCAB, "train_tokens": 4000}
    (d / "meta.json").write_text(json.dumps(meta))
    return d


def make_ckpt(tmp_path, name, data_dir, **cfg):
    """A checkpoint in train.py's format, written here so that the test does not depend on train.py. DyT
    alphas are drawn at random (as after training they differ per layer), so that their correlation is
    defined."""
    args = {**dict(n_layer=2, n_head=2, n_embd=64, block_size=16, vocab_size=VOCAB, bias=False), **cfg}
    torch.manual_seed(0)
    model = M.GPT(M.GPTConfig(**args))
    with torch.no_grad():
        for _, layer in norm_stats.norm_layers(model):
            if isinstance(layer, M.DyT):
                layer.alpha.uniform_(0.5, 3.0)
    out = tmp_path / name
    out.mkdir()
    torch.save(dict(model=model.state_dict(), optimizer={}, model_args=args, iter_num=7,
                    best_val_loss=5.0, best_iter=7, tokenizer="byte",
                    config=dict(dataset="tiny", data_dir=str(data_dir))),
               out / "ckpt.pt")
    return out


NORMS = dict(ln=dict(norm="layernorm"), rms=dict(norm="rmsnorm"), hardtanh=dict(norm="hardtanh"),
             dyt=dict(norm="dyt", dyt_alpha=2.0, attn="diff", mlp="swiglu", pos="rope"))
SECTIONS = dict(saturation=["saturation"], spectra=["spectra"], rank=["rank"], alpha=["alpha"],
                scurve=["scurve"], all=["saturation", "spectra", "rank", "alpha", "scurve"])
LAYER_FIELDS = {"shape", "num_evals", "alpha", "xmin", "D", "num_tail", "lambda_max", "alpha_weighted",
                "stable_rank"}


@pytest.mark.parametrize("command", list(SECTIONS))
@pytest.mark.parametrize("norm", list(NORMS))
def test_every_command_runs_and_json_holds_documented_fields(tmp_path, dataset, command, norm, capsys):
    out = make_ckpt(tmp_path, norm, dataset, **NORMS[norm])
    js = tmp_path / "a.json"
    analyze.main([command, str(out), f"--json={js}", "--windows=6", "--batch_size=4"])
    doc = json.loads(js.read_text())
    assert doc["schema"] == "nanonorm-analysis/1" and doc["command"] == command
    (c,) = doc["checkpoints"]
    assert {"label", "path", "iter_num", "dataset", "norm", "model_args"} <= set(c)
    assert c["iter_num"] == 7
    for section in ("saturation", "spectra", "rank", "alpha", "scurve"):
        assert (section in c) == (section in SECTIONS[command])
    text = capsys.readouterr().out
    is_dyt = norm == "dyt"
    weights = torch.load(out / "ckpt.pt", weights_only=True)["model"]
    alphas = {k.removesuffix(".alpha"): v.item() for k, v in weights.items() if k.endswith(".alpha")}
    assert len(alphas) == (5 if is_dyt else 0)
    if "saturation" in c:
        s = c["saturation"]
        assert c["windows"] == dict(count=6, block_size=16, seed=1337, split="train", tokens=4000)
        assert s["thresholds"] == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
        assert len(s["layers"]) == 5 and all(l["input_std"] > 0 for l in s["layers"].values())
        if is_dyt:
            assert len(s["global"]) == 6 and s["global_at_2"] == s["global"][3]
            assert all(len(l["saturation"]) == 6 for l in s["layers"].values())
            assert {n: l["alpha"] for n, l in s["layers"].items()} == pytest.approx(alphas)
        else:   # the note first, then the input std table; no empty saturation table
            assert s["global"] is None and s["global_at_2"] is None
            note = text.index(f"{norm}: no DyT/Derf layer: saturation is defined for point-wise norm "
                              "layers only")
            assert "fraction of |alpha*x|" not in text and note < text.index("input std per norm layer")
    if "spectra" in c:
        sp = c["spectra"]
        # 64 eigenvalues each: attention and MLP matrices (SwiGLU adds c_up) and wte (300 x 64); wpe is
        # 16 x 64.
        assert len(sp["layers"]) == 2 * (5 if is_dyt else 4) + 1
        assert all(set(l) == LAYER_FIELDS and l["num_evals"] == 64 for l in sp["layers"].values())
        assert ("transformer.wpe" in sp["skipped"]) == (not is_dyt)   # rope: no wpe
        assert {"mean_alpha", "median_alpha", "mean_alpha_weighted", "mean_stable_rank"} <= set(sp)
    if "rank" in c:
        r = c["rank"]
        assert len(r["blocks"]) == 2 and r["mean_blocks"] == pytest.approx(sum(r["blocks"]) / 2)
        assert all(1 <= v <= 64 for v in r["blocks"] + list(r["weights"].values()))
        # Roy & Vetterli written out: exp of the entropy of the singular values normalised to sum 1
        p = np.linalg.svd(weights["transformer.h.0.mlp.c_fc.weight"].double().numpy(), compute_uv=False)
        p = p / p.sum()
        want = math.exp(-sum(p * np.log(p)))
        assert r["weights"]["transformer.h.0.mlp.c_fc"] == pytest.approx(want, rel=1e-9)
    if "alpha" in c:
        a = c["alpha"]
        assert len(a["layers"]) == (5 if is_dyt else 0)
        assert {n: l["alpha"] for n, l in a["layers"].items()} == pytest.approx(alphas)
        for l in a["layers"].values():
            assert l["inv_std"] == pytest.approx(1 / l["input_std"])
        if is_dyt:
            names = list(alphas)
            want = pearson([alphas[n] for n in names], [1 / a["layers"][n]["input_std"] for n in names])
            assert a["pearson"] == pytest.approx(want, rel=1e-9)
        else:
            assert a["pearson"] is None
            assert f"{norm}: no DyT/Derf layer: alpha is defined for point-wise norm layers only" in text
            assert "against 1 / input std" not in text


def test_windows_are_the_first_of_train_pys(tmp_path, dataset):
    # train.py measures saturation on random_windows(n_train, count, block_size + 1, seed 1337); analyze
    # must use the first --windows of them (their first block_size tokens), inside the --train_tokens
    # prefix.
    out = make_ckpt(tmp_path, "dyt", dataset, norm="dyt", dyt_alpha=2.0)
    model, ck = load_checkpoint(out / "ckpt.pt")
    with torch.no_grad():   # inputs of order 1, so that the fractions lie well inside (0, 1)
        model.transformer.wte.weight.mul_(50)
    torch.save(dict(ck, model=model.state_dict()), out / "ckpt.pt")
    js = tmp_path / "w.json"
    analyze.main(["saturation", str(out), f"--json={js}", "--windows=6", "--batch_size=3",
                  "--train_tokens=1000"])
    got = json.loads(js.read_text())["checkpoints"][0]
    data = np.fromfile(dataset / "train.bin", dtype=np.uint16)
    starts = random_windows(1000, 50, 17, seed=1337)[:6]
    assert starts.max() + 17 <= 1000
    windows = torch.from_numpy(np.stack([data[s:s + 16] for s in starts]).astype(np.int64))
    want_global, want_layers = hooked_saturation(model, windows, batch_size=3)
    assert got["windows"] == dict(count=6, block_size=16, seed=1337, split="train", tokens=1000)
    np.testing.assert_allclose(got["saturation"]["global"], want_global, atol=1e-6)
    for n, want in want_layers.items():
        np.testing.assert_allclose(got["saturation"]["layers"][n]["saturation"], want, atol=1e-6)
    # far from 0 and 1 and different per layer, so that other windows would give other fractions
    assert 0.05 < want_global[3] < 0.95 and len({round(w[3], 4) for w in want_layers.values()}) > 2


def test_side_by_side_best_and_plots(tmp_path, dataset, capsys):
    # one block: a plot of each weight's spectrum (most of this test's time), 5 of them rather than 9
    ln = make_ckpt(tmp_path, "run-ln", dataset, n_layer=1)
    dyt = make_ckpt(tmp_path, "run-dyt", dataset, norm="dyt", dyt_alpha=2.0, n_layer=1)
    (dyt / "ckpt.pt").rename(dyt / "best.pt")
    (ln / "ckpt.pt").rename(ln / "best.pt")
    res = analyze.main(["all", str(ln), str(dyt), "--ckpt=best", "--windows=4",
                        f"--plot={tmp_path / 'figs'}", f"--json={tmp_path / 'b.json'}"])
    assert [r["label"] for r in res] == ["run-ln/best", "run-dyt/best"]
    text = capsys.readouterr().out
    assert ["run-ln/best", "run-dyt/best"] in [line.split() for line in text.splitlines()]  # a row
    # the LayerNorm run's note comes before the saturation table, where its column is '-'
    assert text.index("run-ln/best: no DyT/Derf layer") < text.index("saturation: fraction of |alpha*x")
    row = next(line for line in text.splitlines() if line.startswith("global t=2 "))
    assert row.split()[2:] == ["-", f"{res[1]['saturation']['global_at_2']:.3f}"]
    if importlib.util.find_spec("matplotlib"):
        pngs = {p.name for p in (tmp_path / "figs").iterdir()}
        assert {"saturation_thresholds.png", "saturation_layers.png", "erank_blocks.png",
                "alpha_vs_inv_std.png", "esd_transformer.h.0.mlp.c_fc.png"} <= pngs
    else:
        assert "plots skipped" in text
    assert json.loads((tmp_path / "b.json").read_text())["settings"]["ckpt"] == "best"


def test_spectra_table_has_one_aligned_column_per_figure(tmp_path, dataset, capsys):
    runs = [make_ckpt(tmp_path, "run-a", dataset),
            make_ckpt(tmp_path, "run-b", dataset, norm="dyt", mlp="swiglu")]
    res = analyze.main(["spectra", *map(str, runs)])
    lines = capsys.readouterr().out.splitlines()
    h = next(i for i, line in enumerate(lines)
             if line.split() == ["alpha", "alpha_w", "stable_rank"] * 2)
    assert lines[h - 1].split() == ["run-a", "run-b"]
    ends = [m.end() for m in re.finditer(r"\S+", lines[h])]  # each figure right-aligned under its field
    for name in ("transformer.h.0.mlp.c_fc", "transformer.h.0.mlp.c_up"):
        line = next(line for line in lines[h:] if line.startswith(name + " "))
        want = []
        for r in res:   # run-a (GELU) has no c_up: three '-'
            lay = r["spectra"]["layers"].get(name)
            want += ([f"{lay[k]:.2f}" for k in ("alpha", "alpha_weighted")]
                     + [f"{lay['stable_rank']:.1f}"] if lay else ["-"] * 3)
        assert line.split()[1:] == want
        assert [m.end() for m in re.finditer(r"\S+", line)][1:] == ends


def test_bad_input_gives_clear_errors(tmp_path, dataset):
    run = make_ckpt(tmp_path, "run", dataset)
    cases = [
        (["spectra", str(tmp_path / "nowhere")], "no checkpoint"),
        (["spectra", str(run), "--ckpt=best"], "no checkpoint at " + str(run / "best.pt")),
        (["spectra", str(run), "--ckpt=bset"],
         "--ckpt=bset is not a checkpoint choice; use latest (ckpt.pt) or best"),
        (["spectra", str(run), "--bogus=1"], "unknown config key 'bogus'"),
        (["spectra", str(run), "--window=6"], "did you mean windows"),
        (["spectra", str(run), "--windows=x"], "must be int"),
        (["spectra", str(run), "--windows", "6"], "expected --key=value"),
        (["spectra", str(run), "--device=gpu"],
         "device='gpu' is unknown: use 'cpu', 'cuda[:N]' or 'mps'"),
        (["nonsense", str(run)],
         "unknown command 'nonsense'; choose one of saturation, spectra, rank, alpha, scurve, "
         "all"),
        (["satuation", str(run)], "unknown command 'satuation' (did you mean saturation?)"),
        (["spectra"], "usage: python analyze.py"),
        (["saturation", str(run), f"--data_dir={tmp_path}"], "not prepared"),
        (["saturation", str(run), "--dataset=nodata"], "python data/nodata/prepare.py"),
        (["rank", str(run), "--block_size=32"], "exceeds the model's 16"),
        (["rank", str(run), "--train_tokens=10"], "too few for windows of 17 tokens"),
    ]
    if not torch.cuda.is_available():
        cases.append((["spectra", str(run), "--device=cuda"], "no cuda device"))
    (tmp_path / "corrupt.pt").write_bytes(b"not a checkpoint")
    cases.append((["spectra", str(tmp_path / "corrupt.pt")], "cannot read checkpoint"))
    ck = torch.load(run / "ckpt.pt", weights_only=True)
    ck["model_args"]["n_embd"] = 32   # weights of another architecture
    torch.save(ck, tmp_path / "other.pt")
    cases.append((["spectra", str(tmp_path / "other.pt")], "do not fit the model"))
    for argv, msg in cases:
        with pytest.raises(SystemExit) as e:
            analyze.main(argv)
        assert msg in str(e.value), (argv, str(e.value))
