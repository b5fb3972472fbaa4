# GPT-2 1.3b (24 layers, 32 heads, 2048 wide): LayerNorm (the baseline).
from config.study import *

n_layer, n_head, n_embd = 24, 32, 2048
norm = 'layernorm'
learning_rate = 1e-4
batch_size, gradient_accumulation_steps = 32, 2  # one 80 GB GPU: 58-63 GB (64 x 1: 92)
out_dir = 'out/gpt2_1.3b_ln'
