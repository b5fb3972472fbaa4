# GPT-2 124m (12 layers, 12 heads, 768 wide): LayerNorm (the baseline).
from config.study import *

n_layer, n_head, n_embd = 12, 12, 768
norm = 'layernorm'
out_dir = 'out/gpt2_124m_ln'
