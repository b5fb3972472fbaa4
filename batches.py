"""
What train.py feeds a model, and how a step's batch is split over processes. Two kinds of data:
  TokenData  a tokenized corpus (data/<name>/{train,val}.bin): windows of block_size tokens, next-token targets
  ImageData  CIFAR-10 (data/cifar10): whole images, labels; the train images randomly cropped and mirrored
Both draw a step's samples from (seed, step) alone, so a resumed or multi-process run sees exactly the batches of
an uninterrupted single-process one, and both keep fixed eval samples (the same at every evaluation).
"""
import hashlib
import os

import numpy as np
import torch
import torch.nn.functional as F

from data.common import DATA_DIR, DataError, load_meta, load_split, random_windows, unigram_entropy


def derived_seed(*parts):
    """A seed determined by all of its parts (run seed, purpose, step, ...): independent reproducible streams."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), 'little') >> 1


def micro_batches(n, world, rank, batch_size):
    """This process's share of n samples as (first, count) micro-batches. Shares differ by one sample at most and
    every process runs the same number of micro-batches (FSDP's collectives need that), of <= batch_size."""
    lo, hi = rank * n // world, (rank + 1) * n // world
    count = -(-(-(-n // world)) // batch_size)  # ceil(ceil(n / world) / batch_size)
    bounds = [lo + (hi - lo) * k // count for k in range(count + 1)]
    return [(a, b - a) for a, b in zip(bounds, bounds[1:])]


def to_device(t, device):
    if 'cuda' in str(device):  # pinned, so the copy overlaps the work already queued on the GPU
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class TokenData:
    """Windows of block_size tokens of the train split's first n_train tokens (the data budget), with their next
    tokens as targets. A window and its targets end inside the budget: start <= n_train - block_size - 1."""
    unit, predicted = 'tokens', 'token'

    def __init__(self, train, val, block_size, eval_count, eval_seed):
        self.train, self.val, self.block_size = train, val, block_size
        self.n_train, self.per_sample, self.dims = len(train), block_size, {}
        self.entropy = unigram_entropy(train)  # the loss of predicting token frequencies only (collapse)
        # train windows as analyze.py draws them (saturation is measured on them); val windows evenly spread
        self.eval_ids = {'train': torch.from_numpy(random_windows(len(train), eval_count, block_size + 1, eval_seed)),
                         'val': torch.linspace(0, len(val) - block_size - 1, eval_count).long()}

    def draw(self, seed, step, count):
        """Start offsets of the `count` windows of step `step`."""
        g = torch.Generator().manual_seed(derived_seed(seed, 'train', step))
        return torch.randint(self.n_train - self.block_size, (count,), generator=g)

    def batch(self, split, starts, device):
        data, T = self.train if split == 'train' else self.val, self.block_size
        x = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in starts.tolist()])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype(np.int64)) for i in starts.tolist()])
        return to_device(x, device), to_device(y, device)


class ImageData:
    """Labelled images (uint8 N x C x H x W). Training sees every image once per epoch, in an order drawn per
    epoch, zero-padded by `pad`, randomly cropped back and mirrored half of the time (the CIFAR recipe); evaluation
    sees the images as they are. A sample is a row (image index, crop row offset, crop column offset, mirrored)."""
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
        self.entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())  # the loss of predicting class frequencies only
        self.eval_ids = {'train': self.rows(torch.from_numpy(
                             np.random.default_rng(eval_seed).permutation(self.n_train)[:eval_count])),
                         'val': self.rows(torch.arange(len(self.y_val)))}  # the whole test set
        self.perms, self.scales = {}, {}

    def rows(self, index):
        """Samples of the images as they are: the crop at offset (pad, pad) of the padded image, not mirrored."""
        return torch.stack([index, torch.full_like(index, self.pad), torch.full_like(index, self.pad),
                            torch.zeros_like(index)], dim=1)

    def epoch_order(self, seed, epoch):
        if (seed, epoch) not in self.perms:  # a step reads one or two epochs' orders: keep the last few
            g = torch.Generator().manual_seed(derived_seed(seed, 'epoch', epoch))
            self.perms = dict(list(self.perms.items())[-2:]) | {(seed, epoch): torch.randperm(self.n_train, generator=g)}
        return self.perms[(seed, epoch)]

    def draw(self, seed, step, count):
        """The samples of step `step`: places step x count ... of the endless run of epoch orders, each with a
        crop offset in [0, 2 pad] (row and column) and a coin for the mirror."""
        place = torch.arange(step * count, (step + 1) * count)
        epoch, index = place // self.n_train, torch.empty(count, dtype=torch.long)
        for e in epoch.unique().tolist():
            index[epoch == e] = self.epoch_order(seed, e)[place[epoch == e] % self.n_train]
        g = torch.Generator().manual_seed(derived_seed(seed, 'augment', step))
        crops = torch.randint(2 * self.pad + 1, (count, 2), generator=g)
        return torch.cat([index[:, None], crops, torch.randint(2, (count, 1), generator=g)], dim=1)

    def batch(self, split, rows, device):
        """(normalised float images, labels) on the device; the crop and mirror are applied on the CPU, in uint8."""
        x, y = (self.x_train, self.y_train) if split == 'train' else (self.x_val, self.y_val)
        index = rows[:, 0].numpy()
        images = crop_and_flip(torch.from_numpy(x[index]), rows[:, 1], rows[:, 2], rows[:, 3].bool(), self.pad)
        images = to_device(images, device).float().div_(255)
        if images.device not in self.scales:  # put on the device once, not at every batch
            self.scales[images.device] = [torch.tensor(v, device=images.device).view(1, -1, 1, 1)
                                          for v in (self.MEAN, self.STD)]
        mean, std = self.scales[images.device]
        return (images - mean) / std, to_device(torch.from_numpy(y[index]), device)


def crop_and_flip(images, dy, dx, flip, pad):
    """Each image (N, C, H, W) zero-padded by `pad` on every side, cropped back to H x W at offset (dy[i], dx[i]) of
    the padded image, and mirrored left-right where flip[i]. One gather for the whole batch."""
    N, C, H, W = images.shape
    padded = F.pad(images, (pad, pad, pad, pad))
    rows = dy[:, None] + torch.arange(H)
    cols = dx[:, None] + torch.arange(W)
    cols = torch.where(flip[:, None], cols.flip(1), cols)  # a mirrored crop reads its columns right to left
    return padded[torch.arange(N)[:, None, None, None], torch.arange(C)[None, :, None, None],
                  rows[:, None, :, None], cols[:, None, None, :]]


def open_training_data(dataset, data_dir, block_size, train_tokens, val_tokens, eval_count, eval_seed):
    """(meta.json, TokenData or ImageData) of a prepared dataset, every size checked (DataError otherwise).
    train_tokens is the budget (the train split's first tokens; None = all), val_tokens the val prefix."""
    meta = load_meta(dataset, data_dir)
    if meta['kind'] == 'images':
        from data.cifar10.prepare import load
        folder = data_dir or os.path.join(DATA_DIR, dataset)
        return meta, ImageData(load('train', folder), load('test', folder), eval_count, eval_seed)
    train, val = (load_split(dataset, s, data_dir=data_dir) for s in ('train', 'val'))
    n_train = len(train) if train_tokens is None else train_tokens
    if not block_size < n_train <= len(train):
        raise DataError(f'train_tokens={train_tokens} must be between block_size+1 ({block_size + 1}) '
                        f'and the size of the train split ({len(train):,} tokens)')
    val = val[:val_tokens]
    if len(val) <= block_size:
        raise DataError(f'the val split ({len(val):,} tokens, val_tokens={val_tokens}) is shorter than '
                        f'block_size+1 ({block_size + 1})')
    return meta, TokenData(train[:n_train], val, block_size, eval_count, eval_seed)
