"""
WikiText-103 (raw), the study's training data, tokenized with GPT-2 BPE (encode_ordinary) into
train.bin / val.bin / test.bin (uint16) + meta.json. The raw files are tokenized as they are (articles
joined as in the file, no end-of-text tokens), in parallel chunks that give exactly the ids of
tokenizing each whole file at once.

--layout=paper writes the study's own tokenization (Verma 2026) into data/wikitext103/paper/ instead:
every row (line) of the raw files alone, blank rows skipped, the ids concatenated. Train on it with
--data_dir=data/wikitext103/paper to compare with the study's published losses.

    python data/wikitext103/prepare.py [--force=True] [--tiktoken_file=gpt2.tiktoken] [--layout=paper]
"""
import io
import os
import sys
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from data.common import DataError, get_tokenizer, write_json  # noqa: E402
from data.prepare_tools import (cli, download, finished, line_chunks, token_meta,  # noqa: E402
                                tokenize_to_file)

HERE = os.path.dirname(os.path.abspath(__file__))
URLS = ["https://wikitext.smerity.com/wikitext-103-raw-v1.zip"]
SHA256 = "91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794"
SIZE = 191_984_949
MEMBERS = {"train": "wikitext-103-raw/wiki.train.raw", "val": "wikitext-103-raw/wiki.valid.raw",
           "test": "wikitext-103-raw/wiki.test.raw"}


def prepare(out_dir=None, force=False, tiktoken_file=None, urls=URLS, sha256=SHA256, size=SIZE,
            layout="file"):
    """Download, verify and tokenize WikiText-103 into out_dir (default: here, or here/paper for the
    study's layout); returns the meta dict."""
    if layout not in ("file", "paper"):
        raise DataError(f"layout must be 'file' (the raw files as they are) or 'paper' (each non-blank "
                        f"row alone, as the study tokenized them), got {layout!r}")
    out_dir = out_dir or (HERE if layout == "file" else os.path.join(HERE, "paper"))
    if (meta := finished(out_dir, force)) is not None:
        return meta
    tok = get_tokenizer("gpt2", tiktoken_file)  # before the 192 MB download: fail fast if it is missing
    zip_path = download(urls, os.path.join(out_dir, "wikitext-103-raw-v1.zip"), sha256=sha256, size=size)
    meta = {**token_meta(tok), "source": os.path.basename(zip_path), "source_sha256": sha256,
            "layout": layout}
    try:
        with zipfile.ZipFile(zip_path) as zf:
            for split, member in MEMBERS.items():
                with zf.open(member) as raw:
                    # newline="\n": lines end only at "\n" and the text is kept byte for byte
                    lines = io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
                    # the study's rows: each encoded alone, its newline kept; blank rows dropped
                    chunks = line_chunks(lines) if layout == "file" else (r for r in lines if r.strip())
                    path = os.path.join(out_dir, f"{split}.bin")
                    meta[f"{split}_tokens"] = tokenize_to_file(tok, chunks, path,
                                                               batch=16 if layout == "file" else 4096)
    except (zipfile.BadZipFile, KeyError, EOFError, UnicodeDecodeError) as e:
        raise DataError(f"{zip_path} is not a usable WikiText-103 raw zip ({type(e).__name__}: {e}). "
                        "Delete it and run again to download it afresh.") from e
    write_json(os.path.join(out_dir, "meta.json"), meta)
    print(", ".join(f"{s}: {meta[f'{s}_tokens']:,} tokens" for s in MEMBERS))
    return meta


if __name__ == "__main__":
    cli(prepare, __doc__, layout="file")
