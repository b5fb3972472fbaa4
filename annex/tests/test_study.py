"""annex/study.py and annex/report.py: the report's numbers recomputed by hand on synthetic run folders,
the grid runner on tiny real runs (skip, resume, divergence, failure, shards), the screen end to end, the
command line, and bad grid files."""
import importlib.util
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
import torch

import train
from annex import report, stats, study
from checkpoint import load_checkpoint
from configurator import configure
from annex.protocol import budget_tokens
from data.common import random_windows
from run_files import read_log
from tests.common import run_side_by_side

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, eval_samples=8, log_interval=1,
            learning_rate=1e-2, warmup_iters=2, lr_decay_iters=40, min_lr=1e-3)


def t_pvalue(t, df):
    """Two-sided p of Student's t, closed forms for 1 and 2 degrees of freedom."""
    return 1 - 2 / math.pi * math.atan(abs(t)) if df == 1 else 1 - abs(t) / math.sqrt(2 + t * t)


T975 = {1: math.tan(math.pi * 0.475), 2: 0.95 / math.sqrt(2 * 0.975 * 0.025)}  # t's 97.5%, closed forms


def test_leave_one_scale_out_on_separable_cells():
    # each scale alone is one class, so every threshold on one side of it fits it: the tie goes to
    # the smallest, whatever the threshold given. Fitted on b (all help) -> below all, 0.5 - 1: a's
    # two predicted to help, wrong; fitted on a (all hurt) -> above all, 1.2: b's two predicted to
    # hurt, wrong. Another tie-break gets each scale right: 0 to 4 of 4.
    items = [('a', 0.1, False), ('a', 0.2, False), ('b', 0.5, True), ('b', 0.6, True)]
    res = stats.rule_stats(items, 0.43)
    assert (res['loso'], res['loso_range']) == (0.0, [0.0, 1.0])
    # fitted on b (0.45 hurts, 0.7 helps) -> 0.575: a's 0.3 right, 0.5 wrong; fitted on a (0.3
    # hurts, 0.5 helps) -> 0.4: b's 0.45 wrong, 0.7 right. As well fitted: b by any t in [0.45, 0.7)
    # (a: 2 right below 0.5, 1 above), a by any t in [0.3, 0.5) (b: 1 right below 0.45, 2 above)
    items = [('a', 0.3, False), ('a', 0.5, True), ('b', 0.45, False), ('b', 0.7, True)]
    res = stats.rule_stats(items, 0.43)
    assert (res['loso'], res['loso_range']) == (0.5, [0.5, 1.0])


# -------------------------------------------------------------------------- the report on synthetic
# runs DyT seed-mean saturations and whether DyT helps, chosen so that the rule's figures are known
# by hand: threshold 0.43 is right on 3 of 4 cells (64m/1M, 64m/all, 124m/all; wrong on 124m/1M) ->
# accuracy 0.75; helps: {0.60 right, 0.38 wrong} -> TPR 0.5, hurts: both right -> balanced accuracy
# 0.75; AUC: positives {0.60, 0.38} vs negatives {0.40, 0.20}: 3 of 4 pairs ordered -> 0.75;
# leave-one-scale-out: 124m alone fits 0.29 (64m: 0.60 right, 0.40 wrong), 64m alone fits 0.50
# (124m: 0.38 wrong, 0.20 right) -> 2 of 4 = 0.5.
SAT = {('64m', '1M'): (0.60, True), ('64m', 'all'): (0.40, False), ('124m', '1M'): (0.38, True),
       ('124m', 'all'): (0.20, False)}


def write_run(root, scale, budget, variant, seed, final, best, sat=None, train_loss=1.0, data_dir='',
              tokens=6400, paper_val=0, **summary):
    name = f'{scale}_{study.label(budget)}_{variant}_s{seed}'
    d = os.path.join(root, name)
    os.makedirs(d)
    sats = None if sat is None else [min(1.0, sat * k) for k in (1.8, 1.5, 1.2, 1.0, 0.8, 0.6)]
    cfg = dict(dataset='tiny', data_dir=data_dir, train_tokens=budget, n_layer=2, n_head=2,
               n_embd=64 if scale == '124m' else 32, norm='dyt' if 'dyt' in variant else 'layernorm',
               paper_val=paper_val)
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
                            diverged_reason=None, config=cfg, tokens=tokens), **summary), f)
    return d


@pytest.fixture
def synthetic(tmp_path):
    """Two scales x two budgets x {ln, dyt} x seeds {1, 2}, plus a collapsed, a diverged and a failed
    run."""
    data = tmp_path / 'data'
    data.mkdir()
    tokens = np.random.default_rng(3).integers(0, 50, 3000).astype(np.uint16)
    tokens.tofile(data / 'train.bin')
    np.random.default_rng(4).integers(0, 60, 500).astype(np.uint16).tofile(data / 'val.bin')
    # ids 50-59 are only in val: unseen in train
    (data / 'meta.json').write_text('{"tokenizer": "byte", "vocab_size": 60}')
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


def unigram_on_val(data, budget):
    """The val loss of the budget's token frequencies, add-one smoothed: a loop over the val tokens."""
    train = np.fromfile(os.path.join(data, 'train.bin'), dtype=np.uint16)[:budget].tolist()
    val = np.fromfile(os.path.join(data, 'val.bin'), dtype=np.uint16).tolist()
    counts, vocab = Counter(train), json.load(open(os.path.join(data, 'meta.json')))['vocab_size']
    return -sum(math.log((counts[t] + 1) / (len(train) + vocab)) for t in val) / len(val)


def test_report_numbers_by_hand(synthetic, capsys):
    root, losses, entropy = synthetic
    rep = study.main(['report', root, '--bootstrap=300', '--seed=5'])
    status = {r['name']: r['status'] for r in rep['runs']}
    assert status.pop('64m_1M_dyt_s3') == 'collapsed' and status.pop('64m_all_ln_s3') == 'diverged'
    assert status.pop('124m_all_dyt_s3') == 'failed' and set(status.values()) == {'finished'}
    collapsed = next(r for r in rep['runs'] if r['name'] == '64m_1M_dyt_s3')
    assert collapsed['unigram_entropy'] == pytest.approx(entropy)
    groups = {(g['scale'], g['budget'], g['variant']): g for g in rep['groups']}
    data = os.path.join(os.path.dirname(root), 'data')
    for scale, budget in SAT:
        ln, ln_best, dyt, dyt_best = (np.array([losses[scale, budget, s][k] for s in (1, 2)])
                                      for k in range(4))
        g, b = groups[scale, budget, 'dyt'], groups[scale, budget, 'ln']
        # the collapsed, diverged, failed seed 3 left out of the means, but counted
        assert (g['n'], b['n'], g['seeds']) == (2, 2, [1, 2])
        assert (g['collapsed'], g['n_ended']) == ((1, 3) if (scale, budget) == ('64m', '1M') else (0, 2))
        assert (g['final'] == pytest.approx(dyt.mean())
                and g['final_std'] == pytest.approx(abs(dyt[0] - dyt[1]) / 2 ** 0.5))  # sample std
        assert b['best'] == pytest.approx(ln_best.mean())
        # the change over the seeds both have (1 and 2), in nats with the paired-t interval, and in %
        for key, ours, theirs in (('final', dyt, ln), ('best', dyt_best, ln_best)):
            e, d = g[f'effect_{key}'], ours - theirs
            half = T975[1] * abs(d[0] - d[1]) / 2 ** 0.5 / 2 ** 0.5
            assert e['seeds'] == [1, 2] and e['mean_diff'] == pytest.approx(d.mean())
            assert e['ci'] == pytest.approx([d.mean() - half, d.mean() + half])
            assert g[f'change_{key}'] == pytest.approx(100 * d.mean() / theirs.mean())
            assert e['pct_ci'] == pytest.approx([100 * (d.mean() - half) / theirs.mean(),
                                                 100 * (d.mean() + half) / theirs.mean()])
            assert e['lower'] == sum(d < 0) and 'holm' not in e  # no p-value family from 2 seeds
        d = dyt - ln
        t = d.mean() / (abs(d[0] - d[1]) / 2 ** 0.5 / 2 ** 0.5)
        assert g['effect_final']['p'] == pytest.approx(t_pvalue(t, 1))
        assert (g['sat'] == pytest.approx(SAT[scale, budget][0])
                and g['screen_sat'] == pytest.approx(0.9 * g['sat']))
        # tokens per parameter: the 3000-token file is the whole budget, and the runs saw 6400 tokens
        assert g['tokens_per_param'] == pytest.approx(3000 / 1000)
        assert g['val_unigram'] == pytest.approx(unigram_on_val(data, None))
    rule = {(r['norm'], r['analysis'], r['outcome'], r['predictor']): r for r in rep['rule']}
    pp = rule['dyt', 'per protocol', 'final', 'saturation (end)']
    assert (pp['n'], pp['correct'], pp['accuracy'], pp['balanced_accuracy'], pp['auc'], pp['loso']) == (
        4, 3, 0.75, 0.75, 0.75, 0.5)
    assert pp['accuracy_ci'] == pytest.approx([0.194120, 0.993691], abs=1e-6)  # exact, 3 of 4 (tables)
    # intention to treat: 64m/1M's collapsed seed counts, the cell "hurts", and its saturation is the
    # mean over its 3 runs, (0.61 + 0.59 + 0.99) / 3 = 0.73 > 0.43: a miss. 2 of 4 right.
    itt = rule['dyt', 'intention to treat', 'final', 'saturation (end)']
    assert (itt['n'], itt['correct']) == (4, 2)
    # the bootstrap resamples scales, by hand: default_rng(seed), one integers(0, 2, 2) per resample over
    # the sorted scales ['124m', '64m'], every cell of a drawn scale in
    right = {'64m': 2, '124m': 1}  # cells the rule gets right per scale (per protocol), of 2
    rng, acc = np.random.default_rng(5), []
    for _ in range(300):
        drawn = [['124m', '64m'][i] for i in rng.integers(0, 2, 2)]
        acc.append(sum(right[s] for s in drawn) / 4)
    assert pp['intervals']['accuracy'] == pytest.approx(list(np.percentile(acc, [2.5, 97.5])))
    # step-50 saturation is 0.9x the final: 0.36 no longer clears 0.43 at 64m/all (right), 0.54 still
    # does at 64m/1M
    assert rule['dyt', 'per protocol', 'final', 'saturation (step 50)']['accuracy'] == 0.75
    # the tokens-per-parameter baseline: every cell saw 3.0 tokens per parameter, so it cannot separate
    # them: the best it can do is "never helps", right on the 2 cells that hurt
    assert rule['dyt', 'per protocol', 'final', 'tokens/param (fitted)']['correct'] == 2
    link = rep['screen_vs_final']  # the collapsed run counts: 9 runs
    assert link['n'] == 9 and link['pearson'] == pytest.approx(1.0) and link['same_side'] == 1.0
    # the sign flip on 2 seeds: the smallest budget helps and the largest hurts in both, on both scales
    flips = {(f['scale'], f['variant']): f for f in rep['sign_flips']}
    assert flips['64m', 'dyt']['flipped'] == 2 and flips['124m', 'dyt']['seeds'] == 2
    # the study's figures beside ours, with the difference
    pub = {(p['figure'], p['scale'], p['budget'], p['variant']): p for p in rep['published']}
    p = pub['val_loss', '64m', '1M', 'dyt']
    assert p['published'] == 6.819 and p['ours'] == groups['64m', '1M', 'dyt']['final']
    assert p['difference'] == pytest.approx(p['ours'] - 6.819)
    assert pub['change_%', '124m', 'all', 'dyt']['published'] == 12.8
    md = open(os.path.join(root, 'report.md')).read()
    assert ('64m_1M_dyt_s3: **collapsed**' in md and 'non-finite loss at iter 7' in md
            and '124m_all_dyt_s3: **failed**' in md and '| 2 / 1 / 0 / 0 | 33% |' in md)
    saved = json.load(open(os.path.join(root, 'report.json')))  # what `screen` filters reports by
    assert saved['datasets'] == ['tiny'] and saved['shapes'] == [[2, 2, 32], [2, 2, 64]]
    # plots need the optional matplotlib; without it the report is written all the same
    assert (os.path.exists(os.path.join(root, 'signflip.png'))
            == bool(importlib.util.find_spec('matplotlib')))


def test_collapse_counted_tokens_seen_and_saturated_layers(tmp_path):
    """Near-unigram runs flagged and averaged; tokens per parameter capped by what a run saw; a cell
    whose DyT seeds all collapsed is absent per protocol and a miss by intention to treat."""
    data = tmp_path / 'data'
    data.mkdir()
    tokens = np.random.default_rng(1).integers(0, 40, 4000).astype(np.uint16)
    tokens.tofile(data / 'train.bin')
    tokens[:300].tofile(data / 'val.bin')
    (data / 'meta.json').write_text('{"tokenizer": "byte", "vocab_size": 40}')
    h = -sum(c / 4000 * math.log(c / 4000) for c in Counter(tokens.tolist()).values())
    root, d = str(tmp_path / 'grid'), str(data)
    full = [0.0, 0.0, 0.0, 0.995, 0.0, 0.0]  # over 99% of |f| > tanh(2): saturated
    for seed in (1, 2):  # 1M (the whole 4000-token file): LN overfits, DyT collapses in both seeds
        write_run(root, 'a', 1_000_000, 'ln', seed, 4.0, 3.5, data_dir=d, tokens=1200)
        write_run(root, 'a', 1_000_000, 'dyt', seed, 3.6, 3.6, 0.8, train_loss=h - 0.05, data_dir=d,
                  tokens=1200, saturation_layers={'h.0.ln_1': full, 'h.0.ln_2': [0.5] * 6})
        write_run(root, 'a', None, 'ln', seed, 3.0, 3.0, data_dir=d, tokens=9000,
                  train_loss=h - (0.3 if seed == 1 else 0.6))  # seed 1: 0.3 nats below: near unigram
        write_run(root, 'a', None, 'dyt', seed, 3.3, 3.3, 0.2, data_dir=d, tokens=9000,
                  saturation_layers={'h.0.ln_1': [0.99] * 6})
    write_run(root, 'a', None, 'dyt', 3, 9.9, 9.9, 0.2, data_dir=d, tokens=64, diverged=True,
              diverged_reason='non-finite loss')  # saw 64 tokens: not what the cell could see
    opts = dict(report.OPTIONS, screen_steps=50)
    rows = {r['name']: r for r in report.collect(root, opts)}
    assert rows['a_all_ln_s1']['near_unigram'] and rows['a_all_ln_s1']['status'] == 'finished'
    assert not rows['a_all_ln_s2']['near_unigram'] and rows['a_1M_dyt_s1']['status'] == 'collapsed'
    assert rows['a_1M_ln_s1']['tokens_per_param'] == pytest.approx(1200 / 1000)  # saw 1200 of 4000
    assert rows['a_all_ln_s1']['tokens_per_param'] == pytest.approx(4000 / 1000)  # 9000 = 2.25 epochs
    assert rows['a_1M_dyt_s1']['layers_saturated'] == 1 and rows['a_all_dyt_s1']['layers_saturated'] == 0
    groups = report.summarize(list(rows.values()))
    cells = {(g['budget'], g['variant']): g for g in groups}
    assert cells['1M', 'dyt']['collapse_rate'] == 1.0 and cells['1M', 'dyt']['n'] == 0
    assert cells['all', 'dyt']['tokens_per_param'] == pytest.approx(4.0)
    assert cells['all', 'dyt']['diverged'] == 1
    # the unigram level on val of a budget shorter than the file: the first 1000 tokens' frequencies
    ref = report.budget_reference('tiny', d, 1000)
    assert ref['val_unigram'] == pytest.approx(unigram_on_val(d, 1000))
    assert cells['all', 'ln']['near_unigram'] == 1 and cells['all', 'ln']['final'] == 3.0
    items = report.rule_items(groups, 'dyt')
    # per protocol the collapsed cell is not scored: no paired seeds
    assert [i.helps for i in items['per protocol', 'final']] == [None, False]
    # by intention to treat it is there: saturation 0.8 predicts "helps", the cell counts as "hurts"
    itt = items['intention to treat', 'final']
    assert [(i[0], i[4]) for i in itt] == [('a', False), ('a', False)]
    assert [i[1] for i in itt] == pytest.approx([0.8, 0.2])
    assert [i[3] for i in itt] == pytest.approx([1.2, 4.0])
    scored = report.score_rule(items['intention to treat', 'final'], dict(opts, bootstrap=10))
    sat = next(r for r in scored if r['predictor'] == 'saturation (end)')
    assert (sat['n'], sat['correct']) == (2, 1)


def test_unigram_levels_of_a_budget_docs_run_are_its_subsets(tmp_path):
    """A run with budget_docs (a seeded subset of whole documents) is measured on that subset, not on
    the prefix; the cache keeps the two apart."""
    data = tmp_path / 'data'
    data.mkdir()
    rng = np.random.default_rng(4)
    docs = [rng.integers(0, 20 if k % 2 else 39, size=n).tolist() + [39]  # half the documents: ids < 20
            for k, n in enumerate(rng.integers(5, 60, 80))]
    tokens = np.array(sum(docs, []), dtype=np.uint16)
    tokens.tofile(data / 'train.bin')
    tokens[:300].tofile(data / 'val.bin')
    (data / 'meta.json').write_text('{"tokenizer": "byte", "vocab_size": 40, "eot": 39}')
    root, d = str(tmp_path / 'grid'), str(data)
    write_run(root, 'a', 1000, 'ln', 1, 3.0, 3.0, data_dir=d)
    run = write_run(root, 'a', 1000, 'ln', 2, 3.0, 3.0, data_dir=d)
    path = tmp_path / 'grid' / os.path.basename(run) / 'summary.json'
    summary = json.loads(path.read_text())
    summary['config']['budget_docs'] = 3  # as train.py records it
    path.write_text(json.dumps(summary))
    rows = {r['seed']: r for r in report.collect(root, dict(report.OPTIONS, screen_steps=50))}
    for seed, budget in ((1, tokens[:1000]), (2, budget_tokens(tokens, 1000, 3, 39))):
        h = -sum(c / 1000 * math.log(c / 1000) for c in Counter(budget.tolist()).values())
        assert rows[seed]['unigram_entropy'] == pytest.approx(h)
    assert rows[1]['unigram_entropy'] != pytest.approx(rows[2]['unigram_entropy'])


def test_published_figures_beside_ours_say_what_is_comparable(tmp_path):
    """Losses under the study's protocol (paper_val, the paper layout) are compared with the published
    ones; ours on the fixed val set are shown but marked not comparable; known caveats are noted."""
    data = tmp_path / 'data'
    data.mkdir()
    np.arange(3000, dtype=np.uint16).tofile(data / 'train.bin')
    np.arange(500, dtype=np.uint16).tofile(data / 'val.bin')
    (data / 'meta.json').write_text('{"tokenizer": "gpt2", "vocab_size": 50257, "layout": "paper"}')
    root, d = str(tmp_path / 'grid'), str(data)
    paper = {('ln', 1): 9.3, ('ln', 2): 9.5, ('dyt', 1): 6.8, ('dyt', 2): 6.7}
    for (variant, seed), loss in paper.items():  # 64m/1M under the study's protocol
        write_run(root, '64m', 1_000_000, variant, seed, 3.0, 3.0, data_dir=d, paper_val=3200,
                  final_val_loss_paper=loss)
        write_run(root, '124m', 10_000_000, variant, seed, 4.0 + (variant == 'ln'), 4.0, data_dir=d)
        write_run(root, '64m', None, 'diff' if variant == 'dyt' else 'ln', seed, 3.5, 3.5, data_dir=d)
    rep = study.main(['report', root, '--analysis=False', '--bootstrap=10'])
    pub = {(p['figure'], p['scale'], p['budget'], p['variant']): p for p in rep['published']}
    p = pub['val_loss', '64m', '1M', 'dyt']
    assert p['protocol'] == 'paper' and p['ours'] == pytest.approx(6.75) and not p['notes']
    p = pub['change_%', '64m', '1M', 'dyt']
    assert p['ours'] == pytest.approx(100 * (6.75 - 9.4) / 9.4) and p['protocol'] == 'paper'
    p = pub['change_%', '124m', '10M', 'dyt']  # -20% on our fixed val: not comparable, and disputed
    assert p['protocol'] == 'ours' and p['ours'] == pytest.approx(-20.0)
    assert 'not comparable' in p['notes'][0] and '+6.1% in crossover_predictor.json' in p['notes'][1]
    assert 'Differential Attention' in ' '.join(pub['val_loss', '64m', 'all', 'diff']['notes'])
    assert 'not comparable' in open(os.path.join(root, 'report.md')).read()


def test_effects_intervals_holm_and_the_sign_flip_by_hand(tmp_path):
    """Three seeds: the paired-t interval at 2 degrees of freedom, Holm over the table's comparisons and
    the intersection-union test of the sign flip, against closed forms."""
    root = str(tmp_path / 'grid')
    ln = {'1M': [5.0, 5.2, 4.9], 'all': [3.0, 3.1, 2.95]}
    dyt = {'1M': [4.6, 4.9, 4.7], 'all': [3.1, 3.15, 3.1]}
    for budget, n in (('1M', 1_000_000), ('all', None)):
        for k, seed in enumerate((1, 2, 3)):
            write_run(root, 's', n, 'ln', seed, ln[budget][k], ln[budget][k])
            write_run(root, 's', n, 'dyt', seed, dyt[budget][k], dyt[budget][k], 0.3)
    write_run(root, 's', 1_000_000, 'dyt', 4, 9.0, 9.0, 0.3)  # a seed LayerNorm lacks: in no change
    rep = study.main(['report', root, '--analysis=False', '--bootstrap=10'])
    groups = {g['budget']: g for g in rep['groups'] if g['variant'] == 'dyt'}
    assert groups['1M']['n'] == 4 and groups['1M']['effect_final']['seeds'] == [1, 2, 3]
    assert groups['1M']['change_final'] == pytest.approx(
        100 * (np.mean(dyt['1M']) - np.mean(ln['1M'])) / np.mean(ln['1M']))
    p, one_sided = {}, {}
    for budget in ('1M', 'all'):
        d = np.array(dyt[budget]) - np.array(ln[budget])
        m, sd = d.mean(), math.sqrt(sum((x - d.mean()) ** 2 for x in d) / 2)
        t = m / (sd / math.sqrt(3))
        e = groups[budget]['effect_final']
        half = T975[2] * sd / math.sqrt(3)
        assert e['ci'] == pytest.approx([m - half, m + half])
        p[budget] = t_pvalue(t, 2)
        cdf = 0.5 + t / (2 * math.sqrt(2 + t * t))  # Student's t CDF at 2 degrees of freedom
        one_sided[budget] = cdf if budget == '1M' else 1 - cdf  # lower at 1M, higher on all
        assert e['p'] == pytest.approx(p[budget])
    # Holm, two comparisons: the smaller p times 2, the larger times 1 but not below the first
    lo, hi = sorted(p, key=p.get)
    assert groups[lo]['effect_final']['holm'] == pytest.approx(min(1, 2 * p[lo]))
    assert groups[hi]['effect_final']['holm'] == pytest.approx(max(min(1, 2 * p[lo]), p[hi]))
    flip = rep['sign_flips'][0]
    assert (flip['small'], flip['large'], flip['flipped'], flip['seeds']) == ('1M', 'all', 3, 3)
    assert flip['p'] == pytest.approx(max(one_sided.values()))
    md = open(os.path.join(root, 'report.md')).read()
    assert f"{p[lo]:.3f} ({min(1, 2 * p[lo]):.3f})" in md


def test_a_zero_spread_comparison_stays_in_holm_s_family(tmp_path):
    """DyT equal to LayerNorm in every seed at 1M (zero spread, t's limit 0: p = 1) is a comparison
    like the others: Holm counts three, so the smallest p is multiplied by 3, not 2."""
    root = str(tmp_path / 'grid')
    ln = {1_000_000: [5.0, 5.2, 4.9], 10_000_000: [4.0, 4.1, 3.9], None: [3.0, 3.1, 2.95]}
    dyt = {1_000_000: [5.0, 5.2, 4.9], 10_000_000: [3.7, 3.9, 3.75], None: [3.1, 3.15, 3.1]}
    for budget in ln:
        for k, seed in enumerate((1, 2, 3)):
            write_run(root, 's', budget, 'ln', seed, ln[budget][k], ln[budget][k])
            write_run(root, 's', budget, 'dyt', seed, dyt[budget][k], dyt[budget][k], 0.3)
    rep = study.main(['report', root, '--analysis=False', '--bootstrap=10'])
    effects = {g['budget']: g['effect_final'] for g in rep['groups'] if g['variant'] == 'dyt'}
    assert (effects['1M']['p'], effects['1M']['holm'], effects['1M']['sd_diff']) == (1.0, 1.0, 0)
    p = {}
    for budget, name in ((10_000_000, '10M'), (None, 'all')):
        d = np.array(dyt[budget]) - np.array(ln[budget])
        t = d.mean() / (math.sqrt(sum((x - d.mean()) ** 2 for x in d) / 2) / math.sqrt(3))
        p[name] = t_pvalue(t, 2)
        assert effects[name]['p'] == pytest.approx(p[name])
    lo, hi = sorted(p, key=p.get)
    assert effects[lo]['holm'] == pytest.approx(min(1, 3 * p[lo]))  # 3 comparisons
    assert effects[hi]['holm'] == pytest.approx(max(min(1, 3 * p[lo]), min(1, 2 * p[hi])))


def test_the_sign_flip_is_judged_at_the_smallest_budget_when_every_dyt_seed_collapsed(tmp_path):
    """Scale s: every DyT seed collapsed at 1M (with a lower val loss than LayerNorm's, the fake
    win), helped at 10M and hurt on all: the flip is judged at 1M and all, not at 10M. Scale t: a
    collapsed or diverged side is the worse one, seed by seed, and two are neither."""
    root = str(tmp_path / 'grid')
    h = dict(unigram_entropy=6.0, budget_tokens=10 ** 6)  # train loss 5.95: collapsed, 1.0: not
    ln = {1_000_000: [7.0, 7.2, 6.9], 10_000_000: [4.0, 4.1, 3.9], None: [3.0, 3.1, 2.95]}
    dyt = {1_000_000: [6.0, 6.0, 6.1], 10_000_000: [3.7, 3.9, 3.75], None: [3.1, 3.15, 3.1]}
    for budget in ln:
        for k, seed in enumerate((1, 2, 3)):
            write_run(root, 's', budget, 'ln', seed, ln[budget][k], ln[budget][k], **h)
            write_run(root, 's', budget, 'dyt', seed, dyt[budget][k], dyt[budget][k], 0.6,
                      train_loss=5.95 if budget == 1_000_000 else 1.0, **h)
    # t, seed by seed (ITT sign at 1M, at all): 1: LN diverged, DyT finished (better) / DyT
    # collapsed (worse): a flip; 2: both collapsed (neither) / DyT higher (worse); 3: lower (better)
    # / lower
    for seed, small, large in ((1, ('diverged', 'finished'), ('finished', 'collapsed')),
                               (2, ('collapsed', 'collapsed'), ('finished', 'finished')),
                               (3, ('finished', 'finished'), ('finished', 'finished'))):
        for budget, sides in ((1_000_000, small), (None, large)):
            for variant, side, loss in zip(('ln', 'dyt'), sides, (4.0, 4.2 if seed == 2 else 3.8)):
                sat = 0.6 if variant == 'dyt' else None
                write_run(root, 't', budget, variant, seed, loss, loss, sat,
                          train_loss=5.95 if side == 'collapsed' else 1.0,
                          diverged=side == 'diverged', diverged_reason='non-finite loss', **h)
    rep = study.main(['report', root, '--analysis=False', '--bootstrap=10'])
    flips = {f['scale']: f for f in rep['sign_flips']}
    f = flips['s']
    assert (f['small'], f['large']) == ('1M', 'all')
    assert (f['itt_better'], f['itt_small_n'], f['itt_worse'], f['itt_large_n']) == (0, 3, 3, 3)
    assert (f['itt_flipped'], f['itt_seeds']) == (0, 3)
    # per protocol: no paired seed at 1M, so no flip to count and no p
    assert (f['small_pct'], f['flipped'], f['seeds'], f['p']) == (None, 0, 0, None)
    assert f['large_pct'] == pytest.approx(100 * (np.mean(dyt[None]) - np.mean(ln[None]))
                                           / np.mean(ln[None]))
    f = flips['t']
    assert (f['itt_better'], f['itt_small_n'], f['itt_worse'], f['itt_large_n']) == (2, 3, 2, 3)
    assert (f['itt_flipped'], f['itt_seeds']) == (1, 3)
    # per protocol, seed 3 alone finished on both sides at both budgets
    assert (f['seeds'], f['flipped']) == (1, 0)
    md = open(os.path.join(root, 'report.md')).read()
    assert '| s | dyt | 1M, all | 0 of 3 | 3 of 3 | 0 of 3 | - |' in md


def test_unpaired_cells_paired_saturation_and_tied_thresholds(tmp_path):
    """a/10M: DyT seeds 3 and 4 against LayerNorm's 1 and 2, nothing collapsed: not scored either
    way (it used to "hurt" by intention to treat). b/all: DyT's unpaired seed 3 (saturation 0.95) is
    not in the per-protocol saturation. The other four cells are one class per scale for both
    predictors, so leave-one-scale-out's refits are all ties, broken the same way for both."""
    root = str(tmp_path / 'grid')
    # DyT's loss, saturation and tokens seen, per cell
    cells = {('a', 1_000_000): (5.5, 0.1, 400), ('a', None): (4.4, 0.2, 300),
             ('b', 1_000_000): (4.5, 0.6, 100), ('b', None): (3.6, 0.5, 200)}
    h = dict(budget_tokens=10 ** 6)
    for (scale, budget), (loss, sat, tokens) in cells.items():
        for seed in (1, 2):
            ln = 5.0 if budget else 4.0
            write_run(root, scale, budget, 'ln', seed, ln, ln, tokens=tokens, **h)
            spread = 0.01 if seed == 1 else -0.01
            write_run(root, scale, budget, 'dyt', seed, loss, loss, sat + spread, tokens=tokens,
                      **h)
    write_run(root, 'b', None, 'dyt', 3, 3.6, 3.6, 0.95, tokens=200, **h)
    for seed in (1, 2):
        write_run(root, 'a', 10_000_000, 'ln', seed, 4.5, 4.5, tokens=250, **h)
        write_run(root, 'a', 10_000_000, 'dyt', seed + 2, 4.6, 4.6, 0.9, tokens=250, **h)
    rep = study.main(['report', root, '--analysis=False', '--bootstrap=10'])
    groups = {(g['scale'], g['budget'], g['variant']): g for g in rep['groups']}
    assert groups['b', 'all', 'dyt']['sat_paired'] == pytest.approx(0.5)  # seeds 1 and 2
    assert groups['b', 'all', 'dyt']['sat'] == pytest.approx((0.51 + 0.49 + 0.95) / 3)
    rule = {(r['analysis'], r['outcome'], r['predictor']): r for r in rep['rule']}
    for analysis in ('per protocol', 'intention to treat'):
        sat = rule[analysis, 'final', 'saturation (end)']
        # a/1M 0.1 and a/all 0.2 hurt, b/1M 0.6 and b/all 0.5 (ITT 0.65) help: 0.43 right on all 4
        assert (sat['n'], sat['correct'], sat['not_scored']) == (4, 4, 1)
    # leave-one-scale-out: a left out, b (all help) is fitted as well by any threshold below 0.5 and
    # the smallest tie, 1 below all, predicts a helps: 0 of 2; b left out, a (all hurt) by any above
    # 0.2, the smallest tie 0.2 + 1: b hurts, 0 of 2. Tokens per parameter alike (a: T/P 0.4 and
    # 0.3, b: 0.1 and 0.2). Any other tie-break: 0 to 2 right in each fold.
    for predictor in ('saturation (end)', 'tokens/param (fitted)'):
        r = rule['per protocol', 'final', predictor]
        assert (r['loso'], r['loso_range']) == (0.0, [0.0, 1.0])
    md = open(os.path.join(root, 'report.md')).read()
    assert '| 0.00 [0.00, 0.00] | [0.00, 1.00] | 1 |' in md  # the bootstrap's interval, the range


def test_a_nonfinite_final_loss_is_set_apart(tmp_path):
    """DyT seed 4 at 1M ends with a NaN val loss (not called diverged): its own status, in no mean,
    no change and no p, so Holm's values are those of the two comparisons on seeds 1-3; the rule
    scores its cell by its change, not as "hurts"; report.json has no NaN."""
    root = str(tmp_path / 'grid')
    ln = {'1M': [5.0, 5.2, 4.9, 5.1], 'all': [3.0, 3.1, 2.95]}
    dyt = {'1M': [4.6, 4.9, 4.7, math.nan], 'all': [3.1, 3.15, 3.1]}
    for budget, n in (('1M', 1_000_000), ('all', None)):
        for k, loss in enumerate(ln[budget]):
            write_run(root, 's', n, 'ln', k + 1, loss, loss)
        for k, loss in enumerate(dyt[budget]):
            write_run(root, 's', n, 'dyt', k + 1, loss, 4.0 if math.isnan(loss) else loss, 0.5)
    rep = study.main(['report', root, '--analysis=False', '--bootstrap=10'])
    run = next(r for r in rep['runs'] if r['name'] == 's_1M_dyt_s4')
    assert run['status'] == 'nonfinite' and 'final val loss nan' in run['reason']
    g = {g['budget']: g for g in rep['groups'] if g['variant'] == 'dyt'}
    assert g['1M']['final'] == pytest.approx(np.mean(dyt['1M'][:3]))
    assert g['1M']['effect_final']['seeds'] == [1, 2, 3]
    p = {}
    for budget in ('1M', 'all'):
        d = np.array(dyt[budget][:3]) - np.array(ln[budget][:3])
        t = d.mean() / (math.sqrt(sum((x - d.mean()) ** 2 for x in d) / 2) / math.sqrt(3))
        p[budget] = t_pvalue(t, 2)
    lo, hi = sorted(p, key=p.get)
    assert g[lo]['effect_final']['holm'] == pytest.approx(min(1, 2 * p[lo]))
    assert g[hi]['effect_final']['holm'] == pytest.approx(max(min(1, 2 * p[lo]), p[hi]))
    itt = report.rule_items(rep['groups'], 'dyt')['intention to treat', 'final']
    assert [i.helps for i in itt] == [True, False]  # 1M: lower on seeds 1-3; all: higher
    with open(os.path.join(root, 'report.json')) as f:
        saved = json.load(f, parse_constant=lambda name: pytest.fail(f'{name} in report.json'))
    assert next(r for r in saved['runs'] if r['name'] == 's_1M_dyt_s4')['final'] is None
    assert 's_1M_dyt_s4: **nonfinite**' in open(os.path.join(root, 'report.md')).read()


def test_damaged_run_folders_are_named_with_what_to_do(tmp_path):
    """A torn summary.json (with and without a checkpoint), one without final_val_loss, one missing
    where the log says the run saved a checkpoint that is gone, one missing beside a checkpoint
    (never finished: partial), a torn log.jsonl line and a torn cell.json: each named, none a
    traceback."""
    root = tmp_path / 'grid'
    for variant in ('ln', 'dyt'):
        for seed in (1, 2, 3):
            sat = 0.5 if variant == 'dyt' else None
            write_run(str(root), 's', 1_000_000, variant, seed, 4.0, 4.0, sat)
    (root / 's_1M_ln_s1' / 'summary.json').write_text('{"final_val_loss": 3.')
    (root / 's_1M_ln_s1' / 'ckpt.pt').write_bytes(b'')
    (root / 's_1M_ln_s2' / 'summary.json').write_text('{"final_val_loss": 3.')
    summary = json.loads((root / 's_1M_dyt_s1' / 'summary.json').read_text())
    del summary['final_val_loss']
    (root / 's_1M_dyt_s1' / 'summary.json').write_text(json.dumps(summary))
    (root / 's_1M_dyt_s2' / 'summary.json').unlink()
    (root / 's_1M_dyt_s2' / 'ckpt.pt').write_bytes(b'')
    (root / 's_1M_dyt_s3' / 'summary.json').unlink()
    with open(root / 's_1M_dyt_s3' / 'log.jsonl', 'a') as f:
        f.write(json.dumps(dict(event='saved', iter=100)) + '\n')
    with open(root / 's_1M_ln_s3' / 'log.jsonl', 'a') as f:
        f.write('{"event": "eval", "it')  # line 4, cut short
    (root / 'broken').mkdir()
    (root / 'broken' / 'cell.json').write_text('{"name": ')
    rep = study.main(['report', str(root), '--analysis=False', '--bootstrap=10'])
    runs = {r['name']: r for r in rep['runs']}
    status = {name: r['status'] for name, r in runs.items()}
    assert status == {'s_1M_ln_s1': 'damaged', 's_1M_ln_s2': 'damaged', 's_1M_dyt_s1': 'damaged',
                      's_1M_dyt_s2': 'partial', 's_1M_dyt_s3': 'damaged', 's_1M_ln_s3': 'finished',
                      'broken': 'damaged'}
    summary = os.path.join(str(root), 's_1M_ln_s1', 'summary.json')
    assert runs['s_1M_ln_s1']['reason'].startswith(f'{summary} is not valid JSON')
    assert 'resumes from its checkpoint' in runs['s_1M_ln_s1']['reason']
    assert 'trains anew' in runs['s_1M_ln_s2']['reason']
    assert 'is incomplete: no final_val_loss' in runs['s_1M_dyt_s1']['reason']
    assert runs['s_1M_dyt_s2']['reason'].startswith('never finished')
    assert 'records a saved at iter 100' in runs['s_1M_dyt_s3']['reason']
    assert runs['s_1M_ln_s3']['log_problem'].startswith(
        f"{os.path.join(str(root), 's_1M_ln_s3')}/log.jsonl line 4 not a record")
    assert 'broken/cell.json is not valid JSON' in runs['broken']['reason']
    md = open(root / 'report.md').read()
    assert 'Runs: 1 finished, 5 damaged, 1 partial.' in md
    for name in status:
        assert f'- {name}: **' in md


PAPER = [('64m', '1M', 0.0156, 0.493, -27.3), ('64m', '10M', 0.156, 0.413, 5.9),
         ('64m', '50M', 0.781, 0.237, 19.7),
         ('64m', 'all', 1.84, 0.234, 18.8), ('124m', '1M', 0.0081, 0.466, -9.6),
         ('124m', '10M', 0.081, 0.292, -12.3), ('124m', 'all', 0.952, 0.193, 12.8),
         ('354m', '1M', 0.0028, 0.490, 4.3), ('354m', '10M', 0.028, 0.369, -24.1),
         ('354m', 'all', 0.333, 0.327, 13.4), ('1.3b', '1M', 0.0008, 0.393, 2.1),
         ('1.3b', 'all', 0.090, 0.238, 10.4)]
PAPER_OTHER = {('354m', '1M'): 0.500, ('354m', 'all'): 0.565}  # saturations in crossover_predictor.json


def test_published_cells_reproduce_the_rule_and_its_baseline(capsys):
    assert [tuple(c) for c in report.PAPER_CELLS] == PAPER  # the table typed in twice, checked once
    res = study.main(['report', '--published', '--bootstrap=200'])
    rows = {r['predictor']: r for r in res['predictor_validation.json']}
    sat, tp = rows['saturation (end)'], rows['tokens/param (stated)']
    assert (sat['correct'], sat['n'], sat['auc']) == (9, 12, 0.75)  # the study's 75% / AUC 0.75
    assert (tp['correct'], tp['auc']) == (10, 0.75)  # T/P <= 0.081 -> helps: 10 of 12, AUC 0.75
    assert rows['tokens/param (fitted)']['correct'] == 10
    assert -0.090 < rows['tokens/param (fitted)']['threshold'] < -0.081
    # the other artifact: 124m/10M hurts (+6.1%), 354m/1M and 354m/all more saturated
    other = {r['predictor']: r for r in res['crossover_predictor.json']}
    assert other['saturation (end)']['correct'] == 9  # 124m/10M now right, 354m/all (0.565) now wrong
    # and its refitted threshold 0.467 is right on 67%: 8 of 12, counted here by a loop
    right = sum((PAPER_OTHER.get(c[:2], c[3]) > 0.467) == (c[4] < 0 and c[:2] != ('124m', '10M'))
                for c in PAPER)
    assert other['saturation (its refit)']['correct'] == right == 8
    assert '9 of 12 = 75%' in capsys.readouterr().out


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


def train_cell(cell, cell_dir, *extra):
    """A cell trained as run_cell trains it (its cell.json, then train.py on the cell's arguments and
    --out_dir), but in this process: for a reference or a starting state, where the runner's own child
    process is not what a test checks."""
    os.makedirs(cell_dir, exist_ok=True)
    with open(os.path.join(cell_dir, 'cell.json'), 'w') as f:
        json.dump(cell, f)
    assert train.main([*cell['args'], *extra, f'--out_dir={os.path.abspath(cell_dir)}']) == 0


def test_runner_skips_resumes_records_and_shards(tmp_path, data_dir, capsys, monkeypatch):
    out = str(tmp_path / 'grid')
    path = write_grid(tmp_path / 'g.py', data_dir, out)
    _, cells = study.load_grid(path)
    assert [c['name'] for c in cells] == ['t_5K_ln_s1', 't_5K_dyt_s1', 't_5K_boom_s1', 't_5K_bad_s1']
    # the runner's train.py children on one thread, as this process's own runs (one_thread): the resumed
    # run is compared bit for bit with a reference trained here
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    # the reference: the DyT cell uninterrupted; then the same cell preempted after its step-4 checkpoint
    train_cell(cells[1], tmp_path / 'ref')
    train_cell(cells[1], f'{out}/t_5K_dyt_s1', '--max_iters=4')
    # as a kill after the checkpoint leaves it: ckpt.pt, no summary
    os.remove(f'{out}/t_5K_dyt_s1/summary.json')
    # ln and boom, side by side (each child its CUDA_VISIBLE_DEVICES); the runs below, one at a time
    assert study.main(['run', path, '--shard=0/2', '--gpus=0-1', '--poll=0.2']) == 0
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
    out_text = capsys.readouterr().out
    assert '3 already finished, diverged or given up; 1 to run' in out_text
    # the failure's cause on the screen, not only inside train.out
    assert re.search(r"t_5K_bad_s1: failed in \d+ s: error: dataset 'nodata' is not prepared: .*"
                     r"\(all of it: \S+/t_5K_bad_s1/train.out\)", out_text), out_text
    assert stamps == {c['name']: os.path.getmtime(f"{out}/{c['name']}/summary.json") for c in cells[:3]}
    assert json.load(open(f'{out}/t_5K_bad_s1/failed.json'))['attempts'] == 2
    assert study.main(['run', path]) == 1
    assert '4 already finished, diverged or given up; 0 to run' in capsys.readouterr().out


def test_a_failed_child_s_own_error_line(tmp_path):
    outputs = {  # train.py's own error; a traceback under torchrun; nothing of either
        "$ python train.py\nconfig: ...\nerror: dataset 'x' is not prepared\n":
            "error: dataset 'x' is not prepared",
        ('$ torchrun ...\n[rank1]: Traceback (most recent call last):\n[rank1]:   File "train.py"\n'
         '[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n'
         'torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n'
         'train.py FAILED\n'):
            'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB',
        '$ python train.py\nKilled\n': 'Killed'}
    for text, line in outputs.items():
        (tmp_path / 'train.out').write_text(text)
        assert study.last_error(str(tmp_path)) == line


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


@pytest.mark.parametrize('gpus, nproc, slots', [
    ('0-7', 1, [str(i) for i in range(8)]), ('0,2,5', 1, ['0', '2', '5']),
    ('0-3,6', 1, ['0', '1', '2', '3', '6']), ('0-7', 2, ['0,1', '2,3', '4,5', '6,7']),
    ('3,1', 2, ['3,1']), ('', 4, [None])])
def test_gpu_slots(gpus, nproc, slots):
    assert [s and s['CUDA_VISIBLE_DEVICES'] for s in study.gpu_slots(gpus, nproc)] == slots


@pytest.mark.parametrize('gpus, nproc', [('0-', 1), ('3-1', 1), ('a', 1), ('0,,1', 1), ('0-2-3', 1),
                                         ('-1', 1), ('0,0', 1), ('0-1,1', 1), ('0-2', 2)])
def test_bad_gpus_are_refused(gpus, nproc):
    with pytest.raises(SystemExit, match=f"--gpus='{gpus}'"):
        study.gpu_slots(gpus, nproc)


def test_gpus_dry_run_partitions_the_cells_over_slots(tmp_path, data_dir, capsys):
    """--gpus=0-3: 4 children, each with its own CUDA_VISIBLE_DEVICES, every cell once; nothing
    written."""
    out = str(tmp_path / 'o')
    path = write_grid(tmp_path / 'g.py', data_dir, out, budgets=[1000, 2000, None], seeds=[1, 2, 3])
    _, cells = study.load_grid(path)
    byname = {c['name']: c for c in cells}
    for gpus, nproc, devices in (('0-3', 1, ['0', '1', '2', '3']), ('0-3', 2, ['0,1', '2,3']),
                                 ('0-63', 1, [str(i) for i in range(64)])):  # more slots than cells
        capsys.readouterr()
        assert study.main(['run', path, f'--gpus={gpus}', f'--nproc={nproc}', '--dry_run=True']) == 0
        lines = re.findall(r'^slot (\d+): (\S+): CUDA_VISIBLE_DEVICES=(\S+) (.+)$',
                           capsys.readouterr().out, re.M)
        assert sorted(name for _, name, _, _ in lines) == sorted(byname)  # each cell once, none missing
        slots = {slot: {d for s, _, d, _ in lines if s == slot} for slot, _, _, _ in lines}
        assert sorted(slots, key=int) == [str(i) for i in range(min(len(devices), len(cells)))]
        assert all(slots[s] == {devices[int(s)]} for s in slots)  # one slot, one set of GPUs
        launcher = [sys.executable] + (['-m', 'torch.distributed.run', '--standalone',
                                        '--nproc_per_node=2'] if nproc == 2 else [])
        for _, name, _, command in lines:
            assert shlex.split(command) == [*launcher, 'train.py', *byname[name]['args'],
                                            f'--out_dir={os.path.abspath(os.path.join(out, name))}']
    assert not os.path.exists(out)


def test_cells_run_side_by_side_one_per_gpu(tmp_path, data_dir, capsys, monkeypatch):
    """A real --gpus=0-1 run on the CPU: two cells at a time, each child given its slot's
    CUDA_VISIBLE_DEVICES (train.out's first line), the failure recorded as before."""
    monkeypatch.setenv('OMP_NUM_THREADS', '1')  # two children side by side: a thread each
    out = str(tmp_path / 'grid')
    path = write_grid(tmp_path / 'g.py', data_dir, out, variants=['ln', 'dyt', 'bad'])
    assert study.main(['run', path, '--gpus=0-1', '--poll=0.2']) == 1
    text = capsys.readouterr().out
    assert [study.status(f'{out}/t_5K_{v}_s1') for v in ('ln', 'dyt', 'bad')] == [
        'finished', 'finished', 'failed']
    assert json.load(open(f'{out}/t_5K_bad_s1/failed.json'))['attempts'] == 1
    for variant, device in (('ln', '0'), ('dyt', '1'), ('bad', '0')):  # slot i: --shard=i/2 of the cells
        first = open(f'{out}/t_5K_{variant}_s1/train.out').readline()
        assert first.startswith(f'$ CUDA_VISIBLE_DEVICES={device} {sys.executable} train.py ')
        assert f'] t_5K_{variant}_s1 on GPU {device}\n' in text
    assert ', 2 running, 1 left] ' in text  # both slots busy at once
    assert re.search(r'\[[12]/3 done, [12] running, 0 left, ETA \d+\.\d min\] t_5K_bad_s1', text)
    assert re.search(r'^    t_5K_(ln|dyt)_s1: step \d, val loss \d\.\d{4}$', text, re.M)  # progress


def test_sigterm_stops_every_running_cell(tmp_path, data_dir, monkeypatch):
    """SIGTERM to the runner stops both running children at a step with a checkpoint: no failure
    recorded, both left to resume on a rerun."""
    monkeypatch.setenv('OMP_NUM_THREADS', '1')  # two children side by side: a thread each
    out = str(tmp_path / 'grid')
    long = dict(TINY, max_iters=10**6, eval_interval=2, dataset='tiny', data_dir=data_dir)
    path = write_grid(tmp_path / 'g.py', data_dir, out, variants=['ln', 'dyt'], scales={'t': long})
    proc = subprocess.Popen([sys.executable, 'annex/study.py', 'run', path, '--gpus=0,1', '--poll=0.2'],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ckpts = [f'{out}/t_5K_{v}_s1/ckpt.pt' for v in ('ln', 'dyt')]
    try:
        for _ in range(1200):  # both training: each has written a checkpoint
            if all(map(os.path.exists, ckpts)) or proc.poll() is not None:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        text = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    assert proc.returncode == 143, text
    for v in ('ln', 'dyt'):
        d = f'{out}/t_5K_{v}_s1'
        assert study.status(d) == 'partial' and not os.path.exists(f'{d}/failed.json'), text
        assert read_log(f'{d}/log.jsonl', lambda r: r['event'] == 'stopped'), text


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
    assert len(cells) == 4 * 3 * 2 and grid['out_dir'] == 'out/grid_64m'
    assert Counter(c['variant'] for c in cells) == {'derf': 12, 'derf_ref': 12}
    for cell in cells:  # matched to the study's DyT, or the Derf paper's recipe
        cfg = configure(train.DEFAULTS, cell['args'], train.OPTIONAL_TYPES)
        assert (cfg['n_embd'], cfg['max_iters'], cfg['norm'], cfg['attn']) == (
            512, 5000, 'derf', 'standard')
        ref = cell['variant'] == 'derf_ref'
        assert (cfg['dyt_alpha'], cfg['embed_scale']) == ((0.5, True) if ref else (2.0, False))
        assert ('--embed_scale=True' in cell['args'] and '--dyt_alpha=0.5' in cell['args']) == ref
    assert report.baseline('derf') == report.baseline('derf_ref') == 'ln'
    grid, cells = study.load_grid('config/grid_64m_paper.py')  # the 64m row under the study's protocol
    assert len(cells) == 36 and grid['out_dir'] == 'out/grid_64m_paper'
    for cell in cells:
        cfg = configure(train.DEFAULTS, cell['args'], train.OPTIONAL_TYPES)
        batch = cfg['batch_size'] * cfg['gradient_accumulation_steps']
        assert (cfg['data_dir'], cfg['paper_val'], batch, cfg['eval_samples']) == (
            'data/wikitext103/paper', 3200, 64, 400)  # 3200 = the study's 50 batches of 64
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
    rows = [dict(norm=norm, analysis=analysis, outcome='final', predictor=predictor, correct=correct,
                 accuracy=correct / 10, accuracy_ci=[0.5, 1.0], n=10, auc=0.7, screen_steps=500)
            for norm, analysis, predictor, correct in (  # only the first is the screen's row for DyT
                ('dyt', 'intention to treat', 'saturation (step 500)', 8),
                ('dyt', 'per protocol', 'saturation (step 500)', 9),
                ('derf', 'intention to treat', 'saturation (step 500)', 7),
                ('dyt', 'intention to treat', 'saturation (end)', 6))]
    reports.write_text(json.dumps(dict(rule=rows, datasets=['pydocs', 'tiny'], shapes=[[2, 2, 32]])))
    # reports of other data or another shape are skipped: their rule would say 10 of 10
    rows = [dict(r, correct=10, accuracy=1.0) for r in rows]
    for folder, datasets, shapes in (('d', ['pydocs'], [[2, 2, 32]]), ('e', ['tiny'], [[12, 8, 512]]),
                                     ('f', None, None)):  # f: a report from before the filter
        (tmp_path / folder).mkdir()
        (tmp_path / folder / 'report.json').write_text(json.dumps(
            {'rule': rows} | ({} if datasets is None else dict(datasets=datasets, shapes=shapes))))
    res = study.main(['screen', *args, '--screen_steps=6', '--compare=True',
                      f'--screen_dir={tmp_path / "s"}', f'--reports={tmp_path}/*/report.json'])
    out = capsys.readouterr().out
    assert list(res['our_accuracy']) == [str(reports)] and 'right on 10 of 10' not in out
    assert ('ours: 3 report(s) skipped, without this dataset (tiny) or this shape (n_layer, n_head, '
            'n_embd = 2, 2, 32) among their runs') in out
    dyt, ln = (read_log(tmp_path / 's' / n / 'log.jsonl', lambda r: r['event'] == 'eval')[-1]
               for n in ('dyt', 'layernorm'))
    assert dyt['iter'] == ln['iter'] == 6
    assert (res['saturation'] == dyt['saturation'][3] and dyt['thresholds'][3] == 2.0
            and 0 <= res['saturation'] <= 1)
    assert res['early_gap_%'] == pytest.approx(100 * (dyt['val_loss'] - ln['val_loss']) / ln['val_loss'])
    assert json.load(open(tmp_path / 's' / 'screen.json'))['saturation'] == res['saturation']
    assert 'DyT expected to' in out and '75% in-sample' in out and 'right on 8 of 10 DyT cells' in out
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
    with pytest.raises(SystemExit, match="the screen trains a DyT or Derf configuration; this one has "
                                         "norm='layernorm'"):
        study.main(['screen', *args, '--norm=layernorm'])
    assert not os.path.exists(tmp_path / 'out_screen')  # refused before anything ran


def test_screen_of_a_derf_run(tmp_path, data_dir, capsys, monkeypatch):
    """A Derf configuration is screened as a DyT one, with Derf's saturation: the fraction of
    |erf(alpha x + s)| > tanh(2) (as near erf's bound as DyT's |alpha x| > 2 is to tanh's), recomputed
    here from the run's checkpoint on train.py's train eval windows."""
    (tmp_path / 'tiny_derf.py').write_text(''.join(f'{k} = {v!r}\n' for k, v in TINY.items())
                                           + f"dataset = 'tiny'\ndata_dir = {data_dir!r}\n"
                                           "norm = 'derf'\ndyt_alpha = 2.0\n")
    monkeypatch.chdir(tmp_path)
    res = study.main(['screen', 'tiny_derf.py', '--train_tokens=5000', '--screen_steps=6'])
    out = capsys.readouterr().out
    root = tmp_path / 'out_screen' / 'tiny_derf_5K_s1337'
    assert json.load(open(root / 'screen.json')) == json.loads(json.dumps(res)) and 'dyt' not in res
    ev = read_log(root / 'derf' / 'log.jsonl', lambda r: r['event'] == 'eval')[-1]
    assert ev['iter'] == 6 and res['derf']['iter'] == 6
    assert {v['kind'] for v in ev['norm_layers'].values()} == {'derf'}
    per_layer = [v['saturation'][3] for v in ev['norm_layers'].values()]
    assert res['saturation'] == ev['saturation'][3] == pytest.approx(sum(per_layer) / len(per_layer))
    assert ('Derf after 6 steps: saturation' in out and 'Derf expected to' in out
            and 'fraction of |erf(alpha x + s)| > tanh(2) over every Derf layer' in out
            and 'untested on Derf' in out and 'DyT after' not in out)
    # the same fractions from the checkpoint: its norm layers' inputs on the 8 (eval_samples)
    # windows train.py evaluates on, erf taken here
    model, _ = load_checkpoint(root / 'derf' / 'ckpt.pt')
    tokens = torch.from_numpy(np.fromfile(os.path.join(data_dir, 'train.bin'), dtype=np.uint16)[:5000]
                              .astype(np.int64))
    x = torch.stack([tokens[s:s + 16] for s in random_windows(5000, 8, 17, train.EVAL_SEED)])
    inputs = {}
    names = list(ev['norm_layers'])
    hooks = [model.get_submodule(n).register_forward_pre_hook(
        lambda m, a, n=n: inputs.setdefault(n, []).append(a[0])) for n in names]
    with torch.no_grad():
        for first in (0, 4):  # train.py's micro-batches of batch_size 4
            model(x[first:first + 4])
    for h in hooks:
        h.remove()
    new, old = [], []
    for n in names:
        layer = model.get_submodule(n)
        u = torch.cat([(layer.alpha * a + layer.shift).flatten() for a in inputs[n]]).detach()
        new.append((torch.erf(u.double()).abs() > math.tanh(2.0)).double().mean().item())
        old.append((u.abs() > 2.0).double().mean().item())  # the rule before: erf's argument above 2
    assert per_layer == pytest.approx(new, abs=1e-9)
    assert res['saturation'] == pytest.approx(sum(new) / len(new)) and sum(old) < sum(new)  # not the old



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
    scripts = (['annex/study.py', 'screen', '--help'], ['annex/report.py', '--help'])
    for proc in run_side_by_side([[sys.executable, *s] for s in scripts], 300, cwd=ROOT, env=env):
        assert proc.returncode == 0 and all(u in proc.stdout for u in usages), proc.stderr[-2000:]
    for argv, close in ((['run', 'g.py', '--shards=0/2'], 'shard'),
                        (['report', 'd', '--bootstrp=5'], 'bootstrap'),
                        (['screen', '--thresold=0.5'], 'threshold'),  # screen: its keys and train.py's
                        (['screen', '--max_iter=5'], 'max_iters')):
        with pytest.raises(SystemExit, match=f'did you mean {close}'):
            study.main(argv)
    with pytest.raises(SystemExit, match=r'error: \S+/no_grid is missing \(or not a folder\)'):
        study.main(['report', os.path.join(ROOT, 'no_grid')])


def test_best_on_val_is_reported_on_the_test_split(tmp_path, data_dir, capsys):
    """The report's test losses: the final checkpoint and the one picked on val (best.pt), each on the
    held-out test split, recomputed here window by window (every token predicted once)."""
    import shutil
    from checkpoint import load_checkpoint
    d = tmp_path / 'data'
    shutil.copytree(data_dir, d)
    test = np.fromfile(d / 'val.bin', dtype=np.uint16)[::-1].copy()  # tokens no run trains or picks on
    test.tofile(d / 'test.bin')
    path = write_grid(tmp_path / 'g.py', str(d), str(tmp_path / 'grid'), variants=['ln', 'dyt'],
                      seeds=[1, 2], budgets=[64],  # 64 tokens at a constant lr 0.05: best before the end
                      overrides=dict(max_iters=40, eval_interval=4, learning_rate=0.05, decay_lr=False))
    grid, cells = study.load_grid(path)
    for cell in cells:  # trained here (test_runner_skips_resumes_records_and_shards runs the children)
        train_cell(cell, os.path.join(grid['out_dir'], cell['name']))
    capsys.readouterr()
    assert study.main(['run', path, '--poll=0.2']) == 0  # the runner finds every cell finished
    assert '4 already finished, diverged or given up; 0 to run' in capsys.readouterr().out
    rep = study.main(['report', str(tmp_path / 'grid'), '--analysis=False', '--bootstrap=10',
                      '--test_limit=50'])
    tokens = torch.from_numpy(test.astype(np.int64))
    assert {r['status'] for r in rep['runs']} == {'finished'}
    for r in rep['runs']:
        for key, name in (('test_final', 'ckpt.pt'), ('test_best', 'best.pt')):
            model, _ = load_checkpoint(os.path.join(r['dir'], name))
            total = count = 0
            with torch.no_grad():
                for s in range(0, min(len(tokens) - 1, 50 * 16), 16):  # 50 windows of block_size 16
                    x, y = tokens[s:s + 16], tokens[s + 1:s + 17]
                    x = x[:len(y)]
                    total += model(x[None], y[None])[1].item() * len(y)
                    count += len(y)
            assert r[key] == pytest.approx(total / count, abs=1e-5)
    groups = {g['variant']: g for g in rep['groups']}
    e = groups['dyt']['effect_test_best']
    assert e['seeds'] == [1, 2] and groups['dyt']['test_best'] == pytest.approx(
        np.mean([r['test_best'] for r in rep['runs'] if r['variant'] == 'dyt']))
    assert 'Held-out test split' in open(tmp_path / 'grid' / 'report.md').read()
    # 64 tokens overfit: the best on val is earlier than the end, and the two test losses differ
    assert any(r['best_iter'] < r['final_iter'] and r['test_best'] != r['test_final']
               for r in rep['runs'])


def test_the_change_against_parameters_one_line_per_budget(tmp_path):
    """The ladder's plot: per budget and variant, the final and best change at each scale's parameter
    count, in order of parameters, equal to the paired change written out; capacity.png with two or
    more scales."""
    data = tmp_path / 'data'
    data.mkdir()
    np.random.default_rng(2).integers(0, 40, 4000).astype(np.uint16).tofile(data / 'train.bin')
    np.random.default_rng(3).integers(0, 40, 500).astype(np.uint16).tofile(data / 'val.bin')
    (data / 'meta.json').write_text('{"tokenizer": "byte", "vocab_size": 40}')
    root, d = str(tmp_path / 'grid'), str(data)
    finals = {}  # (scale, budget, variant, seed): final val loss; best = final - 0.1
    for scale, params, penalty in (('big', 4000, 0.3), ('small', 1000, 0.1)):  # out of order
        for budget in (1000, None):
            for seed in (1, 2):
                ln = 3.0 + 0.1 * seed
                dyt = ln + (penalty if budget is None else -0.2) + 0.01 * seed
                for variant, loss in (('ln', ln), ('dyt', dyt)):
                    finals[scale, budget, variant, seed] = loss
                    write_run(root, scale, budget, variant, seed, loss, loss - 0.1, 0.3,
                              data_dir=d, n_params=params)
    groups = report.summarize(report.collect(root, dict(report.OPTIONS, screen_steps=50)))
    lines = report.capacity_lines([g for g in groups if g.get('change_final') is not None])
    for key, shift in (('final', 0.0), ('best', 0.1)):
        for budget, name in ((1000, '1K'), (None, 'all')):
            points = lines[key][name, 'dyt']
            assert [p[0] for p in points] == [1000, 4000]
            for (params, change, ci, name_of_scale), scale in zip(points, ('small', 'big')):
                assert name_of_scale == scale
                ln = [finals[scale, budget, 'ln', s] - shift for s in (1, 2)]
                dyt = [finals[scale, budget, 'dyt', s] - shift for s in (1, 2)]
                want = 100 * sum(b - a for a, b in zip(ln, dyt)) / 2 / (sum(ln) / 2)
                assert change == pytest.approx(want) and ci[0] < change < ci[1]
    assert lines['final']['all', 'dyt'][1][1] > lines['final']['all', 'dyt'][0][1]  # grows
    report.main([root])
    assert (os.path.exists(os.path.join(root, 'capacity.png'))
            == bool(importlib.util.find_spec('matplotlib')))


def test_the_ladder_gives_every_scale_the_same_tokens_per_parameter(monkeypatch):
    """config/grid_ladder.py: 4 scales x 3 budgets x 3 variants x 2 seeds, steps x 2,048 tokens over
    the parameters (counted on the model each scale builds) within 1.5% of the miniature's 1.24; the
    quick version's 12 cells are full cells with the same arguments, in the same folder."""
    monkeypatch.chdir(ROOT)
    from model import GPT, GPTConfig
    grid, cells = study.load_grid('config/grid_ladder.py')
    assert len(cells) == 4 * 3 * 3 * 2 and grid['out_dir'] == 'out/grid_ladder'
    ratios = {}
    for cell in cells:
        cfg = configure(train.DEFAULTS, cell['args'], train.OPTIONAL_TYPES)
        assert cfg['lr_decay_iters'] == cfg['max_iters'] and cfg['max_iters'] % 25 == 0
        assert 100 % cfg['eval_interval'] == 0  # an eval at the screen's step 100
        model = GPT(GPTConfig(n_layer=cfg['n_layer'], n_head=cfg['n_head'], n_embd=cfg['n_embd'],
                              block_size=cfg['block_size'], vocab_size=320, bias=cfg['bias']))
        tokens = cfg['max_iters'] * cfg['batch_size'] * cfg['block_size']
        ratios[cell['scale']] = tokens / model.get_num_params()
    assert ratios == pytest.approx(dict.fromkeys(('w128', 'w192', 'w256', 'd8'), 1.236), rel=0.015)
    quick_grid, quick = study.load_grid('config/grid_ladder_quick.py')
    full = {c['name']: c['args'] for c in cells}
    assert len(quick) == 12 and quick_grid['out_dir'] == grid['out_dir']
    assert all(full[c['name']] == c['args'] for c in quick)
