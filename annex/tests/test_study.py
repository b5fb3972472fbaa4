"""annex/study.py and annex/report.py: the report's numbers recomputed by hand on synthetic run folders,
the grid runner on tiny real runs (skip, resume, divergence, failure, shards), the screen end to end, the
command line, and bad grid files."""
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch

import train
from annex import report, study
from configurator import configure
from data.common import read_log

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, eval_iters=2, log_interval=1,
            learning_rate=1e-2, warmup_iters=2, lr_decay_iters=40, min_lr=1e-3)


def t_pvalue(t, df):
    """Two-sided p of Student's t, closed forms for 1 and 2 degrees of freedom."""
    return 1 - 2 / math.pi * math.atan(abs(t)) if df == 1 else 1 - abs(t) / math.sqrt(2 + t * t)


def test_paired_t_and_auc_by_hand():
    for a, b in (([3.1, 3.5], [3.0, 3.2]), ([1.0, 2.0, 4.5], [0.5, 2.2, 3.0])):
        d = [x - y for x, y in zip(a, b)]
        m = sum(d) / len(d)
        sd = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1))
        t = m / (sd / math.sqrt(len(d)))
        res = report.paired_t(a, b)
        assert res['t'] == pytest.approx(t) and res['mean_diff'] == pytest.approx(m)
        assert res['p'] == pytest.approx(t_pvalue(t, len(d) - 1), abs=1e-10)
    # t tables: the 97.5% point of 3, 4 and 10 degrees of freedom gives p = 0.05
    for t, n in ((3.182446, 4), (2.776445, 5), (2.228139, 11)):
        d = np.linspace(-1, 1, n)
        d = d - d.mean() + t * d.std(ddof=1) / math.sqrt(n)  # a sample whose t statistic is exactly t
        assert report.paired_t(d, np.zeros(n))['p'] == pytest.approx(0.05, abs=1e-5)
    assert report.paired_t([1.0], [0.0])['p'] is None
    scores, labels = [0.9, 0.4, 0.4, 0.1, 0.7], [True, True, False, False, False]
    pairs = [(p, n) for p, y in zip(scores, labels) if y for n, z in zip(scores, labels) if not z]
    assert report.auc(scores, labels) == sum(1.0 if p > n else 0.5 if p == n else 0.0
                                             for p, n in pairs) / len(pairs)
    assert report.auc([0.5, 0.6], [True, True]) is None


def test_leave_one_scale_out_on_separable_cells():
    # each scale alone is one class; the published 0.43 fits it perfectly and predicts the other scale
    # right
    items = [('a', 0.1, False), ('a', 0.2, False), ('b', 0.5, True), ('b', 0.6, True)]
    assert report.rule_stats(items, 0.43)['loso'] == 1.0
    # a threshold the other scale contradicts: fitted on b (0.45 hurts, 0.7 helps) -> 0.575; a's 0.5 then
    # predicted to hurt although it helps; fitted on a (0.3 hurts, 0.5 helps) -> 0.43 (tie with 0.4); b:
    # 0.45 wrong, 0.7 right
    items = [('a', 0.3, False), ('a', 0.5, True), ('b', 0.45, False), ('b', 0.7, True)]
    assert report.rule_stats(items, 0.43)['loso'] == 0.5


# -------------------------------------------------------------------------- the report on synthetic runs
# DyT seed-mean saturations and whether DyT helps, chosen so that the rule's figures are known by hand:
# threshold 0.43 is right on 3 of 4 cells (64m/1M, 64m/all, 124m/all; wrong on 124m/1M) -> accuracy 0.75;
# helps: {0.60 right, 0.38 wrong} -> TPR 0.5, hurts: both right -> balanced accuracy 0.75;
# AUC: positives {0.60, 0.38} vs negatives {0.40, 0.20}: 3 of 4 pairs ordered -> 0.75;
# leave-one-scale-out: 124m alone fits 0.29 (64m: 0.60 right, 0.40 wrong), 64m alone is fitted as well by
# 0.43 as by 0.50 and keeps 0.43 (124m: 0.38 wrong, 0.20 right) -> 2 of 4 = 0.5.
SAT = {('64m', '1M'): (0.60, True), ('64m', 'all'): (0.40, False), ('124m', '1M'): (0.38, True),
       ('124m', 'all'): (0.20, False)}


def write_run(root, scale, budget, variant, seed, final, best, sat=None, train_loss=1.0, data_dir='',
              **summary):
    name = f'{scale}_{study.label(budget)}_{variant}_s{seed}'
    d = os.path.join(root, name)
    os.makedirs(d)
    sats = None if sat is None else [min(1.0, sat * k) for k in (1.8, 1.5, 1.2, 1.0, 0.8, 0.6)]
    cfg = dict(dataset='tiny', data_dir=data_dir, train_tokens=budget,
               norm='dyt' if 'dyt' in variant else 'layernorm')
    with open(os.path.join(d, 'cell.json'), 'w') as f:
        json.dump(dict(name=name, scale=scale, budget=budget, variant=variant, seed=seed, args=[],
                       screen_steps=50), f)
    with open(os.path.join(d, 'log.jsonl'), 'w') as f:
        for it in (0, 50, 100):  # the screen's saturation (step 50) is 0.9x the final one
            f.write(json.dumps(dict(event='eval', iter=it, val_loss=final,
                                    saturation=None if sats is None else
                                    [s * (0.9 if it == 50 else 1.0) for s in sats])) + '\n')
    with open(os.path.join(d, 'summary.json'), 'w') as f:
        json.dump(dict(dict(final_val_loss=final, best_val_loss=best, best_iter=50, final_iter=100,
                            n_params=1000, final_train_loss=train_loss, saturation=sats, diverged=False,
                            diverged_reason=None, config=cfg), **summary), f)
    return d


@pytest.fixture
def synthetic(tmp_path):
    """Two scales x two budgets x {ln, dyt} x seeds {1, 2}, plus a collapsed, a diverged and a failed
    run."""
    data = tmp_path / 'data'
    data.mkdir()
    tokens = np.random.default_rng(3).integers(0, 50, 3000).astype(np.uint16)
    tokens.tofile(data / 'train.bin')
    (data / 'meta.json').write_text('{"vocab_size": 50}')
    root, rng, losses = str(tmp_path / 'grid'), np.random.default_rng(0), {}
    for (scale, budget), (sat, helps) in SAT.items():
        for seed in (1, 2):
            ln = 4 + rng.random()
            dyt = ln * (0.9 if helps else 1.1) + 0.05 * rng.random()
            losses[scale, budget, seed] = (ln, ln - 0.3, dyt, dyt - 0.1)
            n = 1_000_000 if budget == '1M' else None
            write_run(root, scale, n, 'ln', seed, ln, ln - 0.3, data_dir=str(data))
            write_run(root, scale, n, 'dyt', seed, dyt, dyt - 0.1, sat + (0.01 if seed == 1 else -0.01),
                      data_dir=str(data))
    # 64m/1M dyt seed 3 collapsed: train loss at the unigram entropy of the budget (the whole token file)
    entropy = -sum(c / 3000 * math.log(c / 3000) for c in Counter(tokens.tolist()).values())
    write_run(root, '64m', 1_000_000, 'dyt', 3, 1.0, 1.0, 0.99, train_loss=entropy - 0.02,
              data_dir=str(data))
    write_run(root, '64m', None, 'ln', 3, 0.5, 0.5, diverged=True,
              diverged_reason='non-finite loss at iter 7')
    d = write_run(root, '124m', None, 'dyt', 3, 0.1, 0.1, 0.9)
    os.remove(os.path.join(d, 'summary.json'))
    with open(os.path.join(d, 'failed.json'), 'w') as f:
        json.dump(dict(attempts=2, returncode=1, output_tail='boom'), f)
    return root, losses, entropy


def test_report_numbers_by_hand(synthetic, capsys):
    root, losses, entropy = synthetic
    rep = study.main(['report', root, '--bootstrap=300', '--seed=5'])
    status = {r['name']: r['status'] for r in rep['runs']}
    assert status.pop('64m_1M_dyt_s3') == 'collapsed' and status.pop('64m_all_ln_s3') == 'diverged'
    assert status.pop('124m_all_dyt_s3') == 'failed' and set(status.values()) == {'finished'}
    collapsed = next(r for r in rep['runs'] if r['name'] == '64m_1M_dyt_s3')
    assert collapsed['unigram_entropy'] == pytest.approx(entropy)
    groups = {(g['scale'], g['budget'], g['variant']): g for g in rep['groups']}
    for scale, budget in SAT:
        ln, ln_best, dyt, dyt_best = (np.array([losses[scale, budget, s][k] for s in (1, 2)])
                                      for k in range(4))
        g, b = groups[scale, budget, 'dyt'], groups[scale, budget, 'ln']
        # the collapsed, diverged, failed seed 3 left out
        assert (g['n'], b['n'], g['seeds']) == (2, 2, [1, 2])
        assert (g['final'] == pytest.approx(dyt.mean())
                and g['final_std'] == pytest.approx(abs(dyt[0] - dyt[1]) / 2 ** 0.5))
        assert b['best'] == pytest.approx(ln_best.mean())
        assert g['change_final'] == pytest.approx(100 * (dyt.mean() - ln.mean()) / ln.mean())
        assert g['change_best'] == pytest.approx(100 * (dyt_best.mean() - ln_best.mean())
                                                 / ln_best.mean())
        assert g['seed_change_final'] == pytest.approx(list(100 * (dyt - ln) / ln))
        d = dyt - ln
        t = d.mean() / (abs(d[0] - d[1]) / 2 ** 0.5 / 2 ** 0.5)
        assert (g['paired_final']['t'] == pytest.approx(t)
                and g['paired_final']['p'] == pytest.approx(t_pvalue(t, 1)))
        assert (g['sat'] == pytest.approx(SAT[scale, budget][0])
                and g['screen_sat'] == pytest.approx(0.9 * g['sat']))
    rule = rep['rule']['final_sat/final']
    assert (rule['n'], rule['accuracy'], rule['balanced_accuracy'], rule['auc'], rule['loso']) == (
        4, 0.75, 0.75, 0.75, 0.5)
    # the bootstrap, by hand: resample the 4 items with default_rng(seed), one integers(0, 4, 4) per
    # resample; the items in the report's order
    items = [(g['scale'], *SAT[g['scale'], g['budget']]) for g in rep['groups'] if g['variant'] == 'dyt']
    rng, acc, aucs = np.random.default_rng(5), [], []
    for _ in range(300):
        sample = [items[i] for i in rng.integers(0, 4, 4)]
        acc.append(sum((sat > 0.43) == helps for _, sat, helps in sample) / 4)
        pos = [sat for _, sat, h in sample if h]
        neg = [sat for _, sat, h in sample if not h]
        if pos and neg:
            aucs.append(sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg)))
    assert rule['accuracy_ci'] == pytest.approx(list(np.percentile(acc, [2.5, 97.5])))
    assert rule['auc_ci'] == pytest.approx(list(np.percentile(aucs, [2.5, 97.5])))
    # step-50 saturation is 0.9x the final: 0.36 no longer clears 0.43 at 64m/all (right), 0.54 still
    # does at 64m/1M
    assert rep['rule']['screen_sat/final']['accuracy'] == 0.75
    link = rep['screen_vs_final']
    assert link['n'] == 8 and link['pearson'] == pytest.approx(1.0) and link['same_side'] == 1.0
    # the study's figures beside ours, with the difference
    pub = {(p['figure'], p['scale'], p['budget'], p['variant']): p for p in rep['published']}
    p = pub['val_loss', '64m', '1M', 'dyt']
    assert p['published'] == 6.819 and p['ours'] == groups['64m', '1M', 'dyt']['final']
    assert p['difference'] == pytest.approx(p['ours'] - 6.819)
    assert pub['change_%', '124m', 'all', 'dyt']['published'] == 12.8
    md = open(os.path.join(root, 'report.md')).read()
    assert ('64m_1M_dyt_s3: **collapsed**' in md and 'non-finite loss at iter 7' in md
            and '124m_all_dyt_s3: **failed**' in md)
    assert os.path.exists(os.path.join(root, 'report.json'))
    # plots need the optional matplotlib; without it the report is written all the same
    assert (os.path.exists(os.path.join(root, 'signflip.png'))
            == bool(importlib.util.find_spec('matplotlib')))


# -------------------------------------------------------------------------- the runner on tiny real runs

def write_grid(path, data_dir, out_dir, **keys):
    scale = dict(TINY, max_iters=8, eval_interval=4, dataset='tiny', data_dir=data_dir)
    grid = dict(scales={'t': scale}, budgets=[5000], variants=['ln', 'dyt', 'boom', 'bad'], seeds=[1],
                out_dir=out_dir,
                custom_variants={
                    'boom': dict(learning_rate=1e6, grad_clip=0.0, decay_lr=False),  # diverges
                    'bad': dict(dataset='nodata', data_dir=None)})  # fails: no such dataset
    grid.update(keys)
    path.write_text(''.join(f'{k} = {v!r}\n' for k, v in grid.items()))
    return str(path)


def test_runner_skips_resumes_records_and_shards(tmp_path, data_dir, capsys):
    out = str(tmp_path / 'grid')
    path = write_grid(tmp_path / 'g.py', data_dir, out)
    _, cells = study.load_grid(path)
    assert [c['name'] for c in cells] == ['t_5K_ln_s1', 't_5K_dyt_s1', 't_5K_boom_s1', 't_5K_bad_s1']
    # the reference: the DyT cell uninterrupted; then the same cell preempted after its step-4 checkpoint
    assert study.run_cell(cells[1], str(tmp_path / 'ref')) == 'finished'
    assert study.run_cell(cells[1], f'{out}/t_5K_dyt_s1', extra=['--max_iters=4']) == 'finished'
    # as a kill after the checkpoint leaves it: ckpt.pt, no summary
    os.remove(f'{out}/t_5K_dyt_s1/summary.json')
    assert study.main(['run', path, '--shard=0/2', '--poll=0.2']) == 0  # ln and boom
    # shard 1/2 not touched
    assert sorted(os.listdir(out)) == ['t_5K_boom_s1', 't_5K_dyt_s1', 't_5K_ln_s1']
    assert study.main(['run', path, '--shard=1/2', '--poll=0.2']) == 1  # dyt (resumed) and bad (fails)
    assert ([study.status(f'{out}/{c["name"]}') for c in cells]
            == ['finished', 'finished', 'diverged', 'failed'])
    failed = json.load(open(f'{out}/t_5K_bad_s1/failed.json'))
    assert (failed['attempts'] == 1 and failed['returncode'] == 1
            and 'python data/nodata/prepare.py' in failed['output_tail'])
    assert 'non-finite' in json.load(open(f'{out}/t_5K_boom_s1/summary.json'))['diverged_reason']
    ref, got = (read_log(f'{d}/log.jsonl', lambda r: r['event'] == 'eval')
                for d in (tmp_path / 'ref', f'{out}/t_5K_dyt_s1'))
    assert [(r['iter'], r['val_loss']) for r in ref] == [(r['iter'], r['val_loss']) for r in got]
    wa, wb = (torch.load(f'{d}/ckpt.pt', weights_only=True)['model']
              for d in (tmp_path / 'ref', f'{out}/t_5K_dyt_s1'))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # a second run skips what is finished or diverged, retries the failure once more, and a third gives
    # up on it
    stamps = {c['name']: os.path.getmtime(f"{out}/{c['name']}/summary.json") for c in cells[:3]}
    capsys.readouterr()
    assert study.main(['run', path, '--poll=0.2']) == 1
    assert '3 already finished, diverged or given up; 1 to run' in capsys.readouterr().out
    assert stamps == {c['name']: os.path.getmtime(f"{out}/{c['name']}/summary.json") for c in cells[:3]}
    assert json.load(open(f'{out}/t_5K_bad_s1/failed.json'))['attempts'] == 2
    assert study.main(['run', path]) == 1
    assert '4 already finished, diverged or given up; 0 to run' in capsys.readouterr().out


def test_shards_cover_the_grid_without_overlap(tmp_path, data_dir):
    path = write_grid(tmp_path / 'g.py', data_dir, str(tmp_path / 'o'), budgets=[1000, 2000, None],
                      seeds=[1, 2, 3],
                      scales={'a': dict(n_embd=32, n_head=2), 'b': dict(n_embd=64, n_head=2)})
    _, cells = study.load_grid(path)
    names = [c['name'] for c in cells]
    assert len(names) == len(set(names)) == 2 * 3 * 4 * 3
    for n in (1, 5, 7, 72, 100):
        shards = [[c['name'] for c in study.shard_of(cells, f'{i}/{n}')] for i in range(n)]
        assert sorted(sum(shards, [])) == sorted(names)
    for bad in ('2/2', '1', 'a/b', '-1/3'):
        with pytest.raises(SystemExit, match='must be i/n'):
            study.shard_of(cells, bad)


@pytest.mark.parametrize('text, message', [
    ("scales = {'t': {}}\nbudgets = [1000]\nvariants = ['dyt', 'DyT']", "unknown variant 'DyT'"),
    ("scales = {'t': {}}\nbudgets = []\nvariants = ['dyt']", "'budgets' is missing or empty"),
    ("scales = {'t': {}}\nbudgets = [1000]\nvariants = ['dyt']\nseed = [1]", "unknown grid key 'seed'"),
    ("scales = {'t': {}}\nbudgets = [1000]\nvariants = ['dyt']\nseeds = 1", "'seeds' must be a list"),
    ("scales = {'t': {}}\nbudgets = [-5]\nvariants = ['dyt']", 'budgets must be positive ints'),
    ("scales = {'t': {'n_head': 3}}\nbudgets = [1000]\nvariants = ['ln']",
     'cell t_1K_ln_s1337: n_embd=128 must be divisible'),
    ("scales = {'t': {}}\nbudgets = [1000]\nvariants = ['ln']\noverrides = {'learning_rat': 1e-3}",
     "unknown config key 'learning_rat'.*learning_rate"),
    ("scales = {'t': {}}\nbudgets = [1000]\nvariants = ['ln']\noverrides = {'seed': 3}",
     'the runner sets seed'),
    ("scales = {'t': 'config/nope.py'}\nbudgets = [1000]\nvariants = ['ln']",
     "config file '.*nope.py' not found")])
def test_bad_grid_files_fail_before_anything_runs(tmp_path, text, message):
    path = tmp_path / 'bad.py'
    path.write_text(text + f"\nout_dir = '{tmp_path / 'out'}'\n")
    with pytest.raises(SystemExit, match=message):
        study.main(['run', str(path)])
    assert not (tmp_path / 'out').exists()


def test_the_repositorys_grids(monkeypatch):
    monkeypatch.chdir(ROOT)
    grid, cells = study.load_grid('config/grid_64m.py')
    assert len(cells) == 1 * 4 * 3 * 3 and grid['out_dir'] == 'out/grid_64m'
    for cell in cells:  # the study's protocol (config/study.py), its variants, budgets and seeds
        cfg = configure(train.DEFAULTS, cell['args'], train.OPTIONAL_TYPES)
        assert (cfg['n_layer'], cfg['n_head'], cfg['n_embd'], cfg['max_iters'], cfg['dataset']) == (
            12, 8, 512, 5000, 'wikitext103')
        assert cfg['norm'] == {'ln': 'layernorm', 'dyt': 'dyt', 'diff': 'layernorm'}[cell['variant']]
        assert cfg['attn'] == ('diff' if cell['variant'] == 'diff' else 'standard')
        assert cfg['norm'] != 'dyt' or cfg['dyt_alpha'] == 2.0
        assert (cfg['train_tokens'], cfg['seed']) == (cell['budget'], cell['seed'])
    assert {c['budget'] for c in cells} == {1_000_000, 10_000_000, 50_000_000, None}
    _, cells = study.load_grid('config/grid_scales.py')
    lrs = {c['scale']: configure(train.DEFAULTS, c['args'], train.OPTIONAL_TYPES)['learning_rate']
           for c in cells}
    assert lrs == {'124m': 3e-4, '354m': 3e-4, '1.3b': 1e-4, '3.78b': 1e-4}
    grid, cells = study.load_grid('config/grid_64m_derf.py')  # Derf beside the 64m row, in its folder
    assert len(cells) == 4 * 3 and grid['out_dir'] == 'out/grid_64m'
    for cell in cells:
        cfg = configure(train.DEFAULTS, cell['args'], train.OPTIONAL_TYPES)
        assert (cfg['n_embd'], cfg['max_iters'], cfg['norm'], cfg['dyt_alpha'], cfg['attn']) == (
            512, 5000, 'derf', 2.0, 'standard')
    assert report.baseline('derf') == 'ln'
    grid, cells = study.load_grid('config/grid_mini.py')
    assert (len(grid['budgets']) >= 3 and {'ln', 'dyt'} <= set(grid['variants'])
            and len(grid['seeds']) >= 2)


def test_screen_end_to_end(tmp_path, data_dir, capsys, monkeypatch):
    # a config file given by a path relative to where the user is, not to the repository
    (tmp_path / 'tiny_dyt.py').write_text(''.join(f'{k} = {v!r}\n' for k, v in TINY.items())
                                          + f"dataset = 'tiny'\ndata_dir = {data_dir!r}\nnorm = 'dyt'\n"
                                          "dyt_alpha = 2.0\n")
    monkeypatch.chdir(tmp_path)
    args = ['tiny_dyt.py', '--train_tokens=5000']
    reports = tmp_path / 'r' / 'report.json'
    reports.parent.mkdir()
    reports.write_text(json.dumps({'rule': {'screen_sat/final': dict(
        accuracy=0.8, accuracy_ci=[0.5, 1.0], n=10, auc=0.7, screen_steps=500)}}))
    res = study.main(['screen', *args, '--screen_steps=6', '--compare=True',
                      f'--screen_dir={tmp_path / "s"}', f'--reports={tmp_path}/*/report.json'])
    out = capsys.readouterr().out
    dyt, ln = (read_log(tmp_path / 's' / n / 'log.jsonl', lambda r: r['event'] == 'eval')[-1]
               for n in ('dyt', 'layernorm'))
    assert dyt['iter'] == ln['iter'] == 6
    assert (res['saturation'] == dyt['saturation'][3] and dyt['thresholds'][3] == 2.0
            and 0 <= res['saturation'] <= 1)
    assert res['early_gap_%'] == pytest.approx(100 * (dyt['val_loss'] - ln['val_loss']) / ln['val_loss'])
    assert json.load(open(tmp_path / 's' / 'screen.json'))['saturation'] == res['saturation']
    assert 'DyT expected to' in out and '75% in-sample' in out and 'right on 80% of 10 cells' in out
    # reruns reuse the finished screening runs; the threshold decides the prediction
    stamp = os.path.getmtime(tmp_path / 's' / 'dyt' / 'summary.json')
    for threshold, prediction, words in ((-0.01, 'help', 'DyT expected to HELP'),
                                         (1.0, 'hurt', 'DyT expected to HURT')):
        res = study.main(['screen', *args, '--screen_steps=6', f'--screen_dir={tmp_path / "s"}',
                          f'--threshold={threshold}'])
        assert res['prediction'] == prediction and words in capsys.readouterr().out
    assert os.path.getmtime(tmp_path / 's' / 'dyt' / 'summary.json') == stamp
    # other settings in the same folder are refused, not silently reused
    with pytest.raises(SystemExit, match='holds a screening run with other settings'):
        study.main(['screen', *args, '--screen_steps=4', f'--screen_dir={tmp_path / "s"}'])
    with pytest.raises(SystemExit,
                       match="the screen trains a DyT configuration; this one has norm='layernorm'"):
        study.main(['screen', *args, '--norm=layernorm'])
    assert not os.path.exists(tmp_path / 'out_screen')  # refused before anything ran



def test_screen_shows_progress_warnings_and_what_the_early_gap_is(tmp_path, data_dir, capsys,
                                                                    monkeypatch):
    """What a new user missed: progress while the runs train, every collapse warning of the runs, the
    early gap said to be the gap at step N (here still in warmup), and a folder beside out/."""
    (tmp_path / 'tiny_dyt.py').write_text(''.join(f'{k} = {v!r}\n' for k, v in TINY.items())
                                          + f"dataset = 'tiny'\ndata_dir = {data_dir!r}\nnorm = 'dyt'\n"
                                          "dyt_alpha = 1000.0\n")  # every norm layer saturated: warned
    monkeypatch.chdir(tmp_path)
    args = ['tiny_dyt.py', '--train_tokens=5000', '--warmup_iters=10', '--screen_steps=6']
    res = study.main(['screen', *args, '--compare=True', '--poll=0.01'])
    out = capsys.readouterr().out
    root = os.path.join('out_screen', 'tiny_dyt_5K_s1337')  # <config>_<budget>_s<seed>
    assert json.load(open(os.path.join(root, 'screen.json')))['saturation'] == res['saturation']
    assert not (tmp_path / 'out').exists()
    for norm in ('dyt', 'layernorm'):  # train.py's step records, while it runs
        assert f'{norm}: training 6 steps in {os.path.join(root, norm)}' in out
        assert re.search(rf'^    {norm}: iter [0-5], train loss \d+\.\d{{4}}$', out, re.M)
    warnings = [(norm, r['iter'], w) for norm in ('dyt', 'layernorm')
                for r in read_log(os.path.join(root, norm, 'log.jsonl'), lambda r: r['event'] == 'eval')
                for w in r['warnings']]
    assert len(warnings) >= 2 and all('norm layers saturated' in w for _, _, w in warnings)
    assert all(f'warning ({norm} run, step {it}): {w}' in out for norm, it, w in warnings)
    assert "early gap at step 6: val loss DyT" in out
    assert ("This is the gap at step 6 of the run's 300, still in warmup (10 steps): not the end-of-run "
            "change that the prediction is about") in out
    assert 'DyT expected to HELP (lower val loss than LayerNorm) at the end of the run' in out
    study.main(['screen', *args])  # a rerun reuses the run, and says so
    reused = f"dyt: reusing the finished 6-step run in {os.path.join(root, 'dyt')}"
    assert reused in capsys.readouterr().out


def test_command_line_help_and_typos(capsys):
    usages = [f'python annex/study.py {c}' for c in ('screen', 'run', 'report')]
    for command, key in (('screen', 'screen_steps = 500'), ('run', "shard = '0/1'"),
                         ('report', 'bootstrap = 2000')):
        with pytest.raises(SystemExit) as e:
            study.main([command, '--help'])
        out = capsys.readouterr().out
        assert e.value.code == 0 and key in out and all(u in out for u in usages)
        assert 'python annex/study.py screen --norm=dyt' in out  # the CPU-sized screen
    # the scripts, as the docstring runs them: from the repository root, no PYTHONPATH
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    for script in (['annex/study.py', 'screen', '--help'], ['annex/report.py', '--help']):
        proc = subprocess.run([sys.executable, *script], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0 and all(u in proc.stdout for u in usages), proc.stderr[-2000:]
    for argv, close in ((['run', 'g.py', '--shards=0/2'], 'shard'),
                        (['report', 'd', '--bootstrp=5'], 'bootstrap'),
                        (['screen', '--thresold=0.5'], 'threshold'),  # screen: its keys and train.py's
                        (['screen', '--max_iter=5'], 'max_iters')):
        with pytest.raises(SystemExit, match=f'did you mean {close}'):
            study.main(argv)
