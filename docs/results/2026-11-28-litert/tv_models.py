"""torchvision's MobileNetV3, seeded random weights, for `python -m export module`."""
import torch
import torchvision


def mobilenet_v3_large():
    torch.manual_seed(0)
    return torchvision.models.mobilenet_v3_large(weights=None)


def mobilenet_v3_small():
    torch.manual_seed(0)
    return torchvision.models.mobilenet_v3_small(weights=None)
