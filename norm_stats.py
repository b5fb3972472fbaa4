"""Each norm layer's input std and, for a norm with squashed() and cut() (DyT, Derf: model.py), its
saturation (the fraction of |f| > tanh(t) per t, f = tanh or erf; Verma 2026), summed by hooks."""
import math

import torch

THRESHOLDS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
AT_2 = THRESHOLDS.index(2.0)  # the study's headline saturation: |f| > tanh(2), DyT's |alpha x| > 2
SUMS = dict(stat_count=((), torch.long), stat_sum=((), None), stat_sumsq=((), None),
            stat_sat=(len(THRESHOLDS), torch.long))  # (shape, dtype): exact counts, float32 sums


def norm_layers(model):  # [(name, layer)]: each block's ln_1, ln_2, and ln_f
    return [(n, m) for n, m in model.named_modules()
            if n.rpartition('.')[2] in ('ln_1', 'ln_2', 'ln_f')]


def observe(layer, args):
    if layer.recording:  # when off, the hook's only cost
        with torch.no_grad():
            x = args[0].float()
            real = torch.arange(len(x), device=x.device) < layer.stat_rows  # not the padding
            real = real.view(-1, *[1] * (x.dim() - 1))
            layer.stat_count += real.sum() * x[0].numel()
            layer.stat_sum += (x * real).sum()
            layer.stat_sumsq += (x.square() * real).sum()
            if layer.stat_cuts:
                u = layer.squashed(args[0]).abs()
                layer.stat_sat += torch.stack([((u > c) & real).sum() for c in layer.stat_cuts])


def instrument(model):  # once per layer, before torch.compile (it traces hooks)
    for layer in [m for _, m in norm_layers(model) if not hasattr(m, 'recording')]:
        for name, (shape, dtype) in SUMS.items():
            layer.register_buffer(name, torch.zeros(shape, dtype=dtype, device=layer.weight.device),
                                  persistent=False)
        rows = torch.zeros((), dtype=torch.long, device=layer.weight.device)
        layer.register_buffer('stat_rows', rows, persistent=False)  # set by real_rows
        layer.stat_cuts = [layer.cut(t) for t in THRESHOLDS] if hasattr(layer, 'squashed') else []
        layer.recording = False
        layer.register_forward_pre_hook(observe)
    return model


def record(model, on=True):  # start recording from zero (on), or stop: the sums stay for read
    for _, layer in norm_layers(instrument(model)):
        layer.recording = on
        if on:
            for name in SUMS:
                getattr(layer, name).zero_()
    real_rows(model, 2 ** 62)


def real_rows(model, n):  # the next forwards record their first n rows: the rest is padding
    for _, layer in norm_layers(model):
        layer.stat_rows.fill_(n)


def sums(model):  # the buffers of the sums, for an all-reduce
    return [getattr(layer, name) for _, layer in norm_layers(model) for name in SUMS]


def read(model):  # {thresholds, layers: {name: {kind, alpha, input_std, count, saturation}}, ...}
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
    # each layer sees as many elements: the pooled fraction is the mean
    pooled = [sum(c) / len(sats) for c in zip(*sats)] if sats else None
    return {'thresholds': list(THRESHOLDS), 'layers': layers, 'saturation': pooled}
