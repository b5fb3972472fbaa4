# ViT on CIFAR-10 (config/vision.py's recipe) with LayerNorm: the baseline (the study: 72.4% test
# accuracy).
from config.vision import *

norm = 'layernorm'
out_dir = 'out/vit_cifar10_ln'
