# The study's training protocol (Verma 2026; docs/model.md, "Scales and configs"), shared by every
# config/gpt2_*.py and config/llama_*.py. Those files `from config.study import *`, then set the shape
# and the variant; --key=value overrides all.
# Data budgets (1M/10M/50M/118M tokens) and seeds (1337/42/7) are set per run, each in its own out_dir
# (train.py refuses an out_dir that already holds a run, unless --overwrite=True), e.g.
#   torchrun --nproc_per_node=8 train.py config/gpt2_64m_dyt.py --train_tokens=1_000_000 --seed=42 \
#            --out_dir=out/gpt2_64m_dyt_1M_s42
dataset = 'wikitext103'
block_size = 512
# global: 64 sequences = 32,768 tokens a step, whatever the GPU count and micro-batch. On one 80 GB GPU
# 64m to 354m run one micro-batch of 64 (annex/memory.py's plan, compiled, bf16: 18-20 GB at 64m,
# 23-25 at 124m, 46-50 at 354m); config/gpt2_1.3b_*.py: 2 of 32. Under torchrun a GPU runs its share
batch_size = 64
gradient_accumulation_steps = 1
max_iters = 5000
learning_rate = 3e-4
warmup_iters = 2000
lr_decay_iters = 600000  # cosine over 600k steps: in practice constant after warmup, as in the study
min_lr = 6e-5
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
dropout = 0.0
bias = False
# GPT-2's init, as the study (train.py's small default model uses a larger one: docs/collapse.md)
emb_init_std = 0.02
eval_interval = 500
eval_samples = 400  # windows per split an eval, whatever the micro-batch
compile = True
seed = 1337
