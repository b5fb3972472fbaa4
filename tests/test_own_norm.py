"""The README's "Add your own norm", followed to the letter: a norm defined here (a dynamic softsign,
gamma * softsign(alpha x) + beta), one entry in model.NORMS, then train.py trains it by name, its
saturation is read like DyT's, and the memory plan counts what it keeps; a name not in NORMS is an
error, and every entry is a class."""
import json
import math

import pytest
import torch
import torch.nn as nn

import model
import norm_stats
import train
from tests.common import randomize, tiny
from tests.test_train import records, run


class DySoftsign(model.DyT):
    """gamma * softsign(alpha x) + beta, softsign(u) = u / (1 + |u|): bounded like tanh, slower. DyT's
    parameters and squashed(x) (the README writes them out), its own cut and forward."""

    @staticmethod
    def cut(t):  # |softsign(u)| > tanh(t) where |u| > tanh(t) / (1 - tanh(t))
        return math.tanh(t) / (1 - math.tanh(t))

    def forward(self, x):
        y = nn.functional.softsign(self.squashed(x)) * self.weight
        return y if self.bias is None else y + self.bias


@pytest.fixture
def softsign(monkeypatch):
    monkeypatch.setitem(model.NORMS, 'softsign', DySoftsign)


def test_every_norm_is_a_class_and_an_unknown_name_is_an_error():
    assert all(isinstance(cls, type) and issubclass(cls, nn.Module) for cls in model.NORMS.values())
    with pytest.raises(ValueError, match=r"norm='softsign' is not known; choose one of \('layernorm', "):
        model.GPTConfig(norm='softsign')


def test_a_norm_added_by_the_recipe_trains_and_has_its_saturation(softsign, data_dir, tmp_path):
    out = tmp_path / 'softsign'
    assert run(data_dir, out, '--norm=softsign', '--dyt_alpha=1.5', '--max_iters=6',
               '--eval_interval=3') == 0
    evals = records(out, 'eval')
    assert evals[-1]['val_loss'] < evals[0]['val_loss']  # it learns
    layers = evals[-1]['norm_layers']
    assert len(layers) == 5 and all(s['kind'] == 'softsign' and len(s['saturation']) == 6
                                    for s in layers.values())
    summary = json.loads((out / 'summary.json').read_text())
    assert set(summary['alphas']) == set(layers) and summary['saturation'] == evals[-1]['saturation']
    # the pooled saturation, written out: |softsign(alpha x)| > tanh(t) over every layer's inputs
    net = norm_stats.instrument(randomize(model.GPT(tiny(norm='softsign'))))  # O(1) inputs, alphas
    inputs = []
    for _, layer in norm_stats.norm_layers(net):
        layer.register_forward_hook(lambda m, args, out: inputs.append((m.alpha.item(), args[0])))
    norm_stats.record(net)
    with torch.no_grad():
        net(torch.randint(64, (4, 16)))
    got = norm_stats.read(net)['saturation']
    want = [sum((nn.functional.softsign(a * x).abs() > math.tanh(t)).double().mean().item()
                for a, x in inputs) / len(inputs) for t in norm_stats.THRESHOLDS]
    assert got == pytest.approx(want, abs=1e-12) and 1 > want[0] > want[1] > 0  # not all 0 or 1


def test_the_memory_plan_counts_what_a_new_norm_keeps(softsign):
    memory = pytest.importorskip('annex.memory')
    # eager u / (1 + |u|) * gamma, u = alpha x: x (for alpha's gradient), u and 1 + |u| (the
    # division's), and the softsign (gamma's): 4 input-sized tensors
    assert memory.eager_copies(model.GPTConfig(norm='softsign')) == 4
    assert memory.eager_copies(model.GPTConfig(norm='dyt')) == 2
