"""
Downstream evaluation of one or more checkpoints (README "Evaluation"), comparable with
lm-evaluation-harness.

  python annex/eval.py out-ln out-dyt --ckpt=best --tasks=lambada,blimp --limit=500 --json=results.json
  python annex/eval.py out/gpt2_64m_dyt/ckpt.pt --tasks=val --device=cpu
  python annex/eval.py --help                   # this text, then the keys and their defaults

Checkpoint files and run directories come first, then --key=value options. A run directory stands for
its ckpt.pt (--ckpt=latest, the default) or its best.pt (--ckpt=best, the lowest val loss); a checkpoint
file is evaluated as it is.
Tasks (--tasks, comma separated; default all four):
  lambada   OpenAI LAMBADA, 5153 passages, split as lm-evaluation-harness's lambada_openai: context =
            text before its last space, target = " " + last word, and whitespace ending the context
            moves to the target (a double space or "\\n " before the last word is scored); an empty
            context is EOT.
            acc = share of passages whose every target token is the greedy argmax given the true prefix;
            ppl = exp(-mean over passages of the target's log-prob).
  blimp     every BLiMP paradigm file (67). A pair is right iff
            log P(" "+good | EOT) >= log P(" "+bad | EOT): a tie counts as right, as in
            lm-evaluation-harness (right iff argmax of [good, bad] is 0, and argmax takes the first of
            equal values). score = mean over paradigms; a field's = mean over its paradigms.
  wikitext  token-level perplexity of the WikiText-103 test split (data/wikitext103/, or
            --wikitext_dir); GPT-2-tokenized models only (WikiText-103 is prepared in GPT-2 BPE only).
  val       token-level perplexity of the val split of the checkpoint's dataset, from the folder it
            trained on (its data_dir, else data/<dataset>/); --dataset=NAME reads data/NAME/ instead;
            --data_dir=DIR is the folder holding val.bin and meta.json, as in train.py.
Everything is checked before any scoring: checkpoints, tokenizers, every task's data. Tasks named in
--tasks must all run: any problem is an error. With the default list, a task that cannot run is skipped
with a note saying how to fix it: LAMBADA/BLiMP that cannot be downloaded, a perplexity split not
prepared, and wikitext for a checkpoint that is not GPT-2-tokenized (said before whether the data is
there). A split tokenized unlike the checkpoint is always an error: its data changed since training.
Perplexity uses consecutive windows of block_size + 1 tokens that share one token at the edges, as in
training: every token but the first is predicted exactly once, from 1 to block_size tokens of context.
Contexts longer than block_size are cut from the left. Sequences are sorted by length and batched up to
--batch_tokens tokens, padding included (as many sequences as fit, at least one); lm_head runs only where
a target token is predicted. 8192 holds 8 perplexity windows of GPT-2's 1024 tokens, ~60 LAMBADA passages
or ~800 BLiMP sentences. Perplexity and BLiMP score nearly every token, so a batch makes up to
batch_tokens x vocab float32 logits (1.6 GB at 8192 with GPT-2's vocabulary) and a temporary as large:
lower it if memory runs out. --device=auto picks cuda, else mps, else cpu (or name one: cpu, cuda,
cuda:1, mps). --dtype=bfloat16 (the default on a GPU that has it) runs under autocast as training does;
on CUDA float32 matmuls use TF32.
--limit caps the LAMBADA passages, the BLiMP pairs per paradigm and the perplexity windows. LAMBADA and
BLiMP are downloaded into data/lambada/ and data/blimp/ on first use (data/<name>/prepare.py);
--lambada_dir=DIR / --blimp_dir=DIR point at copies made elsewhere. --tiktoken_file defaults to the one
the run was trained with.
Progress and notes go to stderr; stdout holds the table, then "wrote FILE" with --json=FILE.

--json=FILE schema:
  {"args": {...the command-line options...},
   "checkpoints": [{"checkpoint": file, "iter_num": int|null, "tokenizer": "gpt2"|"byte",
     "model_args": {...}, "skipped": {task: why},
     "tasks": {
       "lambada":  {"n", "acc", "ppl", "seconds", "examples_per_s"},
       "blimp":    {"n" (pairs), "n_paradigms", "score", "fields": {field: score},
                    "paradigms": {UID: {"field", "linguistics_term", "n", "acc"}}, "seconds",
                    "examples_per_s"},
       "wikitext": {"dataset", "n" (windows), "tokens", "loss" (mean nats/token), "ppl", "seconds",
                    "examples_per_s"},
       "val":      {"dataset", "n", "tokens", "loss", "ppl", "seconds", "examples_per_s"}}}]}
"""
import contextlib
import math
import os
import sys
import time
from collections import defaultdict
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as annex/eval.py
from checkpoint import checkpoint_file, load_checkpoint  # noqa: E402
from configurator import config_keys, configure, split_args  # noqa: E402
from data.blimp import prepare as blimp  # noqa: E402
from data.common import DataError, get_tokenizer, load_meta, load_split, write_json  # noqa: E402
from distributed import pick_device, precision  # noqa: E402
from data.lambada import prepare as lambada  # noqa: E402

TASKS = ("lambada", "blimp", "wikitext", "val")

# -------------------------------------------------------------------------------------------------------
ckpt = "latest"  # a run directory's 'latest' (ckpt.pt) or 'best' (best.pt)
tasks: str | None = None  # comma-separated subset of TASKS; None = all, skipping those that cannot run
limit: int | None = None  # LAMBADA passages, BLiMP pairs per paradigm, perplexity windows; None = all
batch_tokens = 8192  # tokens per forward pass, padding included
dtype: str | None = None  # 'float32' or 'bfloat16'; None = bfloat16 on a GPU that has it, else float32
device = "auto"
json: str | None = None  # also write the results to this file
lambada_dir: str | None = None  # the folder holding lambada_test.jsonl; None = data/lambada/
blimp_dir: str | None = None  # the folder of BLiMP's <UID>.jsonl files; None = data/blimp/
wikitext_dir: str | None = None  # WikiText-103's test.bin and meta.json; None = data/wikitext103/
dataset: str | None = None  # the val task's dataset; None = the checkpoint's
data_dir: str | None = None  # the val task's val.bin and meta.json; None = the run's data_dir
tiktoken_file: str | None = None  # a GPT-2 .tiktoken ranks file; None = the run's own
# -------------------------------------------------------------------------------------------------------
DEFAULTS, OPTIONAL_TYPES = config_keys(globals())


def progress(label, done, total, t0):
    # one self-overwriting line on stderr, so stdout stays a clean table
    rate = done / max(time.time() - t0, 1e-9)
    end = "\n" if done == total else ""
    print(f"\r  {label}: {done}/{total} ({rate:.1f}/s)", end=end, file=sys.stderr, flush=True)


def token_batches(lengths, batch_tokens):
    """Indices into `lengths` grouped into batches, longest first: a batch holds as many sequences as fit
    in batch_tokens once padded to its first (longest) one, and at least one. Sorting makes neighbours
    of similar length share a batch (little padding), and a batch too large for memory fails at the
    start."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, start = [], 0
    while start < len(order):
        size = max(1, batch_tokens // lengths[order[start]])
        batches.append(order[start:start + size])
        start += size
    return batches


@torch.inference_mode()
def score(model, examples, batch_tokens, device, dtype=torch.float32, label="scoring"):
    """examples: list of (context_ids, target_ids). Returns, per example, the summed log-prob of the
    target given the context and whether every target token is the greedy argmax given the true prefix.
    dtype=torch.bfloat16 runs the model under autocast; the log-softmax is always float32."""
    block_size = model.config.block_size
    seqs = []
    for ctx, tgt in examples:
        if not ctx or not tgt:
            raise ValueError("every example needs a non-empty context and target")
        if len(tgt) > block_size:
            raise ValueError(f"a target of {len(tgt)} tokens does not fit the model's block_size "
                             f"{block_size}")
        seqs.append((list(ctx) + list(tgt))[-(block_size + 1):])  # cut the context from the left
    autocast = torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype != torch.float32)
    logprob, greedy = [0.0] * len(seqs), [False] * len(seqs)
    done, t0, last_report = 0, time.time(), time.time()
    for batch in token_batches([len(s) - 1 for s in seqs], batch_tokens):
        T = len(seqs[batch[0]]) - 1
        # right padding: attention is causal, so pad tokens never change the real positions
        x = torch.tensor([seqs[i][:-1] + [0] * (T + 1 - len(seqs[i])) for i in batch])
        rows, cols, targets = [], [], []
        for row, i in enumerate(batch):
            n, tgt = len(seqs[i]) - 1, examples[i][1]
            rows += [row] * len(tgt)
            cols += range(n - len(tgt), n)
            targets += tgt
        # the target positions are known here on the CPU; finding them on the device (nonzero) would
        # wait for it
        rows, cols, targets = torch.tensor([rows, cols, targets]).to(device)
        with autocast:
            # lm_head only where a target is predicted: LAMBADA scores ~2 of ~130 positions
            logits = model.lm_head(model.hidden(x.to(device))[rows, cols]).float()
        token_lp = logits.gather(1, targets[:, None])[:, 0] - logits.logsumexp(-1)
        lp = torch.zeros(len(batch), device=device).index_add_(0, rows, token_lp)
        misses = torch.zeros(len(batch), device=device).index_add_(
            0, rows, (logits.argmax(-1) != targets).float())
        # one device sync per batch
        for i, lp_i, misses_i in zip(batch, *torch.stack([lp, misses]).tolist()):
            logprob[i], greedy[i] = lp_i, misses_i == 0
        done += len(batch)
        if done == len(seqs) or time.time() - last_report > 1:  # about once a second, not once a batch
            progress(label, done, len(seqs), t0)
            last_report = time.time()
    return logprob, greedy


def lambada_example(tok, text):
    """(context ids, target ids) of a passage, as lm-evaluation-harness scores lambada_openai: context =
    the text before its last space, target = " " + last word; then (its _encode_pair) whitespace that
    ends the context moves to the front of the target, so a double space or "\\n " before the last word
    is scored. The target's ids are those of context + target after the context's, also as there."""
    context, word = text.rsplit(" ", 1) if " " in text else ("", text)
    stripped = context.rstrip()
    context, target = stripped, context[len(stripped):] + " " + word
    # the harness's empty context: the target is scored after EOT (it needs a token before it)
    if not context:
        return [tok.eot], tok.encode(target)
    ctx = tok.encode(context)
    return ctx, tok.encode(context + target)[len(ctx):]


def eval_lambada(model, tok, passages, limit, **scoring):
    """scoring: score()'s batch_tokens, device and dtype."""
    examples = [lambada_example(tok, text) for text in passages[:limit]]
    logprob, greedy = score(model, examples, label="lambada", **scoring)
    return {"n": len(examples), "acc": sum(greedy) / len(greedy),
            "ppl": math.exp(-sum(logprob) / len(logprob))}


def eval_blimp(model, tok, paradigms, limit, **scoring):
    """paradigms: one list of pair dicts per paradigm; scoring: score()'s batch_tokens, device and
    dtype."""
    paradigms = [pairs[:limit] for pairs in paradigms]
    # all sentences of all paradigms in one call, so batches stay full
    examples = [([tok.eot], tok.encode(" " + pair[key])) for pairs in paradigms
                for pair in pairs for key in ("sentence_good", "sentence_bad")]
    logprob, _ = score(model, examples, label="blimp", **scoring)
    per_paradigm, by_field, k = {}, defaultdict(list), 0
    for pairs in paradigms:
        right = [logprob[k + 2 * j] >= logprob[k + 2 * j + 1] for j in range(len(pairs))]  # tie: right
        k += 2 * len(pairs)
        first = pairs[0]
        per_paradigm[first["UID"]] = {"field": first["field"],
                                      "linguistics_term": first["linguistics_term"],
                                      "n": len(pairs), "acc": sum(right) / len(right)}
        by_field[first["field"]].append(sum(right) / len(right))
    accs = [p["acc"] for p in per_paradigm.values()]
    return {"n": len(examples) // 2, "n_paradigms": len(accs), "score": sum(accs) / len(accs),
            "fields": {f: sum(a) / len(a) for f, a in sorted(by_field.items())},
            "paradigms": per_paradigm}


def eval_perplexity(model, tokens, limit, label, **scoring):
    n = model.config.block_size
    starts = list(range(0, len(tokens) - 1, n))[:limit]
    examples = [([int(tokens[s])], tokens[s + 1:s + n + 1].tolist()) for s in starts]
    logprob, _ = score(model, examples, label=label, **scoring)
    count = sum(len(tgt) for _, tgt in examples)
    loss = -sum(logprob) / count
    return {"n": len(examples), "tokens": count, "loss": loss, "ppl": math.exp(loss)}


def check_checkpoint(path, args):
    """Check a checkpoint (on the meta device: no weights are read) and its tokenizer before any data is
    fetched or scored; keeps what planning needs. A run directory becomes its --ckpt file from here
    on."""
    try:
        path = checkpoint_file(path, args.ckpt)  # ValueError: --ckpt is neither latest nor best
        model, ckpt = load_checkpoint(path, device="meta", language_model=True)
        # nanoGPT checkpoints predate the field and are all GPT-2 BPE
        tokenizer = ckpt.get("tokenizer", "gpt2")
        tok = get_tokenizer(tokenizer, args.tiktoken_file or ckpt.get("config", {}).get("tiktoken_file"))
    except (FileNotFoundError, ValueError, DataError) as e:
        raise SystemExit(f"error: {e}") from None
    if tok.n_vocab > model.config.vocab_size:
        raise SystemExit(f"error: {path} has {model.config.vocab_size} token embeddings, fewer than the "
                         f"{tok.n_vocab} ids of its tokenizer '{tokenizer}'; is the 'tokenizer' entry "
                         "wrong?")
    return {"path": path, "tokenizer": tokenizer, "tok": tok, "config": ckpt.get("config", {})}


def eval_set_dir(name, module, given):
    """Folder of an eval set: the one given, else data/<name>/, downloaded first if not complete
    there."""
    if given:
        return given
    if not os.path.exists(os.path.join(module.HERE, "meta.json")):  # prepare() writes it last
        print(f"{name}: not prepared yet, downloading it", file=sys.stderr)
        try:
            with contextlib.redirect_stdout(sys.stderr):  # its progress; stdout is for the table
                module.prepare()
        except (DataError, OSError) as e:  # OSError covers the requests errors
            raise DataError(f"could not prepare {name}: {e}\nOr run `python data/{name}/prepare.py` on "
                            f"a machine with internet and copy its data/{name}/ folder to "
                            f"{module.HERE}, or pass --{name}_dir=DIR") from e
    return module.HERE


def load_blimp(folder):
    # every paradigm file in the folder (a folder of a few paradigms works too); name = UID
    uids = sorted(f[:-len(".jsonl")] for f in os.listdir(folder) if f.endswith(".jsonl"))
    if not uids:
        raise DataError(f"no BLiMP paradigm files (<UID>.jsonl) in {folder}")
    if len(uids) != len(blimp.UIDS):
        print(f"note: {folder} holds {len(uids)} of BLiMP's {len(blimp.UIDS)} paradigms",
              file=sys.stderr)
    return [blimp.load_paradigm(os.path.join(folder, f"{uid}.jsonl"), uid) for uid in uids]


def cannot_run(args, task, why, where=""):
    """A task that cannot run: an error when --tasks named it, else a note and the task is skipped."""
    if args.explicit:
        raise SystemExit(f"error: {where}{why}")
    print(f"note: {where}skipping {task}: {why}", file=sys.stderr)
    return why


def load_eval_sets(args):
    """({task: LAMBADA passages / BLiMP paradigms}, {task: why it is not available}) for those asked
    for."""
    sets, missing = {}, {}
    for task, module, given in (("lambada", lambada, args.lambada_dir),
                                ("blimp", blimp, args.blimp_dir)):
        if task in args.tasks:
            try:
                folder = eval_set_dir(task, module, given)
                sets[task] = lambada.load(folder) if task == "lambada" else load_blimp(folder)
            except (DataError, OSError) as e:
                missing[task] = cannot_run(args, task, str(e))
    return sets, missing


def perplexity_split(task, info, args):
    """(dataset, tokens) of a checkpoint's wikitext or val task. DataError: not prepared, or wikitext for
    a model that is not GPT-2-tokenized (both skipped in the default task list); SystemExit: wrong
    data."""
    cfg = info["config"]
    # said first: preparing the data would not help
    if task == "wikitext" and info["tokenizer"] != "gpt2":
        raise DataError("wikitext needs a GPT-2-tokenized model (WikiText-103 is prepared in GPT-2 BPE "
                        f"only); {info['path']} uses '{info['tokenizer']}'")
    if task == "wikitext":
        dataset, split, folder, option = "wikitext103", "test", args.wikitext_dir, "--wikitext_dir"
    else:  # the folder the run trained from (train.py --data_dir), unless another dataset is asked for
        dataset, split, option = args.dataset or cfg.get("dataset"), "val", "--data_dir"
        folder = args.data_dir or (None if args.dataset else cfg.get("data_dir"))
        if not dataset:
            raise DataError(f"{info['path']} does not name its dataset; pass --dataset=NAME")
    try:
        have = load_meta(dataset, folder).get("tokenizer")
        tokens = load_split(dataset, split, folder)
    except DataError as e:
        raise DataError(f"{e}\n(or give the folder holding {split}.bin and meta.json with "
                        f"{option}=DIR)") from None
    # token ids only mean something under the tokenizer the model was trained with
    if have != info["tokenizer"]:
        fix = (f"rebuild it with: python data/{dataset}/prepare.py --force=True" if task == "wikitext"
               else "evaluate on a dataset prepared with it (--dataset=NAME, --data_dir=DIR)")
        raise SystemExit(f"error: dataset '{dataset}' is tokenized with '{have}' but {info['path']} "
                         f"uses '{info['tokenizer']}'; {fix}")
    # load_split refuses empty files; perplexity needs a token to predict and one before
    if len(tokens) < 2:
        raise SystemExit(f"error: the {split} split of '{dataset}' has 1 token, perplexity needs 2 or "
                         f"more; rebuild it with: python data/{dataset}/prepare.py --force=True")
    return dataset, tokens


def plan(info, args, sets, missing):
    """Each task's input for one checkpoint, all checked before any scoring:
    ({task: input}, {task: why not})."""
    inputs, skipped = {}, {}
    for task in args.tasks:
        if task in sets:
            inputs[task] = sets[task]
        elif task in missing:
            skipped[task] = missing[task]
        else:
            try:
                inputs[task] = perplexity_split(task, info, args)
            except DataError as e:
                skipped[task] = cannot_run(args, task, str(e), f"{info['path']}: ")
    if not inputs:
        raise SystemExit(f"error: nothing to evaluate for {info['path']}: every task was skipped (see "
                         "the notes)")
    return inputs, skipped


def evaluate(info, inputs, skipped, args):
    # checked already: ValueError is unlikely
    model, ckpt = load_checkpoint(info["path"], device=args.device)
    result = {"checkpoint": info["path"], "iter_num": ckpt.get("iter_num"),
              "tokenizer": info["tokenizer"], "model_args": ckpt["model_args"], "skipped": skipped,
              "tasks": {}}
    common = dict(limit=args.limit, batch_tokens=args.batch_tokens, device=args.device,
                  dtype=getattr(torch, args.dtype))
    for task, data in inputs.items():
        t0 = time.time()
        if task == "lambada":
            r = eval_lambada(model, info["tok"], data, **common)
        elif task == "blimp":
            r = eval_blimp(model, info["tok"], data, **common)
        else:
            dataset, tokens = data
            r = {"dataset": dataset, **eval_perplexity(model, tokens, label=task, **common)}
        r["seconds"] = time.time() - t0
        r["examples_per_s"] = r["n"] / max(r["seconds"], 1e-9)
        result["tasks"][task] = r
    return result


def table(results):
    """One row per metric, one column per checkpoint; '-' where a checkpoint skipped the task."""
    def row(label, task, get, spec):
        return [label] + [format(get(r["tasks"][task]), spec) if task in r["tasks"] else "-"
                          for r in results]
    # one result per task that ran
    ran = {task: r["tasks"][task] for r in results for task in r["tasks"]}
    lines = [["metric"] + [r["checkpoint"] for r in results]]
    if "lambada" in ran:
        lines += [row("lambada acc %", "lambada", lambda t: 100 * t["acc"], ".2f"),
                  row("lambada ppl", "lambada", lambda t: t["ppl"], ".2f")]
    if "blimp" in ran:  # the same paradigms, so the same fields, for every checkpoint
        lines += [row("blimp (mean of paradigms)", "blimp", lambda t: t["score"], ".4f")]
        lines += [row(f"  blimp {field}", "blimp", lambda t, f=field: t["fields"][f], ".4f")
                  for field in ran["blimp"]["fields"]]
    for task, label in (("wikitext", "wikitext103 test ppl"), ("val", "val ppl")):
        if task in ran:
            lines += [row(label, task, lambda t: t["ppl"], ".2f")]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(line[0].ljust(widths[0])
                     + "".join("  " + c.rjust(w) for c, w in zip(line[1:], widths[1:]))
                     for line in lines)


def parse_args(argv):
    """The checkpoints (positional arguments) and the --key=value options, checked, in one namespace."""
    paths, options = split_args(argv)
    args = SimpleNamespace(checkpoints=paths, **configure(DEFAULTS, options, OPTIONAL_TYPES, __doc__))
    if not paths:
        raise SystemExit("usage: python annex/eval.py CHECKPOINT_OR_RUN_DIR [...] [--key=value ...] "
                         "(--help lists the keys)")
    if args.dtype not in (None, "float32", "bfloat16"):
        raise SystemExit(f"error: dtype={args.dtype!r} is not known; use 'float32' or 'bfloat16'")
    args.explicit = args.tasks is not None  # tasks named by the user must all run
    args.tasks = [t.strip() for t in (args.tasks or ",".join(TASKS)).split(",") if t.strip()]
    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown or not args.tasks:
        raise SystemExit(f"error: unknown task(s) {unknown}; choose from {','.join(TASKS)}")
    if args.limit is not None and args.limit < 1 or args.batch_tokens < 1:
        raise SystemExit("error: --limit and --batch_tokens must be positive")
    return args


def main(argv):
    args = parse_args(argv)
    try:
        args.device = pick_device(args.device)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    args.dtype = precision(args.device, args.dtype)[0]  # as in training (TF32 on CUDA too)
    # every check before any scoring; the checkpoints first, so a mistyped path downloads nothing
    infos = [check_checkpoint(path, args) for path in args.checkpoints]
    sets, missing = load_eval_sets(args)
    plans = [plan(info, args, sets, missing) for info in infos]
    results = []
    for info, (inputs, skipped) in zip(infos, plans):
        print(f"{info['path']}:", file=sys.stderr)
        try:
            results.append(evaluate(info, inputs, skipped, args))
        except (FileNotFoundError, ValueError) as e:  # e.g. a LAMBADA target longer than block_size
            raise SystemExit(f"error: {info['path']}: {e}") from None
    print(table(results))
    if args.json:
        # atomic: temp file, then rename
        write_json(args.json, {"args": vars(args), "checkpoints": results})
        print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
