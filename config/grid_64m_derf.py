# Derf on the study's 64m row: four data budgets, three seeds, two variants, 24 runs written beside
# config/grid_64m.py's, so one report compares LayerNorm, DyT and Derf cell by cell (keys: see
# config/grid_64m.py). 'derf' is matched to the study's DyT (alpha0 2.0, shift0 0); 'derf_ref' is the
# Derf paper's own recipe (alpha0 0.5, a learnable scalar on the embeddings, init sqrt(n_embd)).
#   python annex/study.py run config/grid_64m_derf.py --gpus=0-7 --nproc=1
#   python annex/study.py report out/grid_64m
scales = {'64m': 'config/gpt2_64m_ln.py'}
budgets = [1_000_000, 10_000_000, 50_000_000, None]
variants = ['derf', 'derf_ref']
seeds = [1337, 42, 7]
overrides = {'eval_interval_warmup': 100}  # as config/grid_64m.py's cells
out_dir = 'out/grid_64m'
