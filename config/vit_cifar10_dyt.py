# ViT on CIFAR-10 (config/vision.py's recipe) with DyT at the DyT paper's vision alpha0 0.5 (the study:
# 81.2%; at the language runs' alpha0 2.0 it fails, 33.3%: config/grid_vit.py sweeps alpha0).
from config.vision import *

norm = 'dyt'
dyt_alpha = 0.5
out_dir = 'out/vit_cifar10_dyt'
