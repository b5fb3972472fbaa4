"""The data as every script reads it: tokenizers, token files, train.py's windows, atomic writes."""
import json
import os
from dataclasses import fields
from hashlib import blake2b

import numpy as np
import torch

from configurator import annex
from model import GPTConfig

DATA_DIR = os.path.dirname(os.path.abspath(__file__))
TIKTOKEN_ENV = "NANONORM_TIKTOKEN_FILE"  # GPT-2's ranks file, offline
EOT = {"byte": 256, "gpt2": 50256}  # end-of-text ids
BYTES = {**{i: bytes([i]) for i in range(256)}, EOT["byte"]: b"<|endoftext|>"}  # byte ids' text
FOLDER_FORMAT = ('a data folder holds train.bin and val.bin (uint16 ids, or "dtype": "uint32")'
                 ' and meta.json {"tokenizer": "byte"/"gpt2", "vocab_size": int} (docs/data.md)')
WRITTEN_AS = {1: "uint8", 2: "uint16", 4: "uint32", 8: "int64 (numpy's default)"}  # by bytes per id


class DataError(RuntimeError):  # one the user can fix, as its message says
    pass


class Tokenizer:
    def __init__(self, name, enc=None):
        self.name, self.enc = name, enc
        self.eot, self.n_vocab = (enc.eot_token, enc.n_vocab) if enc else (EOT["byte"], 257)

    def encode(self, text):
        return self.enc.encode_ordinary(text) if self.enc else list(text.encode("utf-8"))

    def decode(self, ids):  # a byte id past the vocabulary (padding) decodes as U+FFFD
        if self.enc:
            return self.enc.decode(list(ids))
        return b"".join(BYTES.get(i, "\ufffd".encode()) for i in ids).decode(errors="replace")


def get_tokenizer(name, tiktoken_file=None):
    if name == "byte":
        return Tokenizer("byte")
    if name != "gpt2":
        raise DataError(f"unknown tokenizer {name!r}: use 'gpt2' or 'byte'")
    from data.prepare_tools import gpt2_encoding
    return Tokenizer("gpt2", gpt2_encoding(tiktoken_file or os.environ.get(TIKTOKEN_ENV) or None))


def load_split(dataset, split, data_dir=None):  # a read-only memmap
    meta = load_meta(dataset, data_dir)  # first: no meta.json, no prepared folder
    folder = data_dir or os.path.join(DATA_DIR, dataset)
    path = os.path.join(folder, f"{split}.bin")
    rebuild = f"rebuild with: python data/{dataset}/prepare.py --force=True"
    if not os.path.exists(path):
        have = sorted(f[:-4] for f in os.listdir(folder) if f.endswith(".bin"))
        raise DataError(f"no {split!r} split ({path} missing; found {have}); if deleted, {rebuild}")
    size = os.path.getsize(path)
    if size == 0:
        raise DataError(f"{path} is empty; {rebuild}")
    dtype, count = np.dtype(meta.get("dtype", "uint16")), meta.get(f"{split}_tokens")
    if count is not None and (type(count) is not int or count < 1):
        raise DataError(f"{folder}/meta.json: '{split}_tokens' must be the number of tokens in "
                        f"{split}.bin (a positive int), got {count!r}; {FOLDER_FORMAT}")
    n = size / dtype.itemsize
    if n != int(n) and count is None:
        raise DataError(f"{path} has {size:,} bytes, not a whole number of {dtype} ids: truncated, "
                        f"or not {dtype}?")
    if count is not None and n != count:  # a wrong dtype would read garbage silently
        why = "truncated, or meta.json's count is another file's? Write both again"
        if size / count in WRITTEN_AS:
            why = (f"written as {WRITTEN_AS[size / count]}? meta.json's \"dtype\" must say how "
                   "they are stored: uint16 or uint32")
        raise DataError(f"{path} holds {n:g} {dtype} ids but meta.json says {split}_tokens="
                        f"{count:,}: {why}")
    return np.memmap(path, dtype=dtype, mode="r")


def load_meta(dataset, data_dir=None):  # its "kind": "tokens" (fields checked) or "images"
    path = os.path.join(data_dir or os.path.join(DATA_DIR, dataset), "meta.json")
    how = FOLDER_FORMAT if data_dir else f"Run: python data/{dataset}/prepare.py --force=True"
    if not os.path.exists(path):
        raise DataError(f"dataset {dataset!r} is not prepared: {path} not found. {how}")
    try:
        with open(path) as f:
            meta = json.load(f)
    except ValueError as e:
        raise DataError(f"{path} is not valid JSON ({e}). {how}") from e
    if not isinstance(meta, dict):
        raise DataError(f"{path} must hold a JSON object; {FOLDER_FORMAT}")
    meta["kind"] = meta.get("kind") or ("images" if "train_images" in meta else "tokens")
    if meta["kind"] == "images":
        return meta
    if meta.get("tokenizer") not in ("byte", "gpt2"):
        wrong = f"""'tokenizer' must be "byte" or "gpt2", got {meta.get('tokenizer')!r}"""
    elif type(meta.get("vocab_size")) is not int or meta["vocab_size"] < 1:
        wrong = f"'vocab_size' must be a positive int, got {meta.get('vocab_size')!r}"
    elif "eot" in meta and not (type(meta["eot"]) is int and 0 <= meta["eot"] < meta["vocab_size"]):
        wrong = f"'eot' must be the end-of-text id (an int below vocab_size), got {meta['eot']!r}"
    elif meta.get("dtype", "uint16") not in ("uint16", "uint32"):
        wrong = f"""'dtype' must be "uint16" or "uint32" (the ids' type), got {meta['dtype']!r}"""
    else:
        return meta
    raise DataError(f"{path}: {wrong}; {FOLDER_FORMAT}")


def random_windows(n_tokens, count, length, seed=1337):  # the first k starts do not depend on count
    if n_tokens < length:
        raise DataError(f"{n_tokens:,} tokens are too few for windows of {length} tokens; use a "
                        "smaller block_size")
    return np.random.default_rng(seed).integers(0, n_tokens - length + 1, size=count)


def token_counts(tokens, minlength=0, chunk=1 << 24):  # in chunks: no copy of a 118M-token budget
    counts = np.zeros(minlength, dtype=np.int64)
    for k in range(0, len(tokens), chunk):
        c = np.bincount(np.asarray(tokens[k:k + chunk]), minlength=len(counts))
        counts = np.pad(counts, (0, len(c) - len(counts))) + c
    return counts


def entropy_of(counts):  # in nats: the loss of a frequencies-only model
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def data_budget(train, train_tokens, budget_docs=None, meta=None):  # or seeded whole documents
    if budget_docs is None:
        return train[:train_tokens]
    protocol = annex('protocol', 'budget_docs')
    return protocol.budget_tokens(train, train_tokens, budget_docs, protocol.eot_id(meta))


def derived_seed(*parts):  # of (seed, purpose, step...): independent, reproducible
    return int.from_bytes(blake2b(repr(parts).encode(), digest_size=8).digest(), 'little') >> 1


def micro_batches(n, world, rank, batch_size):  # this rank's (first, count)s, as many on all (FSDP)
    lo, hi = rank * n // world, (rank + 1) * n // world
    count = -(-n // (world * batch_size))  # = ceil(ceil(n / world) / batch_size)
    bounds = [lo + (hi - lo) * k // count for k in range(count + 1)]
    return [(a, b - a) for a, b in zip(bounds, bounds[1:])]


def largest_part(n, world, batch_size):  # the rows of micro_batches' largest part, on any rank
    return -(-(-(-n // world)) // -(-n // (world * batch_size)))


def padded(x, y, rows):  # to `rows` rows, one shape for compiled code: the added ones ignored (-1)
    extra = rows - len(y)
    if extra == 0:
        return x, y
    return (torch.cat([x, x[:1].expand(extra, *x.shape[1:])]),
            torch.cat([y, y.new_full((extra, *y.shape[1:]), -1)]))


class TokenData:  # a step's windows from (seed, step) alone: resumable
    unit, predicted = 'tokens', 'token'

    def __init__(self, train, val, block_size, eval_count, eval_seed, paper_val=None):
        self.train, self.val, self.val_paper, self.block_size = train, val, paper_val, block_size
        self.n_train, self.per_sample = len(train), block_size
        counts = token_counts(train)  # one pass: the top id, a collapsed model's loss
        self.top_id, self.entropy = len(counts) - 1, entropy_of(counts)
        windows = random_windows(len(train), eval_count, block_size + 1, eval_seed)
        self.eval_ids = {'train': torch.from_numpy(windows),
                         'val': torch.linspace(0, len(val) - block_size - 1, eval_count).long()}

    def model_args(self, config):  # a GPT's, from train.py's config
        return {f.name: config[f.name] for f in fields(GPTConfig)}

    def describe(self, n):  # n samples
        return f'{n} sequences x {self.block_size} tokens = {n * self.block_size:,} tokens'

    def next_steps(self, out_dir):  # what train.py suggests once a run ends
        return f'python sample.py --out_dir={out_dir}; python analyze.py all {out_dir}'

    def draw(self, seed, step, count, split='train'):  # where a step's windows start
        g = torch.Generator().manual_seed(derived_seed(seed, split, step))
        return torch.randint(len(getattr(self, split)) - self.block_size, (count,), generator=g)

    def batch(self, split, starts, device):
        windows = np.asarray(starts)[:, None] + np.arange(self.block_size + 1)  # + the token after
        xy = torch.from_numpy(getattr(self, split)[windows].astype(np.int64))
        return to_device(xy[:, :-1].contiguous(), device), to_device(xy[:, 1:].contiguous(), device)


def to_device(t, device):  # pinned for CUDA: the copy overlaps queued work
    cuda = 'cuda' in str(device)
    return (t.pin_memory() if cuda else t).to(device, non_blocking=cuda)


def open_data(cfg, env, eval_seed):  # (meta, data), cfg.vocab_size set; pydocs built if missing
    try:
        if cfg.dataset == 'pydocs' and cfg.data_dir is None and not os.path.exists(
                os.path.join(DATA_DIR, 'pydocs', 'meta.json')):
            if env.master:
                from data.pydocs.prepare import prepare
                prepare()
            if env.ddp:
                torch.distributed.barrier()
        meta, eval_count = load_meta(cfg.dataset, cfg.data_dir), cfg.eval_samples
        if meta['kind'] == 'images':
            vit = annex('vit', f'dataset {cfg.dataset!r} (images, for a ViT)')
            return vit.open_images(cfg.dataset, cfg.data_dir, eval_count, eval_seed, cfg.paper_val)
        return meta, open_tokens(cfg, meta, eval_count, eval_seed)
    except DataError as e:
        raise SystemExit(f'error: {e}') from None


def open_tokens(cfg, meta, eval_count, eval_seed):
    train, val = (load_split(cfg.dataset, s, data_dir=cfg.data_dir) for s in ('train', 'val'))
    T, vocab, paper = cfg.block_size, meta['vocab_size'], None
    if cfg.paper_val:
        paper = val[:annex('protocol', 'paper_val').paper_val_tokens(cfg.train_tokens, len(val))]
    val = val[:cfg.val_tokens]
    n_train = len(train) if cfg.train_tokens is None else cfg.train_tokens
    if not T < n_train <= len(train):
        raise DataError(f'train_tokens={cfg.train_tokens} must be between block_size+1 ({T + 1}) '
                        f'and the size of the train split ({len(train):,} tokens)')
    if len(val) <= T:
        raise DataError(f'the val split ({len(val):,} tokens, val_tokens={cfg.val_tokens}) is '
                        f'shorter than block_size+1 ({T + 1})')
    data = TokenData(data_budget(train, cfg.train_tokens, cfg.budget_docs, meta), val, T,
                     eval_count, eval_seed, paper)
    for split, top in (('train', data.top_id), ('val', int(val.max()))):
        if top >= vocab:
            raise DataError(f"the {split} split (as trained on) holds token id {top:,}, but "
                            f"meta.json's vocab_size is {vocab:,}: ids must be below it. Fix "
                            'vocab_size or the token files (another tokenizer? wrong "dtype"?)')
    if cfg.vocab_size is None:
        cfg.vocab_size = -(-vocab // 64) * 64
    elif cfg.vocab_size < vocab:
        raise DataError(f"vocab_size={cfg.vocab_size} is smaller than the dataset's vocabulary "
                        f"({vocab} in meta.json); use vocab_size=None (padded automatically)")
    return data


def atomic_write(path, write):  # temp, fsync, rename: a crash leaves the old file or the new
    tmp, fd = f"{path}.tmp{os.getpid()}", None
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        os.fsync(fd)  # the rename too
    except OSError as e:
        raise DataError(f"cannot write {path}: {e}. Free space or use a writable folder.") from e
    finally:
        if fd is not None:
            os.close(fd)
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path, obj):
    atomic_write(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode()))
