"""A run's files in out_dir other than checkpoints: config.json, log.jsonl, summary.json (wandb:
annex/wandb_log.py)."""
import contextlib
import json
import os
import re
import shutil

from configurator import annex
from data.common import atomic_write, write_json


def read_log(path, keep):  # the records keep(record) accepts; a torn line is dropped
    records = []
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        for line in f:
            with contextlib.suppress(json.JSONDecodeError):
                records.append(json.loads(line))
    return [r for r in records if keep(r)]


def prepare_run_dir(run, resume, state_bytes):
    """Rank 0's config.json; log.jsonl cut back to the resumed iter or, in a new run, emptied (old
    files gone); the room for checkpoints of state_bytes checked (annex/memory.py)."""
    if not run.writing:
        return
    out_dir, config, resume_iter = run.cfg.out_dir, run.saved['config'], run.start_iter
    os.makedirs(out_dir, exist_ok=True)
    log_path, kept = os.path.join(out_dir, 'log.jsonl'), []
    if not resume:  # the old run's checkpoints (kept ones too), exports and summary gone
        for name in os.listdir(out_dir):
            path = os.path.join(out_dir, name)
            if re.fullmatch(r'(ckpt|best)(-\d+)?\.dcp|export', name) and os.path.isdir(path):
                shutil.rmtree(path)
            elif re.fullmatch(r'(ckpt|best)(-\d+)?\.pt|summary\.json', name):
                os.remove(path)
    else:  # the checkpoint's eval (or stop) kept
        kept = read_log(log_path, lambda r: r['iter'] < resume_iter or (
            r['iter'] == resume_iter and r['event'] in ('eval', 'saved', 'stopped')))
    write_json(os.path.join(out_dir, 'config.json'), config)
    atomic_write(log_path, lambda f: f.write(''.join(json.dumps(r) + '\n' for r in kept).encode()))
    if config['wandb_log']:
        annex('wandb_log').start(config)
    memory, problem = annex('memory'), None
    if memory:
        problem = memory.check_room(out_dir, state_bytes, gathered=not run.env.sharded)
    if problem:  # now, not after hours of training
        raise SystemExit(f'error: {problem}')


def log(run, record):  # a log.jsonl line (a step, eval or event), a wandb step
    if not run.writing:
        return
    with open(os.path.join(run.cfg.out_dir, 'log.jsonl'), 'a') as f:
        f.write(json.dumps(record) + '\n')
    if run.cfg.wandb_log:
        annex('wandb_log').log(record)


def write_summary(run, state, reason):
    """summary.json: how the run ended, its last eval's figures, what it read; ends wandb's run."""
    last, it = state.last_eval or {}, state.iter_num
    layers = last.get('norm_layers', {})
    final = ('iter', 'val_loss', 'val_loss_paper', 'train_loss', 'val_acc', 'train_acc')
    write_json(os.path.join(run.cfg.out_dir, 'summary.json'), {
        'status': 'diverged' if reason else 'finished',
        **{f'final_{k}': last.get(k) for k in final},
        'best_val_loss': state.best_val_loss if state.best_iter is not None else None,
        'best_iter': state.best_iter, 'saturation': last.get('saturation'),
        'thresholds': last.get('thresholds'), 'saturation_layers': {
            k: v['saturation'] for k, v in layers.items() if v['saturation'] is not None},
        'alphas': {k: v['alpha'] for k, v in layers.items() if v['alpha'] is not None},
        'iters': it, 'wall_time_s': state.wall_time_s, 'diverged': bool(reason),
        'diverged_reason': reason, 'diverged_iter': it if reason else None,
        'warnings': last.get('warnings'), **seen(run, it), 'n_params': run.raw.get_num_params(),
        f'budget_{run.data.unit}': run.data.n_train, 'unigram_entropy': run.data.entropy,
        'config': run.saved['config'], 'layout': run.meta.get('layout', 'file')})  # tokenization
    if run.cfg.wandb_log:
        annex('wandb_log').finish()


def log_step(run, it, loss, lr, grad_norm, dt):  # throughput and MFU once timed
    rate = mfu = None
    speed = 'first step (compilation and warm-up: not timed)'
    if dt:  # MFU of this process's samples
        rate = run.samples * run.data.per_sample / dt
        mfu = run.raw.estimate_mfu(sum(count for _, count in run.parts), dt, run.peak_flops)
        speed = f'{rate:,.0f} {run.data.unit}/s, {1000 * dt:.1f} ms/iter'
    if mfu is not None:
        speed += f', mfu {100 * mfu:.1f}%'
    log(run, {'event': 'step', 'iter': it, 'loss': loss, 'lr': lr, 'grad_norm': grad_norm,
              **seen(run, it + 1), f'{run.data.unit}_per_sec': rate, 'mfu': mfu,
              'ms_per_iter': 1000 * dt if dt else None})
    if run.env.master:
        print(f'iter {it}: loss {loss:.4f}, lr {lr:.2e}, grad norm {grad_norm:.3f}, {speed}')


def seen(run, steps):  # what `steps` steps read: tokens (or images), epochs of the budget
    n = steps * run.samples * run.data.per_sample
    return {run.data.unit: n, 'epochs': n / run.data.n_train}
