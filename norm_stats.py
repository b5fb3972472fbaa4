"""
What the norm layers see, measured while the model runs (train.py at every eval, analyze.py): each norm
layer's input mean and std, and for DyT and Derf the saturation: the fraction of outputs with |f| > tanh(t)
for each threshold t, f being tanh or erf (DyT: |alpha x| > t, Verma 2026; headline 2, 96.4% of the bound).
instrument(model) attaches it from outside model.py: every norm layer (ln_1, ln_2, ln_f) gets sums in buffers
and a forward pre-hook that adds to them while recording. Instrument before torch.compile, which then traces
the hook too; the buffers follow .to(device) and stay out of checkpoints. Off, a hook costs one bool test.
"""
import math

import torch

from model import Derf, DyT

THRESHOLDS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
AT_2 = THRESHOLDS.index(2.0)  # the study's headline saturation: |f| > tanh(2), DyT's |alpha x| > 2
# Derf's: |erf(u)| > tanh(t) is |u| > erfinv(tanh(t)), 1.483 at t = 2 (|u| > 2 would be at 99.5% of the bound)
ERF_CUTS = tuple(torch.erfinv(torch.tanh(torch.tensor(THRESHOLDS, dtype=torch.float64))).tolist())
SUMS = ('stat_count', 'stat_sum', 'stat_sumsq', 'stat_sat')


def norm_layers(model):
    """[(name, layer)] of the norms before attention, before the MLP, and the final one, in module order."""
    return [(n, m) for n, m in model.named_modules() if n.rpartition('.')[2] in ('ln_1', 'ln_2', 'ln_f')]


def squashed(layer, x):
    """(What DyT's tanh or Derf's erf is applied to, its cuts for THRESHOLDS); None for the other norms."""
    if isinstance(layer, DyT):
        return layer.alpha * x, THRESHOLDS
    if isinstance(layer, Derf):
        return layer.alpha * x + layer.shift, ERF_CUTS
    return None


def observe(layer, args):
    if not layer.recording:  # the training steps' only cost
        return
    with torch.no_grad():
        x = args[0].float()  # sums of one call in float32; counts are exact integers
        layer.stat_count += x.numel()
        layer.stat_sum += x.sum()
        layer.stat_sumsq += x.square().sum()
        squash = squashed(layer, args[0])
        if squash is not None:
            a, cuts = squash[0].abs(), squash[1]
            layer.stat_sat += torch.stack([(a > c).sum() for c in cuts])


def instrument(model):  # every norm layer gets its statistics (once); returns the model
    for _, layer in norm_layers(model):
        if not hasattr(layer, 'recording'):
            for name in SUMS:  # counts are exact integers, sums float32
                shape = len(THRESHOLDS) if name == 'stat_sat' else ()
                dtype = torch.long if name in ('stat_count', 'stat_sat') else None
                layer.register_buffer(name, torch.zeros(shape, dtype=dtype, device=layer.weight.device),
                                      persistent=False)
            layer.recording = False
            layer.register_forward_pre_hook(observe)
    return model


def record(model, on=True):
    """Start recording from zero (on) or stop (the sums are kept for read)."""
    instrument(model)
    for _, layer in norm_layers(model):
        layer.recording = on
        if on:
            for name in SUMS:
                getattr(layer, name).zero_()


def sums(model):  # the buffers holding the sums, for an all-reduce over processes
    return [getattr(layer, name) for _, layer in norm_layers(model) for name in SUMS]


def read(model):
    """{'thresholds', 'saturation': pooled over every DyT/Derf layer (None without one), 'layers': {name:
    {'kind', 'alpha', 'input_std', 'count' (elements seen), 'saturation' (per threshold, or None)}}}."""
    layers = {}
    for name, layer in norm_layers(model):
        n = layer.stat_count.item()
        mean = layer.stat_sum.item() / max(n, 1)
        std = math.sqrt(max(layer.stat_sumsq.item() / max(n, 1) - mean * mean, 0.0)) if n else None
        alpha = getattr(layer, 'alpha', None)
        if hasattr(alpha, 'full_tensor'):  # sharded by FSDP2: every process calls read, gathering this scalar
            alpha = alpha.full_tensor()
        sat = [c / n for c in layer.stat_sat.tolist()] if n and isinstance(layer, (DyT, Derf)) else None
        layers[name] = {'kind': model.config.norm, 'alpha': None if alpha is None else alpha.item(),
                        'input_std': std, 'count': int(n), 'saturation': sat}
    sats = [s['saturation'] for s in layers.values() if s['saturation'] is not None]
    # every DyT/Derf layer sees as many elements, so the pooled fraction is the mean over layers
    pooled = [sum(col) / len(sats) for col in zip(*sats)] if sats else None
    return {'thresholds': list(THRESHOLDS), 'layers': layers, 'saturation': pooled}
