"""
WikiText-103 (raw), the study's training data, tokenized with GPT-2 BPE (encode_ordinary) into
train.bin / val.bin / test.bin (uint16) + meta.json. The raw files are tokenized as they are (articles
joined as in the file, no end-of-text tokens), in parallel chunks that give exactly the ids of
tokenizing each whole file at once.

--layout=paper writes the study's own tokenization (Verma 2026) into data/wikitext103/paper/ instead:
every row (line) of the raw files alone, blank rows skipped, the ids concatenated. Train on it with
--data_dir=data/wikitext103/paper to compare with the study's published losses.

--layout=docs writes the raw files with one end-of-text after each article into
data/wikitext103/docs/, so that train.py's budget_docs can draw whole articles: train with
--data_dir=data/wikitext103/docs. An article starts at its title line, " = Title = " (a line
" = = Section = = " is one of its sections). Apart from the end-of-text ids, the ids are the default
layout's.

The zip is downloaded once, into data/wikitext103/ (or out_dir), for every layout.

    python data/wikitext103/prepare.py [--force=True] [--tiktoken_file=gpt2.tiktoken]
                                       [--layout=paper|docs]
"""
import io
import os
import re
import sys
import zipfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from data.common import DataError, get_tokenizer, token_counts, write_json  # noqa: E402
from data.prepare_tools import (cli, download, finished, line_chunks, token_meta,  # noqa: E402
                                tokenize_to_file)

HERE = os.path.dirname(os.path.abspath(__file__))
URLS = ["https://wikitext.smerity.com/wikitext-103-raw-v1.zip"]
SHA256 = "91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794"
SIZE = 191_984_949
MEMBERS = {"train": "wikitext-103-raw/wiki.train.raw", "val": "wikitext-103-raw/wiki.valid.raw",
           "test": "wikitext-103-raw/wiki.test.raw"}
LAYOUTS = {"file": "the raw files as they are", "paper": "each non-blank row alone, as the study "
           "tokenized them", "docs": "the raw files with an end-of-text after each article"}
# exactly one "=" on each side: " = = Section = = " and deeper headings are parts of an article
TITLE = re.compile(r" = [^=](.*[^=])? = \n")


def articles(lines):
    """The articles (str) of a raw WikiText file's lines, each from its title line up to the next
    title. The blank line the files begin with goes with the first article, not into an empty one of
    its own, so the articles joined are the file."""
    article = []
    for line in lines:
        if TITLE.fullmatch(line) and any(x.strip() for x in article):
            yield "".join(article)
            article = []
        article.append(line)
    if article:
        yield "".join(article)


def pieces(lines, layout):
    """(the texts to encode one by one, how many to encode at a time) of a raw file in `layout`."""
    if layout == "file":  # chunks cut where the whole file's ids do not change
        return line_chunks(lines), 16
    if layout == "paper":  # the study's rows, each alone, its newline kept; blank rows dropped
        return (row for row in lines if row.strip()), 4096
    # a cut before a title line (" =" after a newline) changes no id either (see line_chunks), so
    # only the end-of-texts differ from the file layout
    return articles(lines), 256


def prepare(out_dir=None, force=False, tiktoken_file=None, urls=URLS, sha256=SHA256, size=SIZE,
            layout="file"):
    """Download, verify and tokenize WikiText-103 into out_dir (default: here, or here/<layout> for
    the paper and docs layouts); returns the meta dict."""
    if layout not in LAYOUTS:
        raise DataError("layout must be " + ", ".join(f"{k!r} ({v})" for k, v in LAYOUTS.items())
                        + f", got {layout!r}")
    zip_dir = out_dir or HERE  # every layout's default folder shares one download
    out_dir = out_dir or (HERE if layout == "file" else os.path.join(HERE, layout))
    if (meta := finished(out_dir, force)) is not None:
        return meta
    tok = get_tokenizer("gpt2", tiktoken_file)  # before the 192 MB download: fail fast if it is missing
    zip_path = download(urls, os.path.join(zip_dir, "wikitext-103-raw-v1.zip"), sha256=sha256,
                        size=size)
    meta = {**token_meta(tok), "source": os.path.basename(zip_path), "source_sha256": sha256,
            "layout": layout}
    end = tok.eot if layout == "docs" else None
    try:
        with zipfile.ZipFile(zip_path) as zf:
            for split, member in MEMBERS.items():
                with zf.open(member) as raw:
                    # newline="\n": lines end only at "\n" and the text is kept byte for byte
                    lines = io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
                    texts, batch = pieces(lines, layout)
                    path = os.path.join(out_dir, f"{split}.bin")
                    meta[f"{split}_tokens"] = tokenize_to_file(tok, texts, path, batch=batch,
                                                               end=end)
                if end is not None:  # counted as budget_docs counts them: by their end-of-text ids
                    ids = np.memmap(path, dtype=meta["dtype"], mode="r")
                    meta[f"{split}_documents"] = int(token_counts(ids, tok.n_vocab)[end])
    except (zipfile.BadZipFile, KeyError, EOFError, UnicodeDecodeError) as e:
        raise DataError(f"{zip_path} is not a usable WikiText-103 raw zip ({type(e).__name__}: {e}). "
                        "Delete it and run again to download it afresh.") from e
    write_json(os.path.join(out_dir, "meta.json"), meta)
    print(", ".join(f"{s}: {meta[f'{s}_tokens']:,} tokens" for s in MEMBERS))
    return meta


if __name__ == "__main__":
    cli(prepare, __doc__, layout="file")
