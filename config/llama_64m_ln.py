# Llama-style 64m (RoPE, SwiGLU, grouped-query attention with 4 key/value heads): LayerNorm, the study's
# Llama baseline.
from config.study import *

n_layer, n_head, n_embd = 12, 8, 512
pos, mlp, n_kv_head = 'rope', 'swiglu', 4
norm = 'layernorm'
out_dir = 'out/llama_64m_ln'
