"""annex/protocol.py: data budgets as a seeded subset of whole documents (budget_docs) and the
study's val slice (paper_val), written out independently here, and as train.py and analyze.py use them."""
import json
import math

import numpy as np
import pytest
import torch

from annex.protocol import budget_tokens, eot_id, paper_val_tokens
from checkpoint import load_checkpoint
from data.common import DataError, derived_seed, load_meta, load_split, open_data
from tests.common import GPT2_RANKS, data_cfg, needs_gpt2, own_folder
from tests.test_train import records, run


def documents(n, eot, seed=0, last_eot=True):
    """n documents of distinct lengths (3..n+2) of ids below 50, each ended by eot (the last optionally
    not)."""
    rng = np.random.default_rng(seed)
    docs = [list(rng.integers(0, 50, size=k)) + [eot] for k in rng.permutation(np.arange(2, n + 2))]
    return docs if last_eot else docs[:-1] + [docs[-1][:-1]]


def expected_budget(docs, n, seed):
    """budget_docs as docs/data.md says it, written independently: (tokens, the documents kept)."""
    taken, total = [], 0
    for i in np.random.default_rng(seed).permutation(len(docs)):
        if total >= n:
            break
        taken.append(i)
        total += len(docs[i])
    return [t for i in sorted(taken) for t in docs[i]][:n], sorted(taken)


@pytest.mark.parametrize("last_eot", [True, False])
def test_budget_docs_is_a_seeded_subset_of_whole_documents(tmp_path, last_eot):
    docs = documents(20, 256, last_eot=last_eot)
    flat = np.array([t for d in docs for t in d], dtype=np.uint16)
    d = own_folder(tmp_path / "docs", flat, flat[:50], {"tokenizer": "byte", "vocab_size": 257})
    train = load_split("own", "train", data_dir=d)
    assert eot_id(load_meta("own", d)) == 256  # no "eot" in meta.json: the byte tokenizer's
    subsets = set()
    for n, seed in [(1, 0), (40, 0), (40, 1), (40, 2), (100, 3), (100, 4), (len(flat), 5)]:
        want, taken = expected_budget(docs, n, seed)
        got = budget_tokens(train, n, seed, 256)
        assert got.tolist() == want and len(got) == n and got.dtype == np.uint16
        assert budget_tokens(train, n, seed, 256, chunk=7).tolist() == want  # eots across chunk edges
        assert budget_tokens(train, n, seed, 256).tolist() == want  # the same seed, the same subset
        subsets.add(tuple(taken))
        # whole documents in increasing corpus order, each with its eot, then a document's first tokens
        pieces = np.split(got, np.flatnonzero(got == 256) + 1)
        pieces = [p.tolist() for p in pieces if len(p)]
        where = [docs.index(p) for p in pieces[:-1]]
        assert where == sorted(where) and len(set(where)) == len(where) and set(where) <= set(taken)
        last = [i for i in taken if i not in where][0]  # the next one drawn, cut by the end of the budget
        assert last > max(where, default=-1) and docs[last][:len(pieces[-1])] == pieces[-1]
    assert len(subsets) == 7  # other seeds, other subsets
    for n in (len(flat), len(flat) + 9):  # all of it (or more): the whole corpus, in its order
        assert budget_tokens(train, n, 5, 256).tolist() == budget_tokens(train, n).tolist() == flat.tolist()
    prefix = budget_tokens(train, 40, None, 256)
    assert isinstance(prefix, np.memmap) and prefix.tolist() == flat[:40].tolist()  # a view, no copy


def test_budget_docs_errors(tmp_path):
    train = np.array([t for d in documents(5, 256) for t in d], dtype=np.uint16)
    with pytest.raises(DataError, match=r"budget_docs needs train_tokens: .*Set --train_tokens=N"):
        budget_tokens(train, None, 3, 256)
    with pytest.raises(DataError, match=r'budget_docs needs the id that ends each document.*add "eot"'):
        budget_tokens(train, 10, 3, None)
    assert eot_id({"tokenizer": "gpt2", "vocab_size": 50257}) == 50256 and eot_id({}) is None
    with pytest.raises(DataError, match=r"the train split is one document \(no end-of-text id 99 .*Set "
                                        r'meta.json\'s "eot"'):
        budget_tokens(train, 10, 3, 99)
    with pytest.raises(DataError, match=r"budget_docs must be a seed \(an int >= 0\)"):
        budget_tokens(train, 10, -1, 256)
    d = own_folder(tmp_path / "own", train, train, {"tokenizer": "byte", "vocab_size": 257, "eot": 300})
    with pytest.raises(DataError, match=r"'eot' must be the end-of-text id .*got 300"):
        load_meta("own", d)
    d = own_folder(tmp_path / "own", train, train, {"tokenizer": "byte", "vocab_size": 257})
    with pytest.raises(SystemExit, match=r"error: budget_docs needs train_tokens"):  # as train.py says it
        open_data(data_cfg(d, budget_docs=3), None, 0)


def test_train_py_trains_on_the_budget_docs_subset(tmp_path):
    """train.py's budget, entropy and eval windows are budget_tokens' subset (meta.json's own "eot")."""
    import analyze  # here: the other tests of this file need no model
    import train as train_py
    from checkpoint import load_checkpoint
    docs = documents(300, 59, seed=1)  # ~45,000 tokens, ids below 60
    flat = np.array([t for d in docs for t in d], dtype=np.uint16)
    d = own_folder(tmp_path / "docs", flat, flat[:2000], {"tokenizer": "byte", "vocab_size": 60, "eot": 59})
    out, n = tmp_path / "out", 3000
    assert train_py.main(["--dataset=docs", f"--data_dir={d}", f"--out_dir={out}", "--n_layer=1",
                          "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4", "--eval_samples=8",
                          "--max_iters=2", "--compile=False", "--device=cpu", f"--train_tokens={n}",
                          "--budget_docs=3"]) == 0
    subset = np.array(expected_budget(docs, n, 3)[0])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["budget_tokens"] == n and summary["config"]["budget_docs"] == 3
    def entropy(tokens):  # of the token frequencies, written out
        p = np.bincount(tokens) / len(tokens)
        return -sum(q * math.log(q) for q in p if q > 0)
    assert summary["unigram_entropy"] == pytest.approx(entropy(subset))
    assert summary["unigram_entropy"] != pytest.approx(entropy(flat[:n]))  # not the prefix's
    model, ckpt = load_checkpoint(out / "ckpt.pt")
    starts = np.random.default_rng(1337).integers(0, n - 16, size=2 * 4)  # the train eval windows
    x = torch.tensor(np.stack([subset[s:s + 16] for s in starts]).astype(np.int64))
    y = torch.tensor(np.stack([subset[s + 1:s + 17] for s in starts]).astype(np.int64))
    evals = [r for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if r["event"] == "eval"]
    with torch.no_grad():
        assert evals[-1]["train_loss"] == pytest.approx(model(x, y)[1].item(), abs=1e-5)
    # analyze.py measures on the first of those windows: in the run's subset too
    _, windows, seen = analyze.measurement_windows(model, ckpt, dict(analyze.DEFAULTS, windows=5))
    assert seen == n and torch.equal(windows, x[:5])


@needs_gpt2
def test_train_py_draws_whole_articles_of_wikitext103_docs(tmp_path):
    """train.py --budget_docs on WikiText-103 prepared with --layout=docs (from a local zip): the
    budget is a seeded subset of whole articles, each with its end-of-text."""
    import train as train_py
    from data.common import get_tokenizer
    from data.wikitext103.prepare import prepare
    from tests.test_data import make_zip
    rng = np.random.default_rng(0)
    words = "the a game of war river city was is in and by".split()
    arts = [f" = Article {k} = \n \n" + " ".join(rng.choice(words, size=10 + 7 * k)) + " .\n \n"
            for k in range(12)]
    arts[0] = " \n" + arts[0]  # the raw files begin with a blank line
    names = ("train", "valid", "test")
    body = make_zip({f"wikitext-103-raw/wiki.{s}.raw": "".join(arts) for s in names})
    d = tmp_path / "docs"
    d.mkdir()
    (d / "wikitext-103-raw-v1.zip").write_bytes(body)  # as if downloaded: nothing is fetched
    prepare(out_dir=str(d), tiktoken_file=GPT2_RANKS, urls=["http://127.0.0.1:9/never-asked"],
            sha256=None, size=len(body), layout="docs")
    enc = get_tokenizer("gpt2", GPT2_RANKS)
    docs = [enc.encode(a) + [50256] for a in arts]  # each article alone, its end-of-text after it
    out, n = tmp_path / "out", 300
    assert train_py.main(["--dataset=wikitext103", f"--data_dir={d}", f"--out_dir={out}",
                          "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16",
                          "--batch_size=4", "--eval_samples=8", "--max_iters=2", "--compile=False",
                          "--device=cpu", f"--train_tokens={n}", "--budget_docs=5"]) == 0
    subset, taken = expected_budget(docs, n, 5)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["budget_tokens"] == n and summary["config"]["budget_docs"] == 5
    assert summary["layout"] == "docs"
    assert taken != list(range(len(taken)))  # not the first articles: not the prefix
    p = np.bincount(subset) / n
    assert summary["unigram_entropy"] == pytest.approx(-sum(q * math.log(q) for q in p if q > 0))


def test_paper_val_is_the_studys_slice_with_windows_redrawn_per_eval(tmp_path):
    """val_loss_paper: the budget's first max(10K, budget / 100) val tokens (the study's protocol), its
    windows redrawn at every eval from (seed, step): recomputed here from the final checkpoint."""
    assert [paper_val_tokens(b, 10**6) for b in (10**6, 10**7, 5 * 10**7, None)] == [
        10_000, 100_000, 500_000, 10**6]
    assert paper_val_tokens(5 * 10**7, 247_000) == 247_000  # WikiText-103's val: shorter than 500K
    d = tmp_path / 'data'
    d.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 60, 8000).astype(np.uint16).tofile(d / 'train.bin')
    val = rng.integers(0, 60, 30_000).astype(np.uint16)
    val.tofile(d / 'val.bin')
    (d / 'meta.json').write_text(json.dumps({'tokenizer': 'byte', 'vocab_size': 60}))
    assert run(d, tmp_path / 'p', '--max_iters=4', '--eval_interval=2', '--paper_val=6',
               '--train_tokens=5000') == 0
    evals = records(tmp_path / 'p', 'eval')
    assert [e['iter'] for e in evals] == [0, 2, 4] and all(e['val_loss_paper'] for e in evals)
    model, _ = load_checkpoint(tmp_path / 'p' / 'ckpt.pt')
    paper = torch.from_numpy(val[:10_000].astype(np.int64))  # budget 5000: the first 10,000 val tokens
    starts = [torch.randint(10_000 - 16, (6,), generator=torch.Generator().manual_seed(
        derived_seed(1337, 'val_paper', it))).tolist() for it in (2, 4)]
    assert starts[0] != starts[1]  # redrawn at every eval
    x = torch.stack([paper[s:s + 16] for s in starts[1]])
    y = torch.stack([paper[s + 1:s + 17] for s in starts[1]])
    with torch.no_grad():
        assert evals[-1]['val_loss_paper'] == pytest.approx(model(x, y)[1].item(), abs=1e-5)
    assert evals[-1]['val_loss'] != evals[-1]['val_loss_paper']  # ours: the fixed val windows
    assert run(d, tmp_path / 'q', '--max_iters=0') == 0
    assert records(tmp_path / 'q', 'eval')[0]['val_loss_paper'] is None  # off by default
