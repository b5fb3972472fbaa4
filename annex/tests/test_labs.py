"""docs/labs.md: every lab's commands, as the page writes them, at a smaller size. train.py's runs
on the tiny token stream (tests/common.py's data_dir) for a few steps, side by side; then each
analysis command on those runs, side by side, which must end well and write what the lab says to
look at."""
import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

from tests.common import run_side_by_side

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--max_iters=6", "--lr_decay_iters=6", "--warmup_iters=2", "--eval_interval=3",
         "--log_interval=3", "--eval_samples=8", "--batch_size=4", "--block_size=16", "--n_layer=2",
         "--n_embd=32", "--n_head=2"]


def lab_commands():
    """{lab's title: [argv of each command]}: the lines of its fenced blocks that run python."""
    labs = {}
    for part in re.split(r"^## ", (REPO / "docs" / "labs.md").read_text(), flags=re.M)[1:]:
        blocks = re.findall(r"^```\n(.*?)^```", part, flags=re.M | re.S)
        lines = [line for block in blocks for line in block.splitlines()]
        labs[part.splitlines()[0]] = [shlex.split(line.partition("#")[0]) for line in lines
                                      if line.startswith("python ")]
    return labs


def in_tmp(argv, tmp):  # the lab's out/ folders under tmp
    return [a.replace("out/", f"{tmp}/out/") for a in argv]


def test_every_lab_runs_at_a_smaller_size(tmp_path, data_dir):
    labs = lab_commands()
    assert len(labs) >= 5 and all(labs.values()), labs
    trains = [in_tmp(a, tmp_path) + SMALL + [f"--data_dir={data_dir}"]
              for cmds in labs.values() for a in cmds if a[1] == "train.py"]
    others = [in_tmp(a, tmp_path) for cmds in labs.values() for a in cmds if a[1] != "train.py"]
    assert len(trains) >= 10 and len(others) >= 4
    for argv, done in zip(trains, run_side_by_side([[sys.executable, *a[1:]] for a in trains],
                                                   cwd=REPO)):
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        out = next(a.split("=", 1)[1] for a in argv if a.startswith("--out_dir="))
        summary = json.loads((Path(out) / "summary.json").read_text())
        assert summary["status"] == "finished" and summary["iters"] == 6, argv
    for argv, done in zip(others, run_side_by_side([[sys.executable, *a[1:]] for a in others],
                                                   cwd=REPO)):  # they read the runs, not each other
        assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-2000:])
        assert "Traceback" not in done.stderr, argv
        plots = [a.split("=", 1)[1] for a in argv if a.startswith("--plot=")]
        if plots and importlib.util.find_spec("matplotlib"):
            made = Path(plots[0])
            assert (made.is_file() or any(made.glob("*.png"))), argv
