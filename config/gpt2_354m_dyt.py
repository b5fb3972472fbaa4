# GPT-2 354m (24 layers, 16 heads, 1024 wide): Dynamic Tanh in place of every LayerNorm, alpha0 = 2.0 as
# in the study.
from config.study import *

n_layer, n_head, n_embd = 24, 16, 1024
norm = 'dyt'
dyt_alpha = 2.0
out_dir = 'out/gpt2_354m_dyt'
