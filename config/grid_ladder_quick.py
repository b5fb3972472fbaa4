# The scale ladder's quick version (config/grid_ladder.py): 12 of its cells, 27 minutes here on 2
# cores. Three scales (width 128 and 192, depth 8), the smallest and the whole budget, LayerNorm and
# DyT at alpha0 0.5, seed 1337, in the same folder: the full ladder then runs only the other 60.
#   python annex/study.py run config/grid_ladder_quick.py && python annex/study.py report out/grid_ladder
import config.grid_ladder as _full

scales = {name: _full.scales[name] for name in ('w128', 'w192', 'd8')}
budgets = [10_000, None]
variants = ['ln', 'dyt_a05']
custom_variants = _full.custom_variants
seeds = [1337]
budget_overrides = _full.budget_overrides
screen_steps = _full.screen_steps
out_dir = 'out/grid_ladder'
