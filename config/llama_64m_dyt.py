# Llama-style 64m (RoPE, SwiGLU, grouped-query attention with 4 key/value heads): DyT (alpha0 = 2.0);
# collapses in 1 of 3 seeds in the study.
from config.study import *

n_layer, n_head, n_embd = 12, 8, 512
pos, mlp, n_kv_head = 'rope', 'swiglu', 4
norm = 'dyt'
dyt_alpha = 2.0
out_dir = 'out/llama_64m_dyt'
