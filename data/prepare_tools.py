"""
The prepare scripts' tools: one robust downloader for every data set (mirrors, resume, retries,
checksums), GPT-2's BPE (tiktoken's download, or an offline ranks file), tokenization of large texts on
every core into token files, and the scripts' command line.
"""
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

from configurator import configure
from data.common import TIKTOKEN_ENV, DataError, atomic_write

GPT2_RANKS_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# some hosts (wikitext.smerity.com) answer 403 to the default python-requests agent
USER_AGENT = ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0 "
              "Safari/537.36")


# ----------------------------------------------------------------------------- download

def download(urls, dest, sha256=None, md5=None, size=None, headers=None, retries=4, backoff=2.0,
             timeout=60):
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
        raise DataError(f"cannot write {part}: {e}. Free some disk space or choose a writable "
                        "folder.") from e
    raise DataError(f"could not download {os.path.basename(dest)}:\n  " + "\n  ".join(tried) +
                    "\nDownload it by hand from one of these URLs and save it as "
                    f"{os.path.abspath(dest)}"
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
            raise requests.RequestException(f"asked for bytes {have}- but got "
                                            f"{r.headers.get('Content-Range')}")
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
                    _progress(os.path.basename(part[:-5]), done, total,
                              (done - have) / (shown - t0 + 1e-9))
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


@functools.lru_cache(maxsize=None)
def gpt2_encoding(path=None):
    """tiktoken's GPT-2 encoding: from tiktoken's cache (downloaded on first use), or from a ranks file
    at `path` for machines without internet, its ids checked."""
    import tiktoken
    import tiktoken.load
    from tiktoken_ext.openai_public import r50k_pat_str  # the installed tiktoken's own GPT-2 regex
    how = (f"Get {GPT2_RANKS_URL} (sha256 {GPT2_RANKS_SHA256}) on a machine with internet, copy it here "
           f"and pass --tiktoken_file=PATH or set {TIKTOKEN_ENV}=PATH.")
    if path is None:
        try:
            return tiktoken.get_encoding("gpt2")
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
        raise DataError(f"{path} does not give GPT-2's ids ('Hello world' should be [15496, 995]). "
                        f"{how}")
    return enc


# ----------------------------------------------------------------------------- token files

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


def tokenize_to_file(tok, chunks, path, num_threads=None, batch=16, end=None):
    """Encode text `chunks` (an iterable of str) with `tok`, `batch` chunks at a time on `num_threads`
    threads, and write the ids to `path` (write_tokens), each chunk followed by the id `end` if any
    (a document's end-of-text); returns the number of tokens. Prints MB/s."""
    t0, nbytes = time.time(), 0
    tail = [] if end is None else [end]

    def arrays():
        nonlocal nbytes
        it = iter(chunks)
        while group := [c for _, c in zip(range(batch), it)]:
            nbytes += sum(len(c.encode("utf-8")) for c in group)
            if tok.enc is None:
                ids = [tok.encode(text) for text in group]
            else:  # tiktoken releases the GIL, so its threads run in parallel
                ids = tok.enc.encode_ordinary_batch(group,
                                                    num_threads=num_threads or os.cpu_count() or 1)
            yield from (a + tail for a in ids)
            rate = nbytes / 1e6 / (time.time() - t0 + 1e-9)
            sys.stderr.write(f"\r  {os.path.basename(path)}: {nbytes / 1e6:.1f} MB of text, "
                             f"{rate:.1f} MB/s ")
        sys.stderr.write("\n")

    n = write_tokens(path, arrays(), tok.n_vocab)
    dt = time.time() - t0
    print(f"{path}: {n:,} tokens from {nbytes:,} bytes of text in {dt:.1f} s "
          f"({nbytes / 1e6 / (dt + 1e-9):.1f} MB/s)")
    return n


def token_dtype(vocab_size):
    """The id type of a vocabulary's token files (meta.json's "dtype"): uint16 up to 65,536 ids."""
    return "uint16" if vocab_size <= 2 ** 16 else "uint32"


def token_meta(tok):
    """meta.json's fields that describe `tok`'s token files (a prepare adds each split's count)."""
    return {"tokenizer": tok.name, "vocab_size": tok.n_vocab, "eot": tok.eot,
            "dtype": token_dtype(tok.n_vocab)}


def write_tokens(path, arrays, vocab_size):
    """Write token ids (an iterable of int sequences, concatenated), each below vocab_size, to `path` as
    flat token_dtype(vocab_size), atomically; returns the number of tokens."""
    n, dtype = 0, token_dtype(vocab_size)

    def write(f):
        nonlocal n
        for a in arrays:
            a = np.asarray(a, dtype=np.int64)
            if a.size and (a.min() < 0 or a.max() >= vocab_size):
                bad = a.max() if a.max() >= vocab_size else a.min()
                raise DataError(f"token id {bad} is outside the vocabulary (0..{vocab_size - 1}) of "
                                f"{path}; pass the tokenizer's whole vocab_size")
            a.astype(dtype).tofile(f)
            n += a.size
    atomic_write(path, write)
    return n


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
    print(f"{out_dir} is already prepared ({path} exists); nothing to do. Use --force=True to rebuild.")
    with open(path) as f:
        return json.load(f)


def cli(prepare, doc, **options):
    """A prepare script's command line, the configurator's: --force=True rebuilds,
    --tiktoken_file=PATH (a GPT-2 ranks file, or set NANONORM_TIKTOKEN_FILE) serves a `prepare` that
    tokenizes with GPT-2 offline, and `options` (name=default) are the script's own."""
    defaults = dict(force=False, **options)
    if "tiktoken_file" in inspect.signature(prepare).parameters:
        defaults["tiktoken_file"] = None
    try:
        prepare(**configure(defaults, sys.argv[1:], dict(tiktoken_file=str), doc))
    except DataError as e:
        sys.exit(f"error: {e}")
