"""annex/vit.py, the vision check: CIFAR-10 in its real on-disk format, the crop and flip, the ViT's
non-causal attention and patch embedding, and train.py training a ViT (the loss falls, resume is exact),
analyze.py measuring it."""
import json
import math
import os
import pickle
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import analyze
import norm_stats
import sample
import train
from annex import eval as eval_script
from annex import study
from annex.vit import ImageData, ViT, ViTConfig, accuracy_at_epochs, crop_and_flip, open_images
from checkpoint import load_checkpoint
from configurator import configure
from data.cifar10.prepare import load
from data.common import open_data
from model import GPT, GPTConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_PER_BATCH, TEST_IMAGES = 40, 60  # 5 train batches: 200 train images
TINY = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--patch_size=8', '--batch_size=20',
        '--eval_samples=40', '--eval_interval=10', '--log_interval=5', '--learning_rate=1e-2',
        '--warmup_iters=0', '--lr_decay_iters=40', '--min_lr=3e-4', '--weight_decay=0.05',
        '--emb_init_std=0.02', '--bias=True']


def cifar_row(image):
    """One row of a CIFAR-10 batch's `data` as its authors describe it: 1024 red values, then 1024 green,
    then 1024 blue, each plane row by row."""
    return np.concatenate([image[0].ravel(), image[1].ravel(), image[2].ravel()])


def class_images(labels, rng):
    """A learnable task: each class has its own colour (and a brighter top half for odd classes), plus
    noise."""
    base = np.stack([20 + 23 * labels, 230 - 21 * labels, 60 + 120 * (labels % 3 == 0)], axis=1)
    images = base[:, :, None, None].astype(float) + rng.uniform(-25, 25, (len(labels), 3, 32, 32))
    images[:, :, :16] += 20 * (labels % 2)[:, None, None, None]
    return np.clip(images, 0, 255).astype(np.uint8)


@pytest.fixture(scope='module')
def cifar(tmp_path_factory):
    """A data/cifar10-style folder in the real format: cifar-10-batches-py/data_batch_1..5 and
    test_batch, pickled dicts with byte-string keys, `data` uint8 (N, 3072), `labels` a list; and
    prepare.py's meta.json."""
    folder = tmp_path_factory.mktemp('cifar10')
    rng = np.random.default_rng(0)
    os.makedirs(folder / 'cifar-10-batches-py')
    images = {}
    batches = [(f'data_batch_{i}', TRAIN_PER_BATCH) for i in range(1, 6)] + [('test_batch', TEST_IMAGES)]
    for name, n in batches:
        labels = np.arange(n) % 10  # balanced
        rng.shuffle(labels)
        x = class_images(labels, rng)
        images[name] = (x, labels)
        batch = {b'batch_label': name.encode(), b'labels': labels.tolist(),
                 b'data': np.stack([cifar_row(im) for im in x]),
                 b'filenames': [b'%d.png' % i for i in range(n)]}
        with open(folder / 'cifar-10-batches-py' / name, 'wb') as f:
            pickle.dump(batch, f, protocol=2)
    (folder / 'meta.json').write_text(json.dumps({
        'kind': 'images', 'dir': 'cifar-10-batches-py', 'md5': None, 'train_images': 5 * TRAIN_PER_BATCH,
        'test_images': TEST_IMAGES}))
    return folder, images


def test_the_real_format_loads_with_its_shapes_labels_and_channel_order(cifar):
    folder, images = cifar
    x, y = load('train', str(folder))
    assert x.shape == (5 * TRAIN_PER_BATCH, 3, 32, 32) and x.dtype == np.uint8 and y.dtype == np.int64
    assert np.array_equal(x[:TRAIN_PER_BATCH], images['data_batch_1'][0])  # batches in order 1..5
    assert np.array_equal(x[-TRAIN_PER_BATCH:], images['data_batch_5'][0])
    assert y.tolist() == [int(v) for i in range(1, 6) for v in images[f'data_batch_{i}'][1]]
    xt, yt = load('test', str(folder))
    assert xt.shape == (TEST_IMAGES, 3, 32, 32) and yt.tolist() == images['test_batch'][1].tolist()
    # the planes are R, G, B: a row's first 1024 values are the red plane, row-major
    with open(folder / 'cifar-10-batches-py' / 'test_batch', 'rb') as f:
        raw = pickle.load(f, encoding='bytes')[b'data']
    assert xt[3, 0, 0, 0] == raw[3, 0] and xt[3, 0, 1, 0] == raw[3, 32] and xt[3, 0, 0, 1] == raw[3, 1]
    assert xt[3, 1, 5, 7] == raw[3, 1024 + 5 * 32 + 7] and xt[3, 2, 31, 31] == raw[3, 3071]
    red_class = yt[xt[:, 0].mean(axis=(1, 2)).argmax()]  # class 9 is the reddest and the least green
    assert red_class == 9 and yt[xt[:, 1].mean(axis=(1, 2)).argmax()] == 0


def test_image_data_dims_entropy_and_normalisation(cifar):
    folder, images = cifar
    cfg = SimpleNamespace(dataset='cifar10', data_dir=str(folder), eval_samples=16, batch_size=8,
                          paper_val=0)
    # train.py's data: images, by meta.json's kind; 2 x 8 eval images
    meta, data = open_data(cfg, SimpleNamespace(master=True, ddp=False), 1337)
    assert meta['kind'] == 'images' and data.unit == 'images' and data.n_train == 200
    assert data.dims == dict(image_size=32, channels=3, n_classes=10)
    assert data.entropy == pytest.approx(math.log(10))  # balanced classes
    assert len(data.eval_ids['train']) == 16
    assert len(data.eval_ids['val']) == TEST_IMAGES  # val: the whole test set
    x, y = data.batch('val', data.eval_ids['val'][:5], 'cpu')
    raw = images['test_batch'][0][:5] / 255.0
    mean, std = np.array([0.4914, 0.4822, 0.4465]), np.array([0.2470, 0.2435, 0.2616])
    expected = (raw - mean[None, :, None, None]) / std[None, :, None, None]  # eval images: not augmented
    assert x.dtype == torch.float32 and np.allclose(x.numpy(), expected, atol=1e-5)
    assert y.tolist() == images['test_batch'][1][:5].tolist()


def test_crop_and_flip_against_numpy_for_every_offset():
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (3, 3, 32, 32), dtype=np.uint8)
    pad = 4
    cases = [(i, dy, dx, f) for i in range(3) for dy in range(2 * pad + 1) for dx in range(2 * pad + 1)
             for f in (0, 1)]
    i, dy, dx, flip = (torch.tensor(c) for c in zip(*cases))
    got = crop_and_flip(torch.from_numpy(images)[i], dy, dx, flip.bool(), pad).numpy()
    for k, (n, a, b, f) in enumerate(cases):
        # zeros, as torchvision's RandomCrop(32, 4)
        padded = np.pad(images[n], ((0, 0), (pad, pad), (pad, pad)))
        want = padded[:, a:a + 32, b:b + 32]
        assert np.array_equal(got[k], want[:, :, ::-1] if f else want), (n, a, b, f)
    x = torch.from_numpy(images)
    centre = torch.full((3,), pad)
    assert torch.equal(crop_and_flip(x, centre, centre, torch.zeros(3, dtype=torch.bool), pad), x)
    mirrored = crop_and_flip(x, centre, centre, torch.ones(3, dtype=torch.bool), pad)
    assert torch.equal(mirrored, x.flip(-1))  # a mirror


def test_training_draws_each_image_once_per_epoch_with_every_crop_and_flip(cifar):
    folder, images = cifar
    data = open_images('cifar10', str(folder), 16, 1337)[1]
    count, n = 32, 200
    steps = 3 * n // count + 2  # three epochs and a bit, with steps that straddle the epoch boundaries
    rows = torch.cat([data.draw(7, s, count) for s in range(steps)])
    for e in range(3):
        epoch = rows[e * n:(e + 1) * n, 0]
        assert sorted(epoch.tolist()) == list(range(n))  # every image once per epoch
    assert not torch.equal(rows[:n, 0], rows[n:2 * n, 0])  # a new order each epoch
    # offsets 0..2 x pad: all of the padding
    assert set(rows[:, 1].tolist()) == set(rows[:, 2].tolist()) == set(range(9))
    assert 0.4 < rows[:, 3].float().mean() < 0.6
    fresh = open_images('cifar10', str(folder), 16, 1337)[1]  # (seed, step) alone decide
    assert torch.equal(fresh.draw(7, 9, count), data.draw(7, 9, count))
    x, y = data.batch('train', rows[:count], 'cpu')
    train_labels = np.concatenate([images[f'data_batch_{i}'][1] for i in range(1, 6)])
    assert x.shape == (count, 3, 32, 32) and y.tolist() == train_labels[rows[:count, 0].numpy()].tolist()


def tiny_vit(**kw):
    args = dict(n_layer=2, n_head=2, n_embd=32, image_size=8, patch_size=4, bias=True)
    return ViT(ViTConfig(**args | kw))


@pytest.mark.parametrize('attn,pool,norm', [('standard', 'cls', 'layernorm'), ('diff', 'mean', 'dyt'),
                                            ('standard', 'mean', 'derf')])
def test_every_position_attends_to_every_other(attn, pool, norm):
    torch.manual_seed(0)
    vit = tiny_vit(attn=attn, pool=pool, norm=norm).eval()
    x = torch.randn(1, 3, 8, 8)
    base = vit.hidden(x)
    for row, col in ((0, 0), (0, 4), (4, 0), (4, 4)):  # each of the 4 patches, the last one included
        y = x.clone()
        y[:, :, row:row + 4, col:col + 4] += 1.0
        changed = (vit.hidden(y) - base).abs().amax(dim=-1)[0]
        assert (changed > 1e-4).all(), (row, col, changed)  # every output moves, the first one too
    # the GPT is still causal: a change to the last token leaves every earlier position alone
    gpt = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=16, attn=attn,
                        norm=norm)).eval()
    idx = torch.randint(16, (1, 8))
    idx2 = idx.clone()
    idx2[0, -1] = (idx[0, -1] + 1) % 16
    assert torch.allclose(gpt.hidden(idx)[:, :-1], gpt.hidden(idx2)[:, :-1])


def test_patch_embedding_is_a_strided_convolution_and_the_parameter_count():
    torch.manual_seed(0)
    vit = tiny_vit(image_size=16)
    x = torch.randn(2, 3, 16, 16)
    seen = {}
    vit.transformer.patch.register_forward_hook(lambda m, i, o: seen.update(out=o))
    vit(x)
    w = vit.transformer.patch.weight.view(32, 3, 4, 4)
    conv = F.conv2d(x, w, vit.transformer.patch.bias, stride=4)
    assert torch.allclose(seen['out'], conv.flatten(2).transpose(1, 2), atol=1e-5)  # patches row by row
    # the study's ViT: 6 layers, width C = 256, 4x4 patches of 32x32 images + a class token: 65 positions
    C = 256
    block = (4 * C * C + 4 * C) + (8 * C * C + 5 * C)  # attention, MLP (weights and biases)
    outside = (48 * C + C) + 65 * C + C + (10 * C + 10)  # patch embedding, positions, class token, head
    for norm, per_norm in (('layernorm', 2 * C), ('dyt', 2 * C + 1)):  # gain and bias (+ DyT's alpha)
        with torch.device('meta'):
            vit = ViT(ViTConfig(n_layer=6, n_head=4, n_embd=C, bias=True, norm=norm))
        n = sum(p.numel() for p in vit.parameters())
        assert n == 6 * (block + 2 * per_norm) + per_norm + outside
    assert n == 4_771_095  # "about 4.8M"
    with pytest.raises(ValueError, match="needs pos='learned'"):
        ViTConfig(pos='rope')
    with pytest.raises(ValueError, match='must divide image_size'):
        ViTConfig(patch_size=5)


def test_init_and_weight_decay_follow_timms_vit():
    torch.manual_seed(0)
    vit = ViT(ViTConfig(n_layer=6, n_head=4, n_embd=256, bias=True, norm='dyt', emb_init_std=0.02))
    # the patch embedding keeps PyTorch's Linear (and Conv2d) default, U(+-1/sqrt(fan_in)) for the weight
    # (kaiming_uniform with a=sqrt(5)) and the bias alike
    bound = 1 / math.sqrt(3 * 4 * 4)
    for p in (vit.transformer.patch.weight, vit.transformer.patch.bias):
        assert p.abs().max() <= bound and p.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert vit.cls_token.abs().max() < 1e-5
    assert vit.transformer.wpe.weight.std().item() == pytest.approx(0.02, rel=0.05)
    for name, p in vit.named_parameters():
        if name.endswith(('c_attn.weight', 'c_proj.weight', 'c_fc.weight')) or name == 'head.weight':
            assert p.std().item() == pytest.approx(0.02, rel=0.1), name  # no GPT-2 depth scaling
        if name.endswith('.alpha'):
            assert p.item() == 0.5
        if name.endswith('bias') and name != 'transformer.patch.bias':  # linear layers' and norms'
            assert p.eq(0).all(), name
    decayed, exempt = vit.configure_optimizers(0.05, 1e-3, (0.9, 0.999), 'cpu').param_groups
    names = {id(p): n for n, p in vit.named_parameters()}
    assert (decayed['weight_decay'], exempt['weight_decay']) == (0.05, 0.0)
    # every matrix but the position embeddings; the class token is exempt too
    matrices = {n for n, p in vit.named_parameters() if p.dim() == 2}
    assert {names[id(p)] for p in decayed['params']} == matrices - {'transformer.wpe.weight'}
    assert 'cls_token' in {names[id(p)] for p in exempt['params']}


def test_the_vit_configs_give_the_studys_recipe(monkeypatch):
    monkeypatch.chdir(REPO)
    for name, norm, alpha in (('ln', 'layernorm', None), ('dyt', 'dyt', 0.5), ('derf', 'derf', 0.5)):
        cfg = configure(train.DEFAULTS, [f'config/vit_cifar10_{name}.py'], train.OPTIONAL_TYPES)
        assert (cfg['dataset'], cfg['n_layer'], cfg['n_head'], cfg['n_embd'], cfg['patch_size']) == (
            'cifar10', 6, 4, 256, 4)
        assert (cfg['learning_rate'], cfg['weight_decay'],
                cfg['batch_size'] * cfg['gradient_accumulation_steps']) == (1e-3, 0.05, 128)
        assert (cfg['max_iters'] - 1) * 128 < 100 * 50_000 <= cfg['max_iters'] * 128  # 100 epochs
        # cosine to 0
        assert cfg['decay_lr'] and cfg['lr_decay_iters'] == cfg['max_iters'] and cfg['min_lr'] == 0
        assert cfg['norm'] == norm and (alpha is None or cfg['dyt_alpha'] == alpha)
        assert cfg['out_dir'] == f'out/vit_cifar10_{name}'


def run(folder, out_dir, *args):
    return train.main(['--dataset=cifar10', f'--data_dir={folder}', f'--out_dir={out_dir}', *TINY,
                       *args])


def records(out_dir, event):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [r for r in map(json.loads, f) if r['event'] == event]


def test_a_bad_vit_option_is_an_error_before_anything_is_written(cifar, tmp_path):
    folder, _ = cifar
    for arg, message in (('--pool=avg', "pool='avg' is not known; choose 'cls' or 'mean'"),
                         ('--pos=rope', "a ViT needs pos='learned'"),
                         ('--patch_size=5', 'patch_size=5 must divide image_size=32')):
        with pytest.raises(SystemExit, match=f'^error: {re.escape(message)}'):
            run(folder, tmp_path / 'bad', arg)
    assert not (tmp_path / 'bad').exists()


@pytest.mark.parametrize('norm', ['layernorm', 'dyt'])
def test_train_py_trains_a_vit_and_resumes_exactly(cifar, tmp_path, norm, capsys):
    folder, _ = cifar
    out = tmp_path / 'full'
    assert run(folder, out, f'--norm={norm}', '--max_iters=40') == 0
    assert 'ViT, patch 8, cls pooling' in capsys.readouterr().out
    evals = records(out, 'eval')
    assert [r['iter'] for r in evals] == [0, 10, 20, 30, 40]
    assert evals[-1]['train_loss'] < evals[0]['train_loss'] - 0.5  # from about ln 10 = 2.30
    assert evals[-1]['val_acc'] >= max(0.3, evals[0]['val_acc'] + 0.2)  # chance is 0.1
    steps = records(out, 'step')
    assert all(r['images_per_sec'] > 0 for r in steps[1:]) and steps[-1]['epochs'] == 4.0
    summary = json.loads((out / 'summary.json').read_text())
    assert summary['final_val_acc'] == evals[-1]['val_acc'] and summary['budget_images'] == 200
    if norm == 'dyt':
        assert evals[-1]['saturation'] is not None and len(evals[-1]['norm_layers']) == 5
    # 13 steps (mid-epoch: the resumed run starts inside an epoch's order), then resumed to 40: the same
    # weights
    part = tmp_path / 'part'
    assert run(folder, part, f'--norm={norm}', '--max_iters=13') == 0
    assert run(folder, part, f'--norm={norm}', '--max_iters=40', '--init_from=resume') == 0
    full_model, _ = load_checkpoint(out)
    resumed, _ = load_checkpoint(part)
    for (k, a), b in zip(full_model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k


def test_analyze_reads_the_vit_and_sample_and_eval_refuse_it(cifar, tmp_path):
    folder, _ = cifar
    out = tmp_path / 'dyt'
    assert run(folder, out, '--norm=dyt', '--dyt_alpha=2.0', '--max_iters=10', '--n_embd=64') == 0
    opts = dict(analyze.DEFAULTS, windows=24, device='cpu')
    res, _ = analyze.analyze(str(out / 'ckpt.pt'), 'all', opts)
    # spectra: every 2-D weight with at least min_evals (50) eigenvalues: both sides >= 50 at width 64
    model, _ = load_checkpoint(out)
    wide = {n.removesuffix('.weight') for n, p in model.named_parameters()
            if p.dim() == 2 and min(p.shape) >= 50}
    # 4 per block, the 192 x 64 patch layer
    assert set(res['spectra']['layers']) == wide and len(wide) == 2 * 4 + 1
    assert all(math.isfinite(layer['alpha']) for layer in res['spectra']['layers'].values())
    assert len(res['rank']['blocks']) == 2 and all(r > 1 for r in res['rank']['blocks'])
    # the same saturation written out: train.py's eval images, hooks on every DyT layer, |alpha x| > 2
    data = open_images('cifar10', str(folder), 24, 1337)[1]
    x, _ = data.batch('train', data.eval_ids['train'], 'cpu')
    above, total = {}, {}

    def hook(name):
        def count(module, inputs, output):
            a = (module.alpha * inputs[0]).abs()
            above[name] = above.get(name, 0) + (a > 2.0).sum().item()
            total[name] = total.get(name, 0) + a.numel()
        return count
    for name, layer in norm_stats.norm_layers(model):
        layer.register_forward_hook(hook(name))
    with torch.no_grad():
        for k in range(0, 24, 10):
            model(x[k:k + 10])
    layers = res['saturation']['layers']
    assert set(layers) == set(above) and res['windows']['count'] == 24
    assert res['windows']['block_size'] == 17
    for name in above:
        assert layers[name]['saturation'][res['saturation']['thresholds'].index(2.0)] == pytest.approx(
            above[name] / total[name], abs=1e-9)
    for main, argv in ((sample.main, [f'--out_dir={out}', '--max_new_tokens=2']),
                       (eval_script.main, [str(out)])):
        with pytest.raises(SystemExit, match='holds a ViT, an image classifier: this needs a language '
                                             'model'):
            main(argv)


def test_the_alpha0_sweep_runs_as_a_study_grid(cifar, tmp_path, monkeypatch):
    """config/grid_vit.py's cells, then the same sweep at a tiny shape through study.py's run and
    report."""
    monkeypatch.chdir(REPO)
    grid, cells = study.load_grid('config/grid_vit.py')
    assert [c['variant'] for c in cells] == ['ln', 'dyt_a05', 'dyt_a1', 'dyt_a2', 'derf_a05']
    alphas = [configure(train.DEFAULTS, c['args'], train.OPTIONAL_TYPES) for c in cells]
    assert [(a['norm'], a['dyt_alpha'], a['dataset'], a['n_embd']) for a in alphas[1:]] == [
        ('dyt', 0.5, 'cifar10', 256), ('dyt', 1.0, 'cifar10', 256), ('dyt', 2.0, 'cifar10', 256),
        ('derf', 0.5, 'cifar10', 256)]
    folder, _ = cifar
    tiny = dict(a.removeprefix('--').split('=') for a in TINY)
    scale = {k: eval(v) if v[0].isdigit() or v in ('True', 'False') else v for k, v in tiny.items()}
    scale.update(dataset='cifar10', data_dir=str(folder), max_iters=20, eval_interval=10, compile=False)
    path = tmp_path / 'grid.py'
    path.write_text(f"scales = {{'vit': {scale!r}}}\n"
                    "budgets = [None]\nvariants = ['ln', 'dyt_a05', 'dyt_a2']\nseeds = [1]\n"
                    "screen_steps = 10\ncustom_variants = {'dyt_a05': dict(norm='dyt', dyt_alpha=0.5), "
                    "'dyt_a2': dict(norm='dyt', dyt_alpha=2.0)}\n"
                    f"out_dir = {str(tmp_path / 'out')!r}\n")
    # two cells at a time, a thread each (--gpus: each child its CUDA_VISIBLE_DEVICES, which changes
    # nothing without GPUs): a child's start, torch's import, is most of its time
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    study.main(['run', str(path), '--gpus=0-1'])
    rep = study.main(['report', str(tmp_path / 'out'), '--bootstrap=10'])
    assert {r['name']: r['status'] for r in rep['runs']} == {
        f'vit_all_{v}_s1': 'finished' for v in ('ln', 'dyt_a05', 'dyt_a2')}
    for r in rep['runs']:
        summary = json.loads(open(os.path.join(r['dir'], 'summary.json')).read())
        assert r['acc'] == summary['final_val_acc'] and r['final'] == summary['final_val_loss']
        assert r['variant'] == 'ln' or r['sat'] == summary['saturation'][3]
        # analyze.py ran on the ViT (too small for spectra)
        assert r['analysis_error'] is None and r['erank'] > 1
    groups = {g['variant']: g for g in rep['groups']}
    assert groups['dyt_a2']['change_final'] == pytest.approx(
        100 * (groups['dyt_a2']['final'] - groups['ln']['final']) / groups['ln']['final'])
    assert 'final val accuracy' in open(tmp_path / 'out' / 'report.md').read()


def test_torchrun_two_processes_match_one(cifar, tmp_path):
    """DDP on two gloo processes: 21 images per step (3 micro-batches of 7) split 11 + 10, crops and
    flips included, give the single process's losses and accuracies."""
    folder, _ = cifar
    args = ['--dataset=cifar10', f'--data_dir={folder}', *TINY, '--batch_size=7',
            '--gradient_accumulation_steps=3', '--max_iters=6', '--eval_interval=3', '--norm=dyt']
    one, two = tmp_path / 'one', tmp_path / 'two'
    assert train.main(args + [f'--out_dir={one}']) == 0
    proc = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                           '--nproc_per_node=2', 'train.py', *args, f'--out_dir={two}'], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'global batch: 21 images/step (2 process(es) x 2 micro-batch(es) of 6)' in proc.stdout
    for event, key in (('step', 'loss'), ('eval', 'val_loss'), ('eval', 'train_loss'),
                       ('eval', 'val_acc')):
        a, b = records(one, event), records(two, event)
        assert len(a) == len(b) > 0, key
        assert [r[key] for r in a] == pytest.approx([r[key] for r in b], abs=1e-5), key


# -------------------------------------------------------------------------------------------------------
# the study's ViT as its code ran (vit_as_run, config/vit_cifar10_as_run.py)

LR, WD = 1e-3, 0.05  # the study's


def as_run_vit(**kw):
    torch.manual_seed(0)
    return ViT(ViTConfig(n_layer=2, n_head=2, n_embd=64, patch_size=8, bias=True, vit_as_run=True, **kw))


def adamw_steps(model, steps):
    """`steps` AdamW steps at the study's lr and weight decay, with the optimizer the model builds."""
    optimizer = model.configure_optimizers(WD, LR, (0.9, 0.999), 'cpu')
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 3, 32, 32, generator=g), torch.randint(10, (8,), generator=g)
        model(x, y)[1].backward()
        optimizer.step()
        optimizer.zero_grad()


def test_bf16_spacing_and_adamw_update_sizes_by_hand():
    bf16 = torch.bfloat16
    # bf16 keeps 8 significant bits: the spacing is 2^-7 on [1, 2), 2^-8 just below 1, 2^-6 on [2, 4)
    def step(v, towards):  # the distance to the next bf16 value towards `towards`
        v = torch.tensor(v, dtype=bf16)
        return abs((torch.nextafter(v, torch.tensor(towards, dtype=bf16)) - v).item())
    assert [step(1.0, 9), step(1.0, 0), step(2.0, 9), step(2.0, 0)] == [2**-7, 2**-8, 2**-6, 2**-7]
    # AdamW's first steps move a parameter by about lr (m / sqrt(v) is about +-1): under half the spacing
    # on either side of 1.0 (2^-9 = 0.00195) and of 2.0 (2^-8), so the update rounds away
    assert LR < 2 ** -9 < 2 ** -8
    for v in (1.0, 2.0):
        for d in (LR, -LR):
            assert torch.tensor(v, dtype=bf16).add(d).item() == v
    # weight decay multiplies by 1 - lr wd = 1 - 5e-5: a relative change under half a bf16 step (2^-9)
    # at any magnitude, so it is a no-op on every bf16 weight
    w = torch.randn(10_000, dtype=bf16)
    assert torch.equal(w * (1 - LR * WD), w) and LR * WD < 2 ** -9


@pytest.mark.parametrize('norm', ['layernorm', 'dyt'])
def test_as_run_in_bf16_adamw_moves_no_gain_nor_alpha_nor_decays_while_fp32_moves_them(norm):
    """The study's ViT trained its norm parameters frozen: gains at 1.0 and alphas at 2.0 stay where
    they start under AdamW at lr 1e-3 in bf16, and so does a weight whose gradient is zero (decay alone);
    the same steps in float32 move them by about lr a step (the first: lr exactly, as g / |g| = +-1)."""
    gains = ('ln_1.weight', 'ln_2.weight', 'ln_f.weight', '.alpha')

    def frozen(model):
        return {n: p for n, p in model.named_parameters() if n.endswith(gains)}
    model = as_run_vit(norm=norm, dyt_alpha=2.0)
    start = {n: p.detach().clone() for n, p in frozen(model).items()}
    assert start and all(p.eq(2.0 if n.endswith('alpha') else 1.0).all() for n, p in start.items())
    head = model.head.weight.detach().clone()
    adamw_steps(model, 5)
    for n, p in frozen(model).items():
        assert torch.equal(p, start[n]), n
    assert not torch.equal(model.head.weight, head)  # it trains: near 0 the bf16 steps are finer
    fp32 = as_run_vit(norm=norm, dyt_alpha=2.0).float()
    adamw_steps(fp32, 1)
    for n, p in frozen(fp32).items():  # lr x sign(g), plus decay lr wd p (5e-5 or 1e-4)
        moved = (p.detach() - start[n].float()).abs()
        assert ((moved - LR).abs() <= 1.1e-4).all(), n
    # weight decay alone (a zero gradient): a no-op in bf16, (1 - lr wd)^5 in float32
    for dtype, expected in ((torch.bfloat16, 0.75), (torch.float32, 0.75 * (1 - LR * WD) ** 5)):
        w = torch.nn.Parameter(torch.full((4,), 0.75, dtype=dtype))
        optimizer = torch.optim.AdamW([w], lr=LR, weight_decay=WD)
        for _ in range(5):
            w.grad = torch.zeros_like(w)
            optimizer.step()
        assert w.detach().float().tolist() == pytest.approx([expected] * 4, rel=1e-7)
    assert 0.75 * (1 - LR * WD) ** 5 < 0.75 - 1e-4  # float32's moved


def test_as_run_inputs_are_pixels_normalised_by_half():
    """ImageData normalises by the dataset's statistics; the as-run ViT's patch embedding reads
    (pixel / 255 - 0.5) / 0.5, in bf16 (patch_size 32: the one patch is the image flattened)."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (6, 3, 32, 32), dtype=np.uint8)
    labels = np.arange(6) % 10
    data = ImageData((pixels, labels), (pixels, labels), 4, 0)
    x, _ = data.batch('val', data.eval_ids['val'], 'cpu')
    torch.manual_seed(0)
    model = ViT(ViTConfig(n_layer=1, n_head=2, n_embd=32, patch_size=32, vit_as_run=True))
    seen = []
    model.transformer.patch.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    model(x)
    expected = torch.from_numpy((pixels / 255.0 - 0.5) / 0.5).reshape(6, 1, -1).to(torch.bfloat16)
    assert seen[0].dtype == torch.bfloat16
    torch.testing.assert_close(seen[0], expected, rtol=2 ** -8, atol=2 ** -8)  # within a bf16 step


def test_as_run_init_is_pytorchs_default_all_in_bf16_all_decayed():
    model = as_run_vit(norm='dyt', dyt_alpha=2.0)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):  # kaiming_uniform(a=sqrt(5)): U(+-1/sqrt(fan_in)), bias
            bound = 1 / math.sqrt(module.in_features)
            for p in (module.weight, module.bias):
                assert p.abs().max() <= bound * (1 + 2 ** -8), name  # bf16 may round up to the bound
            std = module.weight.float().std().item()
            assert std == pytest.approx(bound / math.sqrt(3), rel=0.1), name
            assert module.bias.ne(0).any(), name  # not our zeros
    assert model.transformer.wpe.weight.float().std().item() == pytest.approx(1.0, rel=0.1)  # N(0, 1)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    groups = model.configure_optimizers(WD, LR, (0.9, 0.999), 'cpu').param_groups
    assert all(g['weight_decay'] == WD for g in groups)
    decayed = sorted(id(p) for g in groups for p in g['params'])
    assert decayed == sorted(id(p) for p in model.parameters())


def test_the_as_run_config_on_top_of_a_vit_config(monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = configure(train.DEFAULTS, ['config/vit_cifar10_dyt.py', 'config/vit_cifar10_as_run.py'],
                    train.OPTIONAL_TYPES)
    assert (cfg['norm'], cfg['dyt_alpha'], cfg['vit_as_run']) == ('dyt', 0.5, True)
    assert cfg['dtype'] == 'float32'  # no autocast
    assert cfg['out_dir'] == 'out/vit_cifar10_dyt_as_run'
    assert (cfg['learning_rate'], cfg['weight_decay'], cfg['warmup_iters'], cfg['min_lr']) == (
        1e-3, 0.05, 0, 0)
    # an eval in [epoch, epoch + 1) for each of the study's epochs, the last at the end (100 epochs)
    epochs = lambda it: it * 128 / 50_000
    assert all(k <= epochs(k * cfg['eval_interval']) < k + 1 for k in (1, 25, 50, 75))
    assert 100 <= epochs(cfg['max_iters']) < 101


def test_accuracy_at_epochs_picks_the_studys_evals_from_the_log(tmp_path):
    evals = ((0, 0.1), (1.001, 0.4), (2.002, 0.5), (25.02, 0.8), (26.03, 0.9), (50.05, 0.7))
    lines = [json.dumps({'event': 'eval', 'epochs': e, 'val_acc': a}) for e, a in evals]
    lines.insert(2, json.dumps({'event': 'step', 'epochs': 1.5}))
    (tmp_path / 'log.jsonl').write_text('\n'.join(lines) + '\n{"torn')
    # 26.03's 0.9 is not at a study epoch; no eval at 75 or 100 (a run stopped early)
    assert accuracy_at_epochs(tmp_path) == {
        'at_epochs': {1: 0.4, 25: 0.8, 50: 0.7, 75: None, 100: None}, 'best_of_those': 0.8, 'final': 0.7}
    assert accuracy_at_epochs(tmp_path / 'none') == {
        'at_epochs': dict.fromkeys((1, 25, 50, 75, 100)), 'best_of_those': None, 'final': None}


def test_train_py_trains_the_as_run_vit_in_bf16(cifar, tmp_path):
    folder, _ = cifar
    out = tmp_path / 'as_run'  # 10 steps of 20 images: an epoch
    assert run(folder, out, '--vit_as_run=True', '--dtype=float32', '--max_iters=30',
               '--norm=dyt') == 0
    evals = records(out, 'eval')
    assert evals[-1]['train_loss'] < evals[0]['train_loss'] - 0.3
    model, _ = load_checkpoint(out)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert accuracy_at_epochs(out, (1, 2, 3)) == {
        'at_epochs': {e: evals[e]['val_acc'] for e in (1, 2, 3)},
        'best_of_those': max(r['val_acc'] for r in evals[1:]), 'final': evals[-1]['val_acc']}
