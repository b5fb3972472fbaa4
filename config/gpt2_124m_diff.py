# GPT-2 124m (12 layers, 12 heads, 768 wide): Differential Attention (heads halved inside the model),
# LayerNorm.
from config.study import *

n_layer, n_head, n_embd = 12, 12, 768
attn = 'diff'
out_dir = 'out/gpt2_124m_diff'
