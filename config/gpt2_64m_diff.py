# GPT-2 64m (12 layers, 8 heads, 512 wide): Differential Attention (heads halved inside the model),
# LayerNorm.
from config.study import *

n_layer, n_head, n_embd = 12, 8, 512
attn = 'diff'
out_dir = 'out/gpt2_64m_diff'
