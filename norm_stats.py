"""
What the norm layers see, measured while the model runs (train.py at every eval, analyze.py): each
norm layer's input mean and std and, for a norm with squashed() and cut() (DyT, Derf: model.py), its
saturation: the fraction of outputs with |f| > tanh(t) for each threshold t, f being tanh or erf
(DyT: |alpha x| > t, Verma 2026). instrument(model) attaches it from outside model.py: each norm layer
(ln_1, ln_2, ln_f) gets sums in buffers and a forward pre-hook that adds to them while recording.
Instrument before torch.compile, which then traces the hook too; the buffers follow .to(device) and
stay out of checkpoints. Off, a hook costs one bool test.
"""
import math

import torch

THRESHOLDS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
AT_2 = THRESHOLDS.index(2.0)  # the study's headline saturation: |f| > tanh(2), DyT's |alpha x| > 2
SUMS = ('stat_count', 'stat_sum', 'stat_sumsq', 'stat_sat')


def norm_layers(model):
    """[(name, layer)] of the norms before attention, before the MLP, and the final one."""
    return [(n, m) for n, m in model.named_modules()
            if n.rpartition('.')[2] in ('ln_1', 'ln_2', 'ln_f')]


def observe(layer, args):
    if not layer.recording:  # the training steps' only cost
        return
    with torch.no_grad():
        x = args[0].float()  # sums of one call in float32; counts are exact integers
        layer.stat_count += x.numel()
        layer.stat_sum += x.sum()
        layer.stat_sumsq += x.square().sum()
        if layer.stat_cuts:
            u = layer.squashed(args[0]).abs()
            layer.stat_sat += torch.stack([(u > c).sum() for c in layer.stat_cuts])


def instrument(model):  # every norm layer gets its statistics (once); returns the model
    for _, layer in norm_layers(model):
        if hasattr(layer, 'recording'):
            continue
        for name in SUMS:  # counts are exact integers, sums float32
            shape = len(THRESHOLDS) if name == 'stat_sat' else ()
            dtype = torch.long if name in ('stat_count', 'stat_sat') else None
            layer.register_buffer(name, torch.zeros(shape, dtype=dtype, device=layer.weight.device),
                                  persistent=False)
        layer.stat_cuts = [layer.cut(t) for t in THRESHOLDS] if hasattr(layer, 'squashed') else []
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
    """{'thresholds', 'saturation': pooled over the layers that have one (None without), 'layers':
    {name: {'kind', 'alpha', 'input_std', 'count' (elements seen), 'saturation' (or None)}}}."""
    layers = {}
    for name, layer in norm_layers(model):
        n = layer.stat_count.item()
        mean = layer.stat_sum.item() / max(n, 1)
        std = math.sqrt(max(layer.stat_sumsq.item() / max(n, 1) - mean * mean, 0.0)) if n else None
        alpha = getattr(layer, 'alpha', None)
        if hasattr(alpha, 'full_tensor'):  # sharded by FSDP2: every process calls read to gather it
            alpha = alpha.full_tensor()
        sat = [c / n for c in layer.stat_sat.tolist()] if n and layer.stat_cuts else None
        layers[name] = {'kind': model.config.norm, 'alpha': None if alpha is None else alpha.item(),
                        'input_std': std, 'count': int(n), 'saturation': sat}
    sats = [s['saturation'] for s in layers.values() if s['saturation'] is not None]
    # every such layer sees as many elements, so the pooled fraction is the mean over layers
    pooled = [sum(col) / len(sats) for col in zip(*sats)] if sats else None
    return {'thresholds': list(THRESHOLDS), 'layers': layers, 'saturation': pooled}
