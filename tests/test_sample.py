"""sample.py: --compile=True compiles what generate() runs, and --ckpt picks the run's checkpoint."""
import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import model as M
import sample
from data.common import get_tokenizer

# byte tokenizer: 257 ids
ARGS = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=257, bias=False)
PROMPT, NEW = "ab", 20   # 22 tokens: generation runs past block_size, so the context gets cropped


def save_ckpt(path, seed):
    """A checkpoint in train.py's format (its keys that sample.py reads), random weights from seed."""
    torch.manual_seed(seed)
    model = M.GPT(M.GPTConfig(**ARGS))
    torch.save(dict(model=model.state_dict(), model_args=ARGS, iter_num=0, config={}, tokenizer="byte"),
               path)
    return model.eval()


def greedy_text(model):
    """Greedy decoding written out: append the argmax of the last position's logits, on the last 16
    tokens."""
    ids = list(PROMPT.encode())
    with torch.no_grad():
        for _ in range(NEW):
            logits = model(torch.tensor([ids[-16:]]), all_logits=True)[0]
            ids.append(int(logits[0, -1].argmax()))
    return get_tokenizer("byte").decode(ids)


def run(capsys, out_dir, *extra):
    sample.main([f"--out_dir={out_dir}", f"--start={PROMPT}", "--num_samples=1",
                 f"--max_new_tokens={NEW}", "--temperature=0", "--device=cpu", *extra])
    return capsys.readouterr().out


def test_compile_runs_compiled_forward_and_matches_eager(tmp_path, capsys):
    want = greedy_text(save_ckpt(tmp_path / "ckpt.pt", seed=0))
    assert run(capsys, tmp_path) == want + "\n---------------\n"
    torch._dynamo.reset()
    counters.clear()
    try:
        got = run(capsys, tmp_path, "--compile=True")
        # torch.compile(model) would leave generate()'s calls eager: nothing captured. Dynamic shapes:
        # one graph for every length (a second one when the cropped context arrives as a strided view),
        # not one per token.
        assert counters["stats"]["calls_captured"] > 0
        assert 1 <= counters["stats"]["unique_graphs"] <= 3
    finally:
        torch._dynamo.reset()
    assert got == want + "\n---------------\n"


def test_ckpt_best_reads_best_pt(tmp_path, capsys):
    best = save_ckpt(tmp_path / "best.pt", seed=1)
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")   # read by mistake, it fails loudly
    want = greedy_text(best) + "\n---------------\n"
    assert run(capsys, tmp_path, "--ckpt=best") == want
    # a file, as it is
    assert run(capsys, tmp_path / "elsewhere", f"--ckpt={tmp_path / 'best.pt'}") == want
    with pytest.raises(SystemExit, match="cannot read checkpoint .*ckpt.pt"):
        run(capsys, tmp_path)   # the default: latest
    with pytest.raises(SystemExit, match=r"no checkpoint at .*nowhere"):
        run(capsys, tmp_path, f"--ckpt={tmp_path / 'nowhere.pt'}")
