"""Preprocessing that belongs to the model, inside the exported graph.

The wrapper takes float32 NCHW RGB in [0, 1], resizes to the network's size when the input's spatial size
differs (an `if` on the input's shape: the branch tracing bakes in), normalises with ImageNet statistics
held as buffers (they follow `.to(device)` and are saved with the module), and runs the network.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImagePreprocess(nn.Module):
    def __init__(self, network: nn.Module, size: int = 224,
                 mean: tuple[float, ...] = IMAGENET_MEAN, std: tuple[float, ...] = IMAGENET_STD):
        super().__init__()
        self.network = network
        self.size = size
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2] != self.size or x.shape[-1] != self.size:
            x = F.interpolate(x, size=[self.size, self.size], mode="bilinear", align_corners=False)
        return self.network((x - self.mean) / self.std)

    def torch_export_form(self) -> nn.Module:
        """The same computation with the branch as `torch.cond`, which torch.export keeps as an ONNX If."""
        return _CondPreprocess(self).train(self.training)  # a new module starts in training mode


class _CondPreprocess(nn.Module):
    """Shares the wrapped module's network and buffers; only the branch is spelled for torch.export."""

    def __init__(self, wrapped: ImagePreprocess):
        super().__init__()
        self.wrapped = wrapped

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = self.wrapped.size

        def resize(t: torch.Tensor) -> torch.Tensor:
            return F.interpolate(t, size=[size, size], mode="bilinear", align_corners=False)

        def keep(t: torch.Tensor) -> torch.Tensor:
            return t.clone()  # torch.cond branches may not return an input as-is

        needs_resize = (torch.tensor(x.shape[-2]) != size) | (torch.tensor(x.shape[-1]) != size)
        x = torch.cond(needs_resize, resize, keep, (x,))
        return self.wrapped.network((x - self.wrapped.mean) / self.wrapped.std)
