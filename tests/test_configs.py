"""Every config file resolves through train.py's configurator to the study's protocol and its named
model."""
import glob
import os
import re
from dataclasses import fields

import pytest
import torch

import train
from configurator import configure
from model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# grids and ViT configs: annex/tests/test_study.py and test_vit.py
CONFIGS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, 'config', '*_*.py'))
                 if not os.path.basename(p).startswith(('grid_', 'vit_')))
SHAPES = {'64m': (12, 8, 512), '124m': (12, 12, 768), '162m': (16, 14, 896), '354m': (24, 16, 1024),
          '1.3b': (24, 32, 2048), '3.78b': (32, 32, 3072)}  # the study's scales
FLAGS = {'ln': dict(norm='layernorm', attn='standard'), 'rmsnorm': dict(norm='rmsnorm', attn='standard'),
         'dyt': dict(norm='dyt', attn='standard', dyt_alpha=2.0),
         'hardtanh': dict(norm='hardtanh', attn='standard'), 'diff': dict(norm='layernorm', attn='diff'),
         'dyt_gelu': dict(norm='dyt', dyt_alpha=2.0, mlp='gelu'),
         'derf': dict(norm='derf', attn='standard', dyt_alpha=2.0)}


def test_every_scale_and_variant_has_a_config():
    names = {os.path.basename(p) for p in CONFIGS}
    for scale in SHAPES:
        for variant in ('ln', 'rmsnorm', 'dyt', 'hardtanh', 'diff'):
            assert f'gpt2_{scale}_{variant}.py' in names
    assert {'gpt2_64m_dyt.py', 'gpt2_64m_derf.py', 'llama_64m_dyt.py'} <= names


@pytest.mark.parametrize('path', CONFIGS)
def test_config_gives_the_study_protocol_and_its_model(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # config files import config.study from the repo root, as train.py runs them
    cfg = configure(train.DEFAULTS, [path], train.OPTIONAL_TYPES)
    family, scale, variant = re.fullmatch(r'(gpt2|llama)_([\d.]+[mb])_(\w+)\.py',
                                          os.path.basename(path)).groups()
    # the study's protocol: 64 sequences of 512 tokens per step, 5000 steps, AdamW (0.9, 0.95), wd 0.1,
    # clip 1, no dropout
    assert (cfg['block_size'], cfg['batch_size'] * cfg['gradient_accumulation_steps']) == (512, 64)
    assert (cfg['max_iters'], cfg['warmup_iters'], cfg['lr_decay_iters'], cfg['min_lr']) \
        == (5000, 2000, 600000, 6e-5)
    assert (cfg['beta1'], cfg['beta2'], cfg['weight_decay'], cfg['grad_clip']) == (0.9, 0.95, 0.1, 1.0)
    assert (cfg['dropout'], cfg['bias'], cfg['dataset'], cfg['eval_interval'], cfg['eval_samples'],
            cfg['emb_init_std']) == (0.0, False, 'wikitext103', 500, 400, 0.02)
    assert cfg['learning_rate'] == (1e-4 if scale in ('1.3b', '3.78b') else 3e-4)
    assert cfg['fsdp'] == (scale == '3.78b')
    assert (cfg['n_layer'], cfg['n_head'], cfg['n_embd']) == SHAPES[scale]
    for key, value in FLAGS[variant].items():
        assert cfg[key] == value, key
    if family == 'llama':
        assert (cfg['pos'], cfg['n_kv_head']) == ('rope', 4)
        assert cfg['norm'] != 'layernorm' or variant == 'ln'
    assert cfg['out_dir'] == f'out/{family}_{scale}_{variant}'
    args = {f.name: cfg[f.name] for f in fields(GPTConfig)} | {'vocab_size': 50304}
    with torch.device('meta'):  # builds the full-size model without allocating it
        n = GPT(GPTConfig(**args)).get_num_params()
    L, _, d = SHAPES[scale]
    if family == 'gpt2' and variant != 'diff':
        # closed form: per block 4d^2 (attention) + 8d^2 (MLP) + two norms; a final norm; the tied
        # embedding. A norm holds d gains, plus one alpha for DyT, one alpha and one shift for Derf (no
        # biases in the study).
        norm = d + {'dyt': 1, 'derf': 2}.get(cfg['norm'], 0)
        assert n == L * (12 * d * d + 2 * norm) + norm + 50304 * d
