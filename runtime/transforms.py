"""The three tensor kernels of torchvision's evaluation transforms that serving runs (torchvision.transforms.v2's
resize and center_crop of an image tensor, and convert_image_dtype to float), written with torch alone.

Why not torchvision itself: importing it imports torchvision.ops and with them torch._dynamo and sympy, over a
second of every worker's start, for three functions that are each a call of torch. These compute what
torchvision 0.29's kernels compute, step for step (the same interpolate call, the same channels-last restride, the
same casts); tests/runtime/test_transforms.py holds them equal bit for bit to torchvision's on real photos.
"""

from __future__ import annotations

import platform

import torch
import torch.nn.functional as F

# torchvision's InterpolationMode values that work on tensors
ANTIALIASED_MODES = ("bilinear", "bicubic", "lanczos")  # the rest (nearest) ignore antialias
TENSOR_MODES = ("nearest", "nearest-exact", *ANTIALIASED_MODES)
# CPUs on which torch's bilinear interpolate has its vectorised uint8 kernel (torchvision asks the same)
NATIVE_UINT8_BILINEAR = ("AVX2", "AVX512")
NATIVE_UINT8_MACHINES = ("aarch64", "arm64")


def resize(image: torch.Tensor, size: list[int], mode: str = "bilinear", antialias: bool = True) -> torch.Tensor:
    """(C, H, W) -> (C, H', W'): `size` [S] resizes the shorter side to S (the longer one in proportion, rounded
    down), [H', W'] to exactly that; torchvision.transforms.v2.functional.resize of an image tensor."""
    if mode not in TENSOR_MODES:
        raise ValueError(f"interpolation {mode!r} cannot resize a tensor; use one of {', '.join(TENSOR_MODES)}")
    channels, height, width = image.shape[-3:]
    new_height, new_width = resized_size(height, width, size)
    if (new_height, new_width) == (height, width):
        return image
    if image.numel() == 0:
        return image.reshape(image.shape[:-3] + (channels, new_height, new_width))
    dtype, numel = image.dtype, image.numel()
    batch = image.reshape(-1, channels, height, width)
    strides = batch.stride()
    if batch.is_contiguous(memory_format=torch.channels_last) and batch.shape[0] == 1 and numel != strides[0]:
        # interpolate may allocate a channels-last 1CHW input's output as contiguous (pytorch#68430): restrided, it
        # keeps the layout, and the uint8 bilinear kernel writes its output without a repacking copy
        batch = batch.as_strided((1, channels, height, width), [numel, *strides[1:]])
    cast = dtype not in (torch.float32, torch.float64) and not native_dtype(dtype, mode, image.device.type)
    if cast:
        batch = batch.to(dtype=torch.float32)
    align_corners = False if mode in ANTIALIASED_MODES else None
    batch = F.interpolate(batch, size=[new_height, new_width], mode=mode, align_corners=align_corners,
                          antialias=antialias and mode in ANTIALIASED_MODES)
    if cast:
        if mode in ("bicubic", "lanczos") and dtype == torch.uint8:
            batch = batch.clamp_(min=0, max=255)  # they overshoot; a GPU or a CPU without the uint8 kernel
        if not dtype.is_floating_point:
            batch = batch.round_()
        batch = batch.to(dtype=dtype)
    return batch.reshape(image.shape[:-3] + (channels, new_height, new_width))


def native_dtype(dtype: torch.dtype, mode: str, device: str) -> bool:
    """Whether interpolate resizes `dtype` itself, rather than in float32 and rounded back."""
    if dtype != torch.uint8:
        return False
    if mode.startswith("nearest"):
        return True
    if device != "cpu":
        return False
    if mode == "bilinear":
        return (torch.backends.cpu.get_cpu_capability() in NATIVE_UINT8_BILINEAR
                or platform.machine() in NATIVE_UINT8_MACHINES)
    return True  # bicubic and lanczos: uint8 kernels on every CPU


def resized_size(height: int, width: int, size: list[int]) -> tuple[int, int]:
    """The (height, width) `size` asks for (see resize)."""
    if len(size) != 1:
        return size[0], size[1]
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size[0], int(size[0] * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


def center_crop(image: torch.Tensor, crop: list[int]) -> torch.Tensor:
    """(C, H, W) -> (C, crop height, crop width) from the centre, zero-padded where the image is smaller: a view
    when it is not; torchvision.transforms.v2.functional.center_crop of an image tensor."""
    crop_height, crop_width = (crop[0], crop[0]) if len(crop) == 1 else (crop[0], crop[1])
    if image.numel() == 0:
        return image.reshape(image.shape[:-2] + (crop_height, crop_width))
    height, width = image.shape[-2:]
    if crop_height > height or crop_width > width:
        pad_width, pad_height = max(crop_width - width, 0), max(crop_height - height, 0)
        # left, right, top, bottom: the odd pixel on the right and at the bottom
        image = F.pad(image, [pad_width // 2, (pad_width + 1) // 2, pad_height // 2, (pad_height + 1) // 2],
                      value=0.0)
        height, width = image.shape[-2:]
        if (crop_height, crop_width) == (height, width):
            return image
    top, left = int(round((height - crop_height) / 2.0)), int(round((width - crop_width) / 2.0))
    return image[..., top:top + crop_height, left:left + crop_width]


def to_float(image: torch.Tensor) -> torch.Tensor:
    """An image tensor as float32 in [0, 1]: integers divided by their type's largest value (uint8: 255), floats
    as they are; torchvision's convert_image_dtype(image, torch.float)."""
    if image.dtype == torch.float32:
        return image
    if image.is_floating_point():
        return image.to(torch.float32)
    return image.to(torch.float32) / float(torch.iinfo(image.dtype).max)
