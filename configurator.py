"""
nanoGPT's configuration convention, for every script: `python train.py config/gpt2_64m_dyt.py --seed=42`.
The script's defaults, then each config file (Python run on top of them; names starting with '_', modules and
functions are not keys), then each --key=value, read as a Python literal (a bare word, and any value of a
string key, stays a string). Unknown keys and wrong types are errors that name the closest keys; --help lists
them. Also here: the device and dtype keys, train.py's checks and processes, and the annexes an option needs.
"""
import ast
import difflib
import importlib
import importlib.util
import inspect
import os
import signal
import sys
import types
from contextlib import nullcontext
from dataclasses import fields
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist

PLAIN = (int, float, bool, str, type(None))
LONG_TIMEOUT = 3600  # seconds collectives wait until the first step is done (compiled), and around saves


def config_keys(namespace):
    """(defaults, types): a script's lower-case plain globals; one annotated `T | None` takes T or None."""
    defaults = {k: v for k, v in namespace.items() if not k.startswith('_') and not k.isupper()
                and isinstance(v, PLAIN)}
    hints = inspect.get_annotations(sys.modules[namespace['__name__']])
    return defaults, {k: next(t for t in hint.__args__ if t is not type(None)) for k, hint in hints.items()
                      if isinstance(hint, types.UnionType) and k in defaults}


def run_config_file(path, namespace=None, what='config file'):
    """Execute a Python config file on top of `namespace` (a copy) and return the resulting names."""
    if not os.path.isfile(path):
        folder = os.path.dirname(path)
        names = [os.path.join(folder, f) for f in os.listdir(folder or '.')] if os.path.isdir(folder or '.') \
            else []
        close = difflib.get_close_matches(path, names, n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ''
        raise SystemExit(f"error: {what} '{path}' not found{hint}")
    namespace = dict(namespace or {})
    with open(path) as f:
        exec(compile(f.read(), path, 'exec'), namespace)
    return namespace


def split_args(argv):  # (positional arguments, --key=value options): paths or a command, then options
    return [a for a in argv if not a.startswith('-')], [a for a in argv if a.startswith('-')]


def configure(defaults, argv, optional_types=None, doc=None):
    """A new dict: defaults <- config files <- --key=value. A value must have its default's type (an int
    does for a float); a key in optional_types takes that type or None; --help prints doc and the keys."""
    optional_types = optional_types or {}
    if '--help' in argv or '-h' in argv:
        print((doc or '').strip() + '\n\nkeys and defaults (override with config files and --key=value):')
        print('\n'.join(f'  {k} = {v!r}' for k, v in defaults.items()))
        raise SystemExit(0)
    cfg = dict(defaults)

    def set_key(key, value, source, text=None):
        if key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(close)}?" if close else "; --help lists the keys"
            if not source.startswith('--'):  # a config file's own helper variable
                hint += f" (a config file's own variables must start with '_', e.g. _{key}: they are ignored)"
            raise SystemExit(f"error: unknown config key '{key}' (from {source}){hint}")
        nullable = key in optional_types or defaults[key] is None
        want = optional_types.get(key, None if defaults[key] is None else type(defaults[key]))
        if want is str and text is not None and not isinstance(value, (str, type(None))):
            value = text  # --wandb_run_name=2024 means the name '2024', not a number
        if value is None and nullable:
            pass
        elif want is float and type(value) is int:
            value = float(value)
        elif want is not None and type(value) is not want:
            raise SystemExit(f"error: config key '{key}' (from {source}) must be {want.__name__}"
                             f"{' or None' if nullable else ''}, got {value!r} ({type(value).__name__})")
        cfg[key] = value

    for arg in argv:
        if not arg.startswith('--'):
            namespace = run_config_file(arg, cfg)
            for key, value in namespace.items():  # modules, functions and _private names are the file's own
                if not key.startswith('_') and isinstance(value, PLAIN):
                    set_key(key, value, arg)
        else:
            key, eq, text = arg[2:].partition('=')
            if not eq:
                flag = f"; for a flag write {arg}=True" if isinstance(defaults.get(key), bool) else ''
                raise SystemExit(f"error: expected --key=value, got '{arg}'{flag}")
            try:
                value = ast.literal_eval(text)
            except (SyntaxError, ValueError):
                value = text  # a bare word such as --init_from=resume
            set_key(key, value, arg, text)
    return cfg


# ------------------------------------------------------------------------------------------------------------
# The keys several scripts share: device and dtype; train.py's checks; the annexes an option needs

def pick_device(device=None):
    """The device asked for (an error if this machine lacks it), or by default cuda, else mps, else cpu."""
    if device in (None, 'auto'):
        return 'cuda' if torch.cuda.is_available() else 'mps' if torch.backends.mps.is_available() else 'cpu'
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ValueError(f"device={device!r} is not a device name; use 'cpu', 'cuda', 'cuda:1' or 'mps'") \
            from None
    available = {'cuda': torch.cuda.is_available(), 'mps': torch.backends.mps.is_available()}
    if not available.get(kind, True):
        raise ValueError(f"device={device!r}, but this machine has no {kind} device; use device='cpu'")
    return device


def precision(device, dtype=None):
    """(dtype name, the context to run the model in), as train.py trains: dtype None = 'bfloat16' on a CUDA
    device that has it, else 'float32'; float32 runs without autocast, and on CUDA its matmuls use TF32."""
    kind = torch.device(device).type
    dtype = dtype or ('bfloat16' if kind == 'cuda' and torch.cuda.is_bf16_supported() else 'float32')
    if kind == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return dtype, nullcontext() if dtype == 'float32' else torch.autocast(kind, dtype=getattr(torch, dtype))


def resolve(cfg, world):
    """train.py's keys completed (device, dtype, backend, init_from) and checked before anything is read."""
    from data.common import micro_batches  # here, not above: the prepare scripts read this file too
    from model import GPTConfig
    try:
        cfg.device = pick_device(cfg.device)
        GPTConfig(**{f.name: getattr(cfg, f.name) for f in fields(GPTConfig)})  # the model's own checks
    except ValueError as e:
        raise SystemExit(f'error: {e}') from None
    cfg.dtype = precision(cfg.device, cfg.dtype)[0]
    cfg.backend = cfg.backend or ('nccl' if cfg.device.startswith('cuda') else 'gloo')
    if cfg.fsdp:
        annex('cluster', 'fsdp=True')  # said before anything starts, where a fork has deleted it
    has_run = any(os.path.exists(os.path.join(cfg.out_dir, name))
                  for name in ('ckpt.pt', 'ckpt.dcp', 'ckpt.dcp.old'))
    if cfg.init_from == 'auto':
        cfg.init_from = 'resume' if has_run else 'scratch'
    checks = [(cfg.init_from in ('scratch', 'resume'), "init_from must be 'scratch', 'resume' or 'auto'"),
              (cfg.init_from == 'resume' or cfg.overwrite or cfg.eval_only or not has_run,
               f'{cfg.out_dir} already holds a run (ckpt.pt); pass --out_dir=NEW, --init_from=resume (or '
               'auto), or --overwrite=True'),
              (cfg.dtype in ('float32', 'bfloat16'), "dtype must be 'float32' or 'bfloat16'"),
              (min(cfg.eval_interval, cfg.log_interval, cfg.eval_iters, cfg.batch_size, cfg.block_size,
                   cfg.gradient_accumulation_steps) > 0, 'eval_interval, log_interval, eval_iters, '
               'batch_size, block_size and gradient_accumulation_steps must be positive'),
              (cfg.max_iters >= 0, f'max_iters ({cfg.max_iters}) must be >= 0 (0 = evaluate the initial '
               'model)'),
              (cfg.paper_val >= 0 and (cfg.eval_interval_warmup is None or cfg.eval_interval_warmup > 0),
               'paper_val must be >= 0 (0 = off) and eval_interval_warmup positive (or None: eval_interval)'),
              (world == 1 or not cfg.fsdp_shard or cfg.fsdp and world % cfg.fsdp_shard == 0,
               f'fsdp_shard={cfg.fsdp_shard} needs fsdp=True and must divide the {world} processes (a '
               "node's GPUs)"),
              (not cfg.wandb_log or importlib.util.find_spec('wandb'),
               'wandb_log=True, but wandb is not installed (pip install wandb)')]
    for n, what in ((cfg.batch_size * cfg.gradient_accumulation_steps, 'samples per step (batch_size x '
                     'gradient_accumulation_steps)'), (cfg.eval_iters * cfg.batch_size, 'eval_iters x '
                                                      'batch_size eval samples')):
        shares = [c for r in range(world) for _, c in micro_batches(n, world, r, cfg.batch_size)
                  ] if min(n, cfg.batch_size) > 0 else []  # else the positivity check says what is wrong
        checks.append((all(c > 0 for c in shares), f'the {n} {what} are too few to give each of {world} '
                       'processes the same number of micro-batches; raise them or use fewer processes'))
    for ok, message in checks:
        if not ok:
            raise SystemExit(f'error: {message}')


def setup(cfg, stop_signals):
    """train.py's processes (torchrun's, or srun's via annex/cluster.py), device, precision, and the stop
    signals that set env.stop; cfg completed and checked (resolve)."""
    if cfg.launcher not in (None, 'srun'):
        raise SystemExit(f"error: launcher={cfg.launcher!r}: use 'srun' or None (torchrun, or one process)")
    if cfg.launcher:  # only when asked: a job's Slurm variables alone do not make a process one of many
        annex('cluster', 'launcher=srun').srun_environment()
    ddp = 'RANK' in os.environ
    rank, local_rank = int(os.environ.get('RANK', 0)), int(os.environ.get('LOCAL_RANK', 0))
    world = int(os.environ.get('WORLD_SIZE', 1))
    resolve(cfg, world)
    device = cfg.device
    if ddp:
        if device.startswith('cuda'):  # modulo: Slurm may show each task only its own GPU
            device = f'cuda:{local_rank % torch.cuda.device_count()}'
            torch.cuda.set_device(device)
            os.environ.setdefault('TORCH_NCCL_TRACE_BUFFER_SIZE', '2000')  # the flight recorder: on a timeout
            os.environ.setdefault('TORCH_NCCL_DUMP_ON_TIMEOUT', '1')  # each rank dumps what it waited for
        dist.init_process_group(backend=cfg.backend, timeout=timedelta(seconds=LONG_TIMEOUT))
    env = SimpleNamespace(ddp=ddp, fsdp=cfg.fsdp and ddp, rank=rank, local_rank=local_rank, world=world,
                          master=rank == 0, device=device, device_type=device.split(':')[0], groups=[None],
                          ptdtype=getattr(torch, cfg.dtype), ctx=precision(device, cfg.dtype)[1], stop=[])

    def request_stop(signum, frame):  # acted on at the next step, by every process at once
        env.stop.append(signal.Signals(signum).name)
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C aborts at once
    for sig in stop_signals:
        signal.signal(sig, request_stop)
    return env


def set_timeout(env, seconds):
    """How long collectives wait for a lost process before failing (torchtitan's way: long while compiling
    and writing checkpoints, short for steps). env.groups: the default group, and HSDP's mesh groups."""
    for group in env.groups if env.ddp else []:
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=seconds), group)


def annex(name, needed_by=None):
    """The module annex/<name>.py. Where a fork has deleted it: None, or, for an option or data that needs it
    (needed_by), an error that says so."""
    try:
        return importlib.import_module(f'annex.{name}')
    except ModuleNotFoundError as e:
        if e.name not in ('annex', f'annex.{name}'):
            raise
        if needed_by:
            raise SystemExit(f'error: {needed_by} needs annex/{name}.py, which this copy of nanonorm does '
                             'not have (restore it from the nanonorm repository)') from None
        return None
