"""
Train a GPT variant (model.py) on a tokenized corpus: on a CPU, one GPU, or many with torchrun.

  python train.py                   # a tiny byte-level GPT on the offline pydocs corpus: ~1 min, 2 CPU cores
  python train.py config/gpt2_64m_dyt.py --train_tokens=1_000_000 --seed=42 --out_dir=out/64m_dyt_1M_s42
  torchrun --standalone --nproc_per_node=8 train.py config/gpt2_64m_dyt.py --init_from=auto

Keys: the globals below, then config files, then --key=value (configurator.py). Writes config.json, log.jsonl,
ckpt.pt, best.pt, summary.json to out_dir; SIGTERM, SIGUSR1, Ctrl-C stop at the next step, ckpt.pt written.
Exit status 0 finished, 3 diverged, 4 stopped, 1 error. Annexes where needed: annex/*.py.
"""
import gc
import math
import signal
import sys
import time
from dataclasses import fields
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import norm_stats
from checkpoint import (any_failed, append_log, build_model, check_room, clear_stale, load_training_state,
                        prepare_run_dir, read_resume_checkpoint, save_run, write_summary)
from configurator import LONG_TIMEOUT, annex, config_keys, configure, set_timeout, setup
from data.common import derived_seed, micro_batches, open_data
from model import GPTConfig

# ------------------------------------------------------------------------------------------------------------
# default config: a tiny model on the offline pydocs corpus that learns visibly in a minute on 2 CPU cores
# I/O
out_dir = 'out'
eval_interval = 100
eval_interval_warmup: int | None = None  # evals this often until warmup ends (an early best); None = as after
log_interval = 10
eval_iters = 10  # batches per split per evaluation (image data: val is the whole test set)
eval_only = False
always_save_checkpoint = True  # False: ckpt.pt written only when val loss improves, and at the end (nanoGPT)
init_from = 'scratch'  # 'scratch', 'resume' (out_dir/ckpt.pt) or 'auto' (resume if there is one: requeues)
overwrite = False  # a scratch run refuses an out_dir that holds a run (sweeps must not clobber each other)
wandb_log = False
wandb_project = 'nanonorm'
wandb_run_name = 'run'
# data
dataset = 'pydocs'
data_dir: str | None = None  # the folder with train.bin, val.bin and meta.json; None = data/<dataset>
train_tokens: int | None = None  # the data budget: windows in the first train_tokens train tokens; None = all
budget_docs: int | None = None  # an int: the budget is a random subset of whole documents, from this seed
val_tokens: int | None = None  # evaluate on the first val_tokens val tokens (for every budget); None = all
paper_val = 0  # > 0: also log val_loss_paper, the study's protocol (README): this many windows, redrawn
tiktoken_file: str | None = None  # a GPT-2 .tiktoken ranks file for offline machines (sample.py reads it too)
gradient_accumulation_steps = 1  # micro-batches per step in all: batch_size x this = sequences per step
batch_size = 16  # sequences per micro-batch, at most
block_size = 128
# model: GPTConfig's fields (model.py)
n_layer = 4
n_head = 4
n_embd = 128
n_kv_head: int | None = None
dropout = 0.0
bias = False
norm = 'layernorm'  # 'layernorm', 'rmsnorm', 'dyt', 'derf' or 'hardtanh'
norm_eps = 1e-5
dyt_alpha = 0.5  # alpha0 of DyT and Derf; the study uses 2.0
dyt_alpha_attn: float | None = None  # per place, the DyT paper's LLM rule; None = dyt_alpha
dyt_alpha_ffn: float | None = None
dyt_alpha_final: float | None = None
embed_scale = False
emb_init_std = 0.3  # GPT-2's 0.02 makes a model this small collapse with DyT (docs/collapse.md)
attn = 'standard'  # or 'diff'
mlp = 'gelu'  # or 'swiglu'
pos = 'learned'  # or 'rope'
rope_theta = 10000.0
vocab_size: int | None = None  # None = the dataset's, padded to a multiple of 64 (GPT-2's 50304)
patch_size = 4  # image data (annex/vit.py): the ViT's patches and pooling, 'cls' or 'mean'
pool, vit_as_run = 'cls', False  # vit_as_run: the study's ViT as its code ran (annex/vit.py)
# AdamW (weight decay on >= 2-D weights only) and the learning-rate schedule
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
spike_factor: float | None = None  # stop when a loss exceeds this x the best smoothed one (non-finite always)
# system
device: str | None = None  # None = 'cuda' if available, else 'mps', else 'cpu'
dtype: str | None = None  # 'float32' or 'bfloat16' (autocast); None = bfloat16 on CUDA if supported
compile = False
backend: str | None = None  # torch.distributed's; None = 'nccl' on CUDA, 'gloo' otherwise
fsdp = False  # under torchrun: shard weights, gradients and AdamW state with FSDP2 (the 3.78b configs)
fsdp_shard = 0  # HSDP: shard within groups of this many processes (a node's GPUs), replicate across; 0 = all
fsdp_bf16 = False  # FSDP: bf16 weight gathers, fp32 gradient reduces (torchtitan's); False: DDP's numbers
peak_flops: float | None = None  # the device's peak FLOP/s for MFU; None = by GPU name (annex/memory.py)
launcher: str | None = None  # 'srun': one process per srun task (annex/cluster.py); None = torchrun's, or one
step_timeout = 600  # seconds a step's collectives wait for a lost process (checkpoint writes: 1 hour)
shard_checkpoints_above = 1e9  # parameters: a bigger multi-process run saves per-process shards (ckpt.dcp/)
seed = 1337
# ------------------------------------------------------------------------------------------------------------
DEFAULTS, OPTIONAL_TYPES = config_keys(globals())
EVAL_SEED = 1337  # the fixed train-split eval windows: analyze.py's (data.common.random_windows)
COLLAPSE_MARGIN = 0.1  # nats: a train loss this close to the entropy of the token (class) frequencies
COLLAPSE_AFTER = 200  # steps (or warmup's, if fewer) before it warns: the study's warmup outlasts its screen
EXIT_DIVERGED, EXIT_STOPPED = 3, 4
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


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
        status = train(cfg, env := setup(cfg, STOP_SIGNALS))
        if env.ddp:
            gc.collect()  # the model freed before its process group (FSDP hooks hold cycles), or gloo aborts
            dist.destroy_process_group()
        return status
    finally:  # main() may run again in the same process (tests, notebooks)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def train(cfg, env):
    meta, data = open_data(cfg, env, EVAL_SEED)
    config = vars(cfg).copy()
    model_args = data.model_args(config) if data.unit == 'images' else {  # a ViT: annex/vit.py's fields
        f.name: config[f.name] for f in fields(GPTConfig)}
    resume = cfg.init_from == 'resume'
    if env.master and not cfg.eval_only:
        clear_stale(cfg.out_dir)  # what an interrupted save left
    if env.ddp:
        dist.barrier()
    ckpt = read_resume_checkpoint(cfg, model_args, data.n_train, env.master) if resume else None
    if ckpt == 'complete':  # the run in out_dir has ended: its files are left as they are
        return 0
    samples = cfg.batch_size * cfg.gradient_accumulation_steps  # per step, over every process
    parts = micro_batches(samples, env.world, env.rank, cfg.batch_size)  # this process's (first, count)
    memory = annex('memory')  # the memory plan, and GPUs' peak FLOP/s for MFU (None: the annex is deleted)
    if env.master:
        changed = ', '.join(f'{k}={v!r}' for k, v in config.items() if v != DEFAULTS[k])
        print(f"config (all of it in {cfg.out_dir}/config.json): {changed or 'the defaults'}")
        if memory and data.unit == 'tokens':  # before the model exists: told before it runs out of memory
            memory.print_plan(GPTConfig(**model_args), cfg, env, max(count for _, count in parts))
    peak = cfg.peak_flops or (memory and memory.gpu_peak_flops(env.device, env.ptdtype))
    torch.manual_seed(cfg.seed)
    if env.fsdp:  # built on the meta device, sharded, each block compiled (annex/cluster.py)
        raw = model = norm_stats.instrument(annex('cluster', 'fsdp=True').build_sharded(model_args, cfg, env))
        ddp = None
    else:  # DDP, then compile: the gradient all-reduce overlaps the compiled backward
        raw = norm_stats.instrument(build_model(model_args).to(env.device))  # instrumented before compile
        ddp = DDP(raw, device_ids=[env.local_rank] if env.device_type == 'cuda' else None,
                  broadcast_buffers=False) if env.ddp else None  # norm statistics are sums: not broadcast
        model = torch.compile(ddp or raw) if cfg.compile else ddp or raw
    optimizer = raw.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2),
                                         env.device_type)
    n_params = sum(p.numel() for p in raw.parameters())  # what a checkpoint holds (get_num_params drops some)
    sharded = env.ddp and n_params > cfg.shard_checkpoints_above and annex('cluster', 'sharded checkpoints')
    iter_num, best_val_loss, best_iter, guard, last_eval, wall_time = 0, float('inf'), None, {}, None, 0.0
    if ckpt:
        state = load_training_state(raw, optimizer, ckpt, env)
        iter_num, best_val_loss, best_iter, guard, last_eval, wall_time = state
        del ckpt
    if env.master:
        images = data.unit == 'images'
        print(f'model: {raw.get_num_params():,} parameters ({cfg.norm}, {cfg.attn} attention, {cfg.mlp} MLP, '
              + (f'ViT, patch {cfg.patch_size}, {cfg.pool} pooling)' if images else f'{cfg.pos} positions)'))
        print(f'global batch: {samples} ' + ('images' if images else f'sequences x {cfg.block_size} tokens = '
              f'{samples * cfg.block_size:,} tokens') + f'/step ({env.world} process(es) x {len(parts)} '
              f'micro-batch(es) of <= {cfg.batch_size}); budget {data.n_train:,} train {data.unit} '
              f'(entropy of the {data.predicted} frequencies {data.entropy:.3f} nats)')
        if resume:
            print(f'resuming {cfg.out_dir} at iter {iter_num} (best val loss {best_val_loss:.4f})')
    writing = env.master and not cfg.eval_only
    if writing:  # config.json, log.jsonl cut back to the checkpoint (and a wandb run)
        prepare_run_dir(cfg.out_dir, config, iter_num if resume else None)
    problem = writing and check_room(cfg.out_dir, 12 * n_params, gathered=not sharded)  # fp32 weights, AdamW
    if any_failed(env, problem):  # said now, not after the first hours of training
        raise SystemExit(f"error: {problem or 'rank 0 cannot save checkpoints (its message says why)'}")

    def log(record):  # a line of log.jsonl (and a wandb step)
        if writing:
            append_log(cfg.out_dir, record, cfg.wandb_log)

    def save(best=False):  # ckpt.pt or ckpt.dcp/ (and best); iter_num: the next step. Every process calls it
        fields = dict(model_args=model_args, config=config, tokenizer=meta.get('tokenizer'),
                      iter_num=iter_num, best_val_loss=best_val_loss, best_iter=best_iter, guard=guard,
                      last_eval=last_eval, wall_time_s=wall_time + time.time() - t_start,  # data order, crops
                      sampler=dict(seed=cfg.seed, train_tokens=data.n_train, block_size=cfg.block_size,  # and
                                   budget_docs=cfg.budget_docs, eval_seed=EVAL_SEED))  # dropout: (seed, step)
        set_timeout(env, LONG_TIMEOUT)  # rank 0 may write 45 GB while the others wait
        save_run(raw, optimizer, fields, cfg.out_dir, env, best, sharded)  # a failure ends every process
        set_timeout(env, cfg.step_timeout if iter_num > start_iter else LONG_TIMEOUT)

    def micro_batch(windows, k):  # this process's k-th micro-batch of a step's windows, on the device
        first, count = parts[k]
        return data.batch('train', windows[first:first + count], env.device)

    # -------------------------------------------------------------------------------------------- the loop
    t_start = t_log = time.time()
    start_iter, reason, stop, steps_since_log, timed, batch = iter_num, None, False, 0, False, None
    while True:
        saved = False
        every = (iter_num < cfg.warmup_iters and cfg.eval_interval_warmup) or cfg.eval_interval
        if cfg.eval_only or (iter_num % every == 0 or iter_num >= cfg.max_iters) and not (
                iter_num == start_iter and resume):  # a resumed step's eval is in the log already
            ev = evaluate(cfg, env, raw, model, data, iter_num)
            if not (math.isfinite(ev['train_loss']) and math.isfinite(ev['val_loss'])):
                reason = f"non-finite eval loss at iter {iter_num} (train {ev['train_loss']}, val " \
                         f"{ev['val_loss']})"
                break
            improved = ev['val_loss'] < best_val_loss
            if improved:
                best_val_loss, best_iter = ev['val_loss'], iter_num
            last_eval = dict(ev, best_val_loss=best_val_loss, best_iter=best_iter)
            log(last_eval)
            if env.master:
                sat = ev['saturation'] and f", saturation@2.0 {ev['saturation'][norm_stats.AT_2]:.3f}"
                acc = data.unit == 'images' and \
                    f", train acc {ev['train_acc']:.2%}, val acc {ev['val_acc']:.2%}"
                print(f"step {iter_num}: train loss {ev['train_loss']:.4f}, val loss {ev['val_loss']:.4f} "
                      f"(best {best_val_loss:.4f} @ {best_iter}){acc or ''}, epochs {ev['epochs']:.2f}"
                      f"{sat or ''}", *(f'  warning: {w}' for w in ev['warnings']), sep='\n')
            if cfg.eval_only:
                break
            if (cfg.always_save_checkpoint or improved) and iter_num > 0 or iter_num >= cfg.max_iters:
                save(best=improved)  # not at step 0: the seed rebuilds it
                saved = True
            t_log, steps_since_log = time.time(), 0  # throughput leaves out evaluation and checkpoints
        if iter_num >= cfg.max_iters:
            break
        if stop:  # a stop signal reached some process: all of them saw it in the last step's all-reduce
            if not saved:
                save()
            break
        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:
            group['lr'] = lr
        if cfg.dropout > 0:  # dropout masks are a function of the step (reseeding costs ~0.4 ms: if needed)
            torch.manual_seed(derived_seed(cfg.seed, 'dropout', env.rank, iter_num))
        if batch is None:  # else copied during the previous step
            windows = data.draw(cfg.seed, iter_num, samples)
            batch = micro_batch(windows, 0)
        loss_sum = torch.zeros((), device=env.device)
        for k, (first, count) in enumerate(parts):
            if ddp:  # DDP all-reduces the gradients after the last micro-step only
                ddp.require_backward_grad_sync = k == len(parts) - 1
            elif env.fsdp:  # HSDP: reduce-scatter every micro-step, all-reduce across nodes after the last
                raw.set_requires_all_reduce(k == len(parts) - 1)
            with env.ctx:
                _, loss = model(*batch)
            # the next micro-batch (or the next step's first) is copied while the backward runs, as in nanoGPT
            batch = None
            if k + 1 < len(parts):
                batch = micro_batch(windows, k + 1)
            elif iter_num + 1 < cfg.max_iters:
                windows = data.draw(cfg.seed, iter_num + 1, samples)
                batch = micro_batch(windows, 0)
            # each micro-batch weighs its share of the step: the average over processes is the step's mean
            (loss * (count * env.world / samples)).backward()
            loss_sum += loss.detach().float() * (count / samples)
        grad_norm = torch.nn.utils.clip_grad_norm_(raw.parameters(), cfg.grad_clip or float('inf'))
        if hasattr(grad_norm, 'full_tensor'):  # FSDP: a DTensor
            grad_norm = grad_norm.full_tensor()
        flags = torch.stack([loss_sum, grad_norm.float() / env.world,  # torch.full: a fill, no blocking copy
                             torch.full((), float(bool(env.stop)), device=env.device)])
        if env.ddp:
            dist.all_reduce(flags)
        loss, grad_norm, stop = flags.tolist()  # the step's one host sync; the same on every process
        if iter_num == start_iter:  # compiled: from now on a lost process fails the job in minutes
            set_timeout(env, cfg.step_timeout)
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            reason = f'non-finite loss ({loss}) or gradient norm ({grad_norm}) at iter {iter_num}'
        elif cfg.spike_factor and guard.get('best_ema') and loss > cfg.spike_factor * guard['best_ema']:
            reason = (f"loss spike at iter {iter_num}: {loss:.4f} > spike_factor {cfg.spike_factor} x best "
                      f"smoothed loss {guard['best_ema']:.4f}")
        if reason:
            break
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ema = loss if 'ema' not in guard else 0.9 * guard['ema'] + 0.1 * loss
        guard = {'ema': ema, 'best_ema': min(ema, guard.get('best_ema', ema))}
        steps_since_log += 1
        if iter_num % cfg.log_interval == 0 or iter_num + 1 == cfg.max_iters:
            dt = (time.time() - t_log) / steps_since_log if timed else None  # the first interval compiles
            rate = samples * data.per_sample / dt if dt else None
            mfu = raw.estimate_mfu(sum(count for _, count in parts), dt, peak) if dt else None  # its share
            log({'event': 'step', 'iter': iter_num, 'loss': loss, 'lr': lr, 'grad_norm': grad_norm,
                 **seen(cfg, data, iter_num + 1), f'{data.unit}_per_sec': rate, 'mfu': mfu,
                 'ms_per_iter': dt and 1000 * dt})
            if env.master:
                print(f'iter {iter_num}: loss {loss:.4f}, lr {lr:.2e}, grad norm {grad_norm:.3f}, ' + (
                    f'{rate:,.0f} {data.unit}/s, {1000 * dt:.1f} ms/iter' if dt else
                    'first step (compilation and warm-up: not timed)')
                    + (f', mfu {100 * mfu:.1f}%' if mfu is not None else ''))
            t_log, steps_since_log, timed = time.time(), 0, True
        iter_num += 1

    # ----------------------------------------------------------------------------------------------- the end
    status = 'diverged' if reason else 'stopped' if stop and iter_num < cfg.max_iters else 'finished'
    if status == 'stopped':
        why = env.stop[0] if env.stop else 'signal on another process'
        log({'event': 'stopped', 'iter': iter_num, 'signal': why})
        if env.master:
            print(f'stopped at iter {iter_num} ({why}); ckpt.pt is saved. Continue with the same command and '
                  '--init_from=auto (or resume)')
    elif status == 'diverged':
        log({'event': 'diverged', 'iter': iter_num, 'diverged': True, 'reason': reason})
        if env.master:
            print(f'DIVERGED: {reason}. Stopped; the checkpoints in {cfg.out_dir} are the last good ones.',
                  file=sys.stderr)
    if writing and status != 'stopped':  # summary.json: the run has ended
        write_summary(cfg.out_dir, status, dict(
            iter_num=iter_num, best_val_loss=best_val_loss, best_iter=best_iter, last_eval=last_eval,
            wall_time_s=wall_time + time.time() - t_start, diverged=reason), {
            **seen(cfg, data, iter_num), 'n_params': raw.get_num_params(),
            f'budget_{data.unit}': data.n_train, 'unigram_entropy': data.entropy, 'config': config,
            'layout': meta.get('layout', 'file')})  # the tokenization: the study's row by row, or ours
    if writing and status == 'finished':
        print(f"done: {cfg.out_dir} at iter {iter_num}, final val loss {last_eval['val_loss']:.4f}, best "
              f'{best_val_loss:.4f} @ {best_iter}. Next: ' + ('' if data.unit == 'images' else
              f'python sample.py --out_dir={cfg.out_dir}; ') + f'python analyze.py all {cfg.out_dir}')
    return {'finished': 0, 'diverged': EXIT_DIVERGED, 'stopped': EXIT_STOPPED}[status]


# ----------------------------------------------------------------------------------------- evaluation, logs

@torch.no_grad()
def evaluate(cfg, env, raw, model, data, it):
    """Mean loss and accuracy (next token, or class) on each split's fixed eval samples, shared out over the
    processes, run by `model` (compiled where training is); the norm statistics on the train samples
    (saturation as the study measures it)."""
    raw.eval()
    result = {}
    for split in ('train', 'val', 'val_paper')[:3 if cfg.paper_val else 2]:
        norm_stats.record(raw, split == 'train')
        ids = data.draw(cfg.seed, it, cfg.paper_val, split) if split == 'val_paper' else data.eval_ids[split]
        sums = torch.zeros(2, device=env.device)  # loss x samples, correct predictions
        for first, count in micro_batches(len(ids), env.world, env.rank, cfg.batch_size):
            x, y = data.batch(split, ids[first:first + count], env.device)
            with env.ctx:
                logits, loss = model(x, y)
            sums += torch.stack([loss.float() * count, (logits.argmax(-1) == y).sum().float()])
        for t in ([sums] + (norm_stats.sums(raw) if split == 'train' else [])) if env.ddp else []:
            dist.all_reduce(t)
        result[split] = [s / n for s, n in zip(sums.tolist(), (len(ids), len(ids) * data.per_sample))]
    raw.train()
    stats = norm_stats.read(raw)  # under FSDP every process takes part: alpha is gathered from its shards
    layers = {name: {k: s[k] for k in ('kind', 'alpha', 'input_std', 'saturation')}
              for name, s in stats['layers'].items()}
    warnings = []  # the signs of a collapsed run (DyT at small scale)
    if it > min(cfg.warmup_iters, COLLAPSE_AFTER) and result['train'][0] > data.entropy - COLLAPSE_MARGIN:
        warnings.append(f"train loss {result['train'][0]:.3f} after {it} steps: at the unigram level of the "
                        f"budget ({data.entropy:.3f} nats), {data.predicted} frequencies only (collapsed?)")
    full = [name for name, s in layers.items() if s['saturation'] and s['saturation'][norm_stats.AT_2] > 0.99]
    if full:  # a saturated layer's output is sign(x) * gamma, whatever its input; f: DyT's tanh, Derf's erf
        warnings.append(f"norm layers saturated (|f| > tanh(2) on over 99% of inputs): {', '.join(full)}")
    return {'event': 'eval', 'iter': it, 'train_loss': result['train'][0], 'val_loss': result['val'][0],
            'val_loss_paper': result['val_paper'][0] if cfg.paper_val else None,
            'train_acc': result['train'][1], 'val_acc': result['val'][1], 'lr': get_lr(it, cfg),
            **seen(cfg, data, it), 'saturation': stats['saturation'], 'thresholds': stats['thresholds'],
            'norm_layers': layers, 'warnings': warnings}


def seen(cfg, data, steps):
    """What `steps` steps have read: tokens (or images), and epochs of the budget."""
    n = steps * cfg.batch_size * cfg.gradient_accumulation_steps * data.per_sample
    return {data.unit: n, 'epochs': n / data.n_train}


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
