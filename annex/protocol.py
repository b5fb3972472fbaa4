"""
The study's data protocol beyond a prefix of the train split: data budgets as a seeded random subset of
whole documents (train.py's budget_docs; docs/data.md), and the val slice the study evaluated each
budget on (paper_val; README, "The paper's protocol"). An annex: train.py, analyze.py and the report
import it only for these.
"""
import numpy as np

from data.common import EOT, DataError


def eot_id(meta):
    """The id that ends each document of a token folder: meta.json's "eot", else its tokenizer's; None
    when neither is known."""
    return meta.get("eot", EOT.get(meta.get("tokenizer")))


def budget_tokens(train, train_tokens, budget_docs=None, eot=None, chunk=1 << 24):
    """The data budget's tokens (all of the train split when it is shorter than train_tokens, or for
    None). budget_docs None: the split's first train_tokens (a memmap slice, no copy). budget_docs a
    seed: a random subset of whole documents (the spans that end with the `eot` id; the last may lack
    it), in memory: documents are taken in the order of np.random.default_rng(budget_docs).permutation
    until they hold train_tokens, put back in corpus order (a subset, not a shuffle), concatenated and
    cut to train_tokens, so each but the last is whole, its eot included. A prefix is biased for an
    ordered corpus; this is not."""
    if train_tokens is None:
        if budget_docs is not None:
            raise DataError("budget_docs needs train_tokens: it draws documents until they hold that "
                            "many tokens. Set --train_tokens=N, or budget_docs=None to train on the "
                            "whole split")
        return train
    if budget_docs is None:
        return train[:train_tokens]
    if type(budget_docs) is not int or budget_docs < 0:
        raise DataError(f"budget_docs must be a seed (an int >= 0) or None, got {budget_docs!r}")
    if eot is None:
        raise DataError("budget_docs needs the id that ends each document, unknown for this data "
                        'folder: add "eot": ID to its meta.json')
    # where documents end, read in chunks: a 118M-token split needs no big temporary copy
    ends = np.concatenate([k + 1 + np.flatnonzero(train[k:k + chunk] == eot)
                           for k in range(0, len(train), chunk)])
    if len(ends) == 0 or ends[-1] != len(train):
        ends = np.append(ends, len(train))  # the last document, without an eot
    if len(ends) < 2:
        raise DataError(f"budget_docs: the train split is one document (no end-of-text id {eot} "
                        "between its tokens), so a subset would be its prefix. Set meta.json's "
                        '"eot" to the id that ends documents, or prepare the data with one after '
                        "each (data/pydocs does)")
    starts = np.concatenate(([0], ends[:-1]))
    order = np.random.default_rng(budget_docs).permutation(len(ends))
    # enough documents to reach train_tokens
    count = int(np.searchsorted(np.cumsum((ends - starts)[order]), train_tokens)) + 1
    taken = np.sort(order[:count])
    return np.concatenate([train[a:b] for a, b in zip(starts[taken], ends[taken])])[:train_tokens]


def paper_val_tokens(train_tokens, n_val):
    """How many val tokens the study evaluated a budget on: the first max(10,000, budget / 100) (1M ->
    10K, 10M -> 100K, 50M -> 500K), all of val for the whole train split (train_tokens None)."""
    return n_val if train_tokens is None else min(n_val, max(10_000, train_tokens // 100))
