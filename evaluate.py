"""train.py's eval: loss and accuracy on each split's fixed samples, norm statistics, warnings."""
import time

import torch
import torch.distributed as dist

import norm_stats
from configurator import annex
from data.common import micro_batches, padded


@torch.no_grad()
def evaluate(run, it, **read):  # the eval record before step it, with read: the lr, what was read
    cfg, env, data, raw, t0 = run.cfg, run.env, run.data, run.raw, time.time()
    splits = dict(data.eval_ids)  # train, val
    if it < cfg.warmup_iters and cfg.eval_samples_warmup:  # fewer, spread over the whole set
        for split, ids in splits.items():
            splits[split] = ids[torch.linspace(0, len(ids) - 1, cfg.eval_samples_warmup).long()]
    if cfg.paper_val:  # the study's val slice, redrawn each eval
        splits['val_paper'] = data.draw(cfg.seed, it, cfg.paper_val, 'val_paper')
    result = {'val_paper': (None, None)}
    raw.eval()
    norm_stats.record(raw)
    for split, ids in splits.items():
        sums = torch.zeros(2, device=env.device)  # loss x samples, correct predictions
        for first, count in micro_batches(len(ids), env.world, env.rank, run.rows):
            x, y = padded(*data.batch(split, ids[first:first + count], env.device), run.rows)
            norm_stats.real_rows(raw, count if split == 'train' else 0)  # train's statistics only
            with env.ctx:
                logits, loss = run.model(x, y)
            sums += torch.stack([loss.float() * count, (logits.argmax(-1) == y).sum().float()])
        if env.ddp:
            dist.all_reduce(sums)
        result[split] = sums[0].item() / len(ids), sums[1].item() / (len(ids) * data.per_sample)
    norm_stats.record(raw, False)
    raw.train()
    if env.ddp:
        for t in norm_stats.sums(raw):
            dist.all_reduce(t)
    stats = norm_stats.read(raw)  # FSDP: every process takes part (alpha gathered)
    layers = {name: {k: s[k] for k in ('kind', 'alpha', 'input_std', 'saturation')}
              for name, s in stats['layers'].items()}
    (train_loss, train_acc), (val_loss, val_acc) = result['train'], result['val']
    collapse = annex('collapse')  # the study's signs of collapse; None if deleted
    warnings = collapse.warnings(cfg, data, it, train_loss, layers) if collapse else []
    return {'event': 'eval', 'iter': it, 'train_loss': train_loss, 'val_loss': val_loss,
            'val_loss_paper': result['val_paper'][0], 'train_acc': train_acc, 'val_acc': val_acc,
            **read, 'seconds': time.time() - t0, 'saturation': stats['saturation'],
            'thresholds': stats['thresholds'], 'norm_layers': layers, 'warnings': warnings}
