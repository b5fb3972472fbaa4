"""annex/eval.py: scoring rules against hand-computed numbers, batching, and the CLI end to end."""
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import data.common
from annex import eval as ev
from model import GPT, GPTConfig
from tests.common import GPT2_RANKS as RANKS  # a ranks file, or None for tiktoken's own cache
from tests.common import needs_gpt2

L3, L1 = math.log(0.3), math.log(0.1)  # log-probs of the stand-in's favorite / any other token
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Favorite(torch.nn.Module):
    """Stand-in model over 8 tokens whose next-token distribution the test controls: after token t its
    favorite fav[t] has probability 0.3 and each other token 0.1 (logit log 3 vs 0: 3/10 and 1/10).
    anchored=True also shifts the favorite by the window's first token, so the left edge of what the
    model sees changes every prediction (like a real transformer reading its first token)."""

    def __init__(self, fav, block_size=64, anchored=False):
        super().__init__()
        self.fav, self.anchored = torch.tensor(fav), anchored
        self.config = SimpleNamespace(block_size=block_size, vocab_size=8)
        self.lm_head = torch.nn.Identity()  # hidden() gives the logits already
        self.seen = []  # every input batch, to check what the model was shown

    def hidden(self, idx):
        assert idx.shape[1] <= self.config.block_size
        self.seen.append(idx.clone())
        fav = self.fav[idx]
        if self.anchored:
            fav = (fav + idx[:, :1]) % 8
        return torch.zeros(*idx.shape, 8).scatter_(-1, fav[..., None], math.log(3))


class CharTok:
    """Tokenizer for the stand-in: ' ' a b c d e f -> 0..6, end-of-text 7."""
    chars, eot, n_vocab = " abcdef", 7, 8

    def encode(self, s):
        return [self.chars.index(c) for c in s]


NEXT = [1, 2, 3, 4, 5, 6, 0, 0]  # ' '->a, a->b, ..., e->f, f->' ', EOT->' '


def write_jsonl(path, rows):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_lambada_rule():
    passages = ["ef abc",     # every target token greedy: ' ' a b c
                "ef abd",     # right except the last token (after b the favorite is c)
                "e fa abc",   # split at the LAST space; the first target token is wrong
                "ef  abc"]    # the first space moves to the target "  abc":
                              # P(' '|f) .3, P(' '|' ') .1, then .3
    model = Favorite(NEXT)
    r = ev.eval_lambada(model, CharTok(), passages, limit=None, batch_tokens=14, device="cpu")
    assert r["n"] == 4 and r["acc"] == pytest.approx(1 / 4)
    summed = [4 * L3, 3 * L3 + L1, L1 + 3 * L3, 4 * L3 + L1]
    assert r["ppl"] == pytest.approx(math.exp(-sum(summed) / 4))
    shown = [row.tolist() for batch in model.seen for row in batch]
    assert [5, 0, 6, 1, 0, 1, 2] in shown  # "e fa abc" without its last token, unpadded (the longest)
    assert ev.eval_lambada(Favorite(NEXT), CharTok(), passages, 1, batch_tokens=14,
                           device="cpu")["n"] == 1
    # no space: EOT is the context (the harness's empty context) and " abd" the target: ' ' a b right,
    # d wrong
    model = Favorite(NEXT)
    r = ev.eval_lambada(model, CharTok(), ["abd"], limit=None, batch_tokens=1, device="cpu")
    assert model.seen[0].tolist() == [[7, 0, 1, 2]]
    assert r["acc"] == 0 and r["ppl"] == pytest.approx(math.exp(-(3 * L3 + L1)))


def test_lambada_split_is_the_harness_split():
    # lm-evaluation-harness: context = words before the last space, target = " " + last word;
    # _encode_pair then moves whitespace that ends the context onto the target; an empty context is
    # scored after EOT
    tok = data.common.get_tokenizer("byte")
    expected = {"He said hello": (b"He said", b" hello"),
                "He said  hello": (b"He said", b"  hello"),
                "the end.\n world": (b"the end.", b"\n world"),
                "a \t\n  b": (b"a", b" \t\n  b"),
                "hello": ([256], b" hello"),
                " hello": ([256], b" hello"),
                "\n hello": ([256], b"\n hello")}
    for text, (ctx, tgt) in expected.items():
        assert ev.lambada_example(tok, text) == (list(ctx), list(tgt)), text


def test_truncation_from_the_left():
    model = Favorite(NEXT, block_size=4, anchored=True)
    # 6 tokens -> the model sees only the last 4 inputs [0,1,2,3]: first token 0, no shift: both right.
    # Had the context been cut elsewhere (first token 3), every favorite would move by 3 and both miss.
    lp, ok = ev.score(model, [([3, 0, 1, 2], [3, 4])], batch_tokens=1, device="cpu")
    assert model.seen[0].tolist() == [[0, 1, 2, 3]]
    assert lp == [pytest.approx(2 * L3)] and ok == [True]
    # exactly block_size inputs: nothing is cut, the first token 5 shifts the favorites and both miss
    lp, ok = ev.score(model, [([5, 0, 1], [2, 3])], batch_tokens=1, device="cpu")
    assert model.seen[1].tolist() == [[5, 0, 1, 2]]
    assert lp == [pytest.approx(2 * L1)] and ok == [False]
    with pytest.raises(ValueError, match="block_size"):
        ev.score(model, [([1], [1, 2, 3, 4, 5])], batch_tokens=1, device="cpu")


def test_blimp_rule():
    # anchored: after EOT at the window start every favorite is the token itself (fav + 1 + 7 = t mod 8).
    # " aa" -> P(' '|EOT) .1, P(a|' ') .1, P(a|a) .3;  " ab", " ac" -> .1 .1 .1.  Without the EOT in
    # front the favorites would be NEXT and " ab" would beat " aa".
    def pairs(field, *sentences):
        return [{"sentence_good": g, "sentence_bad": b, "field": field, "linguistics_term": "term",
                 "UID": f"p_{field}_{len(sentences)}", "pairID": str(i)}
                for i, (g, b) in enumerate(sentences)]
    paradigms = [pairs("syntax", ("aa", "ab"), ("ab", "aa")),                 # right, wrong -> 0.5
                 pairs("syntax", ("aa", "ab"), ("aa", "ac"), ("aa", "ab")),   # 1.0
                 pairs("morphology", ("ab", "ac"), ("ab", "aa"))]             # tie, wrong -> 0.5
    # a tie counts as right, as in lm-evaluation-harness: acc = (argmax([ll_good, ll_bad]) == 0), and
    # np.argmax returns the first of equal values
    model = Favorite(NEXT, anchored=True)
    r = ev.eval_blimp(model, CharTok(), paradigms, limit=None, batch_tokens=9, device="cpu")
    assert all(row[0] == 7 for batch in model.seen for row in batch.tolist())
    assert r["n"] == 7 and r["n_paradigms"] == 3
    # mean over paradigms, not over pairs (5/7)
    assert r["score"] == pytest.approx((0.5 + 1.0 + 0.5) / 3)
    assert r["fields"] == pytest.approx({"morphology": 0.5, "syntax": 0.75})
    assert r["paradigms"]["p_syntax_2"] == {"field": "syntax", "linguistics_term": "term", "n": 2,
                                            "acc": 0.5}
    r = ev.eval_blimp(model, CharTok(), paradigms, 1, batch_tokens=9, device="cpu")  # --limit
    assert r["paradigms"]["p_syntax_3"]["n"] == 1


def naive_score(model, ctx, tgt):
    """One example, no batching, float64: each target token's log-prob,
    log p = logit - log(sum(exp(logits))) over the full vocabulary, and whether it is the argmax."""
    seq = (ctx + tgt)[-(model.config.block_size + 1):]
    with torch.no_grad():
        logits = model(torch.tensor([seq[:-1]]), all_logits=True)[0][0].double()
    logp = logits - logits.exp().sum(-1, keepdim=True).log()
    first = len(seq) - 1 - len(tgt)
    lp = sum(logp[first + j, t].item() for j, t in enumerate(tgt))
    return lp, all(logp[first + j].argmax().item() == t for j, t in enumerate(tgt))


def test_token_batches():
    # longest first; a batch takes as many as fit once padded to its first, and at least one
    assert ev.token_batches([3, 10, 2, 10, 5], 20) == [[1, 3], [4, 0, 2]]
    assert ev.token_batches([3, 10, 2, 10, 5], 4) == [[1], [3], [4], [0], [2]]
    assert ev.token_batches([3, 10, 2, 10, 5], 1000) == [[1, 3, 4, 0, 2]]


# inputs per sequence below (context + target, cut to block_size + 1, less the last token), longest
# first: 16 16 16 11 7 6 6 5 1. A budget of 40 tokens: 2 x 16, 2 x 16 (16 and 11), 5 x 7; of 1: one
# per pass.
BATCH_SHAPES = {1: [(1, n) for n in (16, 16, 16, 11, 7, 6, 6, 5, 1)], 40: [(2, 16), (2, 16), (5, 7)],
                10_000: [(9, 16)]}


@pytest.mark.parametrize("batch_tokens", sorted(BATCH_SHAPES))
@pytest.mark.parametrize("variant", [{}, dict(norm="dyt", pos="rope", attn="diff", mlp="swiglu")])
def test_batched_equals_one_at_a_time(variant, batch_tokens):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32,
                          **variant)).eval()
    g = torch.Generator().manual_seed(1)
    examples = []
    for n_ctx, n_tgt in [(1, 1), (3, 4), (20, 2), (7, 1), (15, 16), (2, 5), (9, 3)]:  # some are cut
        examples.append((torch.randint(0, 64, (n_ctx,), generator=g).tolist(),
                         torch.randint(0, 64, (n_tgt,), generator=g).tolist()))
    # two targets that are the model's own greedy continuation (fitting in one window, as generate() saw
    # them), so the all-greedy flag must be True for them
    for ctx in ([5, 6, 7], list(range(14))):
        out = model.generate(torch.tensor([ctx]), 3, temperature=0)[0].tolist()
        examples.append((ctx, out[len(ctx):]))
    shapes = []
    model.hidden = lambda idx: shapes.append(tuple(idx.shape)) or GPT.hidden(model, idx)
    lp, ok = ev.score(model, examples, batch_tokens=batch_tokens, device="cpu")
    assert shapes == BATCH_SHAPES[batch_tokens]
    expected = [naive_score(model, c, t) for c, t in examples]
    assert lp == pytest.approx([e[0] for e in expected], abs=1e-4)
    assert ok == [e[1] for e in expected] and ok[-2:] == [True, True]


def test_bfloat16_autocast():
    # --dtype=bfloat16 runs the model under autocast: close to float32, but not the same numbers
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32)).eval()
    examples = [([1, 2, 3], [4, 5]), ([7] * 10, [8, 9, 10])]
    expected = [naive_score(model, c, t)[0] for c, t in examples]
    lp, _ = ev.score(model, examples, batch_tokens=64, device="cpu", dtype=torch.bfloat16)
    assert lp == pytest.approx(expected, rel=0.02) and lp != pytest.approx(expected, rel=1e-5)


def tiny_checkpoint(path, seed, dataset, **config):
    torch.manual_seed(seed)
    cfg = GPTConfig(block_size=64, vocab_size=320, n_layer=2, n_head=2, n_embd=32)
    model = GPT(cfg)
    torch.save({"model": model.state_dict(), "optimizer": {}, "model_args": dataclasses.asdict(cfg),
                "config": {"dataset": dataset, **config}, "iter_num": 10 * seed, "best_val_loss": 5.0,
                "best_iter": 0, "tokenizer": "byte"}, path)
    return model


def write_dataset(folder, split, tokens, tokenizer="byte"):
    os.makedirs(folder, exist_ok=True)
    np.asarray(tokens, dtype=np.uint16).tofile(folder / f"{split}.bin")
    with open(folder / "meta.json", "w") as f:
        json.dump({"tokenizer": tokenizer, "vocab_size": 257, "train_tokens": 0}, f)


def write_blimp(folder, paradigms):
    os.makedirs(folder)
    for uid, field, good, bad in paradigms:
        write_jsonl(folder / f"{uid}.jsonl", [{"sentence_good": good, "sentence_bad": bad,
                                               "field": field, "linguistics_term": "term", "UID": uid,
                                               "pairID": str(i)}
                                              for i in range(2)])


VAL = torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(3)).tolist()


def test_cli_end_to_end(tmp_path):
    # trained with --data_dir=<tmp>/scratch/x: the val task reads that folder (not <data_dir>/tiny/)
    models = [tiny_checkpoint(tmp_path / f"ckpt{s}.pt", s, "tiny",
                              data_dir=str(tmp_path / "scratch" / "x"))
              for s in (1, 2)]
    write_jsonl(tmp_path / "lambada_test.jsonl", [
        {"text": "The old man looked at the sea for a long time. He knew the fish was still there, deep "
                 "below the boat. He waited with the line in his hands until the sun went down, and "
                 "then he spoke to the fish"},
        {"text": "She opened the letter slowly. It was from her brother, who had left the village years "
                 "ago. He wrote that he would come home in spring, and she read the letter again and "
                 "again"},
        {"text": "Short one"}])
    write_blimp(tmp_path / "blimp", [
        ("anaphor_gender_agreement", "morphology", "Katherine can't help herself.",
         "Katherine can't help himself."),
        ("adjunct_island", "syntax", "Who should Derek hug after shocking Richard?",
         "Who should Derek hug Richard after shocking?"),
        ("existential_there_quantifiers_1", "semantics", "There was a cat.", "There was every cat.")])
    write_dataset(tmp_path / "scratch" / "x", "val", VAL)
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "annex/eval.py", str(tmp_path / "ckpt1.pt"),
                           str(tmp_path / "ckpt2.pt"), "--tasks=lambada,blimp,val", "--batch_tokens=100",
                           "--device=cpu", f"--lambada_dir={tmp_path}",
                           f"--blimp_dir={tmp_path / 'blimp'}", f"--json={out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # stdout: the table (a header, a row per metric) and the JSON path, nothing else; progress is on
    # stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["metric", str(tmp_path / "ckpt1.pt"), str(tmp_path / "ckpt2.pt")]
    assert [re.split(r"  +", line.strip())[0] for line in lines[1:-1]] == [
        "lambada acc %", "lambada ppl", "blimp (mean of paradigms)", "blimp morphology",
        "blimp semantics", "blimp syntax", "val ppl"]
    # a figure per checkpoint
    assert all(len(re.split(r"  +", line.strip())) == 3 for line in lines[1:-1])
    assert lines[-1] == f"wrote {out}"
    assert "3 of BLiMP's 67 paradigms" in proc.stderr and "blimp: 12/12" in proc.stderr
    doc = json.loads(out.read_text())
    assert set(doc["args"]) >= {"tasks", "limit", "batch_tokens", "device", "dtype", "ckpt"}
    assert doc["args"]["dtype"] == "float32"  # the default on a CPU
    assert [c["iter_num"] for c in doc["checkpoints"]] == [10, 20]
    for model, res in zip(models, doc["checkpoints"]):
        assert res["tokenizer"] == "byte" and res["model_args"]["n_embd"] == 32 and res["skipped"] == {}
        t = res["tasks"]
        assert t["lambada"]["n"] == 3 and 0 <= t["lambada"]["acc"] <= 1
        assert set(t["blimp"]["fields"]) == {"morphology", "syntax", "semantics"}
        assert t["blimp"]["n"] == 6 and t["blimp"]["paradigms"]["adjunct_island"]["n"] == 2
        assert set(t) == {"lambada", "blimp", "val"}
        assert all(t[k]["examples_per_s"] > 0 and t[k]["seconds"] >= 0 for k in t)
        # val perplexity against the model's own loss: windows of 64 predicted tokens, each token once
        nll = 0.0
        for s in range(0, 199, 64):
            x, y = torch.tensor([VAL[s:s + 64]]), torch.tensor([VAL[s + 1:s + 65]])
            n = y.shape[1]
            nll += model(x[:, :n], y)[1].item() * n
        assert t["val"]["tokens"] == 199 and t["val"]["dataset"] == "tiny"
        assert t["val"]["ppl"] == pytest.approx(math.exp(nll / 199), rel=1e-4)
        # LAMBADA perplexity: exp(-mean summed log-prob), each passage's target scored on its own
        tok_ids = lambda s: list(s.encode())
        passages = [json.loads(line)["text"] for line in open(tmp_path / "lambada_test.jsonl")]
        summed = [naive_score(model, tok_ids(p.rsplit(" ", 1)[0]), tok_ids(" " + p.rsplit(" ", 1)[1]))[0]
                  for p in passages]
        assert t["lambada"]["ppl"] == pytest.approx(math.exp(-sum(summed) / 3), rel=1e-4)


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """No network and an empty data/: LAMBADA and BLiMP downloads fail, no dataset is prepared."""
    calls = []

    def prepare(out_dir=None):
        calls.append(out_dir)
        print("fetching the files")  # on stdout, as the real prepare() prints its progress
        raise ev.DataError("could not download it")
    for module in (ev.lambada, ev.blimp):
        monkeypatch.setattr(module, "HERE", str(tmp_path / "absent"))
        monkeypatch.setattr(module, "prepare", prepare)
    monkeypatch.setattr(data.common, "DATA_DIR", str(tmp_path / "data"))
    return calls


def test_default_tasks_skip_what_cannot_run(tmp_path, offline, capsys):
    tiny_checkpoint(tmp_path / "a.pt", 1, "tiny", data_dir=str(tmp_path / "x"))
    tiny_checkpoint(tmp_path / "b.pt", 2, "other")  # data/other/ is not prepared
    write_dataset(tmp_path / "x", "val", VAL)
    write_blimp(tmp_path / "blimp",
                [("passive_1", "syntax", "The cat was seen.", "The cat was arrived.")])
    out = tmp_path / "r.json"
    ev.main([str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), f"--blimp_dir={tmp_path / 'blimp'}",
             "--device=cpu", f"--json={out}"])
    captured = capsys.readouterr()
    assert "skipping lambada: could not prepare lambada" in captured.err
    # a byte-level model is told that wikitext needs GPT-2 tokens, not that WikiText-103 is missing
    assert re.search(r"a\.pt: skipping wikitext: wikitext needs a GPT-2-tokenized model[^\n]*\n",
                     captured.err)
    assert "wikitext103/prepare.py" not in captured.err
    assert "fetching the files" in captured.err  # prepare()'s prints, moved off stdout
    # stdout: the table (header, then a row per metric) and the JSON path, nothing else
    labels = [re.split(r"  +", line.strip())[0] for line in captured.out.splitlines()]
    assert labels == ["metric", "blimp (mean of paradigms)", "blimp syntax", "val ppl", f"wrote {out}"]
    assert re.search(r"b\.pt: skipping val: .*python data/other/prepare.py", captured.err)
    a, b = json.loads(out.read_text())["checkpoints"]
    assert set(a["tasks"]) == {"blimp", "val"} and set(a["skipped"]) == {"lambada", "wikitext"}
    assert set(b["tasks"]) == {"blimp"} and set(b["skipped"]) == {"lambada", "wikitext", "val"}
    assert re.search(r"val ppl +[0-9.]+ +-\n", captured.out + "\n")  # b's column shows it did not run
    # WikiText-103 prepared (GPT-2 BPE): still skipped for this byte-level model, with the reason
    write_dataset(tmp_path / "data" / "wikitext103", "test", range(100), tokenizer="gpt2")
    (r,) = ev.main([str(tmp_path / "a.pt"), f"--blimp_dir={tmp_path / 'blimp'}", "--device=cpu"])
    assert "needs a GPT-2-tokenized model" in r["skipped"]["wikitext"] and "val" in r["tasks"]


def test_problems_are_found_before_any_scoring(tmp_path, offline, monkeypatch):
    def no_scoring(*args, **kwargs):
        raise AssertionError("scored before every input was checked")
    monkeypatch.setattr(ev, "score", no_scoring)
    tiny_checkpoint(tmp_path / "a.pt", 1, "tiny", data_dir=str(tmp_path / "x"))
    write_dataset(tmp_path / "x", "val", VAL)
    # a task named in --tasks must run: val is ready, but wikitext (not prepared either) needs a GPT-2
    # model
    with pytest.raises(SystemExit,
                       match=r"error: .*wikitext needs a GPT-2-tokenized model.*a\.pt uses 'byte'$"):
        ev.main([str(tmp_path / "a.pt"), "--tasks=val,wikitext"])
    # the second checkpoint's data is checked before the first one is scored
    tiny_checkpoint(tmp_path / "b.pt", 2, "other")
    with pytest.raises(SystemExit, match=r"(?s)other/meta.json not found.*prepare.py.*--data_dir"):
        ev.main([str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--tasks=val"])
    # a val split in another tokenizer is an error even with the default task list
    write_dataset(tmp_path / "x", "val", range(100), tokenizer="gpt2")
    with pytest.raises(SystemExit, match="tokenized with 'gpt2' but .*a.pt uses 'byte'"):
        ev.main([str(tmp_path / "a.pt"), f"--blimp_dir={tmp_path}"])
    write_dataset(tmp_path / "x", "val", [5])  # one token: nothing to predict
    with pytest.raises(SystemExit, match="has 1 token, perplexity needs 2 or more"):
        ev.main([str(tmp_path / "a.pt"), "--tasks=val"])
    # explicit eval sets that are missing
    with pytest.raises(SystemExit, match="lambada_test.jsonl not found"):
        ev.main([str(tmp_path / "a.pt"), "--tasks=lambada", f"--lambada_dir={tmp_path}"])
    with pytest.raises(SystemExit, match="no BLiMP paradigm files"):
        ev.main([str(tmp_path / "a.pt"), "--tasks=blimp", f"--blimp_dir={tmp_path}"])
    with pytest.raises(SystemExit, match=r"python data/lambada/prepare.py.*--lambada_dir"):
        ev.main([str(tmp_path / "a.pt"), "--tasks=lambada"])


def test_val_data_dir(tmp_path, offline):
    # --data_dir is the folder with val.bin (as in train.py); --dataset=NAME reads data/NAME/, not the
    # run's
    tiny_checkpoint(tmp_path / "a.pt", 1, "tiny", data_dir=str(tmp_path / "moved"))
    write_dataset(tmp_path / "y", "val", VAL[:65])
    (r,) = ev.main([str(tmp_path / "a.pt"), "--tasks=val", f"--data_dir={tmp_path / 'y'}",
                    "--device=cpu"])
    assert r["tasks"]["val"]["tokens"] == 64
    write_dataset(tmp_path / "data" / "tiny2", "val", VAL[:33])
    (r,) = ev.main([str(tmp_path / "a.pt"), "--tasks=val", "--dataset=tiny2", "--device=cpu"])
    assert r["tasks"]["val"]["tokens"] == 32 and r["tasks"]["val"]["dataset"] == "tiny2"
    with pytest.raises(SystemExit, match=r"(?s)moved/meta.json not found.*--data_dir=DIR"):
        ev.main([str(tmp_path / "a.pt"), "--tasks=val"])


def test_ckpt_choice(tmp_path, offline):
    # a run directory: --ckpt=latest (default) evaluates its ckpt.pt, --ckpt=best its best.pt; a file as
    # it is
    tiny_checkpoint(tmp_path / "ckpt.pt", 1, "tiny", data_dir=str(tmp_path / "x"))
    tiny_checkpoint(tmp_path / "best.pt", 2, "tiny", data_dir=str(tmp_path / "x"))
    write_dataset(tmp_path / "x", "val", VAL[:65])
    run = lambda *argv: ev.main([*argv, "--tasks=val", "--device=cpu"])[0]
    r = run(str(tmp_path))
    assert r["checkpoint"] == str(tmp_path / "ckpt.pt") and r["iter_num"] == 10
    r = run(str(tmp_path), "--ckpt=best")
    assert r["checkpoint"] == str(tmp_path / "best.pt") and r["iter_num"] == 20
    assert run(str(tmp_path / "ckpt.pt"), "--ckpt=best")["iter_num"] == 10
    os.remove(tmp_path / "best.pt")
    with pytest.raises(SystemExit, match=r"no checkpoint at .*best\.pt"):
        run(str(tmp_path), "--ckpt=best")
    with pytest.raises(SystemExit, match='--ckpt=last is not a checkpoint choice'):
        ev.main([str(tmp_path), "--ckpt=last"])


def test_bad_input_errors(tmp_path, offline):
    for argv, message in [(["x.pt", "--bogus=1"], "unknown config key 'bogus' (from --bogus=1)"),
                          (["x.pt", "--tasks=lambada,hellaswag"], "hellaswag"),
                          (["x.pt", "--json", "r.json"], "expected --key=value, got '--json'"),
                          (["x.pt", "--limit=many"], "'limit' (from --limit=many) must be int or None"),
                          (["x.pt", "--dtype=float16"], "dtype='float16' is not known"),
                          (["--tasks=val"], "usage: python annex/eval.py CHECKPOINT_OR_RUN_DIR")]:
        with pytest.raises(SystemExit) as e:
            ev.parse_args(argv)
        assert message in e.value.code, argv  # a message as exit code: Python prints it, exits with 1
    # a missing checkpoint is reported first: nothing is downloaded for it
    tiny_checkpoint(tmp_path / "a.pt", 1, "tiny")
    with pytest.raises(SystemExit, match="no checkpoint at .*missing.pt"):
        ev.main([str(tmp_path / "a.pt"), str(tmp_path / "missing.pt")])
    # a run dir without its ckpt.pt
    with pytest.raises(SystemExit, match=r"no checkpoint at .*ckpt\.pt"):
        ev.main([str(tmp_path)])
    assert offline == []
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="error: .*no cuda device"):
            ev.main([str(tmp_path / "a.pt"), "--device=cuda"])


def test_help_and_misspelt_key(capsys):
    # what `python annex/eval.py --help` prints (test_cli_end_to_end runs the script itself): the usage,
    # the keys with their defaults, and the LAMBADA rule's "\n " printed as written, not as a line break
    with pytest.raises(SystemExit) as e:
        ev.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "python annex/eval.py out-ln out-dyt --ckpt=best --tasks=lambada,blimp" in out
    assert 'a double space or "\\n " before the last word is scored' in out
    assert "  ckpt = 'latest'\n" in out and "  batch_tokens = 8192\n" in out
    with pytest.raises(SystemExit, match=r"unknown config key 'tsks' \(.*\); did you mean tasks\?"):
        ev.parse_args(["x.pt", "--tsks=val"])


@needs_gpt2
def test_gpt2_tokenizer_from_ranks_file(tmp_path, monkeypatch):
    import tiktoken
    import tiktoken.load
    from tiktoken_ext.openai_public import r50k_pat_str
    monkeypatch.setattr(data.common, "DATA_DIR", str(tmp_path / "data"))  # nothing prepared
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=16)  # GPT-2 vocabulary 50304
    model = GPT(cfg)
    torch.save({"model": model.state_dict(), "model_args": dataclasses.asdict(cfg), "tokenizer": "gpt2",
                "config": {"dataset": "wikitext103", "tiktoken_file": RANKS}, "iter_num": 0},
               tmp_path / "ckpt.pt")
    # the contexts and targets, split by hand as lm-evaluation-harness does
    split = {"He looked at the old boat and said that it would never sail again, not even for Santiago":
             ("He looked at the old boat and said that it would never sail again, not even for",
              " Santiago"),
             "Alice opened the door": ("Alice opened the", " door"),
             "Alice opened the door  slowly": ("Alice opened the door", "  slowly")}
    write_jsonl(tmp_path / "lambada_test.jsonl", [{"text": p} for p in split])
    enc = tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, special_tokens={"<|endoftext|>": 50256},
                            mergeable_ranks=tiktoken.load.load_tiktoken_bpe(RANKS)) if RANKS \
        else tiktoken.get_encoding("gpt2")  # tiktoken's own cache
    assert enc.encode_ordinary("Hello world") == [15496, 995]  # really GPT-2's ids
    tokens = enc.encode_ordinary(" ".join(split) * 3)[:70]
    assert len(tokens) == 70
    write_dataset(tmp_path / "wt", "test", tokens, tokenizer="gpt2")
    # a GPT-2 model is told to prepare WikiText-103; no --tiktoken_file: the run's own ranks file is used
    with pytest.raises(SystemExit, match=r"wikitext103/meta.json not found.*prepare.py"):
        ev.main([str(tmp_path / "ckpt.pt"), "--tasks=wikitext", "--device=cpu"])
    (r,) = ev.main([str(tmp_path / "ckpt.pt"), "--tasks=lambada,wikitext", f"--lambada_dir={tmp_path}",
                    f"--wikitext_dir={tmp_path / 'wt'}", "--device=cpu"])
    summed = [naive_score(model, enc.encode_ordinary(c), enc.encode_ordinary(t))[0]
              for c, t in split.values()]
    assert r["tasks"]["lambada"]["ppl"] == pytest.approx(math.exp(-sum(summed) / 3), rel=1e-4)
    # windows of 33 tokens sharing their edge token: 69 predicted tokens in 32 + 32 + 5
    nll = -sum(naive_score(model, [tokens[s]], tokens[s + 1:s + 33])[0] for s in (0, 32, 64))
    assert r["tasks"]["wikitext"]["tokens"] == 69
    assert r["tasks"]["wikitext"]["ppl"] == pytest.approx(math.exp(nll / 69), rel=1e-4)
