"""
The study's vision check: a ViT (Dosovitskiy et al. 2021) of model.py's blocks with attention made
non-causal, and CIFAR-10 as train.py reads it (docs/vision.md). An annex: train.py imports it only for
image data (data/cifar10/prepare.py writes meta.json with "kind": "images"); checkpoint.py for a ViT
checkpoint.

  python data/cifar10/prepare.py && python train.py config/vit_cifar10_dyt.py
"""
import math
import os
from dataclasses import dataclass, field, fields

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from data.common import DATA_DIR, DataError, derived_seed, load_meta, to_device
from run_files import read_log
from model import GPT, Block, GPTConfig, make_norm


@dataclass
class ViTConfig(GPTConfig):
    """A GPTConfig for images: the block fields (norm, attn, mlp, dyt_alpha*, ...) mean the same; the
    sequence is the image's patches, plus a class token with pool='cls'."""
    image_size: int = 32
    channels: int = 3
    n_classes: int = 10
    patch_size: int = 4
    # 'cls': a learned class token, read out after the final norm (ViT, and DeiT, the DyT paper's vision
    # models); 'mean': the mean of the patches' outputs
    pool: str = 'cls'
    # the study's ViT as its code ran (config/vit_cifar10_as_run.py): the whole model in bf16, no
    # autocast; inputs normalised by 0.5/0.5; PyTorch's default init; weight decay on every parameter
    vit_as_run: bool = False
    block_size: int = field(default=0, init=False)  # tokens per image, from the sizes
    vocab_size: int = field(default=0, init=False)  # no vocabulary

    def __post_init__(self):
        if self.pool not in ('cls', 'mean'):
            raise ValueError(f"pool={self.pool!r} is not known; choose 'cls' or 'mean'")
        if self.pos != 'learned':
            raise ValueError("a ViT needs pos='learned': this RoPE is 1-D, an image's patches are 2-D")
        if self.patch_size < 1 or self.image_size % self.patch_size:
            raise ValueError(f"patch_size={self.patch_size} must divide image_size={self.image_size}")
        self.block_size = (self.image_size // self.patch_size) ** 2 + (self.pool == 'cls')
        super().__post_init__()


class ViT(nn.Module):
    """Patches -> one linear layer (a convolution with stride = kernel = patch_size) (+ class token) +
    learned positions -> model.py's blocks, attention non-causal -> final norm -> class token or mean ->
    a linear classifier. Init and weight decay follow timm's ViT (the DyT paper's vision code)."""
    no_decay = ('transformer.wpe.weight',)  # as timm's ViT (the 1-D class token is not decayed either)
    get_num_params, estimate_mfu = GPT.get_num_params, GPT.estimate_mfu  # hold for a ViT as they are

    def describe(self):  # what train.py prints of the model
        c = self.config
        return (f'{self.get_num_params():,} parameters ({c.norm}, {c.attn} attention, {c.mlp} MLP, '
                f'ViT, patch {c.patch_size}, {c.pool} pooling)')

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            patch=nn.Linear(config.channels * config.patch_size ** 2, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i, causal=False) for i in range(config.n_layer)]),
            ln_f=make_norm(config, config.dyt_alpha_final),
        ))
        self.cls_token = nn.Parameter(torch.empty(config.n_embd)) if config.pool == 'cls' else None
        scale = torch.full((1,), math.sqrt(config.n_embd))
        self.embed_scale = nn.Parameter(scale) if config.embed_scale else None
        self.head = nn.Linear(config.n_embd, config.n_classes)
        if not config.vit_as_run:  # as run: PyTorch's default init of every Linear and Embedding
            self.apply(self._init_weights)
        if self.cls_token is not None:  # a bare parameter has no default init: ours in both modes
            nn.init.normal_(self.cls_token, std=1e-6)
        if config.vit_as_run:  # the study's model.to(bfloat16): weights, so gradients and AdamW state
            self.to(torch.bfloat16)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """GPT's AdamW groups; as run, weight decay on every parameter (the study's 0.05 on all)."""
        optimizer = GPT.configure_optimizers(self, weight_decay, learning_rate, betas, device_type)
        if self.config.vit_as_run:
            for group in optimizer.param_groups:
                group['weight_decay'] = weight_decay
        return optimizer

    def _init_weights(self, module):
        """timm's ViT: every linear layer N(0, 0.02), the residual projections too (no GPT-2 depth
        scaling), biases 0; the patch embedding keeps PyTorch's convolution default U(+-1/sqrt(fan_in));
        positions N(0, emb_init_std); the class token N(0, 1e-6); norms and Diff lambdas as in the
        GPT."""
        if isinstance(module, nn.Linear) and module is not self.transformer.patch:
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.emb_init_std)

    def hidden(self, images):
        """(B, channels, H, W) float images -> the final norm's output (B, tokens, n_embd), the class
        token first."""
        B, C, H, W = images.shape
        p = self.config.patch_size
        if (C, H, W) != (self.config.channels, self.config.image_size, self.config.image_size):
            raise ValueError(f"images of shape {(C, H, W)}; this ViT takes "
                             f"{(self.config.channels, self.config.image_size, self.config.image_size)}")
        if self.config.vit_as_run:  # ImageData's (pixel - mean) / std made the study's (pixel - .5) / .5
            mean, std = (images.new_tensor(v).view(-1, 1, 1) for v in (ImageData.MEAN, ImageData.STD))
            images = (images * std + mean - 0.5) / 0.5
        # each patch flattened in (channel, row, column) order, like a convolution kernel; patches row
        # by row
        x = images.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).reshape(B, -1, C * p * p)
        x = self.transformer.patch(x.to(self.transformer.patch.weight.dtype))  # as run: in bf16
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, 1, -1).to(x.dtype), x], dim=1)
        x = x + self.transformer.wpe.weight
        if self.embed_scale is not None:
            x = x * self.embed_scale
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x)

    def forward(self, images, targets=None):
        """-> (class logits (B, n_classes), mean cross-entropy or None)."""
        x = self.hidden(images)
        logits = self.head(x[:, 0] if self.cls_token is not None else x.mean(dim=1))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits, targets, ignore_index=-1)  # -1: train.py's padding

# -------------------------------------------------------------------------------------------------------
# CIFAR-10 as train.py reads it


class ImageData:
    """Labelled images (uint8 N x C x H x W). Training sees every image once per epoch, in an order drawn
    per epoch, zero-padded by `pad`, randomly cropped back and mirrored half of the time (the CIFAR
    recipe); evaluation sees the images as they are. A sample is a row (image index, crop row offset,
    crop column offset, mirrored). Like train.py's token windows, a step's samples are a function of
    (seed, step) alone."""
    unit, predicted = 'images', 'class'
    MEAN = (0.4914, 0.4822, 0.4465)  # CIFAR-10 train set per-channel mean and std of pixel/255
    STD = (0.2470, 0.2435, 0.2616)

    def __init__(self, train, test, eval_count, eval_seed, pad=4):
        (self.x_train, self.y_train), (self.x_val, self.y_val), self.pad = train, test, pad
        self.n_train, self.per_sample = len(self.y_train), 1
        C, H, W = self.x_train.shape[1:]
        if H != W or self.x_val.shape[1:] != (C, H, W):
            raise DataError(f'images must be square and alike in both splits; got {(C, H, W)} and '
                            f'{self.x_val.shape[1:]}')
        self.dims = dict(image_size=H, channels=C, n_classes=int(self.y_train.max()) + 1)
        p = np.bincount(self.y_train) / self.n_train
        # the loss of predicting class frequencies
        self.entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
        self.eval_ids = {'train': self.rows(torch.from_numpy(
                             np.random.default_rng(eval_seed).permutation(self.n_train)[:eval_count])),
                         'val': self.rows(torch.arange(len(self.y_val)))}  # the whole test set
        self.perms, self.scales = {}, {}

    def model_args(self, config):
        """A ViT's model_args from train.py's config (ViTConfig's fields, the image sizes from the data),
        checked before anything is built."""
        args = {f.name: config[f.name] for f in fields(ViTConfig) if f.init and f.name not in self.dims}
        if not args['vit_as_run']:  # left out unless set: checkpoints from before the mode still resume
            del args['vit_as_run']
        try:
            ViTConfig(**args, **self.dims)
        except ValueError as e:
            raise SystemExit(f'error: {e}') from None
        return args | self.dims

    def describe(self, n):  # n samples
        return f'{n} images'

    def next_steps(self, out_dir):  # what train.py suggests once a run has finished
        return f'python analyze.py all {out_dir}'

    def rows(self, index):
        """Samples of the images as they are: the crop at offset (pad, pad) of the padded image, not
        mirrored."""
        return torch.stack([index, torch.full_like(index, self.pad), torch.full_like(index, self.pad),
                            torch.zeros_like(index)], dim=1)

    def epoch_order(self, seed, epoch):
        if (seed, epoch) not in self.perms:  # a step reads one or two epochs' orders: keep the last few
            g = torch.Generator().manual_seed(derived_seed(seed, 'epoch', epoch))
            self.perms = dict(list(self.perms.items())[-2:]) | {
                (seed, epoch): torch.randperm(self.n_train, generator=g)}
        return self.perms[(seed, epoch)]

    def draw(self, seed, step, count):
        """The samples of step `step`: places step x count ... of the endless run of epoch orders, each
        with a crop offset in [0, 2 pad] (row and column) and a coin for the mirror."""
        place = torch.arange(step * count, (step + 1) * count)
        epoch, index = place // self.n_train, torch.empty(count, dtype=torch.long)
        for e in epoch.unique().tolist():
            index[epoch == e] = self.epoch_order(seed, e)[place[epoch == e] % self.n_train]
        g = torch.Generator().manual_seed(derived_seed(seed, 'augment', step))
        crops = torch.randint(2 * self.pad + 1, (count, 2), generator=g)
        return torch.cat([index[:, None], crops, torch.randint(2, (count, 1), generator=g)], dim=1)

    def batch(self, split, rows, device):
        """(normalised float images, labels) on the device; the crop and mirror are applied on the CPU,
        in uint8."""
        x, y = (self.x_train, self.y_train) if split == 'train' else (self.x_val, self.y_val)
        index = rows[:, 0].numpy()
        images = crop_and_flip(torch.from_numpy(x[index]), rows[:, 1], rows[:, 2], rows[:, 3].bool(),
                               self.pad)
        images, labels = (to_device(images, device).float().div_(255),
                          to_device(torch.from_numpy(y[index]), device))
        if images.device not in self.scales:  # put on the device once, not at every batch
            self.scales[images.device] = [torch.tensor(v, device=images.device).view(1, -1, 1, 1)
                                          for v in (self.MEAN, self.STD)]
        mean, std = self.scales[images.device]
        return (images - mean) / std, labels


def crop_and_flip(images, dy, dx, flip, pad):
    """Each image (N, C, H, W) zero-padded by `pad` on every side, cropped back to H x W at offset
    (dy[i], dx[i]) of the padded image, and mirrored left-right where flip[i]. One gather for the whole
    batch."""
    N, C, H, W = images.shape
    padded = F.pad(images, (pad, pad, pad, pad))
    rows = dy[:, None] + torch.arange(H)
    cols = dx[:, None] + torch.arange(W)
    # a mirrored crop reads its columns right to left
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    return padded[torch.arange(N)[:, None, None, None], torch.arange(C)[None, :, None, None],
                  rows[:, None, :, None], cols[:, None, None, :]]


def open_images(dataset, data_dir, eval_count, eval_seed, paper_val=0):
    """(meta.json, ImageData) of a prepared CIFAR-format folder (data/cifar10/prepare.py)."""
    from data.cifar10.prepare import load
    if paper_val:
        raise DataError("paper_val is the study's language-model protocol; use paper_val=0 here")
    folder = data_dir or os.path.join(DATA_DIR, dataset)
    return load_meta(dataset, data_dir), ImageData(load('train', folder), load('test', folder),
                                                   eval_count, eval_seed)


def analysis_images(dataset, data_dir, count, seed):
    """analyze.py's inputs for a ViT: the first `count` of the fixed train images train.py evaluates on
    (with its seed), as they are, and the number of train images."""
    if load_meta(dataset, data_dir)['kind'] != 'images':
        raise DataError(f"dataset '{dataset}' is not image data: pass the ViT's --dataset=NAME")
    _, data = open_images(dataset, data_dir, count, seed)
    return data.batch('train', data.eval_ids['train'], 'cpu')[0], data.n_train


def accuracy_at_epochs(out_dir, epochs=(1, 25, 50, 75, 100)):
    """A ViT run's test accuracy at the study's eval epochs (each: the eval in [epoch, epoch + 1), None
    where the log has none; config/vision.py evaluates every epoch), the best of those (how the study
    reported LayerNorm's 72.4% and DyT 0.5's 81.2%) and the final (how it reported DyT 2.0's 33.3%)."""
    evals = read_log(os.path.join(out_dir, 'log.jsonl'), lambda r: r['event'] == 'eval')
    at = {e: next((r['val_acc'] for r in evals if e <= r['epochs'] < e + 1), None) for e in epochs}
    found = [a for a in at.values() if a is not None]
    return {'at_epochs': at, 'best_of_those': max(found, default=None),
            'final': evals[-1]['val_acc'] if evals else None}
