"""annex/collapse.py: the signs of a collapsed run that train.py's evals warn of (moved with the code
from tests/test_train.py)."""
import json
import os

import numpy as np
import pytest

from annex import collapse
from tests.test_train import records, run


def test_collapse_signs_are_warned(data_dir, tmp_path, capsys, monkeypatch):
    """A model that cannot learn stays at (or above) the unigram loss; a DyT with a huge alpha0 has every
    layer saturated. train.py warns of both (the signs of DyT's collapse) and records the budget's
    unigram entropy. The unigram sign starts after warmup or COLLAPSE_AFTER steps, whichever is fewer."""
    out = str(tmp_path / 'frozen')
    assert run(data_dir, out, '--max_iters=6', '--eval_interval=3', '--learning_rate=0.0',
               '--min_lr=0.0', '--norm=dyt', '--dyt_alpha=100000.0', '--train_tokens=4000') == 0
    counts = np.bincount(np.fromfile(os.path.join(data_dir, 'train.bin'), dtype=np.uint16)[:4000])
    p = counts[counts > 0] / 4000
    entropy = float(-(p * np.log(p)).sum())
    summary = json.load(open(os.path.join(out, 'summary.json')))
    assert summary['unigram_entropy'] == pytest.approx(entropy) and summary['budget_tokens'] == 4000
    evals = records(out, 'eval')
    assert [len(r['warnings']) for r in evals] == [1, 2, 2]  # the unigram sign after warmup (2 steps)
    assert all('norm layers saturated' in r['warnings'][-1] and 'transformer.ln_f' in r['warnings'][-1]
               for r in evals)
    assert (f'after 6 steps: at the unigram level of the budget ({entropy:.3f} nats)'
            in evals[-1]['warnings'][0])
    assert 'warning: train loss' in capsys.readouterr().out
    # a warmup longer than COLLAPSE_AFTER (the study's 2000 steps) does not delay it: its 500-step screen
    # sees it. Here COLLAPSE_AFTER 4 with a warmup of 100: warned at step 6, not at 3
    assert collapse.COLLAPSE_AFTER < 500
    monkeypatch.setattr(collapse, "COLLAPSE_AFTER", 4)
    out = str(tmp_path / 'long_warmup')
    assert run(data_dir, out, '--max_iters=6', '--eval_interval=3', '--learning_rate=0.0', '--min_lr=0.0',
               '--warmup_iters=100', '--train_tokens=4000') == 0
    evals = records(out, 'eval')
    assert evals[1]['train_loss'] == evals[2]['train_loss'] > entropy - collapse.COLLAPSE_MARGIN  # lr 0
    assert [r['warnings'] for r in evals[:2]] == [[], []] and len(evals[2]['warnings']) == 1
    assert 'after 6 steps: at the unigram level' in evals[2]['warnings'][0]
    # a model that learns gets no warning
    assert run(data_dir, str(tmp_path / 'ok'), '--max_iters=40', '--eval_interval=20',
               '--overwrite=True') == 0
    assert [r['warnings'] for r in records(str(tmp_path / 'ok'), 'eval')] == [[], [], []]
