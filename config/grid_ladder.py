# A scale ladder on a CPU (docs/miniature.md, "The scale ladder"): does DyT's penalty where data is
# plentiful grow with capacity, as the study found from 64m (+18.8%) to 3.78b (+27.9%)? train.py's
# default model (4 layers, width 128, 0.83M parameters) at widths 192 and 256 and at depth 8, the
# miniature's budgets (10K, 100K, all 1.86M pydocs tokens), LayerNorm against DyT at alpha0 0.5 and
# 2.0, two seeds: 72 runs, about 4 hours on 2 cores; resumable (rerun the same command).
#   python annex/study.py run config/grid_ladder_quick.py   # 12 of these cells first, 27 min here
#   python annex/study.py run config/grid_ladder.py && python annex/study.py report out/grid_ladder
# Steps: the same training tokens per parameter at every scale, 1.24 (the miniature's 500 steps of
# 2,048 tokens at 0.83M parameters), so every scale gets as much training for its size. The whole
# split is 1.86M tokens: the larger scales read it more than once (2.1 epochs at width 256),
# and the tokens per parameter the report counts (what a run saw, at most the budget) fall with size,
# from 1.24 to 0.58 on the whole split, as the study's do at its fixed budgets. The study keeps 5000
# steps at every scale instead; here that would also give the wider models less training each.
# Everything else is the miniature's (lr 2e-3, 30 warmup steps, cosine to 2e-4 at the last step,
# emb_init_std 0.3). Width 256 trains in bfloat16 autocast, 1.15x faster here (docs/training.md);
# the others in float32, where bfloat16 does not pay.
scales = {
    'w128': dict(max_iters=500, lr_decay_iters=500, eval_interval=50, log_interval=50),
    'w192': dict(n_embd=192, n_head=6, max_iters=1100, lr_decay_iters=1100, eval_interval=100,
                 log_interval=100),
    'w256': dict(n_embd=256, n_head=8, max_iters=1950, lr_decay_iters=1950, eval_interval=100,
                 log_interval=100, dtype='bfloat16'),
    'd8': dict(n_layer=8, max_iters=975, lr_decay_iters=975, eval_interval=100, log_interval=100),
}
budgets = [10_000, 100_000, None]
variants = ['ln', 'dyt_a05', 'dyt']
custom_variants = {'dyt_a05': dict(norm='dyt', dyt_alpha=0.5)}
seeds = [1337, 42]
budget_overrides = {10_000: dict(eval_interval=20)}  # the best of an overfitting run, to 20 steps
screen_steps = 100  # an eval of every cell
