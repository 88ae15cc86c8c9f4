"""One decoded image's preprocessing, before and after the uint8 resize, timed on one torch thread.

    python -m examples.preprocess_micro BODIES_DIR EXPORT_DIR [EXPORT_DIR ...] [--repeats 20]

For each export (its manifest's image contract) and each body in BODIES_DIR (*.jpg, *.png: e.g. the folder
`python -m examples.photo_sizes BODIES_DIR` writes, plus examples/cat.jpg), decoded as the served path decodes it
(runtime.images.decode_upright with the contract's draft floor), one line: the milliseconds of

- before: PIL's antialiased resize of the centre crop's window straight to the crop size, then to float (the
  request path at 5ef0c88, restated here: its crop_window);
- after: runtime.images.preprocess (torchvision.transforms.v2 on the uint8 pixels, then float);

and how far apart the two tensors are: the largest difference in levels (1/255) and the share of values that
differ. The image is decoded once; each row is the mean of --repeats calls after one warm-up call.
Read in docs/results/2026-11-25-serving-overhead/analysis.md (third pass); a run's output: docs/results/2026-11-25-uint8-resize-zen5/.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image
from torchvision.transforms import functional as TF

from contract.records import Manifest
from runtime.images import ImageContract, decode_upright, draft_floor, preprocess

DEFAULT_REPEATS = 20
BODY_PATTERN = "*.[jp][pn]g"  # .jpg and .png
PIL_RESAMPLING = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def crop_window(size: tuple[int, int], contract: ImageContract) -> tuple[float, float, float, float]:
    """The crop-window path's box in the decoded image's pixels (5ef0c88's runtime.images.crop_window)."""
    width, height = size
    short, long = sorted((width, height))
    resized_long = int(contract.resize * long / short)
    new_w, new_h = (contract.resize, resized_long) if width <= height else (resized_long, contract.resize)
    crop_h, crop_w = contract.crop
    top, left = round((new_h - crop_h) / 2.0), round((new_w - crop_w) / 2.0)
    scale_x, scale_y = width / new_w, height / new_h
    return (left * scale_x, top * scale_y, (left + crop_w) * scale_x, (top + crop_h) * scale_y)


def before(image: Image.Image, contract: ImageContract) -> torch.Tensor:
    cropped = image.resize(contract.crop[::-1], PIL_RESAMPLING[contract.interpolation],
                           box=crop_window(image.size, contract))
    return TF.convert_image_dtype(TF.pil_to_tensor(cropped), torch.float)


def ms(function: Callable[[], object], repeats: int) -> float:
    """Mean milliseconds of one call, after one warm-up call."""
    function()
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - start) / repeats * 1000


def row(export: Path, body: Path, contract: ImageContract, repeats: int) -> str:
    image = decode_upright(body.read_bytes(), draft_floor(contract))
    levels = ((before(image, contract) - preprocess(image, contract)).abs() * 255).round()
    return (f"{export.name:6} {body.name:18} {image.size!s:12} "
            f"before {ms(lambda: before(image, contract), repeats):6.2f} ms"
            f"  after {ms(lambda: preprocess(image, contract), repeats):6.2f} ms"
            f"  max {levels.max().item():.0f} level(s), {100 * (levels > 0).float().mean().item():.2f} % differ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bodies", type=Path, metavar="BODIES_DIR")
    parser.add_argument("exports", type=Path, nargs="+", metavar="EXPORT_DIR")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help=f"default {DEFAULT_REPEATS}")
    args = parser.parse_args(argv)
    bodies = sorted(args.bodies.glob(BODY_PATTERN))
    if not bodies:
        parser.error(f"no .jpg or .png in {args.bodies}")
    if args.repeats < 1:
        parser.error("--repeats must be 1 or more")
    torch.set_num_threads(1)
    for export in args.exports:
        contract = Manifest.read(export).input.image_contract()
        for body in bodies:
            print(row(export, body, contract, args.repeats), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
