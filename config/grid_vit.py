# The vision check as a grid: LayerNorm, DyT at alpha0 0.5 / 1 / 2 and Derf at 0.5 on config/vision.py's
# ViT recipe (100 CIFAR-10 epochs each; the study: LN 72.4%, DyT 0.5 81.2%, DyT 2.0 33.3%). Keys: see
# config/grid_64m.py.
#   python data/cifar10/prepare.py && python annex/study.py run config/grid_vit.py
#   python annex/study.py report out/grid_vit
# The report's accuracy column is test accuracy; its saturation screening rule is the language study's.
scales = {'vit': 'config/vit_cifar10_ln.py'}
budgets = [None]  # all 50,000 train images
variants = ['ln', 'dyt_a05', 'dyt_a1', 'dyt_a2', 'derf_a05']
custom_variants = {'dyt_a05': dict(norm='dyt', dyt_alpha=0.5), 'dyt_a1': dict(norm='dyt', dyt_alpha=1.0),
                   'dyt_a2': dict(norm='dyt', dyt_alpha=2.0),
                   'derf_a05': dict(norm='derf', dyt_alpha=0.5)}
seeds = [1337]
screen_steps = 391  # one epoch
