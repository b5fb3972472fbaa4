"""annex/curves.py: the loss-curve tables from hand-written logs with known numbers, the plot with
and without matplotlib, a torn line, a folder that is not a run."""
import json
import re
import sys

import pytest

from annex import curves

CONFIG = dict(dataset='pydocs', data_dir=None, train_tokens=50_000, budget_docs=None)
LN_VAL = [5.0, 3.75, 4.25, 4.0]  # the best is not the last
LN_TRAIN = [5.125, 3.875, 3.5, 3.25]


def dyt_layers(alphas, stds):
    return {f'h.{k}.ln_1': dict(kind='dyt', alpha=a, input_std=s, saturation=[0.0])
            for k, (a, s) in enumerate(zip(alphas, stds))}


# alpha against 1/std: equal alphas (no r); 1/std = 1, 2, 4 (r = 1); 1/std = 1, 3, 2 (r = 0.5)
DYT_LAYERS = [dyt_layers([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]),
              dyt_layers([1.0, 2.0, 4.0], [1.0, 0.5, 0.25]),
              dyt_layers([1.0, 2.0, 3.0], [1.0, 1 / 3, 0.5])]


def write_run(d, evals, steps=(), summary=None, lines=()):
    """A run folder as train.py leaves it: log.jsonl (evals at iter 0, 10, 20, ..., a step record
    every 5 iters, 1000 tokens a step), config.json, and summary.json once finished."""
    d.mkdir(parents=True)
    records = [dict(event='step', iter=i, loss=loss, tokens=(i + 1) * 1000, epochs=0.0)
               for i, loss in steps]
    records += [dict(event='eval', iter=10 * k, train_loss=t, val_loss=v, tokens=10_000 * k,
                     epochs=0.2 * k, norm_layers=layers) for k, (t, v, layers) in enumerate(evals)]
    records.sort(key=lambda r: r['iter'])
    text = [json.dumps(r) for r in records] + list(lines)
    (d / 'log.jsonl').write_text(''.join(line + '\n' for line in text))
    (d / 'config.json').write_text(json.dumps(CONFIG))
    if summary:
        (d / 'summary.json').write_text(json.dumps(summary))
    return d


@pytest.fixture
def two_runs(tmp_path):
    """ln: finished, its budget's unigram level 4.5; dyt: still running, three evals, alphas."""
    ln = write_run(tmp_path / 'ln', [(t, v, {}) for t, v in zip(LN_TRAIN, LN_VAL)],
                   steps=[(0, 5.5), (5, 4.5), (10, 4.0), (15, 3.5), (20, 3.25), (25, 3.0)],
                   summary=dict(status='finished', unigram_entropy=4.5, budget_tokens=50_000))
    dyt = write_run(tmp_path / 'dyt', [(5.0, 5.25, DYT_LAYERS[0]), (4.5, 4.75, DYT_LAYERS[1]),
                                       (4.0, 4.125, DYT_LAYERS[2])], steps=[(0, 5.5), (5, 5.0)])
    return str(ln), str(dyt)


def table_rows(text, title):
    """The `iter N` rows of the table under a title, as numbers."""
    block = text.split(title, 1)[1].split('\n\n', 1)[0]
    rows = [line.split() for line in block.splitlines() if line.startswith('iter ')]
    return [[int(r[1]), int(r[2].replace(',', ''))] + [float(x) for x in r[3:]] for r in rows]


def test_loss_table_from_hand_written_logs(two_runs, capsys):
    ln, dyt = two_runs
    curves.main([ln, dyt])
    out = capsys.readouterr().out
    want = [[10 * k, 10_000 * k, LN_TRAIN[k], LN_VAL[k], min(LN_VAL[:k + 1])] for k in range(4)]
    assert table_rows(out, f'{ln} (finished): loss at each eval') == want
    best = min(LN_VAL)
    assert f'best: val loss {best:.4f} at iter {10 * LN_VAL.index(best)} (10,000 tokens)' in out
    assert 'unigram level: 4.5000 nats (summary.json)' in out
    # the run without summary.json: the finished run's level, as they share a budget
    assert table_rows(out, f'{dyt} (unfinished): loss at each eval') == [
        [0, 0, 5.0, 5.25, 5.25], [10, 10_000, 4.5, 4.75, 4.75], [20, 20_000, 4.0, 4.125, 4.125]]
    assert f'unigram level: 4.5000 nats ({ln}, the same budget)' in out
    side = out.split('the runs side by side', 1)[1]
    assert re.search(r'best val loss\s+3\.7500\s+4\.1250', side)
    assert re.search(r'best at iter\s+10\s+20', side)
    assert re.search(r'final val loss\s+4\.0000\s+4\.1250', side)
    assert re.search(r'status\s+finished\s+unfinished', side)


def test_alpha_against_inverse_std_at_three_evals(two_runs, capsys):
    _, dyt = two_runs
    curves.main([dyt])
    out = capsys.readouterr().out.split('DyT/Derf learned alpha against 1 / input std', 1)[1]
    assert f'{dyt} iter 0' in out and f'{dyt} iter 10' in out and f'{dyt} iter 20' in out
    assert re.search(r'h\.0\.ln_1\s+0\.500\s+2\.000\s+1\.000\s+1\.000\s+1\.000\s+1\.000', out)
    assert re.search(r'h\.2\.ln_1\s+0\.500\s+2\.000\s+4\.000\s+4\.000\s+3\.000\s+2\.000', out)
    assert re.search(r'pearson r\s+-\s+1\.000\s+0\.500', out)


def test_json_holds_every_eval_and_step(two_runs, tmp_path, capsys):
    ln, dyt = two_runs
    curves.main([ln, dyt, f'--json={tmp_path}/out/curves.json'])
    got = json.loads((tmp_path / 'out' / 'curves.json').read_text())
    runs = {r['dir']: r for r in got['runs']}
    assert [e['val'] for e in runs[ln]['evals']] == LN_VAL
    assert runs[ln]['best']['val'] == min(LN_VAL) and runs[ln]['best']['iter'] == 10
    assert [s['loss'] for s in runs[ln]['steps']] == [5.5, 4.5, 4.0, 3.5, 3.25, 3.0]
    assert [a['iter'] for a in runs[dyt]['alphas']] == [0, 10, 20] and not runs[ln]['alphas']
    assert runs[dyt]['alphas'][1]['layers']['h.2.ln_1']['inv_std'] == 4.0


def test_plot_written_with_matplotlib(two_runs, tmp_path, capsys):
    pytest.importorskip('matplotlib')
    png = tmp_path / 'plots' / 'curves.png'
    curves.main([*two_runs, '--x=tokens', f'--plot={png}'])
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert f'wrote {png}' in capsys.readouterr().out


def test_without_matplotlib_the_same_tables(two_runs, tmp_path, capsys, monkeypatch):
    curves.main(list(two_runs))
    tables = capsys.readouterr().out
    monkeypatch.setitem(sys.modules, 'matplotlib', None)  # import matplotlib raises ImportError
    png = tmp_path / 'curves.png'
    curves.main([*two_runs, f'--plot={png}'])
    out = capsys.readouterr().out
    assert not png.exists() and out.startswith(tables)
    assert 'matplotlib is not installed' in out[len(tables):]


def test_torn_line_named_and_skipped(tmp_path, capsys):
    run = write_run(tmp_path / 'run', [(4.0, 4.5, {}), (3.5, 4.25, {})],
                    lines=['{"event": "eval", "iter": 20, "val_lo'])
    log = run / 'log.jsonl'
    log.write_text(log.read_text().replace('\n', '\n{"event": "step", "it\n', 1))
    curves.main([str(run)])
    out = capsys.readouterr().out
    assert f'warning: {log} line 2 is not a log record (a torn write?): skipped' in out
    assert f'warning: {log} line 4 is not a log record (a torn write?): skipped' in out
    assert table_rows(out, 'loss at each eval') == [[0, 0, 4.0, 4.5, 4.5],
                                                    [10, 10_000, 3.5, 4.25, 4.25]]
    assert 'unigram level: unknown' in out


def test_not_a_run_and_a_folder_of_runs(tmp_path, capsys):
    (tmp_path / 'empty').mkdir()
    with pytest.raises(SystemExit, match=f'{tmp_path}/empty is not a run: it holds no log.jsonl'):
        curves.main([str(tmp_path / 'empty')])
    with pytest.raises(SystemExit, match='is not a run: no such folder'):
        curves.main([str(tmp_path / 'nowhere')])
    grid = tmp_path / 'grid'
    for name in ('b', 'a'):
        write_run(grid / name, [(4.0, 4.5, {})])
    (grid / 'notes').mkdir()  # not a run: left out
    runs = curves.main([str(grid)])
    assert [r['dir'] for r in runs] == [f'{grid}/a', f'{grid}/b']


def test_x_the_log_lacks(tmp_path):
    # a ViT's log counts images, not tokens
    run = tmp_path / 'vit'
    run.mkdir()
    (run / 'log.jsonl').write_text(json.dumps(dict(event='eval', iter=0, train_loss=2.3,
                                                   val_loss=2.3, images=0, epochs=0.0)) + '\n')
    want = "records have no 'tokens': choose --x from iter, images, epochs"
    with pytest.raises(SystemExit, match=want):
        curves.main([str(run), '--x=tokens'])
