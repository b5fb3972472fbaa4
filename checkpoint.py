"""
Checkpoints, one torch.save file each: 'model', 'model_args' and from train.py 'optimizer', 'config',
'tokenizer', 'sampler' and the loop state (LoopState). Every script loads them here, CRC-32s checked
first; train.py writes and resumes them. Sharded ones (ckpt.dcp/) are annex/cluster.py's.
"""
import os
import pickle
import re
import shutil
import sys
import zipfile
from dataclasses import dataclass, fields

import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from configurator import annex
from data.common import atomic_write
from distributed import any_failed, pick_device
from model import GPT, GPTConfig

CHECKPOINTS = {'latest': 'ckpt.pt', 'best': 'best.pt'}  # a run's checkpoints, by the names users pick
SHARDED = {'latest': 'ckpt.dcp', 'best': 'best.dcp'}  # the same as folders of shards
COPY_AGAIN = "Copy it again, or use the run's other checkpoint (ckpt.pt / best.pt)"


@dataclass
class LoopState:
    """train.py's loop, as a checkpoint holds it, field by field."""
    iter_num: int = 0  # the next step
    best_val_loss: float = float('inf')
    best_iter: int | None = None
    loss_ema: float | None = None  # the divergence guard: the smoothed train loss, and its lowest
    best_loss_ema: float | None = None
    last_eval: dict | None = None
    wall_time_s: float = 0.0

    @classmethod
    def from_checkpoint(cls, ckpt):
        guard = ckpt.get('guard', {})  # how older checkpoints held the two EMAs
        saved = dict(loss_ema=guard.get('ema'), best_loss_ema=guard.get('best_ema')) | ckpt
        return cls(**{f.name: saved[f.name] for f in fields(cls) if f.name in saved})


def checkpoint_file(path, which='latest'):
    """A file as it is, or a run directory's ckpt.pt ('latest', every eval) or best.pt ('best')."""
    if which not in CHECKPOINTS:
        raise ValueError(f"--ckpt={which} is not a checkpoint choice; use latest (ckpt.pt) or best "
                         "(best.pt)")
    return os.path.join(path, CHECKPOINTS[which]) if os.path.isdir(path) else str(path)


def load_checkpoint(path, device='cpu', which='latest', language_model=False, verify=True):
    """(model in eval mode, checkpoint dict) of a train.py or nanoGPT checkpoint, CRC-32s verified
    (torch.load does not). device='meta' checks keys and shapes, copying no weights."""
    path = checkpoint_file(path, which)
    if not os.path.isfile(path):
        how = "give a run's out_dir or its ckpt.pt / best.pt (train one with `python train.py`)"
        folder = os.path.dirname(path)
        for kind, name in CHECKPOINTS.items():  # the file asked for, by its name, may be in shards
            if os.path.basename(path) == name and os.path.isdir(os.path.join(folder, SHARDED[kind])):
                how = f"export it first: python annex/cluster.py export {folder} --which={kind}"
        raise FileNotFoundError(f"no checkpoint at {path}: {how}")
    device = pick_device(device)
    if verify:
        check_crc(path)
    ckpt = read_checkpoint(path)
    if language_model and 'patch_size' in ckpt['model_args']:  # sample.py, annex/eval.py
        raise ValueError(f"{path} holds a ViT, an image classifier: this needs a language model "
                         "(analyze.py reads both)")
    return load_weights(ckpt, path, device), ckpt


def check_crc(path):  # not an archive: read_checkpoint says so
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        damaged = f'({type(e).__name__}: {e})'
    if damaged:
        raise ValueError(f"checkpoint {path} is damaged: {damaged} fails its CRC-32 check (bytes "
                         f"changed on disk or in a copy). {COPY_AGAIN}")


def read_checkpoint(path):
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=True)  # no second copy
    except Exception as e:  # PyTorch's own message suggests save options that do not apply here
        why = f'the archive is damaged ({type(e).__name__})'
        if not zipfile.is_zipfile(path):
            why = 'it is not a complete checkpoint archive (cut short by a copy or a full disk?)'
        elif isinstance(e, pickle.UnpicklingError):
            why = 'it holds objects other than tensors and plain values: not written by train.py'
        raise ValueError(f"cannot read checkpoint {path}: {why}. {COPY_AGAIN}") from None
    if not isinstance(ckpt, dict) or 'model' not in ckpt or 'model_args' not in ckpt:
        raise ValueError(f"{path} is not a training checkpoint: it needs 'model' and 'model_args'")
    # without the prefixes that torch.compile ('_orig_mod.') and DDP ('module.') add
    ckpt['model'] = {re.sub(r'^((_orig_mod|module)\.)+', '', k): v
                     for k, v in ckpt['model'].items()}
    moments = ckpt.get('optimizer', {}).get('state', {}).get('embed_scale', {})
    for state in (ckpt['model'], moments):  # older 0-dim embed_scale: FSDP2 shards no 0-dim tensor
        state.update({k: v.reshape(1) for k, v in state.items()
                      if k in ('embed_scale', 'exp_avg', 'exp_avg_sq') and v.dim() == 0})
    return ckpt


def load_weights(ckpt, path, device):
    """The model of ckpt's model_args with its weights, built on `device` (no CPU copy first)."""
    try:
        with torch.device(device):
            model = build_model(ckpt['model_args'])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: its model_args describe no model this version builds: {e}") \
            from None
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
    return model.eval()


def build_model(model_args):  # a ViT's (annex/vit.py) have a patch_size
    if 'patch_size' in model_args:
        vit = annex('vit', 'a ViT')
        return vit.ViT(vit.ViTConfig(**model_args))
    return GPT(GPTConfig(**model_args))


def few(items, n=3):
    more = f' and {len(items) - n} more' if len(items) > n else ''
    return ', '.join(items[:n]) + more if items else 'none'


# ------------------------------------------------------------------- train.py's: writing, resuming

def training_state(model, optimizer, **fields):
    """The whole model and optimizer state (gathered from FSDP shards) in CPU memory, and `fields`."""
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=full)
    if 'lm_head.weight' in weights:  # tied to the token embedding, but gathered as two copies
        weights['lm_head.weight'] = weights['transformer.wte.weight']
    return {'model': weights, 'optimizer': get_optimizer_state_dict(model, optimizer, options=full),
            **fields}


def save_checkpoint(state, out_dir, best=False):
    """out_dir/ckpt.pt, written atomically; with best, best.pt: a hard link to it (or a copy)."""
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
    """ckpt.pt from rank 0, or ckpt.dcp/ (annex/cluster.py) from all. A failure anywhere ends every
    process at once: none waits an hour."""
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
        raise SystemExit(f"error: checkpoint at iter {fields['iter_num']} not saved "
                         f"({error or 'on another process'}); the last one saved is intact")


def read_resume_checkpoint(cfg, model_args, n_train, master):
    """The checkpoint to resume from (a sharded one's fields only), checked against the config by
    every process (on 'meta': no copy; CRC-32s by rank 0)."""
    path = folder = os.path.join(cfg.out_dir, SHARDED['latest'])
    try:
        if os.path.isdir(folder):
            ckpt = annex('cluster', 'a sharded checkpoint (ckpt.dcp)').read_fields(folder)
        else:
            path = checkpoint_file(cfg.out_dir)
            _, ckpt = load_checkpoint(path, device='meta', verify=master)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: init_from='resume': {e}") from None
    need = ('config', 'iter_num', 'best_val_loss', 'best_iter', 'last_eval', 'sampler',
            'sharded' if 'sharded' in ckpt else 'optimizer')
    missing = [k for k in need if k not in ckpt]
    if missing:
        raise SystemExit(f"error: {path} lacks {', '.join(missing)}: not written by this train.py, "
                         "it cannot be resumed exactly; start a new run in a new out_dir")
    old = ckpt['model_args']
    changed = [f'{k} (checkpoint {old.get(k)!r}, config {v!r})' for k, v in model_args.items()
               if old.get(k) != v and k != 'dropout']
    if changed:
        raise SystemExit('error: the config changes the architecture of the run being resumed: '
                         + ', '.join(changed) + ". Keep the checkpoint's values, or a new out_dir.")
    s = ckpt['sampler']
    if master and old.get('dropout') != cfg.dropout:
        print(f"note: dropout changes from {old.get('dropout')} to {cfg.dropout}")
    if master and ckpt['config'].get('dataset') != cfg.dataset:
        print(f"warning: resuming a run trained on dataset {ckpt['config'].get('dataset')!r} with "
              f"dataset {cfg.dataset!r}")
    order = (cfg.seed, n_train, cfg.budget_docs)
    if master and (s['seed'], s['train_tokens'], s.get('budget_docs')) != order:
        print(f"warning: resuming with seed/train_tokens/budget_docs {cfg.seed}/{n_train:,}/"
              f"{cfg.budget_docs} where the checkpoint has {s['seed']}/{s['train_tokens']:,}/"
              f"{s.get('budget_docs')}: the data order changes")
    return ckpt


def has_ended(cfg, state, master):  # the run being resumed: max_iters reached, summary.json written
    if state.iter_num < cfg.max_iters or cfg.eval_only:
        return False
    if not os.path.exists(os.path.join(cfg.out_dir, 'summary.json')):
        return False
    if master:
        print(f'{cfg.out_dir} is already at max_iters={cfg.max_iters} (iter {state.iter_num}): '
              'nothing to do; raise --max_iters to continue')
    return True


def load_training_state(raw, optimizer, ckpt, env):
    """A resumed run's weights and AdamW state: rank 0's, broadcast (a sharded one's: each part)."""
    if 'sharded' in ckpt:
        annex('cluster').load_sharded(raw, optimizer, ckpt['sharded'], env)
        return
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=env.ddp)
    keep = not env.ddp or env.master
    set_model_state_dict(raw, ckpt['model'] if keep else {}, options=options)
    set_optimizer_state_dict(raw, optimizer, ckpt['optimizer'] if keep else {}, options=options)


def clear_stale(out_dir):
    """What an interrupted save left (ckpt.pt.tmp<pid>, *.dcp.tmp/) removed; a sharded checkpoint
    caught between its two renames put back."""
    for name in os.listdir(out_dir) if os.path.isdir(out_dir) else []:
        path = os.path.join(out_dir, name)
        if re.fullmatch(r'(ckpt|best)\.(pt\.tmp\d+|dcp\.tmp)', name):
            print(f'removing {path}: left by an interrupted save')
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        elif re.fullmatch(r'(ckpt|best)\.dcp\.old', name):
            if os.path.exists(path[:-4]):
                shutil.rmtree(path)
            else:
                os.replace(path, path[:-4])
