"""
A run's files. Checkpoints, one torch.save file each ('model' and 'model_args'; from train.py also
'optimizer', 'config', 'iter_num', the best val loss, the divergence guard, the last eval, the sampler): how
every script loads one (its CRC-32s checked), how train.py writes them (gathered from FSDP shards too) and
resumes. A big multi-process run's sharded checkpoints (ckpt.dcp/) are annex/cluster.py's. And config.json,
log.jsonl, summary.json.
"""
import json
import os
import pickle
import re
import shutil
import sys
import zipfile

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from configurator import annex, pick_device
from data.common import atomic_write, read_log, write_json
from model import GPT, GPTConfig

CHECKPOINTS = {'latest': 'ckpt.pt', 'best': 'best.pt'}  # a run's checkpoints, by the names users pick
SHARDED = {'latest': 'ckpt.dcp', 'best': 'best.dcp'}  # the same, as folders of shards (annex/cluster.py)
LOOP_STATE = ('iter_num', 'best_val_loss', 'best_iter', 'guard', 'last_eval')  # what train.py's loop resumes


def checkpoint_file(path, which='latest'):
    """A file as it is, or a run directory's ckpt.pt ('latest', every eval) or best.pt ('best' val loss)."""
    if which not in CHECKPOINTS:
        raise ValueError(f"{which!r} is not a checkpoint choice; use 'latest' (ckpt.pt) or 'best' (best.pt)")
    return os.path.join(path, CHECKPOINTS[which]) if os.path.isdir(path) else str(path)


def load_checkpoint(path, device='cpu', which='latest', language_model=False, verify=True):
    """A train.py (or nanoGPT) checkpoint -> (model in eval mode, checkpoint dict); errors say what is wrong.
    verify: every byte read against the archive's CRC-32s first (torch.load does not check them).
    device='meta' checks keys and shapes without a copy of the weights: the file is memory-mapped."""
    path = checkpoint_file(path, which)
    if not os.path.isfile(path):
        folder = os.path.join(os.path.dirname(path), SHARDED[which])
        how = f"export it first: python annex/cluster.py export {os.path.dirname(path)}" + (
            ' --which=best' if which == 'best' else '') if os.path.isdir(folder) else \
            "give a run's out_dir or its ckpt.pt / best.pt (train one with `python train.py`)"
        raise FileNotFoundError(f"no checkpoint at {path}: {how}")
    device = pick_device(device)
    damaged = None
    if verify and zipfile.is_zipfile(path):  # not one: torch.load's error below says so
        try:
            with zipfile.ZipFile(path) as archive:
                damaged = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            damaged = f'({type(e).__name__}: {e})'
    if damaged:
        raise ValueError(f"checkpoint {path} is damaged: {damaged} fails its CRC-32 check (bytes changed on "
                         "disk or in a copy). Copy it again, or use the run's other checkpoint (ckpt.pt / "
                         "best.pt)")
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=True)  # mmap: no second copy
    except Exception as e:  # PyTorch's own message suggests save options that do not apply here
        if not zipfile.is_zipfile(path):
            why = 'it is not a complete checkpoint archive (truncated by an interrupted copy or a full disk?)'
        elif isinstance(e, pickle.UnpicklingError):
            why = 'it holds objects other than tensors and plain values; it was not written by train.py'
        else:
            why = f'the archive is damaged ({type(e).__name__})'
        raise ValueError(f"cannot read checkpoint {path}: {why}. Copy it again, or use the run's other "
                         "checkpoint (ckpt.pt / best.pt)") from None
    if not isinstance(ckpt, dict) or 'model' not in ckpt or 'model_args' not in ckpt:
        raise ValueError(f"{path} is not a training checkpoint: it needs 'model' and 'model_args' entries")
    ckpt['model'] = {strip_wrappers(k): v for k, v in ckpt['model'].items()}
    if language_model and 'patch_size' in ckpt['model_args']:  # sample.py and annex/eval.py work on text
        raise ValueError(f"{path} holds a ViT, an image classifier: this needs a language model (analyze.py "
                         "reads both)")
    upgrade_checkpoint(ckpt)
    try:
        with torch.device(device):  # built where it runs: no full-size copy on the CPU first
            model = build_model(ckpt['model_args'])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: its model_args do not describe a model this version builds: {e}") from None
    state = {k: v.to('meta') if device == 'meta' else v for k, v in ckpt['model'].items()
             if not k.endswith('.attn.bias')}  # old nanoGPT checkpoints also saved the causal mask
    mismatch = f"{path}: the weights do not match its model_args (another architecture?):"
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shapes differ; PyTorch lists every tensor, a few say enough
        sizes = [line.strip().rstrip('.') for line in str(e).splitlines() if 'size mismatch' in line]
        raise ValueError(f"{mismatch} {few(sizes)}") from None
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(f"{mismatch} missing {few(result.missing_keys)}; unexpected "
                         f"{few(result.unexpected_keys)}")
    return model.eval(), ckpt


def build_model(model_args):
    """The model that a checkpoint's model_args describe: a ViT's (annex/vit.py) have a patch_size."""
    if 'patch_size' in model_args:
        vit = annex('vit', 'a ViT')
        return vit.ViT(vit.ViTConfig(**model_args))
    return GPT(GPTConfig(**model_args))


def strip_wrappers(key):
    """A parameter name without the prefixes torch.compile ('_orig_mod.') and DDP ('module.') add."""
    while key.startswith(('_orig_mod.', 'module.')):
        key = key.removeprefix('_orig_mod.').removeprefix('module.')
    return key


def upgrade_checkpoint(ckpt):
    """Older checkpoints' 0-dim embed_scale and moments made 1-element (FSDP2 cannot shard a 0-dim one)."""
    moments = ckpt.get('optimizer', {}).get('state', {}).get('embed_scale', {})
    for state in (ckpt['model'], moments):
        state.update({k: v.reshape(1) for k, v in state.items()
                      if k in ('embed_scale', 'exp_avg', 'exp_avg_sq') and v.dim() == 0})


def few(items, n=3):
    more = f' and {len(items) - n} more' if len(items) > n else ''
    return ', '.join(items[:n]) + more if items else 'none'


# ------------------------------------------------------------------------------------------------------------
# train.py's side: writing and resuming

def training_state(model, optimizer, **fields):
    """The whole model and optimizer state, gathered from FSDP shards into CPU memory (one file whatever the
    process count), and `fields`. Every process calls it."""
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=full)
    if 'lm_head.weight' in weights:  # tied to the token embedding, but gathered as two copies: save it once
        weights['lm_head.weight'] = weights['transformer.wte.weight']
    return {'model': weights, 'optimizer': get_optimizer_state_dict(model, optimizer, options=full), **fields}


def save_checkpoint(state, out_dir, best=False):
    """out_dir/ckpt.pt, written atomically; with best, best.pt too: a hard link to the same bytes (a copy
    where links are not supported). The next ckpt.pt is a new file."""
    path = os.path.join(out_dir, CHECKPOINTS['latest'])
    atomic_write(path, lambda f: torch.save(state, f))
    if best:
        final = os.path.join(out_dir, CHECKPOINTS['best'])
        tmp = f'{final}.tmp{os.getpid()}'
        try:
            os.link(path, tmp)
            os.replace(tmp, final)
        except OSError:
            with open(path, 'rb') as src:  # streamed: a 3.78b checkpoint does not fit in RAM twice
                atomic_write(final, lambda f: shutil.copyfileobj(src, f, 1 << 24))


def save_run(model, optimizer, fields, out_dir, env, best=False, sharded=None):
    """train.py's checkpoint, by every process: ckpt.pt that rank 0 writes from the state gathered from all
    (FSDP), or, with `sharded` (annex/cluster.py), ckpt.dcp/ that each writes its part of. A failure
    anywhere (disk full, quota) ends every process at once: none waits in a collective for an hour."""
    error = None
    try:
        if sharded:
            sharded.save_sharded(model, optimizer, fields, out_dir, best, env)
        else:
            state = training_state(model, optimizer, **fields)
            if env.master:
                save_checkpoint(state, out_dir, best=best)
    except Exception as e:
        error = f'{type(e).__name__}: {e}'
        print(f'rank {env.rank}: could not save the checkpoint: {error}', file=sys.stderr)
    if any_failed(env, error):
        where = error or 'on another process'
        raise SystemExit(f"error: checkpoint at iter {fields['iter_num']} not saved ({where}); the last one "
                         'saved is intact')


def read_resume_checkpoint(cfg, model_args, n_train, master):
    """The checkpoint to resume from, checked against the config (on every process: memory-mapped, no copy;
    its CRC-32s by rank 0); 'complete' when the run in out_dir has already ended at max_iters. A sharded one
    (ckpt.dcp/) first: without its weights, which load_training_state reads."""
    path = checkpoint_file(cfg.out_dir)
    try:  # clear errors for a missing, corrupt or foreign file (checked on 'meta': no copy)
        if os.path.isdir(folder := os.path.join(cfg.out_dir, SHARDED['latest'])):
            path, ckpt = folder, annex('cluster', 'a sharded checkpoint (ckpt.dcp)').read_fields(folder)
        else:
            _, ckpt = load_checkpoint(path, device='meta', verify=master)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: init_from='resume': {e}") from None
    missing = [k for k in ('config', *LOOP_STATE, 'sampler', 'sharded' if 'sharded' in ckpt else 'optimizer')
               if k not in ckpt]
    if missing:
        raise SystemExit(f"error: {path} lacks {', '.join(missing)}: it was not written by this train.py "
                         "and cannot be resumed exactly; start a new run in a new out_dir")
    old = ckpt['model_args']
    changed = [f'{k} (checkpoint {old.get(k)!r}, config {v!r})' for k, v in model_args.items()
               if old.get(k) != v and k != 'dropout']
    if changed:
        raise SystemExit('error: the config changes the architecture of the run being resumed: '
                         + ', '.join(changed) + ". Keep the checkpoint's values or use a new out_dir.")
    notes = []
    if old.get('dropout') != cfg.dropout:
        notes.append(f"note: dropout changes from {old.get('dropout')} to {cfg.dropout}")
    if ckpt['config'].get('dataset') != cfg.dataset:
        notes.append(f"warning: resuming a run trained on dataset {ckpt['config'].get('dataset')!r} "
                     f"with dataset {cfg.dataset!r}")
    sampler = ckpt['sampler']
    if (sampler['seed'], sampler['train_tokens'], sampler.get('budget_docs')) != (
            cfg.seed, n_train, cfg.budget_docs):
        notes.append(f"warning: resuming with seed/train_tokens/budget_docs {cfg.seed}/{n_train:,}/"
                     f"{cfg.budget_docs} where the checkpoint has {sampler['seed']}/"
                     f"{sampler['train_tokens']:,}/{sampler.get('budget_docs')}: the data order changes")
    if master and notes:
        print('\n'.join(notes))
    if ckpt['iter_num'] >= cfg.max_iters and not cfg.eval_only and os.path.exists(
            os.path.join(cfg.out_dir, 'summary.json')):
        if master:
            print(f"{cfg.out_dir} is already at max_iters={cfg.max_iters} (iter {ckpt['iter_num']}): nothing "
                  "to do; raise --max_iters to continue")
        return 'complete'
    return ckpt


def load_training_state(raw, optimizer, ckpt, env):
    """Weights and optimizer state of a resumed run (rank 0 reads them and broadcasts them; from a sharded
    checkpoint each process reads its part), and its loop state: iter_num, best_val_loss, best_iter, guard,
    last_eval, wall_time_s."""
    if 'sharded' in ckpt:
        annex('cluster').load_sharded(raw, optimizer, ckpt['sharded'], env)
    else:
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=env.ddp)
        keep = not env.ddp or env.master
        set_model_state_dict(raw, ckpt['model'] if keep else {}, options=options)
        set_optimizer_state_dict(raw, optimizer, ckpt['optimizer'] if keep else {}, options=options)
    return [ckpt[k] for k in LOOP_STATE] + [ckpt.get('wall_time_s', 0.0)]


def prepare_run_dir(out_dir, config, resume_iter=None):
    """config.json; log.jsonl cut back to the checkpoint resumed at resume_iter (its eval kept), or emptied
    for a new run, which also removes the files of a run it replaces (--overwrite). With wandb_log, wandb."""
    os.makedirs(out_dir, exist_ok=True)
    if resume_iter is None:
        for name in (*CHECKPOINTS.values(), 'summary.json'):
            if os.path.exists(os.path.join(out_dir, name)):
                os.remove(os.path.join(out_dir, name))
        for name in SHARDED.values():
            shutil.rmtree(os.path.join(out_dir, name), ignore_errors=True)
    write_json(os.path.join(out_dir, 'config.json'), config)
    log_path = os.path.join(out_dir, 'log.jsonl')
    kept = [] if resume_iter is None else read_log(log_path, lambda r: r['iter'] < resume_iter or (
        r['iter'] == resume_iter and r['event'] in ('eval', 'stopped')))
    atomic_write(log_path, lambda f: f.write(''.join(json.dumps(r) + '\n' for r in kept).encode()))
    if config.get('wandb_log'):
        import wandb
        wandb.init(project=config['wandb_project'], name=config['wandb_run_name'], config=config)


def clear_stale(out_dir):
    """Remove what an interrupted save left in out_dir (its name changes with each requeue, so nothing else
    would): ckpt.pt.tmp<pid>, best.pt.tmp<pid>, *.dcp.tmp/; a sharded checkpoint caught between its two
    renames is put back (ckpt.dcp.old -> ckpt.dcp)."""
    for name in os.listdir(out_dir) if os.path.isdir(out_dir) else []:
        path = os.path.join(out_dir, name)
        if re.fullmatch(r'(ckpt|best)\.(pt\.tmp\d+|dcp\.tmp)', name):
            print(f'removing {path}: left by an interrupted save')
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        elif re.fullmatch(r'(ckpt|best)\.dcp\.old', name):
            if os.path.exists(path[:-4]):
                shutil.rmtree(path)
            else:
                os.replace(path, path[:-4])


def check_room(out_dir, n_bytes, gathered):
    """Why saving a checkpoint of n_bytes would fail, or None: too little free disk for three (best, latest
    and the one being written, until it replaces the latest), or, when gathered into one process, too little
    host RAM (Linux's MemAvailable) to hold it."""
    have = sum(os.path.exists(os.path.join(out_dir, n)) for n in (*CHECKPOINTS.values(), *SHARDED.values()))
    free = shutil.disk_usage(out_dir).free
    if free < (3 - have) * n_bytes:
        return (f'{out_dir} has {free / 2**30:.1f} GiB free; its checkpoints need '
                f'{(3 - have) * n_bytes / 2**30:.1f} GiB more ({n_bytes / 2**30:.1f} GiB each: best, latest '
                'and the next). Free space or choose another out_dir')
    if gathered and os.path.exists('/proc/meminfo'):
        with open('/proc/meminfo') as f:
            available = next((int(line.split()[1]) * 1024 for line in f
                              if line.startswith('MemAvailable:')), None)
        if available is not None and available < n_bytes:
            return (f'rank 0 has {available / 2**30:.1f} GiB of host RAM available, too little to gather a '
                    f'{n_bytes / 2**30:.1f} GiB checkpoint; free memory, or save shards: '
                    '--shard_checkpoints_above=0')
    return None


def any_failed(env, error):
    """Whether any process has an error (each passes its own, or None): all of them learn it at once, so none
    waits in a collective for a process that has left."""
    flag = torch.full((), float(bool(error)), device=env.device)
    if env.ddp:
        dist.all_reduce(flag)
    return flag.item() > 0


def append_log(out_dir, record, wandb_log=False):
    """A line of out_dir/log.jsonl (and, with wandb_log, a step of the wandb run)."""
    with open(os.path.join(out_dir, 'log.jsonl'), 'a') as f:
        f.write(json.dumps(record) + '\n')
    if wandb_log:
        import wandb
        wandb.log(record, step=record['iter'])


def write_summary(out_dir, status, state, facts):
    """summary.json: how a run ended ('finished' or 'diverged'), its last eval, best and divergence; facts.
    Ends the wandb run."""
    last, it, diverged = state['last_eval'] or {}, state['iter_num'], status == 'diverged'
    layers = last.get('norm_layers', {})
    write_json(os.path.join(out_dir, 'summary.json'), {
        'status': status, 'final_iter': last.get('iter'), 'final_val_loss': last.get('val_loss'),
        'final_val_loss_paper': last.get('val_loss_paper'),
        'final_train_loss': last.get('train_loss'), 'final_val_acc': last.get('val_acc'),
        'final_train_acc': last.get('train_acc'),
        'best_val_loss': state['best_val_loss'] if state['best_iter'] is not None else None,
        'best_iter': state['best_iter'], 'saturation': last.get('saturation'),
        'thresholds': last.get('thresholds'),
        'saturation_layers': {k: v['saturation'] for k, v in layers.items() if v['saturation'] is not None},
        'alphas': {k: v['alpha'] for k, v in layers.items() if v['alpha'] is not None}, 'iters': it,
        'wall_time_s': state['wall_time_s'], 'diverged': diverged, 'diverged_reason': state.get('diverged'),
        'diverged_iter': it if diverged else None, 'warnings': last.get('warnings'), **facts})
    if facts['config'].get('wandb_log'):  # the run has ended (a stopped one's ends with the process)
        import wandb
        wandb.finish()
