# GPT-2 3.78b (32 layers, 32 heads, 3072 wide): RMSNorm in place of LayerNorm.
from config.study import *

n_layer, n_head, n_embd = 32, 32, 3072
norm = 'rmsnorm'
learning_rate = 1e-4
batch_size, gradient_accumulation_steps = 8, 8  # FSDP on 8 GPUs: 8 sequences each, 34-36 GB
fsdp = True  # does not fit data-parallel on 80 GB cards
out_dir = 'out/gpt2_3.78b_rmsnorm'
