"""
The offline default corpus: English text present on every machine with Python, so that
`python train.py` works with no download. Documents are, in a fixed order, the docstrings of each
standard-library module (read with `ast` from the .py sources, nothing is imported), then each topic
of the language reference that pydoc ships (pydoc_data/topics.py). Byte tokenizer: ids 0..255 are the
UTF-8 bytes, 256 ends each document. Every 10th document goes to val.bin, the rest to train.bin.
--tokenizer=gpt2 writes GPT-2 BPE ids (the study's vocabulary, offline with a ranks file) into
data/pydocs/gpt2/ instead: train on it with --data_dir=data/pydocs/gpt2.

    python data/pydocs/prepare.py [--force=True] [--tokenizer=gpt2 [--tiktoken_file=gpt2.tiktoken]]
"""
import ast
import os
import platform
import sys
import sysconfig

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from data.common import DataError, get_tokenizer, write_json  # noqa: E402
from data.prepare_tools import cli, finished, token_meta, write_tokens  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# third-party packages differ between machines; tests and demos are code-heavy and slow to parse
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}


def documents():
    """The corpus' documents (str), deterministic for a given Python installation."""
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS]
        paths += [os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/") for f in files
                  if f.endswith(".py")]
    seen = set()  # the same docstring in several places (e.g. _pydecimal and its copies) counts once
    docs = []
    for rel in sorted(paths):
        with open(os.path.join(root, rel), "rb") as f:
            src = f.read()
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError):
            continue  # a file that is not valid for this Python: nothing to learn from
        text = [s for s in _docstrings(tree) if not (s in seen or seen.add(s))]
        if text:
            docs.append("\n\n".join(text))
        if rel == "pydoc_data/topics.py":
            docs += _topics(tree)
    if not docs:
        raise DataError(f"no Python sources with docstrings under {root} (a Python without its .py "
                        "files?). Use another dataset, e.g. python data/shakespeare/prepare.py, and "
                        "dataset=shakespeare.")
    return docs


def _docstrings(node):
    """Docstrings of a module, class or function and everything nested in it, in source order."""
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        s = ast.get_docstring(node)  # cleaned: common indentation removed
        if s and s.strip():
            yield s.strip()
    for child in ast.iter_child_nodes(node):
        yield from _docstrings(child)


def _topics(tree):
    """The pydoc topics: a dict literal `topics = {name: text}` of the language reference, by name."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["topics"]:
            topics = ast.literal_eval(node.value)
            return [topics[k].strip() for k in sorted(topics) if topics[k].strip()]
    return []


def prepare(out_dir=None, force=False, tokenizer="byte", tiktoken_file=None):
    """Build train.bin, val.bin and meta.json in out_dir (default: here, or here/gpt2 for GPT-2's
    BPE; a few seconds); returns the meta dict."""
    out_dir = out_dir or (HERE if tokenizer == "byte" else os.path.join(HERE, tokenizer))
    if (meta := finished(out_dir, force)) is not None:
        return meta
    tok = get_tokenizer(tokenizer, tiktoken_file)  # first: no ranks file fails at once
    docs = documents()
    splits = {"train": [d for i, d in enumerate(docs) if i % 10 != 9], "val": docs[9::10]}
    meta = {**token_meta(tok), "source": "docstrings of the Python standard library + pydoc topics",
            "python": platform.python_version(), "documents": len(docs)}
    for split, ds in splits.items():
        n = write_tokens(os.path.join(out_dir, f"{split}.bin"), (tok.encode(d) + [tok.eot] for d in ds),
                         tok.n_vocab)
        meta[f"{split}_tokens"], meta[f"{split}_documents"] = n, len(ds)
        print(f"{split}: {n:,} tokens ({len(ds):,} documents)")
    write_json(os.path.join(out_dir, "meta.json"), meta)
    return meta


if __name__ == "__main__":
    cli(prepare, __doc__, tokenizer="byte")
