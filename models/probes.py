"""Probe inputs for the trace-vs-script comparison: photograph-like images in [0, 1].

Photo-like, not white noise: with trained-like BatchNorm statistics a deep network amplifies input rounding
(1e-6 of noise on a resized white-noise image moved a random resnet50's logits by 7e-5), so an ONNX Resize
that rounds differently from torch's interpolate exceeded the parity tolerance on resized white noise while
computing the same thing. Smooth colour fields take the same branches and keep that noise far below it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def photo_like(count: int, height: int, width: int, generator: torch.Generator) -> torch.Tensor:
    """Smooth colour fields with fine grain, float32 (count, 3, height, width) in [0, 1]."""
    coarse = torch.rand(count, 3, max(2, height // 16), max(2, width // 16), generator=generator)
    smooth = F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    grain = 0.02 * torch.randn(count, 3, height, width, generator=generator)
    return (smooth + grain).clamp(0.0, 1.0)


def resize_probes(size: int, other: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """One probe at the traced size, one that takes the in-graph resize branch."""
    generator = torch.Generator().manual_seed(seed)
    return {f"{size}x{size} (as traced)": photo_like(2, size, size, generator),
            f"{other}x{other} (resize branch)": photo_like(2, other, other, generator)}
