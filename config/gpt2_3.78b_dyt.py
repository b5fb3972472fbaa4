# GPT-2 3.78b (32 layers, 32 heads, 3072 wide): Dynamic Tanh in place of every LayerNorm, alpha0 = 2.0 as
# in the study.
from config.study import *

n_layer, n_head, n_embd = 32, 32, 3072
norm = 'dyt'
dyt_alpha = 2.0
learning_rate = 1e-4
batch_size, gradient_accumulation_steps = 8, 8  # FSDP on 8 GPUs: 8 sequences each, 34-36 GB
fsdp = True  # does not fit data-parallel on 80 GB cards
out_dir = 'out/gpt2_3.78b_dyt'
