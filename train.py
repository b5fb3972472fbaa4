"""
Train a GPT variant (model.py) on a tokenized dataset (data/<name>/{train,val}.bin), on a CPU or with torchrun.

  python train.py                                   # tiny model on the offline pydocs corpus: about a minute on 2 CPU cores
  python train.py config/gpt2_64m_dyt.py --train_tokens=1_000_000 --seed=42 --out_dir=out/dyt_1M_s42
  torchrun --standalone --nproc_per_node=8 train.py config/gpt2_64m_dyt.py
  python train.py config/gpt2_64m_dyt.py --init_from=resume     # continue out_dir/ckpt.pt exactly

Configuration (nanoGPT's convention, see configurator.py): the globals below are the defaults, then config
files, then --key=value (`python train.py --help` lists them). Every GPTConfig field is a key too.
gradient_accumulation_steps is the GLOBAL number of micro-batches per step (as in nanoGPT, the ranks share
them), so a config means the same batch on any number of GPUs: batch_size x gradient_accumulation_steps
sequences per step. A new run refuses an out_dir that already holds one (--overwrite=True replaces it).
Writes to out_dir: config.json, log.jsonl (one JSON object per event), ckpt.pt (latest, every eval),
best.pt (best val loss), summary.json (at the end).
Exit status: 0 finished; 3 stopped by the divergence guard (summary.json has diverged=true and the reason;
the checkpoints are the last good ones); 1 error.
"""
import hashlib
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import fields
from types import SimpleNamespace
from typing import get_args, get_type_hints

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_optimizer_state_dict)
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import configure, plain_globals
from data.common import (DATA_DIR, DataError, atomic_write, load_meta, load_split, random_windows, unigram_entropy,
                         write_json)
from model import GPT, GPTConfig, load_checkpoint, pick_device

# -----------------------------------------------------------------------------------------------------------
# default config: a tiny model on the offline pydocs corpus (byte-level) that learns visibly in about a minute on 2 CPU cores
# I/O
out_dir = 'out'
eval_interval = 100
log_interval = 10
eval_iters = 10  # batches per split per evaluation
eval_only = False
always_save_checkpoint = True  # False: ckpt.pt only rewritten when val loss improves, and at the end (nanoGPT)
init_from = 'scratch'  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
overwrite = False  # a scratch run refuses an out_dir that holds a run (sweeps must not clobber each other)
wandb_log = False
wandb_project = 'nanonorm'
wandb_run_name = 'run'
# data
dataset = 'pydocs'
data_dir = None  # folder with train.bin, val.bin, meta.json; None = data/<dataset>
train_tokens = None  # data budget: random windows inside the first train_tokens train tokens only; None = all
val_tokens = None  # evaluate on the first val_tokens val tokens (the same for every budget); None = all
tiktoken_file = None  # GPT-2 .tiktoken ranks file for offline machines (recorded for sample.py)
gradient_accumulation_steps = 1  # global micro-batches per step, shared by the ranks
batch_size = 16  # sequences per micro-batch
block_size = 128
# model (every other GPTConfig field is a key with GPTConfig's default)
n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
bias = False
emb_init_std = 0.3  # GPT-2's 0.02 makes a model this small collapse with DyT (README: "When DyT collapses")
vocab_size = None  # None = the dataset's vocabulary (meta.json) padded to a multiple of 64, like GPT-2's 50304
# AdamW (weight decay on >=2-D weights only) and the learning-rate schedule
learning_rate = 2e-3
max_iters = 300
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0 = no clipping
decay_lr = True  # linear warmup, then cosine down to min_lr at lr_decay_iters; False = constant
warmup_iters = 30
lr_decay_iters = 300
min_lr = 2e-4
# divergence guard: a non-finite loss or gradient norm always stops the run
spike_factor = None  # also stop when a step's loss exceeds spike_factor x the best smoothed loss so far
# system
device = None  # None = 'cuda' if available, else 'mps', else 'cpu' (model.pick_device)
dtype = None  # 'float32' or 'bfloat16'; None = bfloat16 autocast on CUDA when supported, else float32
compile = False
backend = None  # torch.distributed backend; None = 'nccl' on CUDA, 'gloo' otherwise
fsdp = False  # under torchrun: shard parameters with FSDP2 (1.3b and 3.78b scales) instead of DDP
peak_flops = None  # the device's peak FLOP/s for MFU; None = known GPUs only (no MFU on CPU)
seed = 1337
# -----------------------------------------------------------------------------------------------------------
for _f in fields(GPTConfig):
    globals().setdefault(_f.name, _f.default)
DEFAULTS = plain_globals(globals())
# types of the keys that default to None; GPTConfig's take the one their annotation names (`int | None` -> int)
OPTIONAL_TYPES = dict(data_dir=str, train_tokens=int, val_tokens=int, tiktoken_file=str, vocab_size=int,
                      spike_factor=float, device=str, dtype=str, backend=str, peak_flops=float)
OPTIONAL_TYPES.update({k: get_args(hint)[0] for k, hint in get_type_hints(GPTConfig).items()
                       if type(None) in get_args(hint)})
# The train-split eval windows (loss and saturation) are analyze.py's: data.common.random_windows with this seed.
# So they are the same at every eval, and the same in every run with equal train_tokens and block_size.
EVAL_SEED = 1337
COLLAPSE_MARGIN = 0.1  # nats: a train loss this close to the budget's unigram entropy = token frequencies only


def derived_seed(*parts):
    """A seed determined by all of its parts (run seed, purpose, step, ...): independent reproducible streams."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), 'little') >> 1


def get_lr(it, cfg):
    if not cfg.decay_lr:
        return cfg.learning_rate
    if it < cfg.warmup_iters:  # linear warmup that never uses lr 0
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it > cfg.lr_decay_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / max(cfg.lr_decay_iters - cfg.warmup_iters, 1)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


def train_windows(seed, it, n_tokens, block_size, count):
    """Start offsets of the `count` training windows of step `it`. They depend on (seed, it) only, so a resumed
    or multi-process run sees exactly the windows of an uninterrupted single-process run. A window and its
    shifted targets lie inside the first n_tokens tokens: start <= n_tokens - block_size - 1."""
    g = torch.Generator().manual_seed(derived_seed(seed, 'train', it))
    return torch.randint(n_tokens - block_size, (count,), generator=g)


def get_batch(data, starts, block_size, device):
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype('int64')) for i in starts.tolist()])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype('int64')) for i in starts.tolist()])
    if 'cuda' in str(device):
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def read_log(path, keep):
    """The parseable records of a log.jsonl that satisfy keep(record) (a torn last line is dropped)."""
    records = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return [r for r in records if keep(r)]


def resolve(cfg, world_size):
    """Fill in the automatic choices (device, dtype, backend) and check the values, before anything is read."""
    try:
        cfg.device = pick_device(cfg.device)
        GPTConfig(**{f.name: getattr(cfg, f.name) for f in fields(GPTConfig)})  # the architecture's own checks
    except ValueError as e:
        raise SystemExit(f'error: {e}') from None
    cuda = cfg.device.startswith('cuda')
    if cfg.dtype is None:
        cfg.dtype = 'bfloat16' if cuda and torch.cuda.is_bf16_supported() else 'float32'
    if cfg.backend is None:
        cfg.backend = 'nccl' if cuda else 'gloo'
    checks = [(cfg.init_from in ('scratch', 'resume'), "init_from must be 'scratch' or 'resume'"),
              (cfg.init_from == 'resume' or cfg.overwrite or cfg.eval_only
               or not os.path.exists(os.path.join(cfg.out_dir, 'ckpt.pt')),
               f'{cfg.out_dir} already holds a run (ckpt.pt); pass --out_dir=NEW, --init_from=resume, '
               f'or --overwrite=True'),
              (cfg.dtype in ('float32', 'bfloat16'), "dtype must be 'float32' or 'bfloat16'"),
              (min(cfg.eval_interval, cfg.log_interval, cfg.eval_iters, cfg.batch_size, cfg.block_size,
                   cfg.gradient_accumulation_steps) > 0, 'eval_interval, log_interval, eval_iters, batch_size, '
               'block_size and gradient_accumulation_steps must be positive'),
              (cfg.max_iters >= 0, f'max_iters ({cfg.max_iters}) must be >= 0 (0 = evaluate the initial model)'),
              (cfg.gradient_accumulation_steps % world_size == 0,
               f"gradient_accumulation_steps ({cfg.gradient_accumulation_steps}) is the global number of "
               f"micro-batches and must be divisible by the number of processes ({world_size})"),
              ((cfg.eval_iters * cfg.batch_size) % world_size == 0,
               f"eval_iters x batch_size ({cfg.eval_iters * cfg.batch_size} eval windows) must be divisible by "
               f"the number of processes ({world_size})")]
    for ok, message in checks:
        if not ok:
            raise SystemExit(f'error: {message}')


def open_data(cfg, master, ddp):
    """(train tokens inside the budget, val tokens, meta); sets vocab_size; prepares the default corpus if missing."""
    try:
        default_missing = not os.path.exists(os.path.join(DATA_DIR, 'pydocs', 'meta.json'))
        if cfg.dataset == 'pydocs' and cfg.data_dir is None and default_missing:
            if master:
                from data.pydocs.prepare import prepare
                prepare()
            if ddp:
                dist.barrier()
        train, val = (load_split(cfg.dataset, s, data_dir=cfg.data_dir) for s in ('train', 'val'))
        meta = load_meta(cfg.dataset, data_dir=cfg.data_dir)
    except DataError as e:
        raise SystemExit(f'error: {e}') from None
    if cfg.vocab_size is None:
        cfg.vocab_size = -(-meta['vocab_size'] // 64) * 64
    elif cfg.vocab_size < meta['vocab_size']:
        raise SystemExit(f"error: vocab_size={cfg.vocab_size} is smaller than the dataset's vocabulary "
                         f"({meta['vocab_size']} in meta.json); use vocab_size=None (padded automatically)")
    n_train = len(train) if cfg.train_tokens is None else cfg.train_tokens
    if not cfg.block_size < n_train <= len(train):
        raise SystemExit(f'error: train_tokens={cfg.train_tokens} must be between block_size+1 ({cfg.block_size + 1}) '
                         f'and the size of the train split ({len(train):,} tokens)')
    val = val[:cfg.val_tokens]
    if len(val) <= cfg.block_size:
        raise SystemExit(f'error: the val split ({len(val):,} tokens, val_tokens={cfg.val_tokens}) is shorter than '
                         f'block_size+1 ({cfg.block_size + 1})')
    return train[:n_train], val, meta


def main(argv):
    cfg = SimpleNamespace(**configure(DEFAULTS, argv, OPTIONAL_TYPES, __doc__))
    ddp = 'RANK' in os.environ  # started by torchrun
    rank, local_rank, world = (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE')) if ddp else (0, 0, 1)
    master = rank == 0
    fsdp = cfg.fsdp and ddp  # a single process has nothing to shard
    resolve(cfg, world)
    device = cfg.device
    if ddp:
        if device.startswith('cuda'):
            device = f'cuda:{local_rank}'
            torch.cuda.set_device(device)
        dist.init_process_group(backend=cfg.backend)
    device_type = device.split(':')[0]
    ptdtype = getattr(torch, cfg.dtype)
    ctx = nullcontext() if ptdtype == torch.float32 else torch.autocast(device_type, dtype=ptdtype)
    if device_type == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    train_data, val_data, meta = open_data(cfg, master, ddp)
    n_train, T, B = len(train_data), cfg.block_size, cfg.batch_size
    entropy = unigram_entropy(train_data)  # the loss of predicting token frequencies only: a collapsed model's
    micro_steps = cfg.gradient_accumulation_steps // world  # per process
    tokens_per_iter = B * cfg.gradient_accumulation_steps * T
    config = vars(cfg).copy()
    model_args = {f.name: config[f.name] for f in fields(GPTConfig)}
    writing = master and not cfg.eval_only
    log_path = os.path.join(cfg.out_dir, 'log.jsonl')
    if master:
        print('config:\n' + '\n'.join(f'  {k} = {v!r}' for k, v in config.items()))
        print(f'global batch: {B * cfg.gradient_accumulation_steps} sequences x {T} tokens = {tokens_per_iter:,} '
              f'tokens/step ({world} process(es) x {micro_steps} micro-batch(es) of {B}); budget {n_train:,} '
              f'train tokens (unigram entropy {entropy:.3f} nats), {len(val_data):,} val tokens')

    # model, optionally resumed; any architecture change on resume is an error (dropout is training, not shape)
    torch.manual_seed(cfg.seed)
    model = GPT(GPTConfig(**model_args))
    iter_num, best_val_loss, best_iter, guard, last_eval = 0, float('inf'), None, {}, None
    if cfg.init_from == 'resume':
        ckpt_path = os.path.join(cfg.out_dir, 'ckpt.pt')
        try:  # model.py's reader: clear errors for a missing, corrupt or foreign file (checked on 'meta': no copy)
            _, ckpt = load_checkpoint(ckpt_path, device='meta')
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"error: init_from='resume': {e}") from None
        missing = [k for k in ('optimizer', 'config', 'iter_num', 'best_val_loss', 'best_iter', 'guard',
                               'last_eval', 'sampler') if k not in ckpt]
        if missing:
            raise SystemExit(f"error: {ckpt_path} lacks {', '.join(missing)}: it was not written by this train.py "
                             "and cannot be resumed exactly; start a new run in a new out_dir")
        changed = [f'{k} (checkpoint {ckpt["model_args"].get(k)!r}, config {v!r})'
                   for k, v in model_args.items() if ckpt['model_args'].get(k) != v and k != 'dropout']
        if changed:
            raise SystemExit('error: the config changes the architecture of the run being resumed: '
                             + ', '.join(changed) + ". Keep the checkpoint's values or use a new out_dir.")
        notes = []
        if ckpt['model_args'].get('dropout') != cfg.dropout:
            notes.append(f"note: dropout changes from {ckpt['model_args'].get('dropout')} to {cfg.dropout}")
        if ckpt['config'].get('dataset') != cfg.dataset:
            notes.append(f"warning: resuming a run trained on dataset {ckpt['config'].get('dataset')!r} "
                         f"with dataset {cfg.dataset!r}")
        if (ckpt['sampler']['seed'], ckpt['sampler']['train_tokens']) != (cfg.seed, n_train):
            notes.append(f"warning: resuming with seed/train_tokens {cfg.seed}/{n_train:,} where the checkpoint "
                         f"has {ckpt['sampler']['seed']}/{ckpt['sampler']['train_tokens']:,}: the data order changes")
        if master and notes:
            print('\n'.join(notes))
        model.load_state_dict(ckpt['model'])  # train.py saves the raw model's state: no prefixes to strip
        moments = ckpt['optimizer']['state'].get('embed_scale', {})  # 0-dim in checkpoints of older versions
        moments.update({k: v.reshape(1) for k, v in moments.items() if k != 'step' and v.dim() == 0})
        iter_num, best_val_loss, best_iter = ckpt['iter_num'], ckpt['best_val_loss'], ckpt['best_iter']
        guard, last_eval = ckpt['guard'], ckpt['last_eval']
    model.to(device)
    raw_model = model  # the unwrapped module: evaluation, statistics and checkpoints
    if fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=ptdtype, reduce_dtype=torch.float32)
        for block in model.transformer.h:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type)
    full_state = StateDictOptions(full_state_dict=True, cpu_offload=True)  # one ordinary file, even from FSDP shards
    if cfg.init_from == 'resume':
        set_optimizer_state_dict(model, optimizer, ckpt['optimizer'], options=StateDictOptions(full_state_dict=True))
        del ckpt
    if cfg.compile:
        model = torch.compile(model)
    if ddp and not fsdp:
        # the norm layers' statistics buffers are accumulators, not state: never broadcast them
        model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None, broadcast_buffers=False)

    train_eval_starts = torch.from_numpy(random_windows(n_train, cfg.eval_iters * B, T + 1, seed=EVAL_SEED))
    val_starts = torch.linspace(0, len(val_data) - T - 1, cfg.eval_iters * B).long()  # evenly spread, fixed

    @torch.no_grad()
    def evaluate(data, starts):
        """Mean loss over the windows; each process takes an equal share, the sums are all-reduced."""
        raw_model.eval()
        total = torch.zeros(2, device=device)
        for xs in starts.tensor_split(world)[rank].split(B):
            X, Y = get_batch(data, xs, T, device)
            with ctx:
                _, loss = raw_model(X, Y)
            total += torch.stack([loss.float() * len(xs), torch.tensor(float(len(xs)), device=device)])
        if ddp:
            dist.all_reduce(total)
        raw_model.train()
        return (total[0] / total[1]).item()

    def eval_record(it):
        raw_model.track_norm_stats(True)  # saturation etc. from the train windows, as the study measures it
        train_loss = evaluate(train_data, train_eval_starts)
        raw_model.track_norm_stats(False)
        if ddp:  # the statistics buffers hold sums: add up every process's share
            for _, layer in raw_model.norm_layers():
                for buf in layer.buffers():
                    dist.all_reduce(buf)
        stats = raw_model.norm_stats()  # under FSDP every process takes part: alpha is gathered from its shards
        return {'event': 'eval', 'iter': it, 'train_loss': train_loss, 'val_loss': evaluate(val_data, val_starts),
                'lr': get_lr(it, cfg), 'tokens': it * tokens_per_iter, 'epochs': it * tokens_per_iter / n_train,
                'saturation': stats['saturation'], 'thresholds': stats['thresholds'],
                'norm_layers': {name: {k: s[k] for k in ('kind', 'alpha', 'input_std', 'saturation')}
                                for name, s in stats['layers'].items()}}

    def collapse_signs(record):
        """The signs of a collapsed run (seen with DyT at small scale): train loss still at the unigram level after
        warmup, or a norm layer saturated (its output is then sign(x) * gamma, whatever the token)."""
        signs = []
        if record['iter'] > cfg.warmup_iters and record['train_loss'] > entropy - COLLAPSE_MARGIN:
            signs.append(f"train loss {record['train_loss']:.3f} is at the unigram level of the budget ({entropy:.3f} "
                         f"nats) after warmup: the model predicts token frequencies only (collapsed?)")
        at_2 = record['thresholds'].index(2.0)
        full = [name for name, s in record['norm_layers'].items() if s['saturation'] and s['saturation'][at_2] > 0.99]
        if full:
            signs.append(f"norm layers saturated (|alpha x| > 2 for over 99% of inputs): {', '.join(full)}")
        return signs

    def save_checkpoints(it, improved):
        """ckpt.pt (latest) and, when val loss improved, best.pt: written after the optimizer step of
        iteration it-1, so iter_num = it is the next iteration to run. Collective under FSDP."""
        names = (['ckpt.pt'] if cfg.always_save_checkpoint or improved or it >= cfg.max_iters else []) \
            + (['best.pt'] if improved else [])  # the same on every process: improved comes from all-reduced losses
        if not names:  # gathering the full state is costly, and collective: every process decides alike
            return
        state = {'model': get_model_state_dict(raw_model, options=full_state),
                 'optimizer': get_optimizer_state_dict(raw_model, optimizer, options=full_state),
                 'model_args': model_args, 'config': config, 'iter_num': it, 'best_val_loss': best_val_loss,
                 'best_iter': best_iter, 'tokenizer': meta['tokenizer'], 'guard': guard, 'last_eval': last_eval,
                 # data order and dropout masks are functions of (seed, iter): this is the whole sampler state
                 'sampler': {'seed': cfg.seed, 'train_tokens': n_train, 'block_size': T, 'eval_seed': EVAL_SEED}}
        if writing:
            for name in names:
                atomic_write(os.path.join(cfg.out_dir, name), lambda f: torch.save(state, f))

    def log(record):
        if writing:
            with open(log_path, 'a') as f:
                f.write(json.dumps(record) + '\n')
            if cfg.wandb_log:
                wandb.log(record, step=record['iter'])

    if writing:
        os.makedirs(cfg.out_dir, exist_ok=True)
        if cfg.init_from == 'scratch':  # a run replaced with --overwrite leaves no file to mix with this one
            for name in ('ckpt.pt', 'best.pt', 'summary.json'):
                if os.path.exists(os.path.join(cfg.out_dir, name)):
                    os.remove(os.path.join(cfg.out_dir, name))
        write_json(os.path.join(cfg.out_dir, 'config.json'), config)
        # a resumed log keeps what happened up to the checkpoint (its eval included), a new run starts afresh
        kept = read_log(log_path, lambda r: r['iter'] < iter_num or (r['iter'] == iter_num and r['event'] == 'eval')) \
            if cfg.init_from == 'resume' else []
        atomic_write(log_path, lambda f: f.write(''.join(json.dumps(r) + '\n' for r in kept).encode()))
        if cfg.wandb_log:
            import wandb
            wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name, config=config)

    t_start = time.time()
    start_iter, diverged = iter_num, None
    t_log, steps_since_log = time.time(), 0
    while True:
        # a resumed checkpoint's evaluation is already in the log
        already_done = iter_num == start_iter and cfg.init_from == 'resume'
        if cfg.eval_only or (iter_num % cfg.eval_interval == 0 or iter_num >= cfg.max_iters) and not already_done:
            record = eval_record(iter_num)
            if not (math.isfinite(record['train_loss']) and math.isfinite(record['val_loss'])):
                diverged = (f"non-finite eval loss at iter {iter_num} (train {record['train_loss']}, "
                            f"val {record['val_loss']})")
                break
            improved = record['val_loss'] < best_val_loss
            if improved:
                best_val_loss, best_iter = record['val_loss'], iter_num
            record.update(best_val_loss=best_val_loss, best_iter=best_iter, warnings=collapse_signs(record))
            last_eval = record
            log(record)
            sat = record['saturation']
            if master:
                print(f"step {iter_num}: train loss {record['train_loss']:.4f}, val loss {record['val_loss']:.4f} "
                      f"(best {best_val_loss:.4f} @ {best_iter}), epochs {record['epochs']:.2f}"
                      + (f", saturation@2.0 {sat[record['thresholds'].index(2.0)]:.3f}" if sat else '')
                      + ''.join(f'\n  warning: {w}' for w in record['warnings']))
            if cfg.eval_only:
                break
            save_checkpoints(iter_num, improved)
            t_log, steps_since_log = time.time(), 0  # throughput excludes evaluation and checkpointing
        if iter_num >= cfg.max_iters or cfg.eval_only:
            break

        # one optimizer step on the windows of this iteration; this process takes its share of micro-batches
        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:
            group['lr'] = lr
        torch.manual_seed(derived_seed(cfg.seed, 'dropout', rank, iter_num))  # dropout masks: a function of the step
        starts = train_windows(cfg.seed, iter_num, n_train, T, B * cfg.gradient_accumulation_steps)
        loss_sum = torch.zeros((), device=device)
        for micro in range(micro_steps):
            last = micro == micro_steps - 1  # gradients are synchronised on the last micro-step only
            if fsdp:
                raw_model.set_requires_gradient_sync(last)
            elif ddp:
                model.require_backward_grad_sync = last
            X, Y = get_batch(train_data, starts[(rank * micro_steps + micro) * B:][:B], T, device)
            with ctx:
                _, loss = model(X, Y)
            (loss / micro_steps).backward()
            loss_sum += loss.detach().float()
        grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip or float('inf'))
        if hasattr(grad_norm, 'full_tensor'):  # a DTensor under FSDP
            grad_norm = grad_norm.full_tensor()
        step_stats = torch.stack([loss_sum / micro_steps, grad_norm.float()])
        if ddp:
            dist.all_reduce(step_stats)
            step_stats /= world
        loss_f, norm_f = step_stats.tolist()  # the same on every process, so all take the same decision
        if not (math.isfinite(loss_f) and math.isfinite(norm_f)):
            diverged = f'non-finite loss ({loss_f}) or gradient norm ({norm_f}) at iter {iter_num}'
        elif cfg.spike_factor and guard.get('best_ema') and loss_f > cfg.spike_factor * guard['best_ema']:
            diverged = (f"loss spike at iter {iter_num}: {loss_f:.4f} > spike_factor {cfg.spike_factor} x best "
                        f"smoothed loss {guard['best_ema']:.4f}")
        if diverged:
            break
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ema = loss_f if 'ema' not in guard else 0.9 * guard['ema'] + 0.1 * loss_f
        guard = {'ema': ema, 'best_ema': min(ema, guard.get('best_ema', ema))}
        steps_since_log += 1
        iter_num += 1

        if (iter_num - 1) % cfg.log_interval == 0 or iter_num == cfg.max_iters:
            dt = (time.time() - t_log) / steps_since_log
            mfu = raw_model.estimate_mfu(B * micro_steps, dt, cfg.peak_flops)
            record = {'event': 'step', 'iter': iter_num - 1, 'loss': loss_f, 'lr': lr, 'grad_norm': norm_f,
                      'tokens': iter_num * tokens_per_iter, 'epochs': iter_num * tokens_per_iter / n_train,
                      'tokens_per_sec': tokens_per_iter / dt, 'mfu': mfu, 'ms_per_iter': 1000 * dt}
            log(record)
            if master:
                print(f"iter {iter_num - 1}: loss {loss_f:.4f}, lr {lr:.2e}, grad norm {norm_f:.3f}, "
                      f"{record['tokens_per_sec']:,.0f} tokens/s, {1000 * dt:.1f} ms/iter"
                      + (f', mfu {100 * mfu:.1f}%' if mfu is not None else ''))
            t_log, steps_since_log = time.time(), 0

    if diverged:
        if master:
            print(f'DIVERGED: {diverged}. Stopped; the checkpoints in {cfg.out_dir} are the last good ones.',
                  file=sys.stderr)
        log({'event': 'diverged', 'iter': iter_num, 'diverged': True, 'reason': diverged})
    if writing:
        layers = (last_eval or {}).get('norm_layers', {})
        write_json(os.path.join(cfg.out_dir, 'summary.json'), {
            'final_iter': last_eval and last_eval['iter'], 'final_val_loss': last_eval and last_eval['val_loss'],
            'final_train_loss': last_eval and last_eval['train_loss'],
            'best_val_loss': best_val_loss if best_iter is not None else None, 'best_iter': best_iter,
            'saturation': last_eval and last_eval['saturation'], 'thresholds': last_eval and last_eval['thresholds'],
            'saturation_layers': {k: v['saturation'] for k, v in layers.items() if v['saturation'] is not None},
            'alphas': {k: v['alpha'] for k, v in layers.items() if v['alpha'] is not None},
            'iters': iter_num, 'tokens': iter_num * tokens_per_iter, 'epochs': iter_num * tokens_per_iter / n_train,
            'wall_time_s': time.time() - t_start, 'diverged': bool(diverged), 'diverged_reason': diverged,
            'diverged_iter': iter_num if diverged else None, 'n_params': raw_model.get_num_params(),
            'budget_tokens': n_train, 'unigram_entropy': entropy, 'warnings': (last_eval or {}).get('warnings'),
            'config': config})
        if cfg.wandb_log:
            wandb.finish()
    if ddp:
        dist.destroy_process_group()
    return 3 if diverged else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
