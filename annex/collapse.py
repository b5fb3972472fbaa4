"""
The signs of a collapsed run, as the study saw DyT collapse at small scale (docs/collapse.md): a
train loss at the unigram level of the budget (the loss of predicting token frequencies alone), and
norm layers saturated, their output sign(x) * gamma whatever the input. An annex: evaluate.py asks it
at every eval when it is here; annex/report.py counts a run collapsed by the same margin.
"""
from norm_stats import AT_2

COLLAPSE_MARGIN = 0.1  # nats: a train loss this close to the entropy of the token frequencies
COLLAPSE_AFTER = 200  # steps (or warmup's, if fewer) before it warns: the study's warmup is longer


def warnings(cfg, data, it, train_loss, layers):
    """The eval's warnings: the unigram-level loss after warmup (or COLLAPSE_AFTER steps), the norm
    layers with |f| > tanh(2) on over 99% of their inputs."""
    found = []
    if it > min(cfg.warmup_iters, COLLAPSE_AFTER) and train_loss > data.entropy - COLLAPSE_MARGIN:
        found.append(f'train loss {train_loss:.3f} after {it} steps: at the unigram level of the '
                     f'budget ({data.entropy:.3f} nats), {data.predicted} frequencies only '
                     '(collapsed?)')
    full = [name for name, s in layers.items() if s['saturation'] and s['saturation'][AT_2] > 0.99]
    if full:
        found.append('norm layers saturated (|f| > tanh(2) on over 99% of inputs): '
                     + ', '.join(full))
    return found
