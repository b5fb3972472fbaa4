# GPT-2 124m (12 layers, 12 heads, 768 wide): RMSNorm in place of LayerNorm.
from config.study import *

n_layer, n_head, n_embd = 12, 12, 768
norm = 'rmsnorm'
out_dir = 'out/gpt2_124m_rmsnorm'
