"""
Tiny Shakespeare with GPT-2 BPE, as in nanoGPT: the first 90% of the characters -> train.bin, the
last 10% -> val.bin (uint16), + meta.json.

    python data/shakespeare/prepare.py [--force=True] [--tiktoken_file=gpt2.tiktoken]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from data.common import get_tokenizer, write_json  # noqa: E402
from data.prepare_tools import cli, download, finished, token_meta, tokenize_to_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
URLS = ["https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"]
SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SIZE = 1_115_394


def prepare(out_dir=HERE, force=False, tiktoken_file=None, urls=URLS, sha256=SHA256, size=SIZE):
    """Download, verify and tokenize Tiny Shakespeare into out_dir; returns the meta dict."""
    if (meta := finished(out_dir, force)) is not None:
        return meta
    tok = get_tokenizer("gpt2", tiktoken_file)
    path = download(urls, os.path.join(out_dir, "input.txt"), sha256=sha256, size=size)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    cut = int(len(text) * 0.9)
    meta = {**token_meta(tok), "source": "input.txt", "source_sha256": sha256}
    for split, part in (("train", text[:cut]), ("val", text[cut:])):
        meta[f"{split}_tokens"] = tokenize_to_file(tok, [part], os.path.join(out_dir, f"{split}.bin"))
    write_json(os.path.join(out_dir, "meta.json"), meta)
    print(f"train: {meta['train_tokens']:,} tokens, val: {meta['val_tokens']:,} tokens")
    return meta


if __name__ == "__main__":
    cli(prepare, __doc__)
