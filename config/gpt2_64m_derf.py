# GPT-2 64m (12 layers, 8 heads, 512 wide): Dynamic erf (Chen et al. 2025) in place of every LayerNorm.
# alpha0 = 2.0 as the study's DyT, so that the two differ only in the function (Derf's default is 0.5).
from config.study import *

n_layer, n_head, n_embd = 12, 8, 512
norm = 'derf'
dyt_alpha = 2.0
out_dir = 'out/gpt2_64m_derf'
