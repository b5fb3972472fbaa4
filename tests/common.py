"""Fixtures and helpers shared by tests/ and annex/tests/ (each conftest.py imports the fixtures from here)."""
import json
import os
from unittest import mock

import numpy as np
import pytest
import torch


def gpt2_offline():
    """(available, ranks file) for the tests that need GPT-2's BPE, with no network: the file named by
    NANONORM_TIKTOKEN_FILE (README "Data"), else tiktoken's own cache (ranks file None)."""
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
    "needs GPT-2's BPE offline: set NANONORM_TIKTOKEN_FILE to a GPT-2 ranks file (README 'Data'), or fill "
    "tiktoken's cache once with internet: python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\""))


@pytest.fixture(scope='session', autouse=True)
def one_thread():
    """The test models are tiny: one thread is faster, and immune to a second thread being descheduled on a
    busy machine (which made each op wait ~10 ms). Subprocesses (torchrun, CLI runs) keep their own default."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
    """A learnable token stream (train.py and study.py tests): next token = perm[token] 90% of the time, else
    uniform (vocabulary 60, padded to 64); 25,000 train and 5,001 val tokens."""
    d = tmp_path_factory.mktemp('tinydata')
    rng = np.random.default_rng(0)
    perm = rng.permutation(60)
    tokens = [0]
    for _ in range(30_000):
        tokens.append(perm[tokens[-1]] if rng.random() < 0.9 else rng.integers(60))
    tokens = np.array(tokens, dtype=np.uint16)
    tokens[:25_000].tofile(d / 'train.bin')
    tokens[25_000:].tofile(d / 'val.bin')
    (d / 'meta.json').write_text(json.dumps({'tokenizer': 'byte', 'vocab_size': 60, 'train_tokens': 25_000}))
    return str(d)
