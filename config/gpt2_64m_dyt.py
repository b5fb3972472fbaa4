# GPT-2 64m (12 layers, 8 heads, 512 wide): Dynamic Tanh in place of every LayerNorm, alpha0 = 2.0 as in
# the study.
from config.study import *

n_layer, n_head, n_embd = 12, 8, 512
norm = 'dyt'
dyt_alpha = 2.0
out_dir = 'out/gpt2_64m_dyt'
