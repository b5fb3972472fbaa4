# GPT-2 162m (16 layers, 14 heads, 896 wide): LayerNorm (the baseline); held-out scale (this shape has
# 199M parameters, see docs/model.md).
from config.study import *

n_layer, n_head, n_embd = 16, 14, 896
norm = 'layernorm'
out_dir = 'out/gpt2_162m_ln'
