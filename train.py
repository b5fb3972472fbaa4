"""Train a GPT variant (model.py) on a tokenized corpus: on a CPU, one GPU, or many with torchrun.
  python train.py  # a tiny byte-level GPT on the offline pydocs corpus: ~1 min on 2 CPUs
  python train.py config/gpt2_64m_dyt.py --train_tokens=1_000_000 --seed=42 --out_dir=out/64m_dyt_1M
  torchrun --standalone --nproc_per_node=8 train.py config/gpt2_64m_dyt.py --init_from=auto
Writes config.json, log.jsonl, ckpt.pt, best.pt, summary.json to out_dir. SIGTERM, SIGUSR1, Ctrl-C
stop at the next step, ckpt.pt saved. Exit status 0 finished, 3 diverged, 4 stopped, 1 error."""
import gc
import math
import signal
import sys
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

import checkpoint
import norm_stats
from checkpoint import (LoopState, build_model, clear_stale, has_ended, load_training_state,
                        starting_checkpoint)
from configurator import annex, config_keys, configure
from data.common import derived_seed, largest_part, micro_batches, open_data, padded
from distributed import LONG_TIMEOUT, on_every_process, set_timeout, setup
from evaluate import evaluate
from run_files import log, log_step, prepare_run_dir, seen, write_summary

# I/O
out_dir = 'out'
eval_interval = 100
eval_interval_warmup: int | None = None  # this often in warmup (an early best)
log_interval = 10
eval_samples = 160  # windows (images) per split per eval; images' val: all of test
eval_samples_warmup: int | None = None  # fewer in warmup, spread over those; None: all
eval_only = False
always_save_checkpoint = True  # False: when val loss improves, and at the end
init_from = 'scratch'  # 'resume' (out_dir's), 'auto' (resume if any), or a run's path: its weights
overwrite = False  # False: a scratch run refuses an out_dir that holds a run
keep_last = 0  # also keep the last this many checkpoints as ckpt-<iter> (annex/cluster.py)
async_save = False  # True: checkpoints written in the background as training goes on (same)
wandb_log = False
wandb_project = 'nanonorm'
wandb_run_name = 'run'
# data
dataset = 'pydocs'
data_dir: str | None = None  # train.bin, val.bin, meta.json's folder; None: data/<dataset>
train_tokens: int | None = None  # the budget: the first this many train tokens; None: all
val_tokens: int | None = None  # evals read the first this many val tokens
tiktoken_file: str | None = None  # a GPT-2 .tiktoken ranks file for offline machines
gradient_accumulation_steps = 1  # sequences per step: batch_size x this, over all processes
batch_size = 16  # sequences per micro-batch, at most
block_size = 128
# model: GPTConfig's fields (model.py)
n_layer = 4
n_head = 4
n_embd = 128
n_kv_head: int | None = None
dropout = 0.0
bias = False
norm = 'layernorm'  # or 'rmsnorm', 'dyt', 'derf', 'hardtanh', DyT's ablations (model.NORMS)
norm_eps = 1e-5
dyt_alpha = 0.5  # alpha0 of DyT and Derf; the study uses 2.0
dyt_alpha_attn: float | None = None  # per place, the DyT paper's LLM rule; None: dyt_alpha
dyt_alpha_ffn: float | None = None
dyt_alpha_final: float | None = None
embed_scale = False
emb_init_std = 0.3  # GPT-2's 0.02: this small a DyT collapses (docs/collapse.md)
attn = 'standard'  # or 'diff'
mlp = 'gelu'  # or 'swiglu'
pos = 'learned'  # or 'rope'
rope_theta = 10000.0
vocab_size: int | None = None  # None: the dataset's, padded to a multiple of 64
# AdamW (decay on >= 2-D weights) and the lr schedule
learning_rate = 2e-3
max_iters = 300
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0 = no clipping
decay_lr = True  # linear warmup, cosine to min_lr at lr_decay_iters; False: constant
warmup_iters = 30
lr_decay_iters = 300
min_lr = 2e-4
spike_factor: float | None = None  # stop at a loss above this x the best smoothed one
# system
device: str | None = None  # None: cuda if available, else mps, else cpu
dtype: str | None = None  # 'float32' or 'bfloat16' (autocast); None: bfloat16 if CUDA has it
compile = False
backend: str | None = None  # torch.distributed's; None: nccl on CUDA, else gloo
peak_flops: float | None = None  # peak FLOP/s for MFU; None: by GPU name
deterministic = False  # True: deterministic algorithms, bitwise on a GPU too (slower)
step_timeout = 600  # seconds collectives wait for a lost process (saves: an hour)
seed = 1337
# for the annexes only, which say what each does: annex/protocol.py, vit.py (ViTConfig), cluster.py
budget_docs: int | None = None
paper_val = 0
patch_size = 4
pool = 'cls'
vit_as_run = False
fsdp = False
fsdp_shard = 0  # HSDP: shards within groups of this many processes; 0: all
fsdp_bf16 = False  # FSDP: bf16 weight gathers, fp32 gradient reduces
launcher: str | None = None  # 'srun', or None: torchrun's processes, or one
shard_checkpoints_above = 1e9  # parameters above which many processes save ckpt.dcp/

DEFAULTS, OPTIONAL_TYPES = config_keys(globals())
EVAL_SEED = 1337  # the fixed train eval windows, analyze.py's too
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
    if cfg.launcher is not None:  # only if asked: Slurm's variables alone are no group
        annex('cluster', f'launcher={cfg.launcher!r}').srun_environment(cfg.launcher)
    handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        return train(cfg, setup(cfg, STOP_SIGNALS))  # setup checks cfg first
    finally:  # errors too: a group left to exit can abort it
        if dist.is_initialized():
            gc.collect()  # the model freed first (FSDP hooks hold cycles)
            dist.destroy_process_group()
        for sig, handler in handlers.items():  # main() may run again (tests, notebooks)
            signal.signal(sig, handler)


def train(cfg, env):
    meta, data = open_data(cfg, env, EVAL_SEED)
    config, resume = vars(cfg).copy(), cfg.init_from == 'resume'
    model_args = data.model_args(config)
    on_every_process(env, 'cannot remove what interrupted saves left', clear_stale, cfg.out_dir,
                     env.master and not cfg.eval_only)  # by rank 0, before any process reads
    ckpt = on_every_process(env, 'cannot start', starting_checkpoint, cfg, model_args,
                            data.n_train, env)  # a failure ends all before they wait on it
    state = LoopState.from_checkpoint(ckpt) if resume else LoopState()
    if resume and has_ended(cfg, state, env.master):  # its files are left as they are
        return 0
    samples = cfg.batch_size * cfg.gradient_accumulation_steps  # a step's, over all processes
    parts = micro_batches(samples, env.world, env.rank, cfg.batch_size)
    rows = largest_part(samples, env.world, cfg.batch_size)  # every forward's, evals' too
    memory = annex('memory')  # memory plan, GPU peak FLOP/s; None if deleted
    if env.master:  # said before the model can run out of memory
        changed = [f'{k}={v!r}' for k, v in config.items() if v != DEFAULTS[k]]
        print(f'config (all of it in {cfg.out_dir}/config.json): '
              + (', '.join(changed) if changed else 'the defaults'))
        if memory:
            memory.print_plan(model_args, cfg, env, rows)
    raw, model = build(cfg, env, model_args)
    optimizer = raw.configure_optimizers(cfg.weight_decay, cfg.learning_rate,
                                         (cfg.beta1, cfg.beta2), env.device_type)
    if ckpt:  # init_from=PATH: the weights only
        load_training_state(raw, optimizer if resume else None, ckpt, env)
        del ckpt
    n_params = sum(p.numel() for p in raw.parameters())  # what a checkpoint holds
    env.sharded = env.ddp and n_params > cfg.shard_checkpoints_above  # every process saves its part
    saves, peak = checkpoint, cfg.peak_flops  # its save_run, or the annex's
    if env.sharded or cfg.async_save or cfg.keep_last:
        saves = annex('cluster', 'sharded, asynchronous or kept checkpoints')
    if not peak and memory:
        peak = memory.gpu_peak_flops(env.device, env.ptdtype)
    if env.master:
        print(f'model: {raw.describe()}')
        print(f'global batch: {data.describe(samples)}/step ({env.world} process(es) x '
              f'{len(parts)} micro-batch(es) of {rows}); budget {data.n_train:,} train'
              f' {data.unit} (entropy of the {data.predicted} frequencies {data.entropy:.3f} nats)')
        if resume:
            print(f'resuming at iter {state.iter_num} (best val loss {state.best_val_loss:.4f})')
    # in every checkpoint with the weights and LoopState; sampler: the data order
    saved = dict(model_args=model_args, config=config, sampler=dict(
        seed=cfg.seed, train_tokens=data.n_train, block_size=cfg.block_size,
        budget_docs=cfg.budget_docs, eval_seed=EVAL_SEED), tokenizer=meta.get('tokenizer'))
    run = SimpleNamespace(cfg=cfg, env=env, data=data, meta=meta, raw=raw, model=model, saved=saved,
                          optimizer=optimizer, samples=samples, parts=parts, rows=rows, saves=saves,
                          peak_flops=peak, start_iter=state.iter_num,
                          writing=env.master and not cfg.eval_only)  # what the steps share
    on_every_process(env, f'cannot write to {cfg.out_dir}', prepare_run_dir, run, resume,
                     12 * n_params)  # fp32 weights and AdamW's two moments: room for them
    return loop(run, state)


def build(cfg, env, model_args):
    """(the module, what runs it) from the seed; norm statistics first: compiling traces them."""
    torch.manual_seed(cfg.seed)
    if env.fsdp:  # sharded, each block compiled (annex/cluster.py)
        raw = annex('cluster', 'fsdp=True').build_sharded(model_args, cfg, env)
        return norm_stats.instrument(raw), raw
    raw = model = norm_stats.instrument(build_model(model_args).to(env.device))
    if env.ddp:  # norm statistics are sums: not broadcast
        model = torch.nn.parallel.DistributedDataParallel(raw, broadcast_buffers=False)
    if cfg.compile:  # after DDP: the gradient all-reduce overlaps the compiled backward
        model = torch.compile(model)
    return raw, model


def loop(run, state):
    """Steps to max_iters, evals and checkpoints between; the exit status."""
    cfg, env, optimizer = run.cfg, run.env, run.optimizer
    batches = train_batches(run, state.iter_num)
    run.t0 = time.time() - state.wall_time_s  # the run's clock across resumes
    t_log, steps, timed, stop = time.time(), 0, False, False
    while True:
        it, saved = state.iter_num, False
        every = cfg.eval_interval
        if it < cfg.warmup_iters and cfg.eval_interval_warmup:
            every = cfg.eval_interval_warmup
        resumed_here = it == run.start_iter and cfg.init_from == 'resume'  # its eval is in the log
        if cfg.eval_only or ((it % every == 0 or it >= cfg.max_iters) and not resumed_here):
            reason, saved = eval_and_save(run, state)
            if reason or cfg.eval_only:
                return finish(run, state, reason)
            t_log, steps = time.time(), 0  # throughput without evals and saves
        if it >= cfg.max_iters:
            return finish(run, state)
        if stop:  # a signal somewhere: all saw it in the last all-reduce
            if not saved:
                save(run, state)
            settle(run)
            why = env.stop[0] if env.stop else 'signal on another process'
            log(run, {'event': 'stopped', 'iter': it, 'signal': why})
            if env.master:
                print(f'stopped at iter {it} ({why}); ckpt.pt is saved. Continue with the same '
                      'command and --init_from=auto (or resume)')
            return EXIT_STOPPED
        lr = get_lr(it, cfg)
        for group in optimizer.param_groups:
            group['lr'] = lr
        if cfg.dropout > 0:  # dropout masks from the step alone (~0.4 ms)
            torch.manual_seed(derived_seed(cfg.seed, 'dropout', env.rank, it))

        loss, grad_norm, stop = train_step(run, batches)
        reason = divergence(cfg, state, loss, grad_norm)
        if reason:
            return finish(run, state, reason)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if it == run.start_iter:  # compiled: a lost process now fails the job in minutes
            set_timeout(env, cfg.step_timeout)

        steps += 1
        if it % cfg.log_interval == 0 or it + 1 == cfg.max_iters:
            log_step(run, it, loss, lr, grad_norm, (time.time() - t_log) / steps if timed else None)
            t_log, steps, timed = time.time(), 0, True  # the first interval compiles: not timed
        state.iter_num += 1


def train_batches(run, step):
    """This process's micro-batches from `step` on, each yielded once the next is on its way."""
    ahead = None
    while True:
        windows = run.data.draw(run.cfg.seed, step, run.samples)
        for first, count in run.parts:
            batch = padded(*run.data.batch('train', windows[first:first + count], run.env.device),
                           run.rows)
            if ahead is not None:
                yield ahead
            ahead = batch
        step += 1


def train_step(run, batches):
    """Forward and backward, clip, the one all-reduce: (mean loss, grad norm, a stop anywhere)."""
    env, parts, n = run.env, run.parts, run.samples
    loss_sum = torch.zeros((), device=env.device)
    for k, (_, count) in enumerate(parts):
        last = k == len(parts) - 1  # gradients are reduced across processes here only
        if env.fsdp:  # HSDP: reduce-scatters each micro-step, the all-reduce last
            run.raw.set_requires_all_reduce(last)
        elif env.ddp:  # DDP, inside torch.compile's wrapper if compiled
            getattr(run.model, '_orig_mod', run.model).require_backward_grad_sync = last
        with env.ctx:
            _, loss = run.model(*next(batches))
        (loss * (count * env.world / n)).backward()  # the mean over processes is the step's mean
        loss_sum += loss.detach().float() * (count / n)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.raw.parameters(), run.cfg.grad_clip or math.inf)
    if hasattr(grad_norm, 'full_tensor'):  # FSDP: a DTensor
        grad_norm = grad_norm.full_tensor()
    stop = torch.full((), float(bool(env.stop)), device=env.device)  # a fill: no blocking copy
    # one sum: the mean loss, 1/world of the (same) gradient norm each, > 0 if any process stops
    totals = torch.stack([loss_sum, grad_norm.float() / env.world, stop])
    if env.ddp:
        dist.all_reduce(totals)
    loss, grad_norm, stop = totals.tolist()  # the step's one host sync
    return loss, grad_norm, stop > 0


def divergence(cfg, state, loss, grad_norm):
    """Why the run must stop (non-finite, a loss spike) or None; the smoothed loss updated."""
    it, best = state.iter_num, state.best_loss_ema
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        return f'non-finite loss ({loss}) or gradient norm ({grad_norm}) at iter {it}'
    if cfg.spike_factor and best and loss > cfg.spike_factor * best:
        return (f'loss spike at iter {it}: {loss:.4f} > spike_factor {cfg.spike_factor} x best '
                f'smoothed loss {best:.4f}')
    ema = loss if state.loss_ema is None else 0.9 * state.loss_ema + 0.1 * loss
    state.loss_ema, state.best_loss_ema = ema, ema if best is None else min(ema, best)
    return None


def eval_and_save(run, state):
    """The eval before step state.iter_num, then the checkpoint: (why to stop or None, saved)."""
    cfg, it = run.cfg, state.iter_num
    ev = evaluate(run, it, lr=get_lr(it, cfg), **seen(run, it))
    if not (math.isfinite(ev['train_loss']) and math.isfinite(ev['val_loss'])):
        why = f"non-finite eval loss at iter {it} (train {ev['train_loss']}, val {ev['val_loss']})"
        return why, False
    improved = ev['val_loss'] < state.best_val_loss
    if improved:
        state.best_val_loss, state.best_iter = ev['val_loss'], it
    state.last_eval = dict(ev, best_val_loss=state.best_val_loss, best_iter=state.best_iter)
    log(run, state.last_eval)
    if run.env.master:
        sat = ''
        if ev['saturation']:
            sat = f", saturation@2.0 {ev['saturation'][norm_stats.AT_2]:.3f}"
        print(f"step {it}: train loss {ev['train_loss']:.4f}, val loss {ev['val_loss']:.4f} (best "
              f"{state.best_val_loss:.4f} @ {state.best_iter}), train acc {ev['train_acc']:.2%}, "
              f"val acc {ev['val_acc']:.2%}, epochs {ev['epochs']:.2f}{sat}",
              *(f'  warning: {w}' for w in ev['warnings']), sep='\n')
    wanted = (cfg.always_save_checkpoint or improved) and it > 0  # step 0: the seed rebuilds it
    if cfg.eval_only or not (wanted or it >= cfg.max_iters):
        return None, False
    save(run, state, best=improved)
    return None, True


def save(run, state, best=False):
    """ckpt.pt or ckpt.dcp/ (and best), by all: rank 0 may write 45 GB as the others wait."""
    set_timeout(run.env, LONG_TIMEOUT)
    t0 = time.time()
    settle(run)  # the save before: all know how it ended before the next collective
    state.wall_time_s = t0 - run.t0
    later = on_every_process(run.env, f'checkpoint at iter {state.iter_num} not saved',
                             run.saves.save_run, run.raw, run.optimizer,
                             dict(run.saved, **vars(state)), run.cfg, run.env, best)
    log(run, {'event': 'saved', 'iter': state.iter_num, 'seconds': time.time() - t0,
              'background': bool(later)})  # the time training waited
    set_timeout(run.env, run.cfg.step_timeout if state.iter_num > run.start_iter else LONG_TIMEOUT)


def settle(run):  # the background save done (annex/cluster.py), or all end with its error
    if run.cfg.async_save:  # the others may wait while rank 0 writes: the long timeout
        set_timeout(run.env, LONG_TIMEOUT)
        on_every_process(run.env, 'the last checkpoint not saved', run.saves.wait, run.env)


def finish(run, state, reason=None):
    """The run's end (reason: why it diverged), said, logged, in summary.json; the exit status."""
    cfg, it = run.cfg, state.iter_num
    settle(run)
    state.wall_time_s = time.time() - run.t0
    if reason:
        log(run, {'event': 'diverged', 'iter': it, 'diverged': True, 'reason': reason})
        if run.env.master:
            print(f'DIVERGED: {reason}; the last good checkpoints: {cfg.out_dir}', file=sys.stderr)
    if run.writing:
        write_summary(run, state, reason)
    if run.writing and not reason:
        print(f"done: {cfg.out_dir} at iter {it}, final val loss {state.last_eval['val_loss']:.4f},"
              f' best {state.best_val_loss:.4f} @ {state.best_iter}. Next: '
              + run.data.next_steps(cfg.out_dir))
    return EXIT_DIVERGED if reason else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
