"""
Train a GPT variant (model.py) on a tokenized corpus, or a ViT on CIFAR-10, on a CPU or with torchrun.

  python train.py                                   # tiny model on the offline pydocs corpus: about a minute on 2 CPU cores
  python train.py config/gpt2_64m_dyt.py --train_tokens=1_000_000 --seed=42 --out_dir=out/dyt_1M_s42
  torchrun --standalone --nproc_per_node=8 train.py config/gpt2_64m_dyt.py --init_from=auto  # resume if out_dir has a run
  python train.py config/vit_cifar10_dyt.py                     # image data: the model is a ViT

Config (nanoGPT's convention, configurator.py): the globals below, then config files, then --key=value; every
GPTConfig/ViTConfig field is a key too (`python train.py --help` lists them). Writes to out_dir: config.json,
log.jsonl, ckpt.pt (every eval), best.pt (best val loss), summary.json (with "status": "finished" or "diverged").
SIGTERM, SIGUSR1 (Slurm's --signal) and Ctrl-C stop at the next step with ckpt.pt written. Exit status: 0
finished, 3 diverged, 4 stopped by a signal, 1 error (torchrun reports any non-zero status as 1: README "Training").
"""
import importlib.util
import json
import math
import os
import signal
import sys
import time
from dataclasses import fields
from datetime import timedelta
from types import SimpleNamespace
from typing import get_args, get_type_hints

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from batches import derived_seed, micro_batches, open_training_data
from checkpoint import (load_training_state, prepare_run_dir, read_resume_checkpoint, save_checkpoint, training_state,
                        write_summary)
from configurator import configure, plain_globals
from data.common import DATA_DIR, DataError
from memory import memory_plan_lines
from model import GPTConfig, ViTConfig, build_model, pick_device, precision

# -----------------------------------------------------------------------------------------------------------
# default config: a tiny model on the offline pydocs corpus (byte-level) that learns visibly in about a minute on 2 CPU cores
# I/O
out_dir = 'out'
eval_interval = 100
log_interval = 10
eval_iters = 10  # batches per split per evaluation (image data: val is always the whole test set)
eval_only = False
always_save_checkpoint = True  # False: ckpt.pt only rewritten when val loss improves, and at the end (nanoGPT)
init_from = 'scratch'  # 'scratch', 'resume' (from out_dir/ckpt.pt) or 'auto' (resume if there is one: requeued jobs)
overwrite = False  # a scratch run refuses an out_dir that holds a run (sweeps must not clobber each other)
wandb_log = False
wandb_project = 'nanonorm'
wandb_run_name = 'run'
# data: token data trains a GPT, image data (cifar10) a ViT
dataset = 'pydocs'
data_dir = None  # folder with train.bin, val.bin, meta.json; None = data/<dataset>
train_tokens = None  # data budget: random windows inside the first train_tokens train tokens only; None = all
val_tokens = None  # evaluate on the first val_tokens val tokens (the same for every budget); None = all
tiktoken_file = None  # GPT-2 .tiktoken ranks file for offline machines (recorded for sample.py)
gradient_accumulation_steps = 1  # micro-batches per step in all (batch_size x this = samples per step)
batch_size = 16  # samples (sequences or images) per micro-batch, at most
block_size = 128  # tokens per sequence (a ViT's come from image_size and patch_size)
# model (every other GPTConfig/ViTConfig field is a key with its default; a ViT's image size and classes come from the data)
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
fsdp = False  # under torchrun: shard parameters, gradients and optimizer state with FSDP2 (the 3.78b configs)
fsdp_shard = 0  # HSDP: shard within groups of this many processes (a node's GPUs), replicate across them; 0 = all
peak_flops = None  # the device's peak FLOP/s for MFU; None = model.peak_flops (known GPUs by name and dtype; no MFU on CPU)
seed = 1337
# -----------------------------------------------------------------------------------------------------------
DATA_DIMS = ('image_size', 'channels', 'n_classes')  # a ViT's, from the data
for _f in fields(ViTConfig):
    if _f.init and _f.name not in DATA_DIMS:
        globals().setdefault(_f.name, _f.default)
DEFAULTS = plain_globals(globals())
# types of the keys that default to None; the configs' take the one their annotation names (`int | None` -> int)
OPTIONAL_TYPES = dict(data_dir=str, train_tokens=int, val_tokens=int, tiktoken_file=str, vocab_size=int,
                      spike_factor=float, device=str, dtype=str, backend=str, peak_flops=float)
OPTIONAL_TYPES.update({k: get_args(hint)[0] for k, hint in get_type_hints(GPTConfig).items()
                       if type(None) in get_args(hint)})
EVAL_SEED = 1337  # the fixed train-split eval samples: for token data analyze.py's (data.common.random_windows)
COLLAPSE_MARGIN = 0.1  # nats: a train loss this close to the entropy of the token (class) frequencies
EXIT_DIVERGED, EXIT_STOPPED = 3, 4
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
COLLECTIVE_TIMEOUT = timedelta(minutes=60)  # rank 0 writes a 3.78b checkpoint (45 GB) while the others wait


def get_lr(it, cfg):
    if not cfg.decay_lr:
        return cfg.learning_rate
    if it < cfg.warmup_iters:  # linear warmup that never uses lr 0
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it > cfg.lr_decay_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / max(cfg.lr_decay_iters - cfg.warmup_iters, 1)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


def main(argv):
    cfg = SimpleNamespace(**configure(DEFAULTS, argv, OPTIONAL_TYPES, __doc__))
    handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        env = setup(cfg)
        meta, data = open_data(cfg, env)
        run = start_run(cfg, env, meta, data)
        if run is None:  # the run in out_dir is already complete
            return 0
        status = train(cfg, env, run)
        finish(cfg, env, run, status)
        return {'finished': 0, 'diverged': EXIT_DIVERGED, 'stopped': EXIT_STOPPED}[status]
    finally:  # main() may be called again in the same process (tests, notebooks)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)

# ----------------------------------------------------------------------------------------------- setup and data


def setup(cfg):
    """Processes (torchrun's variables, or Slurm's under srun), device, precision and the stop signals."""
    if 'RANK' not in os.environ and int(os.environ.get('SLURM_NTASKS', 1)) > 1:  # srun: one task per GPU
        if 'MASTER_ADDR' not in os.environ:
            raise SystemExit('error: under srun, export MASTER_ADDR (the first node) and MASTER_PORT (README "Training")')
        os.environ.update(RANK=os.environ['SLURM_PROCID'], LOCAL_RANK=os.environ['SLURM_LOCALID'],
                          WORLD_SIZE=os.environ['SLURM_NTASKS'], MASTER_PORT=os.environ.get('MASTER_PORT', '29500'))
    ddp = 'RANK' in os.environ
    rank, local_rank, world = (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE')) if ddp else (0, 0, 1)
    resolve(cfg, world)
    device = cfg.device
    if ddp:
        if device.startswith('cuda'):
            device = f'cuda:{local_rank}'
            torch.cuda.set_device(device)
        dist.init_process_group(backend=cfg.backend, timeout=COLLECTIVE_TIMEOUT)
    env = SimpleNamespace(ddp=ddp, fsdp=cfg.fsdp and ddp, ddp_module=None, rank=rank, local_rank=local_rank, world=world,
                          master=rank == 0, device=device, device_type=device.split(':')[0],
                          ptdtype=getattr(torch, cfg.dtype), ctx=precision(device, cfg.dtype)[1], stop=[])

    def request_stop(signum, frame):  # acted on at the next step, by every process at once
        env.stop.append(signal.Signals(signum).name)
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C aborts at once
    for sig in STOP_SIGNALS:
        signal.signal(sig, request_stop)
    return env


def resolve(cfg, world):
    """Fill in device, dtype, backend and init_from=auto; check every value before anything is read or written."""
    try:
        cfg.device = pick_device(cfg.device)
        GPTConfig(**{f.name: getattr(cfg, f.name) for f in fields(GPTConfig)})  # the architecture's own checks
    except ValueError as e:
        raise SystemExit(f'error: {e}') from None
    cfg.dtype = precision(cfg.device, cfg.dtype)[0]
    cfg.backend = cfg.backend or ('nccl' if cfg.device.startswith('cuda') else 'gloo')
    has_run = os.path.exists(os.path.join(cfg.out_dir, 'ckpt.pt'))
    if cfg.init_from == 'auto':
        cfg.init_from = 'resume' if has_run else 'scratch'
    checks = [(cfg.init_from in ('scratch', 'resume'), "init_from must be 'scratch', 'resume' or 'auto'"),
              (cfg.init_from == 'resume' or cfg.overwrite or cfg.eval_only or not has_run,
               f'{cfg.out_dir} already holds a run (ckpt.pt); pass --out_dir=NEW, --init_from=resume (or auto), '
               f'or --overwrite=True'),
              (cfg.dtype in ('float32', 'bfloat16'), "dtype must be 'float32' or 'bfloat16'"),
              (min(cfg.eval_interval, cfg.log_interval, cfg.eval_iters, cfg.batch_size, cfg.block_size,
                   cfg.gradient_accumulation_steps) > 0, 'eval_interval, log_interval, eval_iters, batch_size, '
               'block_size and gradient_accumulation_steps must be positive'),
              (cfg.max_iters >= 0, f'max_iters ({cfg.max_iters}) must be >= 0 (0 = evaluate the initial model)'),
              (world == 1 or not cfg.fsdp_shard or cfg.fsdp and world % cfg.fsdp_shard == 0,
               f'fsdp_shard={cfg.fsdp_shard} needs fsdp=True and must divide the {world} processes (a node\'s GPUs)'),
              (not cfg.wandb_log or importlib.util.find_spec('wandb'),
               'wandb_log=True, but wandb is not installed (pip install wandb)')]
    for n, what in ((cfg.batch_size * cfg.gradient_accumulation_steps, 'samples per step (batch_size x '
                     'gradient_accumulation_steps)'), (cfg.eval_iters * cfg.batch_size, 'eval_iters x batch_size eval samples')):
        checks.append((n <= 0 or all(c > 0 for r in range(world) for _, c in micro_batches(n, world, r, cfg.batch_size)),
                       f'the {n} {what} are too few to give each of {world} processes the same number of '
                       'micro-batches; raise them or use fewer processes'))
    for ok, message in checks:
        if not ok:
            raise SystemExit(f'error: {message}')


def open_data(cfg, env):
    """(meta.json, batches.TokenData or ImageData); sets vocab_size; prepares the default corpus if missing."""
    try:
        if cfg.dataset == 'pydocs' and cfg.data_dir is None and not os.path.exists(
                os.path.join(DATA_DIR, 'pydocs', 'meta.json')):
            if env.master:
                from data.pydocs.prepare import prepare
                prepare()
            if env.ddp:
                dist.barrier()
        meta, data = open_training_data(cfg.dataset, cfg.data_dir, cfg.block_size, cfg.train_tokens, cfg.val_tokens,
                                        cfg.eval_iters * cfg.batch_size, EVAL_SEED)
    except DataError as e:
        raise SystemExit(f'error: {e}') from None
    if data.unit == 'tokens' and cfg.vocab_size is None:
        cfg.vocab_size = -(-meta['vocab_size'] // 64) * 64
    elif data.unit == 'tokens' and cfg.vocab_size < meta['vocab_size']:
        raise SystemExit(f"error: vocab_size={cfg.vocab_size} is smaller than the dataset's vocabulary "
                         f"({meta['vocab_size']} in meta.json); use vocab_size=None (padded automatically)")
    return meta, data

# ------------------------------------------------------------------------------------------------ the model


def start_run(cfg, env, meta, data):
    """The loop's model, optimizer and state (new or resumed), out_dir prepared; None if out_dir's run is complete."""
    config = vars(cfg).copy()
    arch = ViTConfig if data.unit == 'images' else GPTConfig  # the model follows the data
    model_args = {f.name: config[f.name] for f in fields(arch) if f.init and f.name not in DATA_DIMS} | data.dims
    try:
        model_config = arch(**model_args)
    except ValueError as e:
        raise SystemExit(f'error: {e}') from None
    ckpt = read_resume_checkpoint(cfg, model_args, data.n_train, env.master) if cfg.init_from == 'resume' else None
    if ckpt and ckpt['iter_num'] >= cfg.max_iters and not cfg.eval_only \
            and os.path.exists(os.path.join(cfg.out_dir, 'summary.json')):
        if env.master:
            print(f"{cfg.out_dir} is already at max_iters={cfg.max_iters} (iter {ckpt['iter_num']}): nothing to do; "
                  "raise --max_iters to continue")
        if env.ddp:
            dist.destroy_process_group()
        return None
    samples = cfg.batch_size * cfg.gradient_accumulation_steps
    micro = micro_batches(samples, env.world, 0, cfg.batch_size)
    if env.master:
        print('config:\n' + '\n'.join(f'  {k} = {v!r}' for k, v in config.items()))
    if env.master and data.unit == 'tokens':  # before the model exists: told before it runs out of memory
        shards = min(cfg.fsdp_shard or env.world, env.world)  # the processes a parameter is sharded over
        for line in memory_plan_lines(model_config, max(c for _, c in micro), shards, env.fsdp, env.ptdtype,
                                      cfg.compile, env.device):
            print(line)
    raw, model = build(cfg, model_args, env)
    optimizer = raw.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), env.device_type)
    state = dict(iter_num=0, best_val_loss=float('inf'), best_iter=None, guard={}, last_eval=None, wall_time_s=0.0)
    if ckpt:
        load_training_state(raw, optimizer, ckpt, env)
        state.update({k: ckpt.get(k, state[k]) for k in state})
        del ckpt
    run = SimpleNamespace(raw=raw, model=model, optimizer=optimizer, state=state, meta=meta, config=config,
                          model_args=model_args, data=data, samples=samples, prefetched={},
                          resumed=cfg.init_from == 'resume', writing=env.master and not cfg.eval_only,
                          log_path=os.path.join(cfg.out_dir, 'log.jsonl'))
    if env.master:
        kind = f'ViT, patch {cfg.patch_size}, {cfg.pool} pooling' if data.unit == 'images' else f'{cfg.pos} positions'
        print(f'model: {raw.get_num_params():,} parameters ({cfg.norm}, {cfg.attn} attention, {cfg.mlp} MLP, {kind})')
        shape = f'sequences x {cfg.block_size} tokens = {samples * cfg.block_size:,} tokens' if data.unit == 'tokens' \
            else 'images'
        print(f'global batch: {samples} {shape}/step ({env.world} process(es) x {len(micro)} micro-batch(es) of <= '
              f'{cfg.batch_size}); budget {data.n_train:,} train {data.unit} (entropy of the {data.predicted} '
              f'frequencies {data.entropy:.3f} nats)')
        if run.resumed:
            print(f"resuming {cfg.out_dir} at iter {state['iter_num']} (best val loss {state['best_val_loss']:.4f})")
    if run.writing:
        prepare_run_dir(cfg.out_dir, config, state['iter_num'] if run.resumed else None)
        if cfg.wandb_log:
            import wandb
            wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name, config=config)
    return run


def build(cfg, model_args, env):
    """(raw model, the module the training step calls): DDP then compile (the gradient all-reduce overlaps the
    compiled backward: DDPOptimizer splits the graph at bucket boundaries), or under FSDP each block compiled, then
    sharded, materialised only as shards. fp32 weights with bf16 autocast either way: every scale, the same numerics."""
    torch.manual_seed(cfg.seed)
    if not env.fsdp:
        raw = build_model(model_args).to(env.device)
        env.ddp_module = DDP(raw, device_ids=[env.local_rank] if env.device_type == 'cuda' else None,
                             broadcast_buffers=False) if env.ddp else None  # statistics buffers are sums: not broadcast
        model = env.ddp_module or raw
        return raw, torch.compile(model) if cfg.compile else model
    from torch.distributed.fsdp import fully_shard
    with torch.device('meta'):  # no process ever holds the whole model
        raw = build_model(model_args)
    if cfg.compile:  # the blocks one by one (FSDP's hooks stay outside the graphs), and the output layer + loss
        for block in raw.transformer.h:
            block.forward = torch.compile(block.forward)
        raw.head_loss = torch.compile(raw.head_loss)
    mesh = None
    if cfg.fsdp_shard:  # a 2-D mesh: gathers stay inside a node, one gradient all-reduce crosses nodes
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(env.device_type, (env.world // cfg.fsdp_shard, cfg.fsdp_shard),
                                mesh_dim_names=('replicate', 'shard'))
    for block in raw.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(raw, mesh=mesh)
    raw.materialize(env.device)  # the weights of the unsharded init with the same seed, shard by shard
    return raw, raw

# ------------------------------------------------------------------------------------------------- the loop


def train(cfg, env, run):
    """The loop: evaluate and checkpoint every eval_interval steps, one optimizer step otherwise, until max_iters,
    divergence or a stop signal. Returns 'finished', 'diverged' or 'stopped'."""
    s = run.state
    t_start, start_iter = time.time(), s['iter_num']
    t_log, steps_since_log, first_interval, stop = time.time(), 0, True, False
    status = 'finished'
    while True:
        it, saved = s['iter_num'], False
        already_done = it == start_iter and run.resumed  # a resumed checkpoint's evaluation is already in the log
        if cfg.eval_only or (it % cfg.eval_interval == 0 or it >= cfg.max_iters) and not already_done:
            record = evaluate(cfg, env, run, it)
            if record is None or cfg.eval_only:  # None: a non-finite eval loss
                break
            saved = save_checkpoints(cfg, env, run, it, record['improved'], t_start)
            t_log, steps_since_log = time.time(), 0  # throughput excludes evaluation and checkpointing
        if it >= cfg.max_iters:
            break
        if stop:  # agreed by every process during the last step
            if not saved:
                save_checkpoints(cfg, env, run, it, False, t_start, force=True)
            status = 'stopped'
            break
        loss, grad_norm, stop = train_step(cfg, env, run, it)
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            s['diverged'] = f'non-finite loss ({loss}) or gradient norm ({grad_norm}) at iter {it}'
        elif cfg.spike_factor and s['guard'].get('best_ema') and loss > cfg.spike_factor * s['guard']['best_ema']:
            s['diverged'] = (f"loss spike at iter {it}: {loss:.4f} > spike_factor {cfg.spike_factor} x best "
                             f"smoothed loss {s['guard']['best_ema']:.4f}")
        if s.get('diverged'):
            break
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        ema = loss if 'ema' not in s['guard'] else 0.9 * s['guard']['ema'] + 0.1 * loss
        s['guard'] = {'ema': ema, 'best_ema': min(ema, s['guard'].get('best_ema', ema))}
        s['iter_num'] = it + 1
        steps_since_log += 1
        if it % cfg.log_interval == 0 or it + 1 == cfg.max_iters:
            dt = (time.time() - t_log) / steps_since_log
            log_step(cfg, env, run, it, loss, grad_norm, None if first_interval else dt)
            t_log, steps_since_log, first_interval = time.time(), 0, False
    s['wall_time_s'] += time.time() - t_start
    return 'diverged' if s.get('diverged') else status  # s['diverged'] holds the reason


def train_step(cfg, env, run, it):
    """Forward and backward of this process's micro-batches of step `it`, gradients clipped. Returns the step's
    mean loss and gradient norm, and whether a stop signal arrived anywhere: the same on every process."""
    for group in run.optimizer.param_groups:
        group['lr'] = get_lr(it, cfg)
    if cfg.dropout > 0:  # dropout masks: a function of the step (reseeding costs ~0.4 ms, so only when needed)
        torch.manual_seed(derived_seed(cfg.seed, 'dropout', env.rank, it))
    parts = micro_batches(run.samples, env.world, env.rank, cfg.batch_size)

    def micro_batch(samples, k):  # (inputs, targets) of this process's k-th micro-batch of a step, on the device
        first, count = parts[k]
        return run.data.batch('train', samples[first:first + count], env.device)
    samples, batch = run.prefetched.pop(it, (None, None))  # drawn and copied during the previous step
    if samples is None:
        samples = run.data.draw(cfg.seed, it, run.samples)
        batch = micro_batch(samples, 0)
    loss_sum = torch.zeros((), device=env.device)
    for k, (_, count) in enumerate(parts):
        if env.ddp_module:  # DDP all-reduces on the last micro-step only; FSDP reduce-scatters every one
            env.ddp_module.require_backward_grad_sync = k == len(parts) - 1
        with env.ctx:
            _, loss = run.model(*batch)
        if k + 1 < len(parts):  # the next micro-batch's copy overlaps this backward
            batch = micro_batch(samples, k + 1)
        # weighted by its share of the step: the gradients' average over processes is the step's mean
        (loss * (count * env.world / run.samples)).backward()
        loss_sum += loss.detach().float() * (count / run.samples)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.raw.parameters(), cfg.grad_clip or float('inf'))
    if hasattr(grad_norm, 'full_tensor'):  # a DTensor under FSDP
        grad_norm = grad_norm.full_tensor()
    stats = torch.stack([loss_sum, grad_norm.float() / env.world,
                         torch.tensor(float(bool(env.stop)), device=env.device)])
    if env.ddp:
        dist.all_reduce(stats)
    if it + 1 < cfg.max_iters:  # the next step's first micro-batch, copied while the device is still busy
        following = run.data.draw(cfg.seed, it + 1, run.samples)
        run.prefetched = {it + 1: (following, micro_batch(following, 0))}
    loss, grad_norm, stop = stats.tolist()  # the step's one host sync; the same on every process
    return loss, grad_norm, stop > 0

# ------------------------------------------------------------------------------------ evaluation and records


@torch.no_grad()
def mean_loss(cfg, env, run, split):
    """Mean loss and accuracy (next token, or class) over the split's eval samples, shared out over the processes."""
    run.raw.eval()
    ids = run.data.eval_ids[split]
    sums = torch.zeros(2, device=env.device)  # loss x samples, correct predictions
    for first, count in micro_batches(len(ids), env.world, env.rank, cfg.batch_size):
        x, y = run.data.batch(split, ids[first:first + count], env.device)
        with env.ctx:
            logits, loss = run.raw(x, y)
        sums += torch.stack([loss.float() * count, (logits.argmax(-1) == y).sum().float()])
    if env.ddp:
        dist.all_reduce(sums)
    run.raw.train()
    loss, correct = sums.tolist()
    return loss / len(ids), correct / (len(ids) * run.data.per_sample)


def evaluate(cfg, env, run, it):
    """Losses, accuracies, saturation and norm statistics at step `it`: logged and printed; None if not finite."""
    s, raw = run.state, run.raw
    raw.track_norm_stats(True)  # saturation etc. from the train samples, as the study measures it
    train_loss, train_acc = mean_loss(cfg, env, run, 'train')
    raw.track_norm_stats(False)
    if env.ddp:  # the statistics buffers hold sums: add up every process's share
        for _, layer in raw.norm_layers():
            for buf in layer.buffers():
                dist.all_reduce(buf)
    stats = raw.norm_stats()  # under FSDP every process takes part: alpha is gathered from its shards
    val_loss, val_acc = mean_loss(cfg, env, run, 'val')
    if not (math.isfinite(train_loss) and math.isfinite(val_loss)):
        s['diverged'] = f'non-finite eval loss at iter {it} (train {train_loss}, val {val_loss})'
        return None
    improved = val_loss < s['best_val_loss']
    if improved:
        s['best_val_loss'], s['best_iter'] = val_loss, it
    record = {'event': 'eval', 'iter': it, 'train_loss': train_loss, 'val_loss': val_loss, 'train_acc': train_acc,
              'val_acc': val_acc, 'lr': get_lr(it, cfg), **seen(run, it),
              'saturation': stats['saturation'], 'thresholds': stats['thresholds'],
              'norm_layers': {name: {k: st[k] for k in ('kind', 'alpha', 'input_std', 'saturation')}
                              for name, st in stats['layers'].items()},
              'best_val_loss': s['best_val_loss'], 'best_iter': s['best_iter']}
    record['warnings'] = collapse_signs(cfg, run, record)
    s['last_eval'] = record
    log(cfg, run, record)
    if env.master:
        acc = f'train acc {train_acc:.2%}, val acc {val_acc:.2%}, ' if run.data.unit == 'images' else ''
        sat = f", saturation@2.0 {stats['saturation'][stats['thresholds'].index(2.0)]:.3f}" if stats['saturation'] else ''
        print(f"step {it}: train loss {train_loss:.4f}, val loss {val_loss:.4f} (best {s['best_val_loss']:.4f} @ "
              f"{s['best_iter']}), {acc}epochs {record['epochs']:.2f}{sat}"
              + ''.join(f'\n  warning: {w}' for w in record['warnings']))
    return dict(record, improved=improved)


def seen(run, it):
    """What the first `it` steps have read: tokens (or images), and epochs of the budget."""
    n = it * run.samples * run.data.per_sample
    return {run.data.unit: n, 'epochs': n / run.data.n_train}


def collapse_signs(cfg, run, record):
    """The signs of a collapsed run (seen with DyT at small scale): train loss still at the level of predicting
    token (class) frequencies after warmup, or a norm layer saturated (its output is sign(x) * gamma whatever the input)."""
    signs = []
    if record['iter'] > cfg.warmup_iters and record['train_loss'] > run.data.entropy - COLLAPSE_MARGIN:
        signs.append(f"train loss {record['train_loss']:.3f} is at the unigram level of the budget ({run.data.entropy:.3f} "
                     f"nats) after warmup: the model predicts {run.data.predicted} frequencies only (collapsed?)")
    at_2 = record['thresholds'].index(2.0)
    full = [name for name, s in record['norm_layers'].items() if s['saturation'] and s['saturation'][at_2] > 0.99]
    if full:
        signs.append(f"norm layers saturated (|alpha x| > 2 for over 99% of inputs): {', '.join(full)}")
    return signs


def log_step(cfg, env, run, it, loss, grad_norm, dt):
    """A step record; dt (seconds per step) is None for the first interval after a start, which holds compilation."""
    micro = len(micro_batches(run.samples, env.world, 0, cfg.batch_size)) * cfg.batch_size
    mfu = run.raw.estimate_mfu(micro, dt, cfg.peak_flops, env.ptdtype) if dt else None
    rate = run.samples * run.data.per_sample / dt if dt else None
    unit = run.data.unit
    record = {'event': 'step', 'iter': it, 'loss': loss, 'lr': get_lr(it, cfg), 'grad_norm': grad_norm,
              **seen(run, it + 1), f'{unit}_per_sec': rate, 'mfu': mfu, 'ms_per_iter': 1000 * dt if dt else None}
    log(cfg, run, record)
    if env.master:
        print(f"iter {it}: loss {loss:.4f}, lr {record['lr']:.2e}, grad norm {grad_norm:.3f}, "
              + (f"{rate:,.0f} {unit}/s, {1000 * dt:.1f} ms/iter" if dt else 'first step (compilation and warm-up: not timed)')
              + (f', mfu {100 * mfu:.1f}%' if mfu is not None else ''))


def log(cfg, run, record):
    if run.writing:
        with open(run.log_path, 'a') as f:
            f.write(json.dumps(record) + '\n')
        if cfg.wandb_log:
            import wandb
            wandb.log(record, step=record['iter'])

# ----------------------------------------------------------------------------------- checkpoints and the end


def save_checkpoints(cfg, env, run, it, improved, t_start, force=False):
    """ckpt.pt and, when val loss improved, best.pt, written after the optimizer step of iteration it-1: iter_num = it
    is the next iteration to run. Collective: under FSDP rank 0 gathers the state, the others wait."""
    if not (force or cfg.always_save_checkpoint or improved or it >= cfg.max_iters):  # alike on every process
        return False
    s = run.state
    state = training_state(
        run.raw, run.optimizer, model_args=run.model_args, config=run.config, tokenizer=run.meta.get('tokenizer'),
        iter_num=it, best_val_loss=s['best_val_loss'], best_iter=s['best_iter'], guard=s['guard'],
        last_eval=s['last_eval'], wall_time_s=s['wall_time_s'] + time.time() - t_start,
        # data order, augmentation and dropout masks are functions of (seed, iter): the whole sampler state
        sampler={'seed': cfg.seed, 'train_tokens': run.data.n_train, 'block_size': cfg.block_size, 'eval_seed': EVAL_SEED})
    if run.writing:
        save_checkpoint(state, cfg.out_dir, best=improved)
    if env.ddp:
        dist.barrier()  # the others wait here, under the long timeout, while rank 0 writes
    return True


def finish(cfg, env, run, status):
    """summary.json (finished or diverged), or the 'stopped' event and how to continue; the closing lines."""
    s, it = run.state, run.state['iter_num']
    if status == 'diverged':
        if env.master:
            print(f"DIVERGED: {s['diverged']}. Stopped; the checkpoints in {cfg.out_dir} are the last good ones.",
                  file=sys.stderr)
        log(cfg, run, {'event': 'diverged', 'iter': it, 'diverged': True, 'reason': s['diverged']})
    if status == 'stopped':
        why = env.stop[0] if env.stop else 'signal on another process'
        log(cfg, run, {'event': 'stopped', 'iter': it, 'signal': why})
        if env.master:
            print(f"stopped at iter {it} ({why}); ckpt.pt is saved. Continue with the same command and "
                  "--init_from=auto (or resume)")
    elif run.writing:
        facts = {**seen(run, it), 'n_params': run.raw.get_num_params(), f'budget_{run.data.unit}': run.data.n_train,
                 'unigram_entropy': run.data.entropy, 'config': run.config}
        write_summary(cfg.out_dir, status, s, facts)
        if status == 'finished':
            final = (s['last_eval'] or {}).get('val_loss', float('nan'))
            sample = '' if run.data.unit == 'images' else f'python sample.py --out_dir={cfg.out_dir}; '
            print(f"done: {cfg.out_dir} at iter {it}, final val loss {final:.4f}, best {s['best_val_loss']:.4f} @ "
                  f"{s['best_iter']}. Next: {sample}python analyze.py all {cfg.out_dir}")
    if run.writing and cfg.wandb_log:
        import wandb
        wandb.finish()
    if env.ddp:
        dist.destroy_process_group()


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
