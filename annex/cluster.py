"""
train.py on a cluster: processes started by Slurm's srun (launcher='srun'), FSDP2 sharding
(fsdp=True; HSDP with fsdp_shard), sharded checkpoints (ckpt.dcp/: each process writes its part, with
torch.distributed.checkpoint), checkpoints saved in the background (async_save=True) and kept by step
(keep_last=k). `python annex/cluster.py export OUT_DIR [--which=best] [--weights_only=True]
[--dtype=bfloat16]` writes OUT_DIR/export/ckpt-<iter>.pt, a file that sample.py, analyze.py and
annex/eval.py read. An annex: train.py imports it only for these (docs/cluster.md).
"""
import contextlib
import copy
import io
import json
import os
import re
import shutil
import sys
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # as annex/cluster.py
from checkpoint import (CHECKPOINTS, SHARDED, build_model, load_checkpoint,  # noqa: E402
                        load_training_state, save_checkpoint, training_state)
from configurator import configure  # noqa: E402
from data.common import atomic_write, write_json  # noqa: E402
from distributed import LONG_TIMEOUT, any_failed, on_every_process, set_timeout  # noqa: E402
from model import rope_angles  # noqa: E402


def srun_environment(launcher='srun'):
    """torchrun's variables from those srun gives each task of a job step (SLURM_STEP_NUM_TASKS: the
    step's, not the allocation's SLURM_NTASKS). The port, unless given, from the job and step ids: two
    jobs on a node, or two steps of a job, differ; below Linux's ephemeral ports (32768-60999)."""
    if launcher != 'srun':
        raise SystemExit(f"error: launcher={launcher!r}: use 'srun' or None (torchrun, or one process)")
    missing = [v for v in ('SLURM_PROCID', 'SLURM_LOCALID', 'SLURM_STEP_NUM_TASKS', 'MASTER_ADDR')
               if v not in os.environ]
    if missing:
        raise SystemExit(f"error: launcher='srun', but {', '.join(missing)} is not set: start train.py "
                         'with srun, and export MASTER_ADDR (the first node; docs/cluster.md)')
    job, step = (int(os.environ.get(f'SLURM_{v}_ID', 0)) for v in ('JOB', 'STEP'))
    port = 10000 + (job + 7919 * step) % 20000
    os.environ.update(RANK=os.environ['SLURM_PROCID'], LOCAL_RANK=os.environ['SLURM_LOCALID'],
                      WORLD_SIZE=os.environ['SLURM_STEP_NUM_TASKS'],
                      MASTER_PORT=os.environ.get('MASTER_PORT', str(port)))


def check_sharding(cfg, world):
    """train.py's FSDP keys: fsdp_shard needs fsdp=True and must divide the process count."""
    if world > 1 and cfg.fsdp_shard and not (cfg.fsdp and world % cfg.fsdp_shard == 0):
        raise SystemExit(f'error: fsdp_shard={cfg.fsdp_shard} needs fsdp=True and must divide the '
                         f"{world} processes (a node's GPUs)")


def build_sharded(model_args, cfg, env):
    """The model of model_args sharded with FSDP2 over every process (fsdp_shard: a 2-D mesh, sharded
    within groups of fsdp_shard processes, replicated across them), each block compiled with
    compile=True. No process but rank 0 holds the whole model: rank 0 builds it on the CPU from the seed
    train.py set, as a single process does, and its weights are broadcast into the shards, so every
    process count trains the same weights."""
    with torch.device('meta'):
        raw = build_model(model_args)
    # block by block, and the output layer with the loss: FSDP's hooks stay outside the graphs
    if cfg.compile:
        for block in raw.transformer.h:
            block.forward = torch.compile(block.forward)
        if hasattr(raw, 'head_loss'):  # a GPT's
            raw.head_loss = torch.compile(raw.head_loss)
    mesh = None
    if cfg.fsdp_shard:  # all-gathers stay inside a node; one gradient all-reduce crosses nodes
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(env.device_type, (env.world // cfg.fsdp_shard, cfg.fsdp_shard),
                                mesh_dim_names=('replicate', 'shard'))
        env.groups += [mesh.get_group('replicate'), mesh.get_group('shard')]
        set_timeout(env, LONG_TIMEOUT)  # as the default group's, until the first step
    # opt-in: weights gathered in bf16 (half the traffic), gradients reduced in fp32
    policy = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if cfg.fsdp_bf16 else \
        MixedPrecisionPolicy()
    last = len(raw.transformer.h) - 1
    for i, block in enumerate(raw.transformer.h):  # the last block's backward comes first: kept gathered
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=i < last)
    fully_shard(raw, mesh=mesh, mp_policy=policy)
    raw.to_empty(device=env.device)
    if 'wte' in raw.transformer:  # to_empty gave each reference to the tied weight its own tensor
        raw.transformer.wte.weight = raw.lm_head.weight
    if getattr(raw.config, 'pos', None) == 'rope':  # buffers are not broadcast: computed here
        cos, sin = rope_angles(raw.config.block_size, raw.config.n_embd // raw.config.n_head,
                               raw.config.rope_theta)
        raw.rope_cos.copy_(cos)
        raw.rope_sin.copy_(sin)
    if cfg.init_from != 'scratch':  # a checkpoint's weights will fill it
        return raw
    if env.master:
        torch.manual_seed(cfg.seed)  # the single process's init
    whole = build_model(model_args).state_dict() if env.master else {}
    set_model_state_dict(raw, whole,
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return raw


# -------------------------------------------------------------------------------------------------------
# train.py's saves here: sharded (ckpt.dcp/), in the background, kept by step

def save_run(model, optimizer, fields, cfg, env, best=False):
    """ckpt.dcp/ (a DDP or FSDP run above shard_checkpoints_above parameters) or rank 0's ckpt.pt,
    now or in the background (async_save: the state copied off the GPU now, written as training goes
    on). Whether it writes in the background. At most one save in flight: train.py waits for the
    last one first (wait)."""
    if env.sharded:
        writer = ShardWriter(fields, cfg.out_dir, best, cfg.keep_last, env.rank)
        if env.master:
            shutil.rmtree(writer.path, ignore_errors=True)
        dist.barrier()
        if not (cfg.async_save and env.fsdp):  # DDP's would first copy all of it on every process
            said_briefly(dcp.save, state_dicts(model, optimizer), storage_writer=writer)
            return False
        if getattr(env, 'save_group', None) is None:  # its own: the steps' collectives go on
            env.save_group = dist.new_group(backend='gloo', timeout=timedelta(seconds=LONG_TIMEOUT))
        env.pending = fields['iter_num'], dcp.async_save(
            state_dicts(model, optimizer), storage_writer=writer, process_group=env.save_group)
        return True
    state = training_state(model, optimizer, **fields)
    if not cfg.async_save:
        if env.master:
            save_whole(state, cfg.out_dir, best, cfg.keep_last)
        return False
    if env.master:  # the others go on as it writes
        if env.device_type != 'cuda':  # CPU tensors are still the live ones: copied, as CUDA's are
            state = copy.deepcopy(state)
        pool = ThreadPoolExecutor(1)
        env.pending = fields['iter_num'], pool.submit(save_whole, state, cfg.out_dir, best,
                                                      cfg.keep_last)
        pool.shutdown(wait=False)  # its thread ends with the write
    return True


def save_whole(state, out_dir, best, keep_last):
    save_checkpoint(state, out_dir, best)
    keep_steps(out_dir, state['iter_num'], keep_last)


def wait(env):
    """The background save done (swapped in), or its error raised; every process calls it."""
    pending, env.pending = getattr(env, 'pending', None), None
    if pending is None:
        return
    try:
        said_briefly(pending[1].result)
    except Exception as e:
        raise RuntimeError(f'the save of iter {pending[0]}, in the background, failed: {e}') from None


def said_briefly(call, *args, **kwargs):  # DCP's errors: a BaseException with every traceback
    try:
        return call(*args, **kwargs)
    except dcp.api.CheckpointException as e:
        why = '; '.join(f'rank {rank}: {type(error).__name__}: {error}'
                        for rank, (error, _) in sorted(e.failures.items()))
        raise RuntimeError(f'torch.distributed.checkpoint failed on {why}') from None


def keep_steps(out_dir, it, keep_last):
    """ckpt-<it>.pt (or .dcp/) beside ckpt.pt: hard links to its files; the last keep_last kept."""
    if not keep_last:
        return
    sharded = os.path.isdir(os.path.join(out_dir, SHARDED['latest']))
    latest = os.path.join(out_dir, SHARDED['latest'] if sharded else CHECKPOINTS['latest'])
    path = os.path.join(out_dir, f"ckpt-{it}.{'dcp' if sharded else 'pt'}")
    if sharded:
        shutil.rmtree(path + '.tmp', ignore_errors=True)
        shutil.copytree(latest, path + '.tmp', copy_function=link_or_copy)
        swap_in(path + '.tmp', path)
    else:
        link_or_copy(latest, f'{path}.tmp{os.getpid()}')
        os.replace(f'{path}.tmp{os.getpid()}', path)
    steps = sorted((int(m[1]), m[0]) for m in map(STEP.fullmatch, os.listdir(out_dir)) if m)
    for _, old in steps[:-keep_last]:
        remove(os.path.join(out_dir, old))


def remove(path):  # a file or a folder
    if os.path.isdir(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


STEP = re.compile(r'ckpt-(\d+)\.(pt|dcp)')  # keep_steps' names


def state_dicts(model, optimizer):
    """Each process's part of the weights and AdamW state (whole tensors without FSDP: DCP writes each
    replicated one once, spread over the processes). The tied output layer is the token embedding."""
    weights = get_model_state_dict(model)
    weights.pop('lm_head.weight', None)
    return {'model': weights, 'optimizer': get_optimizer_state_dict(model, optimizer)}


def crc32(path, chunk=1 << 20):
    value = 0
    with open(path, 'rb') as f:
        while block := f.read(chunk):
            value = zlib.crc32(block, value)
    return value


class Crc32File:  # a file that keeps the CRC-32 of what is written to it, as it is written
    def __init__(self, file):
        self.file, self.crc = file, 0

    def write(self, data):
        self.crc = zlib.crc32(data, self.crc)
        return self.file.write(data)

    def __getattr__(self, name):  # tell, flush, fileno, close
        return getattr(self.file, name)


class CrcFileSystem(dcp.filesystem.FileSystem):  # DCP's file access, each file's CRC-32 kept
    def __init__(self):
        super().__init__()
        self.crcs = {}

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        with super().create_stream(path, mode) as stream:
            counted = Crc32File(stream)
            yield counted
        self.crcs[os.path.basename(path)] = counted.crc


class ShardWriter(dcp.FileSystemWriter):
    """DCP's writer into ckpt.dcp.tmp/, each file's CRC-32 computed as it is written (no reading
    back). Once every process has written its part, the coordinator (rank 0) adds state.pt (the other
    fields) and checksums.json and swaps the folder in as ckpt.dcp/ (best.dcp/ links to it), in
    DCP's last step: an error anywhere reaches every process there, saved now or in the background."""
    def __init__(self, fields, out_dir, best, keep_last, rank):
        super().__init__(os.path.join(out_dir, SHARDED['latest']) + '.tmp')
        self.fs = CrcFileSystem()
        self.out_dir, self.best, self.keep_last, self.rank = out_dir, best, keep_last, rank
        self.iter_num, buffer = fields['iter_num'], io.BytesIO()
        torch.save(fields, buffer)  # now: the loop goes on changing what they hold
        self.fields = buffer.getvalue()

    def write_data(self, plan, planner):
        written = super().write_data(plan, planner)  # done when it returns
        write_json(os.path.join(self.path, f'__{self.rank}.crc32.json'), self.fs.crcs)
        return written

    def finish(self, metadata, results):  # on the coordinator, when every process has written
        super().finish(metadata, results)
        sums = {'.metadata': self.fs.crcs['.metadata.tmp'], 'state.pt': zlib.crc32(self.fields)}
        for rank in range(len(results)):  # by name: a listing may lag on a network filesystem
            path = os.path.join(self.path, f'__{rank}.crc32.json')
            with open(path) as f:
                sums.update(json.load(f))
            os.remove(path)
        atomic_write(os.path.join(self.path, 'state.pt'), lambda f: f.write(self.fields))
        write_json(os.path.join(self.path, 'checksums.json'), sums)  # last: the folder is whole
        final = os.path.join(self.out_dir, SHARDED['latest'])
        swap_in(str(self.path), final)
        if self.best:
            links = os.path.join(self.out_dir, SHARDED['best']) + '.tmp'
            shutil.rmtree(links, ignore_errors=True)
            shutil.copytree(final, links, copy_function=link_or_copy)
            swap_in(links, os.path.join(self.out_dir, SHARDED['best']))
        for kind in ('latest', 'best') if self.best else ('latest',):  # now the older single file
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.out_dir, CHECKPOINTS[kind]))
        keep_steps(self.out_dir, self.iter_num, self.keep_last)


def link_or_copy(src, dst):  # the same bytes, no copy; a copy where links are not supported
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def swap_in(tmp, final):
    """Folder tmp renamed to final, the old final removed, the renames made durable; a crash in
    between leaves final.old (and a whole tmp), which clear_stale sorts out."""
    if os.path.exists(final):
        if os.path.exists(final + '.old'):  # a stale one (a file held open on NFS): not in the way
            shutil.rmtree(final + '.old')
        os.replace(final, final + '.old')
    os.replace(tmp, final)
    fd = os.open(os.path.dirname(os.path.abspath(final)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    shutil.rmtree(final + '.old', ignore_errors=True)


def clear_stale(out_dir):
    """What an interrupted save left: a whole ckpt.dcp.tmp/ (its checksums.json, written last, there)
    put in as ckpt.dcp/, other *.dcp.tmp/ removed; a folder caught between swap_in's two renames (only
    *.dcp.old/ there) put back; of ckpt.pt and ckpt.dcp/ (best.pt, best.dcp/) both there, a save cut
    short before it removed the other, the older removed."""
    tmp = os.path.join(out_dir, SHARDED['latest'] + '.tmp')
    if os.path.isfile(os.path.join(tmp, 'checksums.json')):
        print(f'putting in {tmp} as {SHARDED["latest"]}: a whole save cut short before its swap')
        swap_in(tmp, tmp[:-4])
    for name in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, name)
        if re.fullmatch(r'(ckpt|best)(-\d+)?\.dcp\.tmp', name):
            print(f'removing {path}: left by an interrupted save')
            shutil.rmtree(path)
        elif re.fullmatch(r'(ckpt|best)(-\d+)?\.dcp\.old', name):
            if os.path.exists(path[:-4]):  # the new one is whole
                shutil.rmtree(path)
            else:
                os.replace(path, path[:-4])
    for kind in SHARDED:
        folder, single = os.path.join(out_dir, SHARDED[kind]), os.path.join(out_dir, CHECKPOINTS[kind])
        if os.path.isdir(folder) and os.path.isfile(single):
            older = single if shards_are_latest(out_dir, kind) else folder
            print(f'removing {older}: the older of {CHECKPOINTS[kind]} and {SHARDED[kind]}/')
            remove(older)


def shards_are_latest(out_dir, which):
    """Whether ckpt.dcp/ (best.dcp/) is the run's latest (best): there, and saved after ckpt.pt
    (best.pt) if that is there too (its state.pt, written last, against the file)."""
    folder, single = os.path.join(out_dir, SHARDED[which]), os.path.join(out_dir, CHECKPOINTS[which])
    if not os.path.isdir(folder):
        return False
    state = os.path.join(folder, 'state.pt')
    return not os.path.isfile(single) or (
        os.path.exists(state) and os.path.getmtime(state) >= os.path.getmtime(single))


def export_stem(which):  # export/ckpt-<iter>.pt, export/best-<iter>.pt
    return CHECKPOINTS[which].removesuffix('.pt')


def current_file(out_dir, which='latest'):
    """The file a reader takes from a run saved in shards: its newest export, said how old (ckpt.pt
    where it was saved after the shards)."""
    if not shards_are_latest(out_dir, which):
        return os.path.join(out_dir, CHECKPOINTS[which])
    folder, exported = os.path.join(out_dir, SHARDED[which]), os.path.join(out_dir, 'export')
    names = os.listdir(exported) if os.path.isdir(exported) else []
    pattern = re.compile(rf'{export_stem(which)}-(\d+)\.pt')
    exports = [(int(m[1]), m[0]) for m in map(pattern.fullmatch, names) if m]
    if not exports:
        raise FileNotFoundError(f'{folder} is in shards: export it first: python annex/cluster.py '
                                f'export {out_dir} --which={which}')
    at, name = max(exports)
    now = read_fields(folder)['iter_num']
    again = f'; export again for iter {now}' if now > at else ''
    print(f'reading {exported}/{name} (iter {at}), exported from {folder} (iter {now}){again}')
    return os.path.join(exported, name)


def read_checksums(folder):
    try:
        with open(os.path.join(folder, 'checksums.json')) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f'{folder} is not a complete sharded checkpoint ({type(e).__name__}: {e}): '
                         'copy it again, or resume from another checkpoint') from None


def read_fields(folder):
    """A sharded checkpoint's fields other than weights and optimizer state (model_args, config, the loop
    state...), their CRC-32 checked before they are unpickled; 'sharded': its folder."""
    path = os.path.join(folder, 'state.pt')
    if not os.path.isfile(path):
        raise ValueError(f'{folder} is not a complete sharded checkpoint (no state.pt): an interrupted '
                         'save? Remove it to resume from ckpt.pt, or start a new run')
    if crc32(path) != read_checksums(folder).get('state.pt'):
        raise ValueError(f'{path} fails its CRC-32 check (torn, or changed on disk or in a copy): '
                         'copy it again, or resume from another checkpoint')
    return dict(torch.load(path, weights_only=True), sharded=folder)


def damaged(folder, rank=0, world=1):
    """The files of a sharded checkpoint (this process's share of them) that fail their CRC-32."""
    bad = []
    for name, crc in sorted(read_checksums(folder).items())[rank::world]:
        try:
            if crc32(os.path.join(folder, name)) != crc:
                bad.append(name)
        except OSError:  # missing or unreadable: a copy cut short
            bad.append(f'{name} (unreadable)')
    return bad


def load_sharded(model, optimizer, folder, env):
    """Weights and AdamW state of a sharded checkpoint (any process count), its files' CRC-32s checked
    first, shared out over the processes. FSDP: each process reads its part; DDP: rank 0 reads it all
    once, and broadcasts it (not every process the whole checkpoint)."""
    bad = damaged(folder, env.rank, env.world)
    if any_failed(env, bad):
        raise SystemExit(f"error: {folder} is damaged: {', '.join(bad) or 'see the other processes'} "
                         'fail their CRC-32 check. Copy it again, or resume from another checkpoint')
    if not env.ddp or env.fsdp:
        read_shards(model, optimizer, folder, no_dist=not env.ddp)
        return
    on_every_process(env, f'cannot read {folder}', read_shards, model, optimizer, folder, True,
                     env.master)  # rank 0's failure known to all before they wait in the broadcast
    full = StateDictOptions(full_state_dict=True)
    whole = {'model': {}, 'optimizer': {}}
    if env.master:
        whole = {'model': get_model_state_dict(model, options=full),
                 'optimizer': get_optimizer_state_dict(model, optimizer, options=full)}
    load_training_state(model, optimizer, whole, env)


def read_shards(model, optimizer, folder, no_dist, mine=True):
    if not mine:
        return
    state = state_dicts(model, optimizer)  # AdamW's state made (a zero step at lr 0) for DCP to fill
    with warnings.catch_warnings():  # that one process reads it all is the point with no_dist
        warnings.filterwarnings('ignore', 'torch.distributed is disabled')
        dcp.load(state, checkpoint_id=folder, no_dist=no_dist)
    set_model_state_dict(model, state['model'], options=StateDictOptions(strict=False))  # lm_head: tied
    set_optimizer_state_dict(model, optimizer, state['optimizer'])


def export(out_dir, which='latest', weights_only=False, dtype='float32'):
    """out_dir/export/ckpt-<iter>.pt (best-<iter>.pt) from the run's latest (best) checkpoint, sharded
    or not, in one process: a training state as a single-file run writes, or its weights only (dtype:
    float32 or bfloat16), which train.py does not resume but every reader reads."""
    if which not in SHARDED or dtype not in ('float32', 'bfloat16'):
        raise SystemExit(f"error: --which={which!r} --dtype={dtype!r}: use which 'latest' or 'best', "
                         "dtype 'float32' or 'bfloat16'")
    folder, single = os.path.join(out_dir, SHARDED[which]), os.path.join(out_dir, CHECKPOINTS[which])
    if shards_are_latest(out_dir, which):
        fields = read_fields(folder)
        del fields['sharded']
        model = build_model(fields['model_args'])
        cfg = fields['config']
        optimizer = model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'],
                                               (cfg['beta1'], cfg['beta2']), 'cpu')
        load_sharded(model, optimizer, folder, SimpleNamespace(rank=0, world=1, ddp=False, device='cpu'))
        state = training_state(model, optimizer, **fields)
    else:
        try:
            state = load_checkpoint(single, which=which)[1]
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f'error: {e}') from None
    if weights_only:
        state.pop('optimizer', None)
        cast = {}  # by storage: the tied output layer stays one tensor
        state['model'] = {k: cast.setdefault((v.data_ptr(), v.shape), v.to(getattr(torch, dtype)))
                          if v.is_floating_point() else v for k, v in state['model'].items()}
    os.makedirs(os.path.join(out_dir, 'export'), exist_ok=True)
    path = os.path.join(out_dir, 'export', f"{export_stem(which)}-{state['iter_num']}.pt")
    atomic_write(path, lambda f: torch.save(state, f))
    return path


if __name__ == '__main__':
    args = sys.argv[1:]
    usage = ('usage: python annex/cluster.py export OUT_DIR [--which=best] [--weights_only=True] '
             '[--dtype=bfloat16]: the latest (best) checkpoint, sharded or not, as one file in '
             'OUT_DIR/export/ckpt-<iter>.pt (best-<iter>.pt)')
    if '--help' in args or '-h' in args:
        print(usage)
        raise SystemExit(0)
    if len(args) < 2 or args[0] != 'export':
        raise SystemExit(usage)
    opts = configure({'which': 'latest', 'weights_only': False, 'dtype': 'float32'}, args[2:])
    print(f'wrote {export(args[1], **opts)}')
