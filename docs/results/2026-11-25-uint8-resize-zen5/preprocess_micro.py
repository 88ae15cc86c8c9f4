"""Preprocessing of one decoded image, one torch thread, before (PIL's antialiased resize of the centre crop's
window, main at 5ef0c88) and after (runtime.images.preprocess: torchvision.transforms.v2 on the uint8 pixels);
the two rows' largest difference in levels and the share of values that differ.

    PYTHONPATH=. python docs/results/2026-11-25-uint8-resize-zen5/preprocess_micro.py EXPORT_DIR... (bodies from examples/photo_sizes.py in /tmp/exp/bodies)
"""
import sys
import time
from pathlib import Path

import torch
from PIL import Image
from torchvision.transforms import functional as TF

from contract.records import Manifest
from runtime.images import decode_upright, draft_floor, preprocess

BODIES = Path("/tmp/exp/bodies")
PIL_RESAMPLING = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def crop_window(size, contract):
    """The crop-window path's box (5ef0c88's runtime.images.crop_window; antialiased bilinear/bicubic contracts)."""
    width, height = size
    short, long = sorted((width, height))
    resized_long = int(contract.resize * long / short)
    new_w, new_h = (contract.resize, resized_long) if width <= height else (resized_long, contract.resize)
    crop_h, crop_w = contract.crop
    top, left = int(round((new_h - crop_h) / 2.0)), int(round((new_w - crop_w) / 2.0))
    scale_x, scale_y = width / new_w, height / new_h
    return (left * scale_x, top * scale_y, (left + crop_w) * scale_x, (top + crop_h) * scale_y)


def before(image, contract):
    cropped = image.resize(contract.crop[::-1], PIL_RESAMPLING[contract.interpolation],
                           box=crop_window(image.size, contract))
    return TF.convert_image_dtype(TF.pil_to_tensor(cropped), torch.float)


def ms(function, repeats=20):
    function()
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - start) / repeats * 1000


torch.set_num_threads(1)
for folder in sys.argv[1:]:
    contract = Manifest.read(Path(folder)).input.image_contract()
    for body in sorted(BODIES.glob("*.[jp][pn]g")):
        image = decode_upright(body.read_bytes(), draft_floor(contract))
        levels = ((before(image, contract) - preprocess(image, contract)).abs() * 255).round()
        print(f"{Path(folder).name:6} {body.name:18} {str(image.size):12} before {ms(lambda: before(image, contract)):6.2f} ms"
              f"  after {ms(lambda: preprocess(image, contract)):6.2f} ms  max {levels.max().item():.0f} level(s),"
              f" {100 * (levels > 0).float().mean().item():.2f} % differ")
