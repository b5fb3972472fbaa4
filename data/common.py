"""
Shared data helpers: one robust downloader for every data set, the two tokenizers, and reading and
writing the flat uint16 token files (data/<dataset>/{train,val,test}.bin + meta.json).
"""
import argparse
import functools
import hashlib
import inspect
import json
import os
import sys
import time

import numpy as np
import requests
from urllib3.exceptions import NameResolutionError

DATA_DIR = os.path.dirname(os.path.abspath(__file__))
# some hosts (wikitext.smerity.com) answer 403 to the default python-requests agent
USER_AGENT = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0 Safari/537.36"
TIKTOKEN_ENV = "NANONORM_TIKTOKEN_FILE"  # path to a GPT-2 .tiktoken ranks file, for machines without internet
GPT2_RANKS_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


class DataError(RuntimeError):
    """A data problem the user can fix; the message says what is wrong and what to do."""


# ----------------------------------------------------------------------------- download

def download(urls, dest, sha256=None, md5=None, size=None, headers=None, retries=4, backoff=2.0, timeout=60):
    """Fetch `dest` from the first URL of `urls` that works; returns dest.

    Each mirror gets `retries` tries, `backoff * 2**k` seconds apart; a partial `dest + '.part'` is
    resumed with an HTTP Range request. `size` (bytes), `sha256` and `md5` are checked before the file
    is renamed to `dest`, so nothing unverified ever sits under the final name. An existing `dest`
    that passes the checks is kept.
    """
    urls = [urls] if isinstance(urls, str) else list(urls)
    expected = ", ".join(f"{k} {v}" for k, v in (("size", size), ("sha256", sha256), ("md5", md5)) if v)
    if os.path.exists(dest):
        problem = _check(dest, sha256, md5, size)
        if problem:
            raise DataError(f"{dest} exists but {problem}. Delete it and run again.")
        return dest
    part = dest + ".part"
    # identity: a gzip Content-Encoding would make byte counts and Range offsets refer to other bytes
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **(headers or {})}
    tried = []
    try:
        os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
        for url in urls:
            what = _try(url, part, headers, size, timeout, retries, backoff)
            if what is None:
                what = _check(part, sha256, md5, size)
                if what is None:
                    os.replace(part, dest)
                    return dest
                os.remove(part)  # a wrong file cannot be resumed: the next try starts clean
                what = "downloaded, but " + what
                print(f"  {url}: {what}", file=sys.stderr)
            tried.append(f"{url}: {what}")
    except OSError as e:  # local trouble: disk full, no permission, a file where a folder should be
        raise DataError(f"cannot write {part}: {e}. Free some disk space or choose a writable folder.") from e
    raise DataError(f"could not download {os.path.basename(dest)}:\n  " + "\n  ".join(tried) +
                    f"\nDownload it by hand from one of these URLs and save it as {os.path.abspath(dest)}"
                    + (f" ({expected})" if expected else "") + ", then run again.")


class WrongFile(Exception):
    """The server offers a file of the wrong size: retrying or resuming it is pointless."""


def _try(url, part, headers, size, timeout, retries, backoff):
    """Fetch `url` into `part`, retrying with backoff; None on success, else what went wrong."""
    what = "not tried (retries=0)"
    for attempt in range(retries):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            _fetch(url, part, headers, size, timeout)
            return None
        except WrongFile as e:
            if os.path.exists(part):
                os.remove(part)
            return str(e)
        except requests.RequestException as e:  # local OSErrors are not RequestExceptions: they go up
            status = e.response.status_code if e.response is not None else None
            what = f"HTTP {status} {e.response.reason}" if status else f"{type(e).__name__}: {e}"
            print(f"  {url}: {what} (try {attempt + 1} of {retries})", file=sys.stderr)
            if status and 400 <= status < 500 and status not in (408, 429):
                return what  # the server said no; asking again will not help
            if isinstance(getattr(e.args[0], "reason", None) if e.args else None, NameResolutionError):
                return what  # no such host from here (offline?): asking again will not help
    return f"{what} ({retries} tries)"


def _fetch(url, part, headers, size, timeout):
    """Append the rest of `url` to `part` (Range request when part has bytes); raises on any failure."""
    have = os.path.getsize(part) if os.path.exists(part) else 0
    if size is not None and have > size:
        os.remove(part)  # longer than the real file: not a prefix of it
        have = 0
    if size is not None and have == size:
        return
    h = dict(headers, **({"Range": f"bytes={have}-"} if have else {}))
    with requests.get(url, headers=h, stream=True, timeout=timeout) as r:
        if r.status_code == 416 and have:
            return  # nothing after `have`: the part is complete (the checks will tell)
        r.raise_for_status()
        resumed = r.status_code == 206
        if resumed and not r.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
            os.remove(part)
            raise requests.RequestException(f"asked for bytes {have}- but got {r.headers.get('Content-Range')}")
        if not resumed:
            have = 0  # plain 200: the server ignored Range and sends everything again
        length = r.headers.get("Content-Length")
        total = have + int(length) if length else size
        if size is not None and total != size:
            raise WrongFile(f"the server's file has {total:,} bytes, expected {size:,}")
        done, t0, shown = have, time.time(), 0.0
        with open(part, "ab" if resumed else "wb") as f:
            for block in r.iter_content(chunk_size=1 << 16):  # a drop loses at most one block
                f.write(block)
                done += len(block)
                if time.time() - shown > 0.5:
                    shown = time.time()
                    _progress(os.path.basename(part[:-5]), done, total, (done - have) / (shown - t0 + 1e-9))
        _progress(os.path.basename(part[:-5]), done, total, (done - have) / (time.time() - t0 + 1e-9))
        print(file=sys.stderr)
    if size is not None and done < size:
        raise requests.ConnectionError(f"transfer ended at {done:,} of {size:,} bytes")


def _progress(name, done, total, rate):
    of = f" / {total / 1e6:.1f} MB ({100 * done / total:.0f}%)" if total else " MB"
    sys.stderr.write(f"\r  {name}: {done / 1e6:.1f}{of}  {rate / 1e6:.1f} MB/s ")
    sys.stderr.flush()


def file_hash(path, algo="sha256"):
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check(path, sha256, md5, size):
    """None when `path` has the expected size and hashes, else what is wrong with it."""
    n = os.path.getsize(path)
    if size is not None and n != size:
        return f"its size is {n:,} bytes, expected {size:,}"
    for algo, want in (("sha256", sha256), ("md5", md5)):
        got = want and file_hash(path, algo)
        if got and got != want.lower():
            return f"its {algo} is {got}, expected {want}"
    return None


# ----------------------------------------------------------------------------- tokenizers

class Tokenizer:
    """GPT-2 BPE ('gpt2', via tiktoken) or UTF-8 bytes ('byte': ids 0..255, end-of-text 256).

    encode() never treats special tokens in the text as special (tiktoken's encode_ordinary).
    """

    def __init__(self, name, enc=None):
        self.name, self._enc = name, enc
        self.eot = enc.eot_token if enc else 256
        self.n_vocab = enc.n_vocab if enc else 257

    def encode(self, text):
        return self._enc.encode_ordinary(text) if self._enc else list(text.encode("utf-8"))

    def encode_batch(self, texts, num_threads=None):
        if not self._enc:
            return [self.encode(t) for t in texts]
        # tiktoken releases the GIL, so threads really run in parallel
        return self._enc.encode_ordinary_batch(texts, num_threads=num_threads or os.cpu_count() or 1)

    def decode(self, ids):
        if self._enc:
            return self._enc.decode(list(ids))
        out, run = [], bytearray()
        for i in ids:
            if i == self.eot:
                out += [run.decode("utf-8", errors="replace"), "<|endoftext|>"]
                run = bytearray()
            elif 0 <= i < 256:
                run.append(i)
            else:  # an id past the vocabulary (a padded embedding table can sample one)
                run += "\ufffd".encode()
        return "".join(out) + run.decode("utf-8", errors="replace")


def get_tokenizer(name, tiktoken_file=None):
    """Tokenizer `name` ('gpt2' or 'byte'). For 'gpt2' without internet, pass `tiktoken_file` (a GPT-2
    .tiktoken ranks file) or set the NANONORM_TIKTOKEN_FILE environment variable."""
    if name == "byte":
        return Tokenizer("byte")
    if name != "gpt2":
        raise DataError(f"unknown tokenizer {name!r}: use 'gpt2' or 'byte'")
    return _gpt2(tiktoken_file or os.environ.get(TIKTOKEN_ENV) or None)


@functools.lru_cache(maxsize=None)
def _gpt2(path):
    import tiktoken
    import tiktoken.load
    from tiktoken_ext.openai_public import r50k_pat_str  # the installed tiktoken's own GPT-2 regex
    how = (f"Get {GPT2_RANKS_URL} (sha256 {GPT2_RANKS_SHA256}) on a machine with internet, copy it here and "
           f"pass --tiktoken_file PATH or set {TIKTOKEN_ENV}=PATH.")
    if path is None:
        try:
            return Tokenizer("gpt2", tiktoken.get_encoding("gpt2"))
        except (OSError, ValueError) as e:  # requests errors are OSErrors
            raise DataError(f"cannot load the GPT-2 tokenizer ({type(e).__name__}: {e}). {how}") from e
    if not os.path.isfile(path):
        raise DataError(f"tiktoken file {path} not found. {how}")
    try:
        ranks = tiktoken.load.load_tiktoken_bpe(path)
        enc = tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                                special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
    except (ValueError, AssertionError) as e:
        raise DataError(f"{path} is not a GPT-2 .tiktoken ranks file ({e}). {how}") from e
    if enc.encode_ordinary("Hello world") != [15496, 995]:
        raise DataError(f"{path} does not give GPT-2's ids ('Hello world' should be [15496, 995]). {how}")
    return Tokenizer("gpt2", enc)


def line_chunks(lines, chunk_chars=1 << 20):
    """Join lines (or any consecutive pieces of a text) into chunks of about `chunk_chars` characters.

    A cut is made only where GPT-2's pre-tokenizer splits the whole text anyway, so encoding the chunks
    one by one (in parallel) gives exactly the ids of encoding the whole text at once: after a newline
    that is followed by ' ' + a non-space character, or by a non-space character when the newline itself
    follows a non-space character. (Elsewhere a run of whitespace could be grouped differently.)
    """
    buf, n, prev = [], 0, ""
    for line in lines:
        if n >= chunk_chars and _cut_ok(prev, line):
            yield "".join(buf)
            buf, n = [], 0
        buf.append(line)
        n += len(line)
        prev = line
    if buf:
        yield "".join(buf)


def _cut_ok(prev, line):
    """May a chunk end with `prev` and the next begin with `line`? (see line_chunks)"""
    if not prev.endswith("\n") or not line:
        return False
    if line[0] == " ":
        return len(line) > 1 and not line[1].isspace()
    return not line[0].isspace() and len(prev) > 1 and not prev[-2].isspace()


def tokenize_to_file(tok, chunks, path, num_threads=None, batch=16):
    """Encode text `chunks` (an iterable of str) with `tok`, `batch` chunks at a time on `num_threads`
    threads, and write the ids to `path` as uint16; returns the number of tokens. Prints MB/s."""
    t0, nbytes = time.time(), 0

    def arrays():
        nonlocal nbytes
        it = iter(chunks)
        while group := [c for _, c in zip(range(batch), it)]:
            nbytes += sum(len(c.encode("utf-8")) for c in group)
            yield from tok.encode_batch(group, num_threads)
            rate = nbytes / 1e6 / (time.time() - t0 + 1e-9)
            sys.stderr.write(f"\r  {os.path.basename(path)}: {nbytes / 1e6:.1f} MB of text, {rate:.1f} MB/s ")
        sys.stderr.write("\n")

    n = write_tokens(path, arrays())
    dt = time.time() - t0
    print(f"{path}: {n:,} tokens from {nbytes:,} bytes of text in {dt:.1f} s ({nbytes / 1e6 / (dt + 1e-9):.1f} MB/s)")
    return n


def write_tokens(path, arrays):
    """Write token ids (an iterable of int sequences, concatenated) to `path` as flat uint16, atomically;
    returns the number of tokens."""
    n = 0

    def write(f):
        nonlocal n
        for a in arrays:
            a = np.asarray(a, dtype=np.int64)
            if a.size and (a.min() < 0 or a.max() >= 2 ** 16):
                raise DataError(f"token id {a.max() if a.max() >= 2 ** 16 else a.min()} does not fit in "
                                f"uint16 ({path}); this format needs a vocabulary below 65536")
            a.astype(np.uint16).tofile(f)
            n += a.size
    atomic_write(path, write)
    return n


# ----------------------------------------------------------------------------- reading, meta, CLI

FOLDER_FORMAT = ("a data folder holds train.bin and val.bin (token ids as raw uint16) and meta.json "
                 '{"tokenizer": "byte" or "gpt2", "vocab_size": int} (README "Data")')


def how_to_prepare(dataset, data_dir):
    """What to do about a data folder that is missing or incomplete."""
    if data_dir:  # the user's own folder: a prepare script writes elsewhere
        return FOLDER_FORMAT
    return f"Prepare it with: python data/{dataset}/prepare.py"


def load_split(dataset, split, data_dir=None):
    """The `split` ('train', 'val', 'test') of a prepared dataset as a read-only uint16 memmap.
    `data_dir` is the folder holding the .bin files (default data/<dataset>/)."""
    folder = data_dir or os.path.join(DATA_DIR, dataset)
    path = os.path.join(folder, f"{split}.bin")
    if not os.path.exists(os.path.join(folder, "meta.json")):
        raise DataError(f"dataset {dataset!r} is not prepared ({folder}/meta.json is missing). "
                        + how_to_prepare(dataset, data_dir))
    if not os.path.exists(path):
        have = sorted(f[:-4] for f in os.listdir(folder) if f.endswith(".bin"))
        raise DataError(f"dataset {dataset!r} has no {split!r} split ({path} missing); it has {have}. "
                        f"If a file was deleted, rebuild with: python data/{dataset}/prepare.py --force")
    if os.path.getsize(path) == 0:
        raise DataError(f"{path} is empty; rebuild with: python data/{dataset}/prepare.py --force")
    return np.memmap(path, dtype=np.uint16, mode="r")


def random_windows(n_tokens, count, length, seed=1337):
    """Start offsets of `count` windows of `length` tokens, uniform inside the first n_tokens, from a fixed seed.
    train.py (saturation during training) and analyze.py draw them alike, and the first k offsets do not
    depend on `count`, so both measure on the same windows."""
    if n_tokens < length:
        raise DataError(f"{n_tokens:,} tokens are too few for windows of {length} tokens; use a smaller block_size")
    return np.random.default_rng(seed).integers(0, n_tokens - length + 1, size=count)


def unigram_entropy(tokens, chunk=1 << 24):
    """Entropy in nats of the token frequencies: the loss of a model that predicts only how common each token is
    (what a collapsed model does). Counted in chunks, so a 118M-token budget needs no big copy."""
    counts = np.zeros(1, dtype=np.int64)
    for k in range(0, len(tokens), chunk):
        c = np.bincount(np.asarray(tokens[k:k + chunk]))
        counts = np.pad(counts, (0, max(len(c) - len(counts), 0)))
        counts[:len(c)] += c
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def load_meta(dataset, data_dir=None):
    """meta.json of a dataset, with its 'kind': 'tokens' (its 'tokenizer' and 'vocab_size' checked) or 'images'."""
    path = os.path.join(data_dir or os.path.join(DATA_DIR, dataset), "meta.json")
    if not os.path.exists(path):
        raise DataError(f"{path} not found. " + how_to_prepare(dataset, data_dir))
    try:
        with open(path) as f:
            meta = json.load(f)
    except ValueError as e:
        raise DataError(f"{path} is not valid JSON ({e}). " + (FOLDER_FORMAT if data_dir else
                        f"Rebuild with: python data/{dataset}/prepare.py --force")) from e
    if not isinstance(meta, dict):
        raise DataError(f"{path} must hold a JSON object; {FOLDER_FORMAT}")
    meta["kind"] = meta.get("kind") or ("images" if "train_images" in meta else "tokens")
    if meta["kind"] == "images":  # CIFAR-10's folder (data/cifar10/prepare.py)
        return meta
    if meta.get("tokenizer") not in ("byte", "gpt2"):
        raise DataError(f"{path}: 'tokenizer' must be \"byte\" or \"gpt2\", got {meta.get('tokenizer')!r}; {FOLDER_FORMAT}")
    if type(meta.get("vocab_size")) is not int or meta["vocab_size"] < 1:
        raise DataError(f"{path}: 'vocab_size' must be a positive int, got {meta.get('vocab_size')!r}; {FOLDER_FORMAT}")
    return meta


def read_log(path, keep):
    """The parseable records of a JSON-lines file (train.py's log.jsonl) that satisfy keep(record); a torn last
    line is dropped."""
    records = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return [r for r in records if keep(r)]


def atomic_write(path, write):
    """write(f) into a temporary file beside `path`, fsync, rename over `path`, fsync the folder: a crash
    leaves the old file or the new one, never half of one."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise DataError(f"cannot write {path}: {e}. Free some disk space or choose a writable folder.") from e
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path, obj):
    """Write `obj` as JSON to `path` atomically."""
    atomic_write(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode()))


def finished(out_dir, force):
    """The meta.json of a completed prepare in `out_dir` (it is written last), or None when there is
    none or `force` asks for a rebuild."""
    path = os.path.join(out_dir, "meta.json")
    if force or not os.path.exists(path):
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as e:
            raise DataError(f"cannot create {out_dir}: {e}. Choose a writable folder.") from e
        return None
    print(f"{out_dir} is already prepared ({path} exists); nothing to do. Use --force to rebuild.")
    with open(path) as f:
        return json.load(f)


def cli(prepare, description):
    """Command line for a prepare script: --force, plus --tiktoken_file when `prepare` tokenizes with GPT-2."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--force", action="store_true", help="rebuild even if meta.json says it is done")
    if "tiktoken_file" in inspect.signature(prepare).parameters:
        p.add_argument("--tiktoken_file", default=None, help="GPT-2 .tiktoken ranks file for machines without "
                       f"internet (or set {TIKTOKEN_ENV})")
    try:
        prepare(**vars(p.parse_args()))
    except DataError as e:
        sys.exit(f"error: {e}")
