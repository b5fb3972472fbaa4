"""data/: downloader, tokenizers, token files and every prepare script, against a local HTTP server."""
import hashlib
import http.server
import inspect
import io
import json
import math
import os
import pickle
import random
import subprocess
import sys
import tarfile
import threading
import zipfile

import numpy as np
import pytest
import torch

from tests.common import GPT2_RANKS as RANKS  # a ranks file, or None for tiktoken's own cache
from tests.common import needs_gpt2 as needs_ranks
from tests.common import data_cfg, own_folder, run_side_by_side
from data.common import DataError, get_tokenizer, load_meta, load_split, open_data
from data.prepare_tools import download, line_chunks, token_dtype, write_tokens

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# text where a naive cut at every line would change GPT-2's ids ("\n\n\n", indentation, " \n" lines)
TRICKY = " = Title = \n \n Para one , it 's 12 .\n\n\nSecond\n        indented\n\n \nLast line\n"


# ----------------------------------------------------------------------------- local HTTP server

class Handler(http.server.BaseHTTPRequestHandler):
    """Routes: path -> (mode, body). mode 'ok' honours Range, 'norange' ignores it, 'drop' sends half of
    the body and closes the connection the first time, a number is an HTTP error status."""

    def do_GET(self):
        srv = self.server
        srv.log.append((self.path, dict(self.headers)))
        mode, body = srv.routes.get(self.path, (404, b""))
        if isinstance(mode, int):
            self.send_error(mode)
            return
        start = 0
        rng = self.headers.get("Range")
        if rng and mode != "norange":
            start = int(rng.split("=")[1].split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        if mode == "drop" and self.path not in srv.dropped:
            srv.dropped.add(self.path)
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body[start:])

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.routes, srv.log, srv.dropped = {}, [], set()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()

    def serve(path, body, mode="ok"):
        srv.routes[path] = (mode, body)
        return srv.url + path
    srv.serve = serve
    yield srv
    srv.shutdown()


def sha(b, algo="sha256"):
    return hashlib.new(algo, b).hexdigest()


def requests_for(server, path):
    return [h for p, h in server.log if p == path]


# ----------------------------------------------------------------------------- download

def test_download_verifies_and_renames(server, tmp_path):
    body = os.urandom(300_000)
    url = server.serve("/ok.bin", body)
    dest = str(tmp_path / "ok.bin")
    assert download([url], dest, sha256=sha(body), md5=sha(body, "md5"), size=len(body)) == dest
    assert open(dest, "rb").read() == body
    assert os.listdir(tmp_path) == ["ok.bin"]  # no .part left
    assert requests_for(server, "/ok.bin")[-1]["User-Agent"].startswith("Mozilla/5.0")
    # already there and correct: kept, no new request
    n = len(server.log)
    download([url], dest, sha256=sha(body), size=len(body))
    assert len(server.log) == n


def test_download_falls_back_to_second_mirror_after_403(server, tmp_path):
    body = b"mirror two " * 1000
    bad, good = server.serve("/forbidden.zip", b"", 403), server.serve("/mirror2.zip", body)
    dest = str(tmp_path / "f.zip")
    download([bad, good], dest, sha256=sha(body), size=len(body), backoff=0)
    assert open(dest, "rb").read() == body
    assert len(requests_for(server, "/forbidden.zip")) == 1  # a 403 is not retried


@pytest.mark.parametrize("check", ["sha256", "md5", "size"])
def test_download_wrong_file_leaves_nothing(server, tmp_path, check):
    body = b"not what you expected" * 100
    url = server.serve("/wrong.bin", body)
    dest = str(tmp_path / "wrong.bin")
    wrong = {"sha256": {"sha256": sha(b"x")}, "md5": {"md5": sha(b"x", "md5")},
             "size": {"size": len(body) + 1}}
    said = {"sha256": f"its sha256 is {sha(body)}", "md5": f"its md5 is {sha(body, 'md5')}",
            "size": f"has {len(body):,} bytes, expected {len(body) + 1:,}"}
    with pytest.raises(DataError) as e:
        download([url], dest, backoff=0, retries=2, **wrong[check])
    msg = str(e.value)
    assert url in msg and os.path.abspath(dest) in msg and said[check] in msg
    assert os.listdir(tmp_path) == []  # neither the final name nor a .part


def test_download_resumes_an_interrupted_transfer(server, tmp_path):
    body = os.urandom(200_000)
    url = server.serve("/drop.bin", body, "drop")
    dest = str(tmp_path / "drop.bin")
    download([url], dest, sha256=sha(body), size=len(body), backoff=0)
    assert open(dest, "rb").read() == body
    first, second = requests_for(server, "/drop.bin")
    assert "Range" not in first
    start = int(second["Range"].removeprefix("bytes=").removesuffix("-"))
    assert 0 < start <= len(body) // 2  # asked only for what was missing (the server dropped at half)


def test_download_restarts_when_server_ignores_range(server, tmp_path):
    body = os.urandom(50_000)
    url = server.serve("/norange.bin", body, "norange")
    dest = str(tmp_path / "n.bin")
    open(dest + ".part", "wb").write(b"junk" * 100)  # a stale partial file
    download([url], dest, sha256=sha(body), backoff=0)
    assert open(dest, "rb").read() == body
    assert requests_for(server, "/norange.bin")[0]["Range"] == "bytes=400-"


def test_download_error_names_every_url(server, tmp_path):
    missing = server.serve("/missing", b"", 404)
    flaky = server.serve("/flaky", b"", 503)
    dest = str(tmp_path / "x.tar.gz")
    with pytest.raises(DataError) as e:
        download([missing, flaky], dest, md5="0" * 32, retries=2, backoff=0)
    msg = str(e.value)
    assert f"{missing}: HTTP 404" in msg and f"{flaky}: HTTP 503" in msg and "2 tries" in msg
    assert f"save it as {os.path.abspath(dest)}" in msg and "0" * 32 in msg
    assert len(requests_for(server, "/flaky")) == 2  # a 5xx is retried


def test_download_local_write_error_is_clear(server, tmp_path):
    url = server.serve("/small", b"abc")
    (tmp_path / "afile").write_text("I am a file, not a folder")
    with pytest.raises(DataError, match="cannot write"):
        download([url], str(tmp_path / "afile" / "x.bin"), backoff=0)


def test_download_existing_wrong_file_is_an_error(tmp_path):
    dest = tmp_path / "have.bin"
    dest.write_bytes(b"placed by hand, but wrong")
    with pytest.raises(DataError, match="exists but its sha256"):
        download(["http://127.0.0.1:9/never-asked"], str(dest), sha256=sha(b"right"))


# ------------------------------------------------------------------------- tokenizers and token files

def test_byte_tokenizer_round_trip():
    tok = get_tokenizer("byte")
    text = "Héllo wörld ✓ <|endoftext|>"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and max(ids) < 256  # special text stays plain bytes
    assert (tok.eot, tok.n_vocab) == (256, 257)
    assert tok.decode(ids) == text
    assert tok.decode([104, 105, 256, 121, 111]) == "hi<|endoftext|>yo"
    assert tok.decode([104, 300, 105]) == "h\ufffdi"  # an id past the vocabulary does not crash


@needs_ranks
def test_gpt2_tokenizer_from_ranks_file(monkeypatch):
    tok = get_tokenizer("gpt2", RANKS)
    assert tok.encode("Hello world") == [15496, 995]
    assert (tok.eot, tok.n_vocab) == (50256, 50257)
    assert 50256 not in tok.encode("a <|endoftext|> b")  # encode_ordinary semantics
    text = "Tokenizers, round trips & ünïcode ✓\n\n  indented"
    assert tok.decode(tok.encode(text)) == text
    if RANKS:
        monkeypatch.setenv("NANONORM_TIKTOKEN_FILE", RANKS)  # the air-gapped setting, set once
        assert get_tokenizer("gpt2").encode("Hello world") == [15496, 995]


def test_tokenizer_bad_input(tmp_path):
    with pytest.raises(DataError, match="--tiktoken_file"):
        get_tokenizer("gpt2", str(tmp_path / "missing.tiktoken"))
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("this is not base64 rank\n")
    with pytest.raises(DataError, match="not a GPT-2"):
        get_tokenizer("gpt2", str(bad))
    with pytest.raises(DataError, match="unknown tokenizer"):
        get_tokenizer("gpt3")


@needs_ranks
def test_chunked_encoding_equals_whole_text():
    enc = get_tokenizer("gpt2", RANKS)
    rnd = random.Random(0)
    pieces = ["word", " word", "\n", "\n\n", " \n", "  ", "\t", ".", "'s", " 12", "\r\n", "\u00a0", "é"]
    text = TRICKY + "".join(rnd.choice(pieces) for _ in range(20_000))
    whole = enc.encode(text)
    naive = [i for line in text.splitlines(keepends=True) for i in enc.encode(line)]
    assert naive != whole  # the text really has cuts that matter
    for size in (1, 50, 10_000):
        chunks = list(line_chunks(text.splitlines(keepends=True), chunk_chars=size))
        assert "".join(chunks) == text
        assert [i for c in chunks for i in enc.encode(c)] == whole


def test_write_tokens_and_load_split(tmp_path):
    d = tmp_path / "toy"
    d.mkdir()
    assert write_tokens(str(d / "train.bin"), [[1, 2, 3], np.array([65535, 0])], 65536) == 5
    missing = r"not prepared: .*/meta.json not found\. a data folder holds train.bin"
    with pytest.raises(DataError, match=missing) as e:
        load_split("toy", "train", data_dir=str(d))  # no meta.json yet: not finished; the user's folder
    assert "prepare.py" not in str(e.value)  # no prepare script writes into the user's folder
    for meta, field in (({}, "'tokenizer'"), ({"tokenizer": "byte"}, "'vocab_size'"),
                        ({"tokenizer": "bpe", "vocab_size": 9}, "'tokenizer'"), ([], "JSON object"),
                        ({"tokenizer": "byte", "vocab_size": "257"}, "'vocab_size'")):
        (d / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(DataError, match=f"{field}.*a data folder holds"):
            load_meta("toy", data_dir=str(d))
    (d / "meta.json").write_text(json.dumps({"tokenizer": "byte", "vocab_size": 257}))
    assert load_split("toy", "train", data_dir=str(d)).tolist() == [1, 2, 3, 65535, 0]
    assert load_meta("toy", data_dir=str(d)) == {"tokenizer": "byte", "vocab_size": 257,
                                                 "kind": "tokens"}
    with pytest.raises(DataError, match="no 'test' split"):
        load_split("toy", "test", data_dir=str(d))
    with pytest.raises(DataError, match=r"token id 65536 is outside the vocabulary \(0\.\.65535\)"):
        write_tokens(str(d / "val.bin"), [[1, 65536]], 65536)
    with pytest.raises(DataError, match=r"token id -1 is outside"):
        write_tokens(str(d / "val.bin"), [[-1]], 65536)
    assert sorted(os.listdir(d)) == ["meta.json", "train.bin"]  # nothing half-written
    with pytest.raises(DataError, match=r"python data/nosuchset/prepare\.py"):
        load_split("nosuchset", "train")


def test_uint32_round_trip_through_train_data(tmp_path):
    """A vocabulary over 65,536 ids (Llama-3 sized): written as uint32, read back exactly by load_split
    and by train.py's data (open_data, TokenData's batches)."""
    assert (token_dtype(65536), token_dtype(65537)) == ("uint16", "uint32")
    vocab = 100_256
    train = [70_000, 100_255, 5, 65_535, 65_536, 99_999, 0, 80_000, 1, 2, 100_000, 3]
    val = [100_255, 70_000, 65_537, 4, 5, 6]
    d = tmp_path / "llama"
    d.mkdir()
    counts = {f"{s}_tokens": write_tokens(str(d / f"{s}.bin"), [ids[:5], ids[5:]], vocab)
              for s, ids in (("train", train), ("val", val))}
    assert counts == {"train_tokens": 12, "val_tokens": 6}
    assert os.path.getsize(d / "train.bin") == 4 * len(train)  # 4 bytes an id
    meta = {"tokenizer": "gpt2", "vocab_size": vocab, "dtype": token_dtype(vocab), **counts}
    (d / "meta.json").write_text(json.dumps(meta))
    for split, ids in (("train", train), ("val", val)):
        assert load_split("own", split, data_dir=str(d)).tolist() == ids
    cfg = data_cfg(str(d), train_tokens=10)
    _, data = open_data(cfg, None, 0)
    assert cfg.vocab_size == 100_288  # padded to a multiple of 64
    x, y = data.batch("train", torch.tensor([0, 5]), "cpu")
    assert x.tolist() == [train[0:4], train[5:9]] and y.tolist() == [train[1:5], train[6:10]]
    x, y = data.batch("val", torch.tensor([1]), "cpu")
    assert x.tolist() == [val[1:5]] and y.tolist() == [val[2:6]]
    assert data.n_train == 10


def test_counts_and_dtype_are_checked(tmp_path):
    """meta.json's counts against the files: a file written with the wrong dtype is refused, saying which
    dtype would fit, before it trains on garbage."""
    ids = np.arange(10, 20)
    base = {"tokenizer": "byte", "vocab_size": 257}

    def refused(train, meta, match):
        d = own_folder(tmp_path / "own", train, ids.astype(np.uint16), {**base, **meta})
        with pytest.raises(DataError, match=match):
            load_split("own", "train", data_dir=d)

    refused(ids.astype(np.uint16), {"train_tokens": 12}, r"train.bin holds 10 uint16 ids but meta.json "
            r"says train_tokens=12: truncated, or meta.json's count is another file's\?")
    refused(ids.astype(np.uint32), {"train_tokens": 10}, r"holds 20 uint16 ids but meta.json says "
            r"train_tokens=10: written as uint32\? meta.json's \"dtype\" must say")
    refused(ids, {"train_tokens": 10}, r"holds 40 uint16 ids .*: written as int64 \(numpy's default\)\?")
    refused(ids.astype(np.uint16), {"train_tokens": 10, "dtype": "uint32"}, r"holds 5 uint32 ids but "
            r"meta.json says train_tokens=10: written as uint16\?")
    refused(ids[:3].astype(np.uint16), {"dtype": "uint32"}, r"has 6 bytes, not a whole number of uint32 "
            r"ids: truncated, or not uint32\?")
    refused(ids.astype(np.uint16), {"train_tokens": "10"}, r"'train_tokens' must be the number of tokens "
            r"in train.bin \(a positive int\), got '10'")
    refused(ids.astype(np.uint16), {"dtype": "int32"}, r"'dtype' must be \"uint16\" or \"uint32\" .*got "
            "'int32'")
    d = own_folder(tmp_path / "own", ids.astype(np.uint32), ids.astype(np.uint16),
                   {**base, "dtype": "uint32", "train_tokens": 10, "val_tokens": 10})
    with pytest.raises(DataError, match=r"val.bin holds 5 uint32 ids"):  # val and train: one dtype
        load_split("own", "val", data_dir=d)
    assert load_split("own", "train", data_dir=d).tolist() == ids.tolist()


def test_ids_at_or_above_vocab_size_are_refused(tmp_path):
    train, val = np.arange(100, dtype=np.uint16), np.arange(20, dtype=np.uint16)
    d = own_folder(tmp_path / "own", train, val, {"tokenizer": "byte", "vocab_size": 100})
    _, data = open_data(data_cfg(d), None, 0)  # ids 0..99: all below vocab_size
    assert data.n_train == 100
    with pytest.raises(SystemExit, match=r"error: the train split \(as trained on\) holds token id 99, but "
                                         r"meta.json's vocab_size is 99: ids must be below it"):
        open_data(data_cfg(own_folder(tmp_path / "own", train, val,
                                      {"tokenizer": "byte", "vocab_size": 99})), None, 0)
    _, data = open_data(data_cfg(d, train_tokens=99), None, 0)  # only the budget counts: ids 0..98
    val[7] = 300
    with pytest.raises(SystemExit, match=r"the val split .* holds token id 300, but meta.json's vocab_size "
                                         "is 100"):
        open_data(data_cfg(own_folder(tmp_path / "own", train[:99], val,
                                      {"tokenizer": "byte", "vocab_size": 100})), None, 0)


# ----------------------------------------------------------------------------- prepare scripts

def make_zip(files):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return buf.getvalue()


@needs_ranks
def test_wikitext103_prepare(server, tmp_path, capsys):
    from data.wikitext103.prepare import prepare
    texts = {"train": TRICKY * 50 + " The end .\n", "val": " = Valid = \n\n\n Some text .\n",
             "test": TRICKY}
    names = {"train": "wiki.train.raw", "val": "wiki.valid.raw", "test": "wiki.test.raw"}
    body = make_zip({f"wikitext-103-raw/{names[s]}": t for s, t in texts.items()})
    url = server.serve("/wikitext-103-raw-v1.zip", body)
    kw = dict(out_dir=str(tmp_path), tiktoken_file=RANKS, urls=[url], sha256=sha(body), size=len(body))
    meta = prepare(**kw)
    enc = get_tokenizer("gpt2", RANKS)
    for s, t in texts.items():
        want = enc.encode(t)  # independent: the whole file at once
        assert np.fromfile(tmp_path / f"{s}.bin", dtype=np.uint16).tolist() == want
        assert meta[f"{s}_tokens"] == len(want)
    assert meta["tokenizer"] == "gpt2" and meta["source_sha256"] == sha(body)
    assert json.loads((tmp_path / "meta.json").read_text()) == meta
    n = len(server.log)
    capsys.readouterr()
    assert prepare(**kw) == meta
    assert "already prepared" in capsys.readouterr().out and len(server.log) == n


@needs_ranks
def test_wikitext103_paper_layout(server, tmp_path):
    """The study's tokenization: each non-blank row of the raw file encoded alone, concatenated."""
    from data.wikitext103.prepare import prepare
    val = " = Valid = \n\n \n Some text , with  spaces .\n\t\n Last row without newline"
    texts = {"train": TRICKY * 3, "val": val, "test": " = T = \n\n x\n"}
    names = {"train": "wiki.train.raw", "val": "wiki.valid.raw", "test": "wiki.test.raw"}
    body = make_zip({f"wikitext-103-raw/{names[s]}": t for s, t in texts.items()})
    url = server.serve("/wikitext-103-raw-v1.zip", body)
    meta = prepare(out_dir=str(tmp_path), tiktoken_file=RANKS, urls=[url], sha256=sha(body),
                   size=len(body), layout="paper")
    enc = get_tokenizer("gpt2", RANKS)
    for s, t in texts.items():
        rows = [row for row in t.splitlines(keepends=True) if row.strip()]  # blank rows skipped
        want = [i for row in rows for i in enc.encode(row)]
        assert np.fromfile(tmp_path / f"{s}.bin", dtype=np.uint16).tolist() == want
        assert meta[f"{s}_tokens"] == len(want)
    assert meta["layout"] == "paper" and len(rows) == 2
    # differs from the whole-file encoding where rows meet: "\n\n" and "\n\t\n" are one token each there
    assert want != enc.encode(texts["test"])
    with pytest.raises(DataError, match="layout must be 'file'"):
        prepare(out_dir=str(tmp_path / "x"), layout="rows")


# Five articles written out in the raw files' format: blank lines are " \n", the file begins with
# one, titles have one "=" each side; sections, deeper headings and rows with "=" are in articles
ARTICLES = [
    " \n = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 is a game .\n \n"
    " = = Gameplay = = \n \n As with previous games , x = y = z .\n \n"
    " = = = Story = = = \n \n = the row that starts with an equals sign .\n \n \n",
    " = Tower Building of the Little Rock Arsenal = \n \n The building , 1840 .\n \n"
    " = Not a title = = \n \n",
    " = E = MC2 = \n \n A title with an equals sign in it .\n \n",
    " = Empty = \n \n",
    " = Last = \n \n Its last row has no newline .",
]


def test_wikitext103_articles_split_at_titles():
    from data.wikitext103.prepare import articles
    text = "".join(ARTICLES)
    assert list(articles(io.StringIO(text, newline="\n"))) == ARTICLES
    untitled = " \n \n No title at all .\n \n"
    assert list(articles(io.StringIO(untitled))) == [untitled]
    assert list(articles(io.StringIO(""))) == []


@needs_ranks
def test_wikitext103_docs_layout(server, tmp_path, monkeypatch):
    """One end-of-text after each article, in data/wikitext103/docs/; the zip is downloaded once,
    and the default layout's files are the whole-file encodes still."""
    import data.wikitext103.prepare as wikitext
    monkeypatch.setattr(wikitext, "HERE", str(tmp_path))  # data/wikitext103/, for this test
    val = [" \n = Valid one = \n \n Text .\n \n", " = Valid two = \n \n More text .\n"]
    texts = {"train": ARTICLES, "val": val, "test": val[:1]}
    names = {"train": "wiki.train.raw", "val": "wiki.valid.raw", "test": "wiki.test.raw"}
    body = make_zip({f"wikitext-103-raw/{names[s]}": "".join(t) for s, t in texts.items()})
    url = server.serve("/docs/wikitext-103-raw-v1.zip", body)
    kw = dict(tiktoken_file=RANKS, urls=[url], sha256=sha(body), size=len(body))
    wikitext.prepare(**kw)
    meta = wikitext.prepare(layout="docs", **kw)
    # the default layout's zip, reused
    assert len(requests_for(server, "/docs/wikitext-103-raw-v1.zip")) == 1
    enc, docs = get_tokenizer("gpt2", RANKS), tmp_path / "docs"
    assert enc.eot == 50256 and meta["eot"] == 50256 and meta["layout"] == "docs"
    for s, arts in texts.items():
        got = np.fromfile(docs / f"{s}.bin", dtype=np.uint16).tolist()
        assert got == [i for a in arts for i in enc.encode(a) + [50256]]
        assert (got.count(50256), meta[f"{s}_documents"], meta[f"{s}_tokens"]) == (
            len(arts), len(arts), len(got))
        assert enc.decode(got).split("<|endoftext|>") == arts + [""]
        default = np.fromfile(tmp_path / f"{s}.bin", dtype=np.uint16).tolist()
        assert default == enc.encode("".join(arts))  # unchanged: the whole file at once, no eot
        assert [i for i in got if i != 50256] == default  # the cuts change no id
    assert meta["train_documents"] == 5
    assert json.loads((docs / "meta.json").read_text()) == meta
    assert not (docs / "wikitext-103-raw-v1.zip").exists()
    assert "train_documents" not in json.loads((tmp_path / "meta.json").read_text())


@needs_ranks
@pytest.mark.parametrize("body", [b"PK\x03\x04 this is not really a zip" * 10,
                                  make_zip({"wikitext-103-raw/wiki.train.raw": "only train"})])
def test_wikitext103_bad_zip_is_a_clear_error(server, tmp_path, body):
    from data.wikitext103.prepare import prepare
    url = server.serve(f"/bad{len(body)}.zip", body)
    with pytest.raises(DataError, match="not a usable WikiText-103 raw zip"):
        prepare(out_dir=str(tmp_path), tiktoken_file=RANKS, urls=[url], sha256=None, size=None)
    assert not (tmp_path / "meta.json").exists()


@needs_ranks
def test_shakespeare_prepare(server, tmp_path):
    from data.shakespeare.prepare import prepare
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 40
    body = text.encode()
    url = server.serve("/input.txt", body)
    meta = prepare(out_dir=str(tmp_path), tiktoken_file=RANKS, urls=[url], sha256=sha(body),
                   size=len(body))
    enc = get_tokenizer("gpt2", RANKS)
    cut = int(len(text) * 0.9)
    for split, part in (("train", text[:cut]), ("val", text[cut:])):
        assert np.fromfile(tmp_path / f"{split}.bin", dtype=np.uint16).tolist() == enc.encode(part)
    assert load_split("shakespeare", "val", data_dir=str(tmp_path)).size == meta["val_tokens"]


def test_lambada_prepare(server, tmp_path):
    from data.lambada import prepare as lam
    texts = ["the cat sat on the mat", "in the end he said goodbye"]
    body = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    dead, url = server.serve("/lambada-dead", b"", 404), server.serve("/lambada_test.jsonl", body)
    meta = lam.prepare(out_dir=str(tmp_path), urls=[dead, url], sha256=sha(body), size=len(body))
    assert meta["examples"] == 2 and lam.load(str(tmp_path)) == texts
    (tmp_path / "lambada_test.jsonl").write_text('{"txt": "wrong field"}\n')
    with pytest.raises(DataError, match="line 1"):
        lam.load(str(tmp_path))


def test_blimp_prepare(server, tmp_path):
    from data.blimp import prepare as blimp
    assert len(blimp.UIDS) == len(set(blimp.UIDS)) == 67
    bodies = {}
    for uid in ("causative", "passive_1"):
        pairs = [{"sentence_good": f"Good {i}.", "sentence_bad": f"Bad {i}.", "field": "syntax",
                  "linguistics_term": "passive", "UID": uid, "pairID": str(i)} for i in range(3)]
        bodies[uid] = "".join(json.dumps(p) + "\n" for p in pairs).encode()
        server.serve(f"/blimp/{uid}.jsonl", bodies[uid])
    meta = blimp.prepare(out_dir=str(tmp_path), base_url=server.url + "/blimp/", uids=list(bodies))
    assert meta["pairs"] == 6 and meta["sha256"] == {u: sha(b) for u, b in bodies.items()}
    pairs = blimp.load_paradigm(str(tmp_path / "passive_1.jsonl"), "passive_1")
    assert pairs[2]["sentence_bad"] == "Bad 2."
    server.serve("/blimp2/causative.jsonl", b'{"sentence_good": "only half a pair"}\n')
    with pytest.raises(DataError, match="not a BLiMP pair"):
        blimp.prepare(out_dir=str(tmp_path / "b2"), base_url=server.url + "/blimp2/", uids=["causative"])
    assert not (tmp_path / "b2" / "causative.jsonl").exists()  # the next run downloads it again


def make_cifar_tarball(extra=None):
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    batches = {}
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            d = {b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8), b"labels": [1, 7]}
            batches[name] = d
            raw = pickle.dumps(d)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
        if extra:
            info = tarfile.TarInfo(extra)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
    return buf.getvalue(), batches


def test_cifar10_prepare(server, tmp_path):
    from data.cifar10 import prepare as cifar
    body, batches = make_cifar_tarball()
    url = server.serve("/cifar-10-python.tar.gz", body)
    meta = cifar.prepare(out_dir=str(tmp_path), urls=[url], md5=sha(body, "md5"), size=len(body))
    assert (meta["train_images"], meta["test_images"]) == (10, 2)
    x, y = cifar.load("test", str(tmp_path))
    d = batches["test_batch"][b"data"]
    assert x.shape == (2, 3, 32, 32) and y.tolist() == [1, 7]
    assert x[1, 2, 0, 5] == d[1, 2 * 1024 + 5]  # image 1, blue plane, row 0, column 5


@pytest.mark.parametrize("case", ["corrupt", "escape"])
def test_cifar10_bad_tarball_is_a_clear_error(server, tmp_path, case):
    from data.cifar10 import prepare as cifar
    body = os.urandom(5000) if case == "corrupt" else make_cifar_tarball(extra="../escaped.txt")[0]
    url = server.serve(f"/cifar-{case}.tar.gz", body)
    out = tmp_path / "out"
    with pytest.raises(DataError, match="not a usable CIFAR-10 tarball"):
        cifar.prepare(out_dir=str(out), urls=[url], md5=None, size=None)
    assert not (tmp_path / "escaped.txt").exists() and not (out / "meta.json").exists()


@pytest.fixture(scope="module")
def pydocs_dir(tmp_path_factory):
    """(folder, meta) of the corpus built here, and a second build started at the same time in another
    Python (for test_pydocs_is_deterministic): (its process, which prints prepare's return value last,
    and its folder)."""
    from data.pydocs.prepare import prepare
    d, again = tmp_path_factory.mktemp("pydocs"), tmp_path_factory.mktemp("pydocs_again")
    code = ("import json, sys; from data.pydocs.prepare import prepare; "
            "print(json.dumps(prepare(out_dir=sys.argv[1])))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(again)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        yield d, prepare(out_dir=str(d)), (proc, again)
    finally:
        proc.kill()  # a no-op once it has ended
        proc.communicate()


def test_pydocs_offline_corpus(pydocs_dir, capsys):
    import json as json_module
    d, meta, _ = pydocs_dir
    train = np.fromfile(d / "train.bin", dtype=np.uint16)
    val = np.fromfile(d / "val.bin", dtype=np.uint16)
    assert (meta["train_tokens"], meta["val_tokens"]) == (train.size, val.size)
    assert meta["tokenizer"] == "byte" and meta["vocab_size"] == 257
    assert meta["python"] == sys.version.split()[0]
    assert train.size > 1_000_000 and 0.05 < val.size / (train.size + val.size) < 0.2
    assert max(train.max(), val.max()) == 256
    assert (train == 256).sum() + (val == 256).sum() == meta["documents"]  # one end-of-text per document
    # the json module's own docstring (read by importing it) is in the corpus
    doc = inspect.cleandoc(json_module.__doc__).encode()[:200]
    corpus = np.concatenate([train, val])
    assert doc in bytes(corpus[corpus < 256].astype(np.uint8))
    from data.pydocs.prepare import prepare
    capsys.readouterr()
    assert prepare(out_dir=str(d)) == meta
    assert "already prepared" in capsys.readouterr().out


def test_pydocs_is_deterministic(pydocs_dir):
    d, meta, (proc, again) = pydocs_dir  # built twice, in two processes
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out.splitlines()[-1]) == meta
    for f in ("train.bin", "val.bin"):
        assert (again / f).read_bytes() == (d / f).read_bytes()


def test_prepare_scripts_run_from_the_repo_root():
    names = ("pydocs", "wikitext103", "shakespeare", "lambada", "blimp", "cifar10")
    *helps, r = run_side_by_side(
        [[sys.executable, f"data/{name}/prepare.py", "--help"] for name in names]
        + [[sys.executable, "data/shakespeare/prepare.py", "--force=True",
            "--tiktoken_file=/nonexistent/gpt2.tiktoken"]], 60, cwd=ROOT)
    for name, h in zip(names, helps):
        assert h.returncode == 0 and "--force" in h.stdout, h.stderr
        assert ("--tiktoken_file" in h.stdout) == (name in ("pydocs", "wikitext103", "shakespeare"))
    assert r.returncode == 1 and "error: tiktoken file /nonexistent/gpt2.tiktoken not found" in r.stderr
    assert "Traceback" not in r.stderr
