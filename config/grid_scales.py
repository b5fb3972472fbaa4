# The study's other GPT-2 scales (Verma 2026): LayerNorm against DyT (alpha0 2.0) at 1M, 10M and all
# tokens, three seeds. With config/grid_64m.py in the same report folder, the screening rule gets its
# leave-one-scale-out test (keys: see config/grid_64m.py):
#   python annex/study.py run config/grid_scales.py --nproc=8
scales = {s: f'config/gpt2_{s}_ln.py' for s in ('124m', '354m', '1.3b', '3.78b')}
budgets = [1_000_000, 10_000_000, None]
variants = ['ln', 'dyt']
seeds = [1337, 42, 7]
out_dir = 'out/grid_64m'  # beside the 64m row: one report over every scale
