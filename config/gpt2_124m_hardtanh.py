# GPT-2 124m (12 layers, 12 heads, 768 wide): HardTanh, the bounded control without a learnable slope.
from config.study import *

n_layer, n_head, n_embd = 12, 12, 768
norm = 'hardtanh'
out_dir = 'out/gpt2_124m_hardtanh'
