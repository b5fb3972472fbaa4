# GPT-2 124m (12 layers, 12 heads, 768 wide): Dynamic Tanh in place of every LayerNorm, alpha0 = 2.0 as
# in the study.
from config.study import *

n_layer, n_head, n_embd = 12, 12, 768
norm = 'dyt'
dyt_alpha = 2.0
out_dir = 'out/gpt2_124m_dyt'
