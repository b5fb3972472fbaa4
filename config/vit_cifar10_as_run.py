# The study's ViT recipe as its code ran (Verma 2026; docs/vision.md), over a config/vit_cifar10_*.py:
#   python train.py config/vit_cifar10_dyt.py config/vit_cifar10_as_run.py  # out/vit_cifar10_dyt_as_run
# The whole model in bf16 with no autocast (so dtype float32: train.py adds none), inputs normalised
# by 0.5/0.5, PyTorch's default init, AdamW weight decay on every parameter (annex/vit.py, vit_as_run).
# Not matched: the study's CosineAnnealingLR(T_max=100) stepped once an epoch (ours lowers the lr every
# step, to 0 at the end) and its DataLoader's epochs (ours run on across epoch boundaries); the betas,
# eps and clipping it leaves at PyTorch's defaults, as config/vision.py does.
from config.vision import *  # 100 epochs, batch 128, lr 1e-3, wd 0.05, cosine to 0, no warmup, an eval
# every 391 steps (1.001 epochs): the study's at epochs 1, 25, 50, 75 and 100 are among them

vit_as_run = True
dtype = 'float32'
out_dir += '_as_run'  # noqa: F405 (train.py's key, set by the config file before this one)
