"""
The eval train.py runs every eval_interval steps: mean loss and accuracy on each split's fixed eval
samples, shared out over the processes; the norm statistics of the train samples; signs of collapse.
"""
import torch
import torch.distributed as dist

import norm_stats
from data.common import micro_batches

COLLAPSE_MARGIN = 0.1  # nats: a train loss this close to the entropy of the token frequencies
COLLAPSE_AFTER = 200  # steps (or warmup's, if fewer) before it warns: the study's warmup is longer


@torch.no_grad()
def evaluate(run, it, **read):
    """The eval record before step `it`, with `read` (the lr, what the steps have read)."""
    cfg, env, data, raw = run.cfg, run.env, run.data, run.raw
    splits = {'train': data.eval_ids['train'], 'val': data.eval_ids['val']}
    if cfg.paper_val:  # the study's val slice: windows redrawn at every eval
        splits['val_paper'] = data.draw(cfg.seed, it, cfg.paper_val, 'val_paper')
    result = {'val_paper': (None, None)}
    raw.eval()
    for split, ids in splits.items():
        norm_stats.record(raw, split == 'train')
        sums = torch.zeros(2, device=env.device)  # loss x samples, correct predictions
        for first, count in micro_batches(len(ids), env.world, env.rank, cfg.batch_size):
            x, y = data.batch(split, ids[first:first + count], env.device)
            with env.ctx:
                logits, loss = run.model(x, y)
            sums += torch.stack([loss.float() * count, (logits.argmax(-1) == y).sum().float()])
        if env.ddp:
            dist.all_reduce(sums)
            if split == 'train':
                for t in norm_stats.sums(raw):
                    dist.all_reduce(t)
        result[split] = sums[0].item() / len(ids), sums[1].item() / (len(ids) * data.per_sample)
    raw.train()
    stats = norm_stats.read(raw)  # under FSDP every process takes part: alpha is gathered
    layers = {name: {k: s[k] for k in ('kind', 'alpha', 'input_std', 'saturation')}
              for name, s in stats['layers'].items()}
    (train_loss, train_acc), (val_loss, val_acc) = result['train'], result['val']
    return {'event': 'eval', 'iter': it, 'train_loss': train_loss, 'val_loss': val_loss,
            'val_loss_paper': result['val_paper'][0], 'train_acc': train_acc, 'val_acc': val_acc,
            **read, 'saturation': stats['saturation'], 'thresholds': stats['thresholds'],
            'norm_layers': layers, 'warnings': collapse_warnings(cfg, data, it, train_loss, layers)}


def collapse_warnings(cfg, data, it, train_loss, layers):
    """A train loss at the unigram level; norm layers saturated (their output sign(x) * gamma,
    whatever the input): the signs of a collapsed run (DyT at small scale)."""
    warnings = []
    if it > min(cfg.warmup_iters, COLLAPSE_AFTER) and train_loss > data.entropy - COLLAPSE_MARGIN:
        warnings.append(f'train loss {train_loss:.3f} after {it} steps: at the unigram level of '
                        f'the budget ({data.entropy:.3f} nats), {data.predicted} frequencies only '
                        '(collapsed?)')
    full = [name for name, s in layers.items()
            if s['saturation'] and s['saturation'][norm_stats.AT_2] > 0.99]
    if full:
        warnings.append('norm layers saturated (|f| > tanh(2) on over 99% of inputs): '
                        + ', '.join(full))
    return warnings
