import json

import numpy as np
import pytest
import torch


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
