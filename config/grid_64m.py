# The study's 64m row (Verma 2026, arXiv 2604.23434): LayerNorm, DyT (alpha0 2.0) and Differential
# Attention at four data budgets, three seeds: 36 runs of 5000 steps with the study's protocol
# (config/study.py).
#   python annex/study.py run config/grid_64m.py --gpus=0-7 --nproc=1  # a cell a GPU; job array: --shard=i/4
#   python annex/study.py report out/grid_64m
# Grid keys (paths relative to the repository root):
#   scales     {name: train.py config file, or {key: value} overrides on train.py's defaults}
#   budgets    [train_tokens]; None = the whole train split
#   variants   [names]: ln rmsnorm dyt derf derf_ref hardtanh diff dyt_diff llama_ln llama_rmsnorm
#              llama_dyt llama_dyt_gelu, or your own from custom_variants = {name: {key: value}}
#   seeds      [ints]
#   overrides  {key: value} for every cell (after the scale and the variant)
#   budget_overrides  {budget: {key: value}} for that budget's cells (after overrides), e.g. denser evals
#   out_dir    default out/<grid file name>; screen_steps: the step whose saturation the report calls the
#              screen's
scales = {'64m': 'config/gpt2_64m_ln.py'}
budgets = [1_000_000, 10_000_000, 50_000_000, None]  # None: all WikiText-103 train, the study's "118M"
variants = ['ln', 'dyt', 'diff']
seeds = [1337, 42, 7]
# evals every 100 steps until warmup ends (1M tokens overfit early), then every 500: the best on val
overrides = {'eval_interval_warmup': 100}
