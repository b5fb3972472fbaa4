"""Checkpoints, a torch.save file each (or shards: annex/cluster.py), the latest the one saved last
(each save removes the other format's): read by every script, written and resumed by train.py."""
import os
import pickle
import re
import shutil
import zipfile
from dataclasses import dataclass, fields

import torch
import torch.distributed.checkpoint.state_dict as dsd

from configurator import annex
from data.common import atomic_write
from distributed import pick_device
from model import GPT, GPTConfig

CHECKPOINTS = {'latest': 'ckpt.pt', 'best': 'best.pt'}  # by the names users pick
SHARDED = {'latest': 'ckpt.dcp', 'best': 'best.dcp'}  # as folders of shards: annex/cluster.py
COPY_AGAIN = "Copy it again, or use the run's other one (ckpt.pt / best.pt)"


@dataclass
class LoopState:  # train.py's loop, as a checkpoint holds it
    iter_num: int = 0  # the next step
    best_val_loss: float = float('inf')
    best_iter: int | None = None
    loss_ema: float | None = None  # the divergence guard's smoothed loss, and its lowest
    best_loss_ema: float | None = None
    last_eval: dict | None = None
    wall_time_s: float = 0.0

    @classmethod
    def from_checkpoint(cls, ckpt):
        guard = ckpt.get('guard', {})  # how older ones held the two EMAs
        saved = dict(loss_ema=guard.get('ema'), best_loss_ema=guard.get('best_ema')) | ckpt
        return cls(**{f.name: saved[f.name] for f in fields(cls) if f.name in saved})


def checkpoint_file(path, which='latest'):  # a file, or a run directory's; of shards, its export
    if which not in CHECKPOINTS:
        raise ValueError(f"--ckpt={which} is not a checkpoint choice; use latest (ckpt.pt) or best")
    folder, name = (path, CHECKPOINTS[which]) if os.path.isdir(path) else os.path.split(str(path))
    which = next((k for k, v in CHECKPOINTS.items() if v == name), None)  # named so or not
    if which and os.path.isdir(os.path.join(folder, SHARDED[which])):  # said how old
        return annex('cluster', 'a sharded checkpoint (ckpt.dcp)').current_file(folder, which)
    return os.path.join(folder, name)


def load_checkpoint(path, device='cpu', which='latest', language_model=False, verify=True):
    """(eval-mode model, dict) of a train.py or nanoGPT file, CRC-32s checked; 'meta': no copy."""
    path = checkpoint_file(path, which)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}: give a run's out_dir or its ckpt.pt / "
                                "best.pt (train one with `python train.py`)")
    device = pick_device(device)
    if verify and zipfile.is_zipfile(path):  # not an archive: read_checkpoint says so
        check_crc(path)
    ckpt = read_checkpoint(path)
    if language_model and 'patch_size' in ckpt['model_args']:
        raise ValueError(f"{path} holds a ViT, an image classifier: this needs a language model "
                         "(analyze.py reads both)")
    return load_weights(ckpt, path, device), ckpt


def check_crc(path):  # torch.load does not
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        damaged = f'({type(e).__name__}: {e})'
    if damaged:
        raise ValueError(f"checkpoint {path} is damaged: {damaged} fails its CRC-32 check "
                         f"(changed on disk or in a copy). {COPY_AGAIN}")


def read_checkpoint(path):
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=True)  # no second copy
    except Exception as e:  # PyTorch's message suggests options that do not apply
        why = f'the archive is damaged ({type(e).__name__})'
        if not zipfile.is_zipfile(path):
            why = 'it is not a complete checkpoint archive (cut short by a copy or a full disk?)'
        elif isinstance(e, pickle.UnpicklingError):
            why = "it holds objects other than tensors and plain values: not train.py's"
        raise ValueError(f"cannot read checkpoint {path}: {why}. {COPY_AGAIN}") from None
    if not isinstance(ckpt, dict) or not {'model', 'model_args'} <= ckpt.keys():
        raise ValueError(f"{path} is not a training checkpoint: it needs 'model' and 'model_args'")
    ckpt['model'] = {re.sub(r'^((_orig_mod|module)\.)+', '', k): v
                     for k, v in ckpt['model'].items()}  # without torch.compile's, DDP's prefixes
    moments = ckpt.get('optimizer', {}).get('state', {}).get('embed_scale', {})
    for state in (ckpt['model'], moments):  # older 0-dim embed_scale: FSDP2 shards no 0-dim tensor
        state.update({k: v.reshape(1) for k, v in state.items()
                      if k in ('embed_scale', 'exp_avg', 'exp_avg_sq') and v.dim() == 0})
    return ckpt


def load_weights(ckpt, path, device, model_args=None):  # on `device`: no CPU copy first
    try:
        with torch.device(device):
            model = build_model(model_args or ckpt['model_args'])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: its model_args fit no model this version builds: {e}") from None
    state = {k: v.to('meta') if device == 'meta' else v for k, v in ckpt['model'].items()
             if not k.endswith('.attn.bias')}  # old nanoGPT ones saved causal masks
    mismatch = f"{path}: the weights do not fit the model (another architecture?):"
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shapes differ: PyTorch lists all, a few say enough
        sizes = [s.strip().rstrip('.') for s in str(e).splitlines() if 'size mismatch' in s]
        raise ValueError(f"{mismatch} {few(sizes)}") from None
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(f"{mismatch} missing {few(result.missing_keys)}; unexpected "
                         f"{few(result.unexpected_keys)}")
    return model.eval()


def build_model(model_args):  # a ViT's (annex/vit.py) have patch_size
    if 'patch_size' in model_args:
        vit = annex('vit', 'a ViT')
        return vit.ViT(vit.ViTConfig(**model_args))
    return GPT(GPTConfig(**model_args))


def few(items, n=3):
    more = f' and {len(items) - n} more' if len(items) > n else ''
    return ', '.join(items[:n]) + more if items else 'none'


def training_state(model, optimizer, **fields):
    """The whole model and optimizer state (gathered from FSDP shards) on CPU; `fields`."""
    full = dsd.StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = dsd.get_model_state_dict(model, options=full)
    if 'lm_head.weight' in weights:  # tied to wte, but gathered as two copies
        weights['lm_head.weight'] = weights['transformer.wte.weight']
    optim = dsd.get_optimizer_state_dict(model, optimizer, options=full)
    return {'model': weights, 'optimizer': optim, **fields}


def save_checkpoint(state, out_dir, best=False):
    """ckpt.pt, written atomically; with best, best.pt too: a hard link (or a copy)."""
    path = os.path.join(out_dir, CHECKPOINTS['latest'])
    atomic_write(path, lambda f: torch.save(state, f))
    if best:
        final = os.path.join(out_dir, CHECKPOINTS['best'])
        tmp = f'{final}.tmp{os.getpid()}'
        try:
            os.link(path, tmp)
            os.replace(tmp, final)
        except OSError:
            with open(path, 'rb') as src:  # streamed: 3.78b weights do not fit in RAM twice
                atomic_write(final, lambda f: shutil.copyfileobj(src, f, 1 << 24))
    for kind in ('latest', 'best') if best else ('latest',):  # the older shards
        shutil.rmtree(os.path.join(out_dir, SHARDED[kind]), ignore_errors=True)


def save_run(model, optimizer, fields, cfg, env, best=False):
    """Rank 0's ckpt.pt, now (sharded, in the background or kept: annex/cluster.py's save_run)."""
    state = training_state(model, optimizer, **fields)
    if env.master:
        save_checkpoint(state, cfg.out_dir, best=best)


def starting_checkpoint(cfg, model_args, n_train, env):
    """What the run starts from: its checkpoint, init_from=PATH's weights (rank 0's), or None."""
    if cfg.init_from == 'resume':
        return read_resume_checkpoint(cfg, model_args, n_train, env.master)
    if cfg.init_from == 'scratch':
        return None
    if not env.master:  # it receives them
        return {'model': {}}
    _, ckpt = load_checkpoint(cfg.init_from, device='meta')
    load_weights(ckpt, cfg.init_from, 'meta', model_args)  # the shapes checked
    return {'model': ckpt['model']}


def read_resume_checkpoint(cfg, model_args, n_train, master):
    """The checkpoint to resume (a sharded one's fields), checked on 'meta' by every rank."""
    path = os.path.join(cfg.out_dir, SHARDED['latest'])
    try:
        if os.path.isdir(path):
            ckpt = annex('cluster', 'a sharded checkpoint (ckpt.dcp)').read_fields(path)
        else:
            path = checkpoint_file(cfg.out_dir)
            _, ckpt = load_checkpoint(path, device='meta', verify=master)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: init_from='resume': {e}") from None
    need = ('config', 'iter_num', 'best_val_loss', 'best_iter', 'last_eval', 'sampler',
            'sharded' if 'sharded' in ckpt else 'optimizer')
    missing = [k for k in need if k not in ckpt]
    if missing:
        raise SystemExit(f"error: {path} lacks {', '.join(missing)}: not this train.py's, so not "
                         "resumable exactly; start a new run in another out_dir")
    old = ckpt['model_args']
    changed = [f'{k} (checkpoint {old.get(k)!r}, config {v!r})' for k, v in model_args.items()
               if old.get(k) != v and k != 'dropout']
    if changed:
        raise SystemExit("error: the config changes the resumed run's architecture: "
                         + ', '.join(changed) + ". Keep the checkpoint's values, or a new out_dir.")
    s = ckpt['sampler']  # what else may change, said: the data (its order), dropout
    now = dict(dataset=cfg.dataset, seed=cfg.seed, train_tokens=n_train,
               budget_docs=cfg.budget_docs, dropout=cfg.dropout)
    was = dict(s, dataset=ckpt['config'].get('dataset'), dropout=old.get('dropout'))
    changes = [f'{k} {was.get(k)!r} -> {v!r}' for k, v in now.items() if was.get(k) != v]
    if master and changes:
        print(f"warning: resuming with {', '.join(changes)}: not the uninterrupted run")
    return ckpt


def has_ended(cfg, state, master):  # at max_iters, with its summary.json written
    summary = os.path.join(cfg.out_dir, 'summary.json')
    if state.iter_num < cfg.max_iters or cfg.eval_only or not os.path.exists(summary):
        return False
    if master:
        print(f'{cfg.out_dir} is already at max_iters={cfg.max_iters} (iter {state.iter_num}): '
              'nothing to do; raise --max_iters to continue')
    return True


def load_training_state(raw, optimizer, ckpt, env):
    """A checkpoint's weights (AdamW state too, with an optimizer): rank 0's, broadcast; shards'."""
    if 'sharded' in ckpt:
        annex('cluster').load_sharded(raw, optimizer, ckpt['sharded'], env)
        return
    options = dsd.StateDictOptions(full_state_dict=True, broadcast_from_rank0=env.ddp)
    keep = not env.ddp or env.master
    dsd.set_model_state_dict(raw, ckpt['model'] if keep else {}, options=options)
    if optimizer:
        dsd.set_optimizer_state_dict(raw, optimizer, ckpt['optimizer'] if keep else {},
                                     options=options)


def clear_stale(out_dir, mine=True):  # left by interrupted saves; *.dcp: annex/cluster.py's
    names = os.listdir(out_dir) if mine and os.path.isdir(out_dir) else []
    for name in names:
        if re.fullmatch(r'(ckpt|best)(-\d+)?\.pt\.tmp\d+', name):
            print(f'removing {os.path.join(out_dir, name)}: left by an interrupted save')
            os.remove(os.path.join(out_dir, name))
    if any(name.endswith(('.dcp', '.dcp.tmp', '.dcp.old')) for name in names):
        annex('cluster', 'a sharded checkpoint (ckpt.dcp)').clear_stale(out_dir)
