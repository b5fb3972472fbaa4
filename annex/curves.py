"""
Curves of training from the runs' log.jsonl, run from the repository root:

  python annex/curves.py out-ln out-dyt [--x=iter|tokens|images|epochs] [--plot=F.png] [--json=F]
  python annex/curves.py out/grid_64m        a folder of runs (a study grid): its subfolders' logs

Prints, per run, a row per eval (iter, tokens, train and val loss, the best val loss so far), its
best eval, the unigram level of its budget (summary.json's unigram_entropy: the loss of a model that
knows only the token frequencies) and, for DyT and Derf runs, each layer's learned alpha against
1/std of its input at the first, middle and last eval; then the runs side by side. --plot also draws
every run's train loss (its steps) and val loss (its evals) against --x, each run's best starred and
each budget's unigram level dashed, beside each layer's alpha against 1/std over training
(matplotlib is optional: without it the tables are all). --json writes every number, each eval's
alphas included. A run without summary.json (running, or stopped) takes the unigram level of a
finished run of the same budget among those given, else it is unknown. A torn log line is named and
skipped.
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # annex/curves.py

from analyze import fmt, print_table  # noqa: E402
from annex.alpha import alpha_vs_std, print_alpha  # noqa: E402
from annex.plots import pyplot, save_png  # noqa: E402
from annex.study import log_records, read_json  # noqa: E402
from configurator import configure, split_args  # noqa: E402
from data.common import write_json  # noqa: E402

DEFAULTS = dict(x='iter', plot='', json='')
XS = ('iter', 'tokens', 'images', 'epochs')  # what a log record counts its progress in
BUDGET = ('dataset', 'data_dir', 'train_tokens', 'budget_docs')  # config keys that fix a budget


def read_records(d):
    """log.jsonl's records; a torn line (a run killed while writing it) is named and skipped."""
    records, torn = log_records(d)
    for number in torn:
        print(f"warning: {d}/log.jsonl line {number} is not a log record (a torn write?): skipped")
    return records


def run_dirs(paths):
    """Each path that holds a log.jsonl, else its subfolders that do (a study grid's cells)."""
    dirs = []
    for path in paths:
        if os.path.isfile(os.path.join(path, 'log.jsonl')):
            dirs.append(os.path.normpath(path))
            continue
        if not os.path.isdir(path):
            raise SystemExit(f"error: {path} is not a run: no such folder")
        runs = sorted(os.path.join(path, d) for d in os.listdir(path)
                      if os.path.isfile(os.path.join(path, d, 'log.jsonl')))
        if not runs:
            raise SystemExit(f"error: {path} is not a run: it holds no log.jsonl (train.py writes "
                             "out_dir/log.jsonl), nor do its subfolders")
        dirs += [os.path.normpath(d) for d in runs]
    return dirs


def finite(v):
    return v is not None and math.isfinite(v)


def eval_rows(evals):
    """Each eval's progress and losses with the best val loss so far; the best eval (None until
    one is finite: a diverged run's NaN is never the best)."""
    rows, best = [], None
    for r in evals:
        row = {k: r.get(k) for k in XS} | dict(train=r.get('train_loss'), val=r.get('val_loss'))
        if finite(row['val']) and (best is None or row['val'] < best['val']):
            best = row
        rows.append(row | dict(best_so_far=best['val'] if best else None))
    return rows, best


def load_run(d):
    """A run's curves from its folder: evals, step losses, its best, alphas, its budget."""
    records = read_records(d)
    summary = read_json(os.path.join(d, 'summary.json')) or {}
    config = read_json(os.path.join(d, 'config.json'))
    evals = [r for r in records if r['event'] == 'eval']
    rows, best = eval_rows(evals)
    unit = 'images' if any('images' in r for r in records) else 'tokens'
    alphas = [dict(iter=r['iter'], **{k: r.get(k) for k in XS[1:]},
                   **alpha_vs_std({'layers': r['norm_layers']})) for r in evals
              if any(layer['alpha'] is not None for layer in r.get('norm_layers', {}).values())]
    return dict(dir=d, unit=unit, status=summary.get('status', 'unfinished'),
                evals=rows, best=best, alphas=alphas,
                steps=[{k: r.get(k) for k in XS} | dict(loss=r['loss'])
                       for r in records if r['event'] == 'step'],
                budget=repr([config.get(k) for k in BUDGET]) if config else None,
                unigram_entropy=summary.get('unigram_entropy'),
                unigram_from='summary.json' if 'unigram_entropy' in summary else None,
                budget_size=summary.get(f'budget_{unit}'))


def borrow_unigram(runs):
    """A run without a summary takes the unigram level and budget size of a finished one's."""
    known = {r['budget']: r for r in runs if r['budget'] and r['unigram_from']}
    for r in runs:
        donor = known.get(r['budget'])
        if r['unigram_from'] is None and donor:
            r.update(unigram_entropy=donor['unigram_entropy'], budget_size=donor['budget_size'],
                     unigram_from=f"{donor['dir']}, the same budget")


def unigram_text(run):
    if run['unigram_from'] is None:
        return 'unknown (no summary.json yet, nor a finished run of its budget given)'
    return f"{run['unigram_entropy']:.4f} nats ({run['unigram_from']})"


def print_run(run):
    """A row per eval, the best, the unigram level; alpha against 1/std at three evals."""
    unit = run['unit']
    rows = [(f"iter {e['iter']}", [(fmt(e[unit], ','), fmt(e['train'], '.4f'),
                                    fmt(e['val'], '.4f'), fmt(e['best_so_far'], '.4f'))])
            for e in run['evals']]
    if rows:
        print_table(f"{run['dir']} ({run['status']}): loss at each eval", [run['dir']], rows,
                    fields=(unit, 'train', 'val', 'best so far'))
    else:
        print(f"\n{run['dir']} ({run['status']}): no eval yet")
    best = run['best']
    if best:
        print(f"best: val loss {best['val']:.4f} at iter {best['iter']} "
              f"({fmt(best[unit], ',')} {unit})")
    print(f"unigram level: {unigram_text(run)}")
    alphas = run['alphas']
    if alphas:  # the first, middle and last evals: how alpha moved, in a table that fits
        picks = [alphas[k] for k in sorted({0, len(alphas) // 2, len(alphas) - 1})]
        print_alpha([{'alpha': a} for a in picks],
                    [f"{run['dir']} iter {a['iter']}" for a in picks])


def print_runs(runs):
    """The runs side by side: best and final val loss, the unigram level."""
    best = [r['best'] or {} for r in runs]
    last = [r['evals'][-1] if r['evals'] else {} for r in runs]
    rows = [("best val loss", [fmt(b.get('val'), '.4f') for b in best]),
            ("best at iter", [fmt(b.get('iter')) for b in best]),
            ("final val loss", [fmt(e.get('val'), '.4f') for e in last]),
            ("final iter", [fmt(e.get('iter')) for e in last]),
            ("unigram level", [fmt(r['unigram_entropy'], '.4f') for r in runs]),
            ("status", [r['status'] for r in runs])]
    print_table("the runs side by side (val loss and unigram level in nats)",
                [r['dir'] for r in runs], rows)


def check_x(runs, x):
    for r in runs:
        records = r['evals'] + r['steps']
        if any(e[x] is None for e in records):
            have = [k for k in XS if records and all(e[k] is not None for e in records)]
            raise SystemExit(f"error: {r['dir']}/log.jsonl's records have no {x!r}: choose --x "
                             f"from {', '.join(have)}")


def plot_curves(runs, x, path):
    """Train (steps) and val (evals) loss against x, the bests starred, each budget's unigram level
    dashed; beside it each DyT/Derf layer's alpha against 1/std, a line from its first eval to its
    last (a dot)."""
    plt = pyplot()
    if plt is None:
        return
    with_alpha = [r for r in runs if r['alphas']]
    fig, axes = plt.subplots(1, 2 if with_alpha else 1, figsize=(13 if with_alpha else 8, 5),
                             squeeze=False)
    cycle = plt.rcParams['axes.prop_cycle'].by_key()['color']
    ax, colors = axes[0][0], [cycle[k % len(cycle)] for k in range(len(runs))]
    levels = {}  # a line per budget, not per run
    for r, c in zip(runs, colors):
        ax.plot([s[x] for s in r['steps']], [s['loss'] for s in r['steps']], c=c, lw=0.8,
                alpha=0.4)
        best = r['best']
        tag = f": best {best['val']:.3f} at {x} {fmt(best[x], ',')}" if best else ""
        ax.plot([e[x] for e in r['evals']], [e['val'] for e in r['evals']], 'o-', c=c, ms=3,
                label=f"{r['dir']} val{tag}")
        if best:
            ax.plot(best[x], best['val'], '*', c=c, ms=15, mec='k', zorder=3)
        if r['unigram_entropy'] is not None:
            levels.setdefault(r['unigram_entropy'], r)
    for h, r in levels.items():
        size = f"{r['budget_size']:,} {r['unit']}" if r['budget_size'] else r['dir']
        ax.axhline(h, ls='--', c='gray', lw=1)
        ax.annotate(f"unigram level {h:.3f}, budget {size}", (0.99, h), fontsize=8, c='gray',
                    xycoords=('axes fraction', 'data'), textcoords='offset points', xytext=(0, 3),
                    ha='right')
    # the first evals' losses (ln(vocab) or above) would squash the rest: the axis stops at the
    # highest val loss after each run's first quarter of evals (its first eval at least), and the
    # unigram levels
    later = [e['val'] for r in runs for e in r['evals'][max(len(r['evals']) // 4, 1):]
             if finite(e['val'])] + list(levels)
    losses = [s['loss'] for r in runs for s in r['steps'] if finite(s['loss'])] + later
    if later:
        low, high = min(losses), max(later)
        ax.set_ylim(low - 0.05 * (high - low), high + 0.1 * (high - low))
    ax.set(xlabel=x, ylabel='loss (nats)', title='train (faint) and val loss, the best starred')
    ax.legend(fontsize=8)
    if with_alpha:
        plot_alphas(axes[0][1], runs, colors)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_png(fig, path)
    print(f"\nwrote {path}")


def plot_alphas(ax, runs, colors):  # the runs with alphas, in their colors of the loss panel
    for r, c in zip(runs, colors):
        if not r['alphas']:
            continue
        first, last = r['alphas'][0]['layers'], r['alphas'][-1]['layers']
        for name in last:
            track = [a['layers'][name] for a in r['alphas'] if name in a['layers']]
            ax.plot([t['inv_std'] for t in track], [t['alpha'] for t in track], c=c, lw=0.8,
                    alpha=0.6)
        ax.scatter([l['inv_std'] for l in last.values()], [l['alpha'] for l in last.values()],
                   color=c, s=18, label=f"{r['dir']} (iter {r['alphas'][-1]['iter']})")
        ax.scatter([l['inv_std'] for l in first.values()], [l['alpha'] for l in first.values()],
                   color=c, s=18, marker='x')
    ax.set(xlabel='1 / input std', ylabel='learned alpha',
           title='DyT/Derf alpha vs 1/std over training (x: first eval, dot: last)')
    ax.legend(fontsize=8)


def main(argv):
    paths, options = split_args(argv)
    opts = configure(DEFAULTS, options, doc=__doc__)
    if not paths:
        raise SystemExit("usage: python annex/curves.py RUN_DIR [RUN_DIR ...] [--x=iter|tokens] "
                         "[--plot=FILE.png] [--json=FILE]  (--help: more)")
    if opts['x'] not in XS:
        raise SystemExit(f"error: --x must be one of {', '.join(XS)}, got {opts['x']!r}")
    runs = [load_run(d) for d in run_dirs(paths)]
    check_x(runs, opts['x'])
    borrow_unigram(runs)
    for r in runs:
        print_run(r)
    print_runs(runs)
    if opts['json']:
        os.makedirs(os.path.dirname(os.path.abspath(opts['json'])), exist_ok=True)
        write_json(opts['json'], dict(schema='nanonorm-curves/1', x=opts['x'], runs=runs))
        print(f"\nwrote {opts['json']}")
    if opts['plot']:
        plot_curves(runs, opts['x'], opts['plot'])
    return runs


if __name__ == '__main__':
    main(sys.argv[1:])
