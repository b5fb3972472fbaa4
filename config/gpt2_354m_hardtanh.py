# GPT-2 354m (24 layers, 16 heads, 1024 wide): HardTanh, the bounded control without a learnable slope.
from config.study import *

n_layer, n_head, n_embd = 24, 16, 1024
norm = 'hardtanh'
out_dir = 'out/gpt2_354m_hardtanh'
