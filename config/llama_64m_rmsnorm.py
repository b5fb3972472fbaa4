# Llama-style 64m (RoPE, SwiGLU, grouped-query attention with 4 key/value heads): RMSNorm.
from config.study import *

n_layer, n_head, n_embd = 12, 8, 512
pos, mlp, n_kv_head = 'rope', 'swiglu', 4
norm = 'rmsnorm'
out_dir = 'out/llama_64m_rmsnorm'
