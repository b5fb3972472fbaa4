# Derf (alpha0 2.0, shift0 0) on the study's 64m row: four data budgets, three seeds, 12 runs written
# beside config/grid_64m.py's, so one report compares LayerNorm, DyT and Derf cell by cell (keys: see
# config/grid_64m.py).
#   python annex/study.py run config/grid_64m_derf.py --nproc=8
#   python annex/study.py report out/grid_64m
# Derf's own alpha0 is 0.5: add custom_variants = {'derf_a05': dict(norm='derf', dyt_alpha=0.5)} and
# list it.
scales = {'64m': 'config/gpt2_64m_ln.py'}
budgets = [1_000_000, 10_000_000, 50_000_000, None]
variants = ['derf']
seeds = [1337, 42, 7]
out_dir = 'out/grid_64m'
