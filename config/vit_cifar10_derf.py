# ViT on CIFAR-10 (config/vision.py's recipe) with Derf at its paper's alpha0 0.5 and shift0 0 (no study
# figure).
from config.vision import *

norm = 'derf'
dyt_alpha = 0.5
out_dir = 'out/vit_cifar10_derf'
