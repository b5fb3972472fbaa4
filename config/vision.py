# The study's vision recipe (Verma 2026, after the DyT paper's vision setting; docs/vision.md),
# shared by config/vit_cifar10_*.py: a ViT of 6 layers, 4 heads, width 256 on 4x4 patches with a class
# token (4.8M parameters), 100 epochs of CIFAR-10's 50,000 train images, batch 128, AdamW lr 1e-3, weight
# decay 0.05, cosine to 0, random crop (zero padding 4) and horizontal flip. train.py builds a ViT
# because the data are images:
#   python data/cifar10/prepare.py && python train.py config/vit_cifar10_dyt.py
dataset = 'cifar10'
n_layer, n_head, n_embd = 6, 4, 256
patch_size = 4
pool = 'cls'
bias = True  # ViT's linear layers and norms have biases (so DyT and Derf have a beta)
dropout = 0.0
emb_init_std = 0.02  # position embeddings N(0, 0.02), as in timm's ViT
batch_size = 128
gradient_accumulation_steps = 1
max_iters = 39_063  # 100 epochs: ceil(100 x 50,000 / 128) steps
lr_decay_iters = 39_063
# about an epoch: train accuracy on 1,280 fixed train images, val (the test set) on all 10,000
eval_interval = 391
eval_samples = 1280  # train images an eval (val: all of test)
log_interval = 100
learning_rate = 1e-3
min_lr = 0.0
warmup_iters = 0  # the recipe names no warmup
weight_decay = 0.05
beta1, beta2 = 0.9, 0.999  # PyTorch's AdamW defaults: the recipe names no betas
grad_clip = 0.0  # nor clipping
compile = True
seed = 1337
