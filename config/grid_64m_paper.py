# The study's 64m row under the study's own protocol, to compare with its published losses (README,
# "The study"): the row-by-row tokenization of WikiText-103 (data/wikitext103/prepare.py --layout=paper)
# and, beside our fixed val set, val_loss_paper: each budget's first max(10K, budget/100) val tokens,
# 3200 windows (the study's 50 batches of 64) redrawn at every eval. Keys: see config/grid_64m.py.
#   python data/wikitext103/prepare.py --layout=paper
#   python annex/study.py run config/grid_64m_paper.py --gpus=0-7
#   python annex/study.py report out/grid_64m_paper
scales = {'64m': 'config/gpt2_64m_ln.py'}
budgets = [1_000_000, 10_000_000, 50_000_000, None]
variants = ['ln', 'dyt', 'diff']
seeds = [1337, 42, 7]
overrides = dict(data_dir='data/wikitext103/paper', paper_val=3200, eval_interval_warmup=100)
