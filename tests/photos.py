"""Real photographs with known ImageNet classes (scikit-image's sample data, installed offline), and the
classes a trained ImageNet classifier must put in its top 5 for each. Written down, not printed."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from gates.photos import sample_photo

# skimage.data photograph -> ImageNet labels any of which counts (the three domestic-cat classes are one
# answer: ImageNet's own annotators confuse them, and chelsea is a tabby-like cat of no clear breed).
EXPECTED_CLASSES = {
    "chelsea": {"tabby", "tiger cat", "Egyptian cat"},
    "coffee": {"espresso"},
    "rocket": {"missile", "projectile", "space shuttle"},
}


def photo_array(name: str) -> np.ndarray:
    return sample_photo(name)


def photo_tensor(name: str) -> torch.Tensor:
    """uint8 (3, H, W), as runtime.images.decode_image returns."""
    return torch.from_numpy(photo_array(name)).permute(2, 0, 1).contiguous()


def photo_jpeg(name: str, quality: int = 92) -> bytes:
    """The photograph as a user would send it."""
    buffer = io.BytesIO()
    Image.fromarray(photo_array(name)).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def top5_labels(logits: torch.Tensor, labels: list[str]) -> list[str]:
    return [labels[i] for i in logits.topk(5).indices.tolist()]
