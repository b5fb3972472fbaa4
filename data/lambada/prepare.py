"""
LAMBADA, OpenAI's version (5153 passages, one JSON object {"text": ...} per line), for annex/eval.py.
Downloads lambada_test.jsonl into this folder and checks it.

    python data/lambada/prepare.py [--force=True]
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from data.common import DataError, write_json  # noqa: E402
from data.prepare_tools import cli, download, finished  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
URLS = ["https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl",
        "https://huggingface.co/datasets/EleutherAI/lambada_openai/resolve/"
        "879e19a2c9bb7ef03f9cf962089cf7d008f91e27/data/lambada_test.jsonl"]
SHA256 = "4aa8d02cd17c719165fc8a7887fddd641f43fcafa4b1c806ca8abc31fabdb226"
SIZE = 1_819_752
FILE = "lambada_test.jsonl"


def prepare(out_dir=HERE, force=False, urls=URLS, sha256=SHA256, size=SIZE):
    """Download and verify LAMBADA into out_dir; returns the meta dict."""
    if (meta := finished(out_dir, force)) is not None:
        return meta
    download(urls, os.path.join(out_dir, FILE), sha256=sha256, size=size)
    meta = {"file": FILE, "examples": len(load(out_dir)), "sha256": sha256}
    write_json(os.path.join(out_dir, "meta.json"), meta)
    print(f"LAMBADA: {meta['examples']:,} passages in {os.path.join(out_dir, FILE)}")
    return meta


def load(data_dir=HERE):
    """The passages (list of str), in file order."""
    path = os.path.join(data_dir, FILE)
    if not os.path.exists(path):
        raise DataError(f"{path} not found. Get it with: python data/lambada/prepare.py")
    with open(path, encoding="utf-8") as f:
        texts = [_text(line, path, i) for i, line in enumerate(f, 1) if line.strip()]
    if not texts:
        raise DataError(f"{path} is empty. Delete it and run: python data/lambada/prepare.py")
    return texts


def _text(line, path, lineno):
    try:
        text = json.loads(line)["text"]
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f'{path} line {lineno} is not a JSON object with a "text" field ({e}). '
                        "Delete the file and run: python data/lambada/prepare.py") from e
    if not isinstance(text, str) or not text.strip():
        raise DataError(f'{path} line {lineno}: "text" is not a non-empty string')
    return text


if __name__ == "__main__":
    cli(prepare, __doc__)
