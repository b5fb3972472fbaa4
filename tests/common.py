"""Fixtures and helpers shared by tests/ and annex/tests/ (each conftest.py imports the fixtures from
here)."""
import json
import os
import subprocess
import types
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

import numpy as np
import pytest
import torch

from model import GPTConfig


def gpt2_offline():
    """(available, ranks file) for the tests that need GPT-2's BPE, with no network: the file named by
    NANONORM_TIKTOKEN_FILE (docs/data.md), else tiktoken's own cache (ranks file None)."""
    path = os.environ.get('NANONORM_TIKTOKEN_FILE')
    if path:
        return os.path.isfile(path), path
    import tiktoken
    import tiktoken.load
    with mock.patch.object(tiktoken.load, 'read_file', side_effect=OSError('no download in tests')):
        try:
            tiktoken.get_encoding('gpt2')  # from the cache, or not at all
            return True, None
        except (OSError, ValueError):
            return False, None


HAVE_GPT2, GPT2_RANKS = gpt2_offline()
needs_gpt2 = pytest.mark.skipif(not HAVE_GPT2, reason=(
    "needs GPT-2's BPE offline: set NANONORM_TIKTOKEN_FILE to a GPT-2 ranks file (docs/data.md), or "
    "fill tiktoken's cache once with internet: "
    "python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\""))


def run_side_by_side(commands, timeout=600, **popen):
    """subprocess.run(command, capture_output=True, text=True) of each command, two per CPU at a time:
    for independent commands that each start a Python, whose imports (torch's above all) are most of
    their time and overlap well (on 2 CPUs, 7 such commands take 7 s 4 at a time, 9 s 2 at a time). Run
    together, each has one thread (OMP_NUM_THREADS=1): processes with a thread per CPU each wait on one
    another's threads. The CompletedProcess of each, in order; a timeout kills its command."""
    if len(commands) > 1:
        popen['env'] = dict(popen.get('env') or os.environ, OMP_NUM_THREADS='1')

    def run(command):
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **popen)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 2
    with ThreadPoolExecutor(max_workers=min(len(commands), 2 * cpus)) as pool:
        return list(pool.map(run, commands))


@pytest.fixture(scope='session', autouse=True)
def one_thread():
    """The test models are tiny: one thread is faster, and immune to a second thread being descheduled on
    a busy machine (which made each op wait ~10 ms). Subprocesses (torchrun, CLI runs) keep their own
    default."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
    """A learnable token stream (train.py and study.py tests): next token = perm[token] 90% of the time,
    else uniform (vocabulary 60, padded to 64); 25,000 train and 5,001 val tokens."""
    d = tmp_path_factory.mktemp('tinydata')
    rng = np.random.default_rng(0)
    perm = rng.permutation(60)
    tokens = [0]
    for _ in range(30_000):
        tokens.append(perm[tokens[-1]] if rng.random() < 0.9 else rng.integers(60))
    tokens = np.array(tokens, dtype=np.uint16)
    tokens[:25_000].tofile(d / 'train.bin')
    tokens[25_000:].tofile(d / 'val.bin')
    meta = {'tokenizer': 'byte', 'vocab_size': 60, 'train_tokens': 25_000}
    (d / 'meta.json').write_text(json.dumps(meta))
    return str(d)


def tiny(**kw):
    """A GPTConfig small enough for exact float64 checks: 2 layers, 4 heads of 8, block 16, vocabulary
    64."""
    args = dict(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=False)
    args.update(kw)
    return GPTConfig(**args)


@torch.no_grad()
def randomize(model, seed=0):
    """Give every parameter that starts at 1, 0 or a constant (norm weights and biases, DyT/Derf alpha,
    Derf shift, lambdas, the sub-norm weight, embed_scale) a random value so a wrong use of it changes
    the output, and make token embeddings O(1) so norms, tanh and the clip operate in their non-linear
    range."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        r = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
        if name == 'transformer.wte.weight':
            p.mul_(40.0)  # std 0.8
        elif p.dim() >= 2:
            continue
        elif name.endswith('alpha') or name == 'embed_scale':
            p.copy_(0.5 + r.abs())
        elif 'lambda_' in name or name.endswith('shift'):
            p.copy_(0.3 * r)
        elif name.endswith('bias'):
            p.copy_(0.1 * r)
        else:
            p.copy_(1.0 + 0.3 * r)
    return model


def own_folder(d, train, val, meta):
    """A user's data folder: the ids written with numpy as they are given (their own dtype)."""
    d.mkdir(exist_ok=True)
    train.tofile(d / "train.bin")
    val.tofile(d / "val.bin")
    (d / "meta.json").write_text(json.dumps(meta))
    return str(d)


def data_cfg(d, **kw):
    """The keys of train.py's config that open_data reads."""
    return types.SimpleNamespace(**{**dict(dataset="own", data_dir=d, eval_samples=2, batch_size=2,
                                           train_tokens=None, budget_docs=None, val_tokens=None,
                                           block_size=4, paper_val=0, vocab_size=None, seed=1), **kw})
