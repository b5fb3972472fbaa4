"""annex/memory.py: MFU peaks by GPU name, parameter counts, activation bytes, the memory plan (and train.py
printing it), checkpoint size.

Every figure is checked against something computed another way: datasheet numbers written out here, counts
of a meta-device model, the storages autograd keeps on CPU, a checkpoint written the way train.py writes
it."""
import collections
import gc
import os
import shutil
import socket

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn as nn

import train
from annex import memory
from annex.memory import (activation_bytes, checkpoint_bytes, format_memory_plan, gpu_peak_flops,
                          memory_plan, param_count, peak_flops)
from configurator import run_config_file
from model import GPT, GPTConfig
from tests.test_train import records, run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BF16, FP32 = torch.bfloat16, torch.float32

# (torch.cuda.get_device_name(), dtype, dense TFLOP/s from the datasheet, or None)
PEAKS = [
    ('NVIDIA H100 80GB HBM3', BF16, 989.4), ('NVIDIA H100 80GB HBM3', FP32, 494.7),  # SXM
    ('NVIDIA H100 PCIe', BF16, 756), ('NVIDIA H100 PCIe', FP32, 378),
    ('NVIDIA H100 NVL', BF16, 835), ('NVIDIA H100 NVL', FP32, 418),
    ('NVIDIA H200', BF16, 989.4), ('NVIDIA H200 NVL', BF16, 835), ('NVIDIA GH200 480GB', FP32, 494.7),
    ('NVIDIA B200', BF16, 2250), ('NVIDIA GB200', BF16, 2500), ('NVIDIA B200', FP32, 1100),
    ('NVIDIA A100-SXM4-80GB', BF16, 312), ('NVIDIA A100-SXM4-40GB', FP32, 156),
    ('NVIDIA A100-PCIE-40GB', BF16, 312), ('NVIDIA A100 80GB PCIe', FP32, 156),
    ('NVIDIA A10G', BF16, 70), ('NVIDIA A10', BF16, 125), ('NVIDIA A10', FP32, 62.5),
    ('NVIDIA L4', BF16, 121), ('NVIDIA L4', FP32, 60),
    ('NVIDIA L40S', BF16, 362.05), ('NVIDIA L40S', FP32, 183),
    ('NVIDIA L40', BF16, 181.05),
    ('NVIDIA RTX A6000', BF16, 154.8),
    ('NVIDIA GeForce RTX 4090', BF16, 165.2), ('NVIDIA GeForce RTX 4090', FP32, 82.6),
    ('NVIDIA GeForce RTX 3090', BF16, 71), ('NVIDIA GeForce RTX 3090', FP32, 35.6),
    ('Tesla V100-SXM2-32GB', BF16, None), ('Tesla V100-SXM2-32GB', FP32, 15.7),
    ('Tesla V100-PCIE-16GB', FP32, 14),
    ('Tesla V100S-PCIE-32GB', FP32, 16.4), ('Tesla T4', BF16, None), ('Tesla T4', FP32, 8.1),
    # not in the table: no MFU rather than a wrong one (RTX A1000 contains 'A100' and 'A10' as substrings)
    ('NVIDIA RTX A1000', BF16, None), ('NVIDIA RTX 6000 Ada Generation', BF16, None),
    ('NVIDIA H800', BF16, None), ('NVIDIA GeForce GTX 1080 Ti', FP32, None),
]


@pytest.mark.parametrize('name,dtype,tflops', PEAKS)
def test_peak_flops_by_device_name_and_dtype(name, dtype, tflops):
    expected = None if tflops is None else pytest.approx(tflops * 1e12)
    assert peak_flops(name, dtype) == expected
    # train.py's dtype names work too
    assert peak_flops(name, str(dtype).removeprefix('torch.')) == expected


def test_peak_flops_refuses_a_dtype_it_has_no_figure_for():
    with pytest.raises(ValueError, match='float16'):
        peak_flops('NVIDIA H100 80GB HBM3', torch.float16)
    assert gpu_peak_flops('cpu', FP32) is None  # train.py's MFU: no peak, no figure, off a GPU


# ------------------------------------------------------------------------------------------------------
# Parameter counts

VARIANTS = [dict(), dict(norm='dyt'), dict(norm='derf', bias=True), dict(norm='hardtanh'),
            dict(norm='rmsnorm'), dict(norm='dyt', bias=True, mlp='swiglu'), dict(attn='diff'),
            dict(pos='rope', n_kv_head=2),
            dict(attn='diff', pos='rope', n_kv_head=2, mlp='swiglu', norm='rmsnorm'),
            dict(embed_scale=True)]
# the study's shapes (config/gpt2_*.py): GPT-2 style, no bias, vocabulary 50304, block 512
STUDY = {'64m': (12, 8, 512), '1.3b': (24, 32, 2048), '3.78b': (32, 32, 3072)}


def study_config(scale, **kw):
    n_layer, n_head, n_embd = STUDY[scale]
    return GPTConfig(block_size=512, vocab_size=50304, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                     bias=False, **kw)


def meta_model(config):
    with torch.device('meta'):
        return GPT(config)


@pytest.mark.parametrize('scale,expected', [('64m', 63_779_328), ('1.3b', 1_312_131_072),
                                            ('3.78b', 3_780_185_088)])
def test_param_counts_of_the_study_scales(scale, expected):
    """GPT-2 without biases: 12 C^2 + 2 C (two LayerNorm weights) per block, plus the tied embedding,
    positions and the final LayerNorm, (V + T + 1) C. The names of the scales are these counts."""
    L, _, C = STUDY[scale]
    n = param_count(study_config(scale))
    assert n == L * (12 * C * C + 2 * C) + (50304 + 512 + 1) * C == expected


# ------------------------------------------------------------------------------------------------------
# Activations: the formula against the storages autograd keeps on CPU

def saved_for_backward(model, idx, targets, autocast, weights=None):
    """(bytes of the distinct storages autograd keeps for backward, bf16 weight copies among them). The
    model's parameters and buffers are not counted; a bf16 tensor equal to the bf16 cast of one of
    `weights` (default: the model's 2-D parameters) or of its transpose is autocast's weight copy."""
    tensors = [*model.parameters(), *model.buffers()]
    # FSDP: the local shard
    own = {getattr(t, '_local_tensor', t).untyped_storage().data_ptr() for t in tensors}
    if weights is None:
        weights = [p for p in model.parameters() if p.dim() == 2]
    weights = [w.detach().to(torch.bfloat16) for w in weights]
    kept, copies = {}, {}

    def is_weight_copy(t):
        return t.dtype == torch.bfloat16 and any(t.shape == w.shape and torch.equal(t, w) for w in
                                                 [*weights, *(w.t() for w in weights)])

    def pack(t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in own:
            (copies if is_weight_copy(t.detach()) else kept)[key] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
            model(idx, targets)
    return sum(kept.values()), sum(copies.values())


def small_config(**kw):
    return GPTConfig(block_size=32, vocab_size=96, n_layer=2, n_head=4, n_embd=64,
                     **{'bias': False, **kw})


def measure(config, batch_size=2, autocast=False, bf16_weights=False, attn_dropout=True, compile=False):
    torch.manual_seed(0)
    model = GPT(config)
    if bf16_weights:  # what FSDP's MixedPrecisionPolicy(param_dtype=bfloat16) all-gathers
        model = model.to(torch.bfloat16)
    if not attn_dropout:
        for block in model.transformer.h:
            block.attn.dropout = 0.0
    idx, targets = (torch.randint(0, config.vocab_size, (batch_size, config.block_size))
                    for _ in range(2))
    if compile:
        torch._dynamo.reset()  # a fresh compile for each model, clear of the recompilation limit
        return saved_for_backward(torch.compile(model), idx, targets, autocast)
    return saved_for_backward(model, idx, targets, autocast)


@pytest.mark.parametrize('kw', VARIANTS)
def test_activation_bytes_float32(kw):
    """float32 (no autocast): every kept tensor has 4 bytes a value; CPU's SDPA, like CUDA's flash
    kernel, keeps q, k, v, the output and the logsumexp only."""
    config = small_config(**kw)
    kept, _ = measure(config)
    assert activation_bytes(config, 2, FP32) == pytest.approx(kept, rel=0.01)


@pytest.mark.parametrize('kw', VARIANTS)
def test_activation_bytes_bf16_autocast_and_weight_copies(kw):
    """bf16 autocast with float32 weights (DDP): matmuls keep bf16 inputs; the residual stream, layer_norm
    and the loss stay float32. CPU's autocast agrees with CUDA's here (layer_norm sees float32 inputs
    either way). The bf16 copies of the weights that autograd keeps are the plan's weight_copies."""
    config = small_config(**kw)
    kept, copies = measure(config, autocast=True)
    assert activation_bytes(config, 2, BF16) == pytest.approx(kept, rel=0.01)
    plan = memory_plan(config, 2, world_size=8, fsdp=False, dtype=BF16)
    assert plan['weight_copies'] == copies


@pytest.mark.parametrize('kw', [dict(norm='dyt', mlp='swiglu'), dict(norm='derf'),
                                dict(norm='hardtanh', bias=True), dict(norm='rmsnorm', attn='diff')])
def test_activation_bytes_with_bf16_weights(kw):
    """FSDP with MixedPrecisionPolicy(param_dtype=bfloat16) gathers bf16 weights: the residual stream is
    bf16 too. (LayerNorm is left out: CUDA's autocast runs it in float32, CPU's in bf16: CPU cannot stand
    in for it.)"""
    config = small_config(**kw)
    kept, _ = measure(config, autocast=True, bf16_weights=True)
    assert activation_bytes(config, 2, BF16, bf16_weights=True) == pytest.approx(kept, rel=0.01)


# one compile: slow on CPU
@pytest.mark.parametrize('kw', [dict(norm='dyt', mlp='swiglu', pos='rope', n_kv_head=2)])
def test_activation_bytes_compiled(kw):
    """torch.compile (inductor, here its CPU backend: ~20 s a model) recomputes pointwise ops in the
    backward rather than keeping them. Its choices are not all modelled (it keeps, e.g., the position
    embeddings of a batch, or one tensor fewer with RoPE), hence 3%; the bf16 weight copies stay."""
    config = small_config(**kw)
    kept, copies = measure(config, autocast=True, compile=True)
    assert activation_bytes(config, 2, BF16, compile=True) == pytest.approx(kept, rel=0.03)
    plan = memory_plan(config, 2, world_size=8, fsdp=False, dtype=BF16, compile=True)
    assert plan['weight_copies'] == copies


def test_dropout_masks_one_per_element_of_each_dropout():
    """CUDA's fused dropout keeps a 1-byte mask; CPU's keeps its scaled noise in the input's dtype (4 bytes
    here), so the test compares the number of mask elements. Attention dropout is off: CUDA's flash kernel
    regenerates its mask, while CPU's SDPA would fall back to the math kernel and keep the T x T
    probabilities."""
    plain, dropped = small_config(), small_config(dropout=0.1)
    masks = measure(dropped, attn_dropout=False)[0] - measure(plain)[0]
    assert masks / 4 == activation_bytes(dropped, 2, FP32) - activation_bytes(plain, 2, FP32)
    # tokens x n_embd x (embedding + 2 per block x 2 blocks)
    assert masks / 4 == 2 * 32 * 64 * (1 + 2 * 2)


# ------------------------------------------------------------------------------------------------------
# The plan

def linear_weights(model):  # lm_head: the tied weight
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize('kw', [dict(), dict(attn='diff', mlp='swiglu', norm='dyt', pos='rope',
                                             n_kv_head=2)])
def test_memory_plan_ddp(kw):
    config = small_config(**kw)
    model = meta_model(config)
    n = sum(p.numel() for p in model.parameters())
    plan = memory_plan(config, 4, world_size=8, fsdp=False, dtype=BF16)
    assert [plan[k] for k in ('parameters', 'gradients', 'optimizer', 'ddp_buckets')] == [
        4 * n, 4 * n, 8 * n, 4 * n]
    assert plan['fsdp_buffers'] == 0
    assert plan['weight_copies'] == 2 * linear_weights(model)
    assert plan['activations'] == activation_bytes(config, 4, BF16)
    # bf16 logits held by train.py, two float32 gradients
    assert plan['logits'] == 4 * 32 * 96 * (2 + 4 + 4)
    assert plan['total'] == sum(v for k, v in plan.items() if k != 'total')
    single = memory_plan(config, 4, world_size=1, fsdp=False, dtype=FP32)  # no DDP wrapper, no autocast
    assert (single['ddp_buckets'], single['weight_copies']) == (0, 0)
    assert single['logits'] == 4 * 32 * 96 * (4 + 4 + 4)


def test_memory_plan_fsdp():
    config = small_config(norm='dyt')
    model = meta_model(config)
    n = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.transformer.h[0].parameters())
    root = n - config.n_layer * block  # embeddings, final norm: FSDP's root module
    # train.py: float32 weights gathered, float32 gradients; autocast's bf16 weight copies are not
    # sharded
    plan = memory_plan(config, 4, world_size=8, fsdp=True, dtype=BF16)
    # 4, 4 and 8 bytes / 8
    assert (plan['parameters'], plan['gradients'], plan['optimizer']) == (n / 2, n / 2, n)
    assert plan['ddp_buckets'] == 0
    # root + 2 blocks; root + 1 block
    assert plan['fsdp_buffers'] == 4 * (root + 2 * block) + 4 * (root + block)
    assert plan['weight_copies'] == 2 * linear_weights(model)
    assert plan['activations'] == activation_bytes(config, 4, BF16)
    # MixedPrecisionPolicy(param_dtype=bfloat16): bf16 gathered weights and gradients, float32
    # reduce-scatter copies
    mixed = memory_plan(config, 4, world_size=8, fsdp=True, dtype=BF16, fsdp_param_dtype=BF16)
    assert mixed['fsdp_buffers'] == 2 * (root + 2 * block) + (2 + 4) * (root + block)
    assert mixed['weight_copies'] == 0
    assert mixed['activations'] == activation_bytes(config, 4, BF16, bf16_weights=True) \
        < plan['activations']
    with pytest.raises(ValueError, match='bfloat16'):
        memory_plan(config, 4, world_size=8, fsdp=True, dtype=FP32, fsdp_param_dtype=BF16)


def test_format_memory_plan_warns_when_the_plan_does_not_fit():
    plan = memory_plan(study_config('3.78b'), 8, world_size=8, fsdp=False, dtype=BF16, compile=True)
    gib = 2 ** 30
    h100 = 80 * gib
    lines = format_memory_plan(plan, h100)
    assert f'{plan["total"] / gib:8.2f} GiB of 80.00 GiB' in lines[-2]
    assert lines[-1].startswith('warning:')
    text = '\n'.join(lines)
    assert 'DDP gradient buckets' in text and 'FSDP' not in text  # zero entries left out
    assert not any(line.startswith(('warning', 'note')) for line in format_memory_plan(plan, 2 * h100))
    assert format_memory_plan(plan, plan['total'] / 0.95)[-1].startswith('note:')
    # without a device: the figures alone
    assert not any('%' in line for line in format_memory_plan(plan))


def test_memory_plan_printed_for_a_big_run(data_dir, tmp_path, capsys, monkeypatch):
    """train.py prints the plan of this very run (its shape, micro-batch and process count) when it is
    big."""
    seen, real_plan = [], memory.memory_plan

    def plan(*args):
        seen.append(args)
        return dict(real_plan(*args), total=2 ** 31)  # as if 2 GiB: big enough to be printed on a CPU
    monkeypatch.setattr(memory, 'memory_plan', plan)  # memory.print_plan decides what train.py prints
    assert train.main(['--dataset=tiny', f'--data_dir={data_dir}', f'--out_dir={tmp_path / "big"}',
                       '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4',
                       '--eval_samples=8', '--max_iters=0', '--gradient_accumulation_steps=3']) == 0
    config, micro, world, fsdp, dtype, compiled = seen[0]
    assert (config.n_embd, config.vocab_size, micro, world, fsdp, dtype, compiled) == (
        32, 64, 4, 1, False, torch.float32, False)
    assert 'memory per process (estimate' in capsys.readouterr().out


def test_the_plan_suggests_the_largest_micro_batch_that_fits(capsys, monkeypatch):
    """The study's 64m on one GPU as 8 x 8: on a 16 GB card the plan (9.8 GB at 32, 18.4 GB at 64:
    docs/memory.md) fits micro-batches of 32 in 85%, so train.py says how to run 2 of 32 instead; on 8
    processes each runs its 8 already: no note."""
    study = run_config_file(os.path.join(REPO, 'config/gpt2_64m_ln.py'))
    model_args = {k: study[k] for k in ('n_layer', 'n_head', 'n_embd', 'block_size', 'bias')}
    model_args['vocab_size'] = 50304
    cfg = train.SimpleNamespace(**dict(train.DEFAULTS, batch_size=8, gradient_accumulation_steps=8,
                                       compile=True))
    monkeypatch.setattr(torch.cuda, 'get_device_properties',
                        lambda device: train.SimpleNamespace(total_memory=16e9))
    env = train.SimpleNamespace(world=1, fsdp=False, device='cuda:0', device_type='cuda',
                                ptdtype=torch.bfloat16)
    memory.print_plan(model_args, cfg, env, 8)
    out = capsys.readouterr().out
    assert 'of 14.90 GiB' in out and 'note: micro-batches of up to 32 fit' in out
    assert '--batch_size=32 --gradient_accumulation_steps=2 trains the same 64 sequences' in out
    env.world = 8
    memory.print_plan(model_args, cfg, env, 8)
    assert 'note: micro-batches' not in capsys.readouterr().out
    env.world = 3  # shares of 21 and 22: one micro-batch of 22, not two of 11 (batch_size 16)
    memory.print_plan(model_args, cfg, env, 8)
    assert ('note: micro-batches of up to 22 fit in 85% of this GPU by the plan: --batch_size=64 '
            '--gradient_accumulation_steps=1') in capsys.readouterr().out


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def fsdp_process(rank, world, port):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=world)
    torch.set_num_threads(1)
    return dist


def fsdp_runs(rank, world, port, saved_path, ckpt_path):
    """Both FSDP measurements below in one pair of processes (a process spawned imports torch and the
    model anew: most of the time): one after the other, each on its own model."""
    dist = fsdp_process(rank, world, port)
    fsdp_saved_tensors(rank, saved_path)
    save_like_train(rank, ckpt_path)
    dist.destroy_process_group()


@pytest.fixture(scope='module')
def fsdp_files(tmp_path_factory):
    """(saved.pt, ckpt.pt): what fsdp_saved_tensors and save_like_train write, on 2 gloo processes."""
    d = tmp_path_factory.mktemp('fsdp')
    paths = str(d / 'saved.pt'), str(d / 'ckpt.pt')
    mp.spawn(fsdp_runs, args=(2, free_port(), *paths), nprocs=2)
    return paths


def fsdp_saved_tensors(rank, path):
    """Forward under autocast of an FSDP2 model sharded like train.py's (float32 weights): what autograd
    keeps."""
    from torch.distributed.fsdp import fully_shard
    config = small_config()
    torch.manual_seed(0)
    model = GPT(config)
    # full values, before sharding
    weights = [p.detach().clone() for p in model.parameters() if p.dim() == 2]
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    idx, targets = (torch.randint(0, config.vocab_size, (2, config.block_size)) for _ in range(2))
    kept, copies = saved_for_backward(model, idx, targets, autocast=True, weights=weights)
    if rank == 0:
        torch.save({'kept': kept, 'copies': copies}, path)
    del model
    gc.collect()  # the sharded model freed before its process group: else gloo can abort at exit


def test_fsdp_keeps_every_layer_s_bf16_weight_copy(fsdp_files):
    """FSDP reshards a block's float32 weights after its forward, but the bf16 copies autocast made of them
    stay with autograd until the block's backward: the whole model's, on every process."""
    saved = torch.load(fsdp_files[0])
    config = small_config()
    plan = memory_plan(config, 2, world_size=2, fsdp=True, dtype=BF16)
    assert saved['copies'] == plan['weight_copies'] == 2 * linear_weights(meta_model(config))
    # + the gathered norm weights
    assert plan['activations'] == pytest.approx(saved['kept'], rel=0.01)


# ------------------------------------------------------------------------------------------------------
# Checkpoint size: written the way train.py writes it, from FSDP shards

def save_like_train(rank, path):
    from torch.distributed.fsdp import fully_shard

    from checkpoint import training_state
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=1000, n_layer=2, n_head=4, n_embd=128, bias=False))
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
    # as train.py gathers it (the optimizer's moments are created here)
    state = training_state(model, optimizer)
    if rank == 0:
        torch.save(state, path)
    del model, optimizer, state
    gc.collect()  # as above


def test_checkpoint_bytes_match_a_checkpoint_gathered_from_fsdp_shards(fsdp_files):
    path = fsdp_files[1]
    config = GPTConfig(block_size=64, vocab_size=1000, n_layer=2, n_head=4, n_embd=128, bias=False)
    size = checkpoint_bytes(config)
    n = sum(p.numel() for p in meta_model(config).parameters())
    assert size['model'] == 4 * n  # the tied embedding once
    assert size['optimizer'] == 8 * n
    assert os.path.getsize(path) == pytest.approx(size['total'], rel=0.02)  # + steps, keys, zip headers


def test_the_docs_memory_table_is_the_plans():
    """docs/memory.md: every row of the study's memory table, recomputed (GB = 1e9 bytes, one
    decimal)."""
    doc = open(os.path.join(REPO, 'docs', 'memory.md')).read()
    rows = [line.split('|')[1:-1] for line in doc.splitlines()
            if line.startswith('| ') and line.split('|')[1].strip() in ('64m', '1.3b', '3.78b')
            and 'DP' in line]
    assert len(rows) == 6
    for scale, mode, gpus, state, buffers, copies, acts, loss, total, share in (
            map(str.strip, r) for r in rows):
        world, micro = int(gpus.split()[0]), 4 if 'of 4' in gpus else 8
        plan = memory_plan(study_config(scale), micro, world, mode == 'FSDP', torch.bfloat16,
                           compile=True)
        gb = {k: round(v / 1e9, 1) for k, v in plan.items()}
        assert float(state) == round((plan['parameters'] + plan['gradients'] + plan['optimizer']) / 1e9, 1)
        assert float(buffers) == round((plan['ddp_buckets'] + plan['fsdp_buffers']) / 1e9, 1)
        assert (float(copies), float(acts), float(loss), float(total)) == \
            (gb['weight_copies'], gb['activations'], gb['logits'], gb['total'])
        assert share == f"{plan['total'] / 80e9:.0%}"


def test_the_first_save_is_checked_for_disk_and_memory(data_dir, tmp_path, monkeypatch):
    """Before the first step: too little free disk for three checkpoints, or host RAM to gather one."""
    Usage = collections.namedtuple('Usage', 'total used free')
    monkeypatch.setattr(shutil, 'disk_usage', lambda path: Usage(10**6, 0, 10**4))
    with pytest.raises(SystemExit, match=r'has 0.0 GiB free; its checkpoints need 0.0 GiB more'):
        run(data_dir, str(tmp_path / 'full'), '--max_iters=2')
    assert not os.path.exists(tmp_path / 'full' / 'log.jsonl') or not records(tmp_path / 'full', 'step')
    monkeypatch.setattr(shutil, 'disk_usage', lambda path: Usage(10**15, 0, 10**15))
    with open('/proc/meminfo') as f:
        available = next(int(line.split()[1]) * 1024 for line in f if line.startswith('MemAvailable:'))
    assert 'host RAM' in memory.check_room(str(tmp_path), 2 * available, gathered=True)
    assert memory.check_room(str(tmp_path), 2 * available, gathered=False) is None
