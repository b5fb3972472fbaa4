"""train.py's checks; every script's device and precision; torchrun's processes."""
import functools
import os
import signal
from contextlib import nullcontext
from dataclasses import fields
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist

from configurator import annex
from data.common import largest_part, micro_batches
from model import GPTConfig

LONG_TIMEOUT = 3600  # seconds collectives wait before the first step, and for saves


def check_train_config(cfg, world):  # before any I/O; sets device, dtype, backend, init_from
    try:
        cfg.device = pick_device(cfg.device)
        GPTConfig(**{f.name: getattr(cfg, f.name) for f in fields(GPTConfig)})  # the model's checks
    except ValueError as e:
        raise SystemExit(f'error: {e}') from None
    cfg.dtype = precision(cfg.device, cfg.dtype)[0]
    if not cfg.backend:
        cfg.backend = 'nccl' if cfg.device.startswith('cuda') else 'gloo'
    if cfg.fsdp or cfg.fsdp_shard:
        annex('cluster', 'fsdp=True').check_sharding(cfg, world)
    has_run = any(os.path.exists(os.path.join(cfg.out_dir, name))
                  for name in ('ckpt.pt', 'ckpt.dcp', 'ckpt.dcp.old'))
    if cfg.init_from == 'auto':
        cfg.init_from = 'resume' if has_run else 'scratch'
    if cfg.init_from not in ('scratch', 'resume') and not os.path.exists(cfg.init_from):
        raise SystemExit(f"error: init_from={cfg.init_from!r}: use 'scratch', 'resume', 'auto' or "
                         "the path of another run's checkpoint (out_dir, ckpt.pt): none there")
    if has_run and cfg.init_from != 'resume' and not (cfg.overwrite or cfg.eval_only):
        raise SystemExit(f'error: {cfg.out_dir} already holds a run (ckpt.pt); pass '
                         '--out_dir=NEW, --init_from=resume (or auto), or --overwrite=True')
    if cfg.dtype not in ('float32', 'bfloat16'):
        raise SystemExit("error: dtype must be 'float32' or 'bfloat16'")
    for key in ('eval_interval', 'eval_interval_warmup', 'log_interval', 'eval_samples',
                'eval_samples_warmup', 'batch_size', 'block_size', 'gradient_accumulation_steps',
                'max_iters', 'paper_val'):
        value, least = getattr(cfg, key), (0 if key in ('max_iters', 'paper_val') else 1)
        if value is not None and value < least:  # eval_interval_warmup None: eval_interval's
            raise SystemExit(f'error: {key}={value} must be >= {least}')
    warmup = cfg.eval_samples_warmup  # a subset of the eval set
    if warmup is not None and warmup > cfg.eval_samples:
        raise SystemExit(f'error: eval_samples_warmup={warmup} must be <= eval_samples='
                         f'{cfg.eval_samples}')
    if cfg.wandb_log:
        annex('wandb_log', 'wandb_log=True').check()
    samples = cfg.batch_size * cfg.gradient_accumulation_steps
    rows = largest_part(samples, world, cfg.batch_size)  # the evals' micro-batches too
    counts = ((samples, cfg.batch_size,
               'samples per step (batch_size x gradient_accumulation_steps)'),
              (cfg.eval_samples, rows, 'eval_samples'),
              (cfg.eval_samples_warmup, rows, 'eval_samples_warmup'),
              (cfg.paper_val, rows, 'paper_val windows'))
    for n, most, what in counts:
        if n and n // world < len(micro_batches(n, world, 0, most)):  # a share left empty
            raise SystemExit(f'error: the {n} {what} are too few to give each of {world} processes '
                             'the same number of micro-batches; raise them or use fewer processes')


def pick_device(device=None):  # the one named, checked; None or 'auto': cuda, mps, else cpu
    have = {'cuda': torch.cuda.is_available(), 'mps': torch.backends.mps.is_available()}
    if device in (None, 'auto'):
        return next((kind for kind, ok in have.items() if ok), 'cpu')
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ValueError(f"device={device!r} is unknown: use 'cpu', 'cuda[:N]' or 'mps'") from None
    if not have.get(kind, True):
        raise ValueError(f"device={device!r}, but this machine has no {kind} device; use 'cpu'")
    return device


def precision(device, dtype=None):  # (dtype, the model's context); None: bfloat16 if CUDA has it
    kind = torch.device(device).type
    if not dtype:
        dtype = 'bfloat16' if kind == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'
    if kind == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    ctx = nullcontext() if dtype == 'float32' else torch.autocast(kind, dtype=getattr(torch, dtype))
    return dtype, ctx


def setup(cfg, stop_signals):  # cfg checked; this process's env, in torchrun's group if any
    world = int(os.environ.get('WORLD_SIZE', 1))  # torchrun's (srun's made torchrun's)
    check_train_config(cfg, world)
    ddp, rank = 'RANK' in os.environ, int(os.environ.get('RANK', 0))
    device, device_id = cfg.device, None
    if ddp:
        if device.startswith('cuda'):  # modulo: Slurm may show a task only its GPU
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0)) % torch.cuda.device_count()}"
            torch.cuda.set_device(device)
            device_id = torch.device(device)  # NCCL's communicator made now, on this GPU
            os.environ.setdefault('TORCH_FR_BUFFER_SIZE', '2000')  # NCCL's flight recorder: what
            os.environ.setdefault('TORCH_NCCL_DUMP_ON_TIMEOUT', '1')  # each awaited, in out_dir
            os.environ.setdefault('TORCH_FR_DUMP_TEMP_FILE', f'{cfg.out_dir}/nccl_trace_rank_')
        dist.init_process_group(backend=cfg.backend, timeout=timedelta(seconds=LONG_TIMEOUT),
                                device_id=device_id)
    env = SimpleNamespace(ddp=ddp, fsdp=cfg.fsdp and ddp, rank=rank, world=world, master=rank == 0,
                          device=device, device_type=device.split(':')[0], groups=[None], stop=[],
                          ptdtype=getattr(torch, cfg.dtype), ctx=precision(device, cfg.dtype)[1])
    if cfg.deterministic:  # bitwise repeatable on a GPU too, slower (docs/training.md)
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
        torch.use_deterministic_algorithms(True)
    for sig in stop_signals:  # each fills env.stop
        signal.signal(sig, functools.partial(request_stop, env))
    return env


def request_stop(env, signum, frame):
    env.stop.append(signal.Signals(signum).name)
    if signum == signal.SIGINT:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C aborts at once


def set_timeout(env, seconds):
    if env.ddp:
        for group in env.groups:
            dist.distributed_c10d._set_pg_timeout(timedelta(seconds=seconds), group)


def on_every_process(env, doing, action, *args):
    """action(*args) on every process; if it fails on any, all end (SystemExit) saying why."""
    error = result = None
    try:
        result = action(*args)
    except SystemExit as e:  # its message is the user's already
        error = str(e)
    except Exception as e:
        error = f'error: {doing} ({type(e).__name__}: {e})'
    if any_failed(env, error):
        raise SystemExit(error or f'error: {doing} (on another process)')
    return result


def any_failed(env, error):  # whether any process has an error (or None): all learn it
    flag = torch.full((), float(bool(error)), device=env.device)
    if env.ddp:
        dist.all_reduce(flag)
    return flag.item() > 0
