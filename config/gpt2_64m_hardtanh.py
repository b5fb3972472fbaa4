# GPT-2 64m (12 layers, 8 heads, 512 wide): HardTanh, the bounded control without a learnable slope.
from config.study import *

n_layer, n_head, n_embd = 12, 8, 512
norm = 'hardtanh'
out_dir = 'out/gpt2_64m_hardtanh'
