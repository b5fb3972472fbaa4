"""
A run's files besides its checkpoints, in out_dir: config.json (every key), log.jsonl (a JSON line per
step logged, eval and event), summary.json (how the run ended) and a wandb run with wandb_log=True.
"""
import json
import os
import shutil

from checkpoint import CHECKPOINTS, SHARDED
from data.common import atomic_write, write_json


def read_log(path, keep):
    """The records of a JSON-lines file that satisfy keep(record); a torn line is dropped."""
    records = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return [r for r in records if keep(r)]


def prepare_run_dir(out_dir, config, resume_iter=None):
    """config.json; log.jsonl cut back to the checkpoint at resume_iter (its eval kept), or emptied
    for a new run, which removes the files of a run it replaces (--overwrite)."""
    os.makedirs(out_dir, exist_ok=True)
    if resume_iter is None:
        for name in (*CHECKPOINTS.values(), 'summary.json'):
            if os.path.exists(os.path.join(out_dir, name)):
                os.remove(os.path.join(out_dir, name))
        for name in SHARDED.values():
            shutil.rmtree(os.path.join(out_dir, name), ignore_errors=True)
    write_json(os.path.join(out_dir, 'config.json'), config)
    log_path = os.path.join(out_dir, 'log.jsonl')
    kept = []
    if resume_iter is not None:
        kept = read_log(log_path, lambda r: r['iter'] < resume_iter or (
            r['iter'] == resume_iter and r['event'] in ('eval', 'stopped')))
    atomic_write(log_path, lambda f: f.write(''.join(json.dumps(r) + '\n' for r in kept).encode()))
    if config.get('wandb_log'):
        import wandb
        wandb.init(project=config['wandb_project'], name=config['wandb_run_name'], config=config)


def log(run, record):
    """A line of log.jsonl (and a wandb step), by the process that writes."""
    if not run.writing:
        return
    with open(os.path.join(run.cfg.out_dir, 'log.jsonl'), 'a') as f:
        f.write(json.dumps(record) + '\n')
    if run.cfg.wandb_log:
        import wandb
        wandb.log(record, step=record['iter'])


def write_summary(run, state, reason, seen, meta):
    """summary.json: how the run ended, its last eval's figures, what it read; ends the wandb run."""
    last, it = state.last_eval or {}, state.iter_num
    layers = last.get('norm_layers', {})
    write_json(os.path.join(run.cfg.out_dir, 'summary.json'), {
        'status': 'diverged' if reason else 'finished', 'final_iter': last.get('iter'),
        'final_val_loss': last.get('val_loss'), 'final_val_loss_paper': last.get('val_loss_paper'),
        'final_train_loss': last.get('train_loss'), 'final_val_acc': last.get('val_acc'),
        'final_train_acc': last.get('train_acc'),
        'best_val_loss': state.best_val_loss if state.best_iter is not None else None,
        'best_iter': state.best_iter, 'saturation': last.get('saturation'),
        'thresholds': last.get('thresholds'),
        'saturation_layers': {k: v['saturation'] for k, v in layers.items()
                              if v['saturation'] is not None},
        'alphas': {k: v['alpha'] for k, v in layers.items() if v['alpha'] is not None},
        'iters': it, 'wall_time_s': state.wall_time_s, 'diverged': bool(reason),
        'diverged_reason': reason, 'diverged_iter': it if reason else None,
        'warnings': last.get('warnings'), **seen, 'n_params': run.raw.get_num_params(),
        f'budget_{run.data.unit}': run.data.n_train, 'unigram_entropy': run.data.entropy,
        'config': run.saved['config'], 'layout': meta.get('layout', 'file')})  # the tokenization
    if run.cfg.wandb_log:  # the run has ended (a stopped one's ends with the process)
        import wandb
        wandb.finish()


def log_step(run, it, loss, lr, grad_norm, dt):
    """A step's record and line: loss, lr, gradient norm and, once timed, throughput and MFU."""
    rate = mfu = None
    speed = 'first step (compilation and warm-up: not timed)'
    if dt:  # MFU of this process's share of the samples
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


def seen(run, steps):  # what `steps` steps have read: tokens (or images), and epochs of the budget
    n = steps * run.samples * run.data.per_sample
    return {run.data.unit: n, 'epochs': n / run.data.n_train}
