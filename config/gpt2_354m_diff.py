# GPT-2 354m (24 layers, 16 heads, 1024 wide): Differential Attention (heads halved inside the model),
# LayerNorm.
from config.study import *

n_layer, n_head, n_embd = 24, 16, 1024
attn = 'diff'
out_dir = 'out/gpt2_354m_diff'
