"""annex/bench.py: one tokens/s (or ViT images/s) line per variant at a tiny shape, the configurator's
--help and errors, and --gpu_report=True refused without CUDA (its run: on a GPU, docs/benchmarks.md)."""
import os
import re
import subprocess
import sys

import pytest
import torch

from annex import bench

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--n_layer=1", "--n_embd=32", "--n_head=2", "--block_size=16", "--vocab_size=64",
        "--batch_size=2", "--steps=1", "--warmup=0", "--device=cpu", "--dtype=float32"]


def run_bench(*args):
    # one thread: tiny ops, and a busy machine makes a second thread wait
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "annex/bench.py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_every_variant_gets_a_tokens_per_second_line():
    r = run_bench(*TINY)
    assert r.returncode == 0, r.stderr
    got = dict(re.findall(r"^(\S.*?)\s+([\d,]+) tokens/s$", r.stdout, re.M))
    want = ["plain nanoGPT-style (LayerNorm)"] + [
        f"norm={n} attn={a}" for a in ("standard", "diff")
        for n in ("layernorm", "rmsnorm", "dyt", "derf", "hardtanh")]
    assert list(got) == want
    assert all(int(v.replace(",", "")) > 0 for v in got.values())
    assert "device cpu, dtype float32, compile False" in r.stdout


def test_vit_variants_get_an_images_per_second_line():
    r = run_bench("--vit=True", "--batch_size=2", "--steps=1", "--warmup=0", "--device=cpu")
    assert r.returncode == 0, r.stderr
    got = dict(re.findall(r"^(\S.*?)\s+([\d,]+) images/s$", r.stdout, re.M))
    assert list(got) == [f"ViT norm={n}" for n in ("layernorm", "rmsnorm", "dyt", "derf", "hardtanh")]
    assert all(int(v.replace(",", "")) > 0 for v in got.values()) and "tokens/s" not in r.stdout


def test_help_prints_the_usage():
    # the whole docstring, as a user runs it from the repository root, then every key with its default
    r = run_bench("--help")
    assert r.returncode == 0, r.stderr
    assert "python annex/bench.py --device=cpu --steps=15" in r.stdout
    assert "python annex/bench.py --help" in r.stdout and "  compile = False\n" in r.stdout


def test_help_and_bad_keys(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--help"])
    assert e.value.code == 0 and "steps = 10" in capsys.readouterr().out
    for args, msg in [(["--stesp=3"],
                       "unknown config key 'stesp' (from --stesp=3); did you mean steps?"),
                      (["--steps=x"], "config key 'steps' (from --steps=x) must be int"),
                      (["--dtype=float16"], "dtype='float16' is not known; use 'float32' or 'bfloat16'"),
                      (["--device=gpu"], "device='gpu' is unknown: use 'cpu', 'cuda[:N]' or 'mps'"),
                      (["--n_head=3"], "n_embd=256 must be divisible by n_head=3"),
                      (["--steps=0"], "batch_size and steps must be positive"),
                      (["--compile=True", "--warmup=0"], "compile=True needs warmup >= 1"),
                      (["--gpu_report=True", "--report_scales=64m,1b"],
                       "report_scales='64m,1b': ['1b'] not in 64m, 124m")]:
        with pytest.raises(SystemExit) as e:
            bench.main(args)
        # a message as exit code: Python prints it and exits with status 1
        assert msg in e.value.code, args


def test_gpu_report_refuses_a_machine_without_cuda(monkeypatch):
    # at once, before building anything; the device by default, or given
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    for args in (["--gpu_report=True"], ["--gpu_report=True", "--device=cpu"]):
        with pytest.raises(SystemExit) as e:
            bench.main(args)
        assert e.value.code == ("error: gpu_report=True needs a CUDA GPU, and the device is 'cpu'; without "
                                "it, python annex/bench.py times the variants on this device")
