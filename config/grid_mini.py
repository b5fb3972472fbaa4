# The study in miniature, on a CPU: LayerNorm against DyT at three data budgets, two seeds, with the
# arms that say what drives the result (docs/miniature.md):
#   python annex/study.py run config/grid_mini.py && python annex/study.py report out/grid_mini
# train.py's default model and corpus (4 layers, 4 heads, width 128, block 128, batch 16, lr 2e-3 after
# 30 warmup steps, emb_init_std 0.3; the offline pydocs corpus, bytes) for 500 steps: 1.0M tokens seen,
# i.e. 100 epochs of the 10K budget, 10 of 100K and 0.55 of the whole 1.86M-token split. Keys: see
# config/grid_64m.py.
scales = {'mini': dict(max_iters=500, lr_decay_iters=500, eval_interval=50, eval_samples=160,
                       log_interval=50)}
budgets = [10_000, 100_000, None]
# ln and dyt_a05 (alpha0 0.5, the DyT paper's default) show the flip; dyt is the study's alpha0 2.0,
# which saturates like the study's runs; ln_gpt2_init is LayerNorm at GPT-2's embedding init (0.02,
# not 0.3)
variants = ['ln', 'ln_gpt2_init', 'dyt_a05', 'dyt']
custom_variants = {'dyt_a05': dict(norm='dyt', dyt_alpha=0.5),
                   'ln_gpt2_init': dict(norm='layernorm', emb_init_std=0.02)}
seeds = [1337, 42]
# LayerNorm is best near step 140 at 10K, then overfits: evals every 10 steps place each run's best
budget_overrides = {10_000: dict(eval_interval=10)}
screen_steps = 50  # a tenth of the run, as 500 is of the study's 5000 steps
