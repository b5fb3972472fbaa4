# Llama-style 64m with DyT (alpha0 = 2.0) and the GELU MLP instead of SwiGLU, which rescues training in
# the study.
from config.study import *

n_layer, n_head, n_embd = 12, 8, 512
pos, mlp, n_kv_head = 'rope', 'gelu', 4
norm = 'dyt'
dyt_alpha = 2.0
out_dir = 'out/llama_64m_dyt_gelu'
