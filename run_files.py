"""
A run's files besides its checkpoints, all in out_dir: config.json (every key), log.jsonl (a JSON line
per step logged, eval and event), summary.json (how the run ended; written once it has), and a wandb
run with wandb_log=True. Read back with read_log (annex/study.py, annex/report.py).
"""
import json
import os
import shutil

from checkpoint import CHECKPOINTS, SHARDED
from data.common import atomic_write, write_json


def read_log(path, keep):
    """The records of a JSON-lines file (log.jsonl) that satisfy keep(record); a torn line is dropped."""
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
    """config.json; log.jsonl cut back to the checkpoint resumed at resume_iter (its eval kept), or
    emptied for a new run, which also removes the files of a run it replaces (--overwrite)."""
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


def append_log(out_dir, record, wandb_log=False):
    """A line of out_dir/log.jsonl (and, with wandb_log, a step of the wandb run)."""
    with open(os.path.join(out_dir, 'log.jsonl'), 'a') as f:
        f.write(json.dumps(record) + '\n')
    if wandb_log:
        import wandb
        wandb.log(record, step=record['iter'])


def write_summary(out_dir, status, state, reason, facts):
    """summary.json: how a run ended ('finished' or 'diverged', and why), its loop state (LoopState),
    the last eval's figures; facts. Ends the wandb run."""
    last, it, diverged = state.last_eval or {}, state.iter_num, status == 'diverged'
    layers = last.get('norm_layers', {})
    write_json(os.path.join(out_dir, 'summary.json'), {
        'status': status, 'final_iter': last.get('iter'), 'final_val_loss': last.get('val_loss'),
        'final_val_loss_paper': last.get('val_loss_paper'),
        'final_train_loss': last.get('train_loss'), 'final_val_acc': last.get('val_acc'),
        'final_train_acc': last.get('train_acc'),
        'best_val_loss': state.best_val_loss if state.best_iter is not None else None,
        'best_iter': state.best_iter, 'saturation': last.get('saturation'),
        'thresholds': last.get('thresholds'),
        'saturation_layers': {k: v['saturation'] for k, v in layers.items()
                              if v['saturation'] is not None},
        'alphas': {k: v['alpha'] for k, v in layers.items() if v['alpha'] is not None},
        'iters': it, 'wall_time_s': state.wall_time_s, 'diverged': diverged,
        'diverged_reason': reason, 'diverged_iter': it if diverged else None,
        'warnings': last.get('warnings'), **facts})
    if facts['config'].get('wandb_log'):  # the run has ended (a stopped one's ends with the process)
        import wandb
        wandb.finish()
