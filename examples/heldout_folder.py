"""A large unlabelled held-out folder for the accuracy gate, for `python -m export ... --validation DIR`.

    python -m examples.heldout_folder OUT_DIR [--count 1000] [--seed 7] [--generated-seed 5000]

Writes OUT_DIR/unlabelled/: --count PNG images (compress level 1), half of them random crops of the default
held-out half's scikit-image photographs (export.precision.calibration.HOLDOUT_PHOTOS, never the calibration
half's; installed with scikit-image, no download), the other half photo-like generated images
(export.checks.parity.structured_images, 448x448) of a seed neither default set uses. One class folder: the gate
judges agreement with fp32 only, no labels.

Why: the gate counts top-1 agreement where fp32 is confident, once at least 32 held-out images are. On random
weights the default 128 held-out images hold too few confident ones; 1000 of these held 67 for ResNet-50
(docs/results/2026-11-23-precision-ladder/, docs/results/2026-11-25-resnet50-gate-1000/).

A crop keeps a random share of 0.3 to 1 of each side at a random place, the photographs taken in turn; --seed
draws the crops, --generated-seed the generated images. Same arguments, same files, byte for byte. Every file is
written atomically (a temporary file, then renamed), and files of an earlier run that this one does not write
again (a larger --count) are removed.
"""

from __future__ import annotations

import argparse
import io
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from contract.files import atomic_write_bytes
from export.checks.parity import structured_images
from gates.photos import HOLDOUT_PHOTOS, sample_photo

DEFAULT_COUNT = 1000
DEFAULT_SEED = 7
DEFAULT_GENERATED_SEED = 5000  # the default sets' generated images use 1000 and 2000 (calibration.GENERATED_SEEDS)
CLASS_FOLDER = "unlabelled"
CROP_SIDE = (0.3, 1.0)  # share of each side a crop keeps
GENERATED_SIZE = 448
PNG_COMPRESS_LEVEL = 1
OWN_FILE = re.compile(r"^(crop|generated)-\d{4}\.png$")  # names this tool writes (and may remove)


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    return buffer.getvalue()


def crops(count: int, seed: int) -> Iterator[tuple[str, bytes]]:
    """(file name, bytes) of `count` random crops of the held-out photographs, taken in turn."""
    rng = np.random.default_rng(seed)
    photos = {name: sample_photo(name) for name in HOLDOUT_PHOTOS}
    for index in range(count):
        photo = photos[HOLDOUT_PHOTOS[index % len(HOLDOUT_PHOTOS)]]
        height, width = photo.shape[:2]
        side = rng.uniform(*CROP_SIDE)
        crop_h, crop_w = int(height * side), int(width * side)
        top, left = rng.integers(0, height - crop_h + 1), rng.integers(0, width - crop_w + 1)
        yield f"crop-{index:04d}.png", png(photo[top:top + crop_h, left:left + crop_w])


def generated(count: int, seed: int) -> Iterator[tuple[str, bytes]]:
    """(file name, bytes) of `count` photo-like generated images (made all at once: 2.4 MB each in float32)."""
    if count == 0:
        return
    for index, picture in enumerate(structured_images(count, 3, GENERATED_SIZE, GENERATED_SIZE, seed=seed)):
        yield f"generated-{index:04d}.png", png((picture.permute(1, 2, 0).numpy() * 255 + 0.5).astype(np.uint8))


def build_folder(out: Path, count: int = DEFAULT_COUNT, seed: int = DEFAULT_SEED,
                 generated_seed: int = DEFAULT_GENERATED_SEED) -> list[Path]:
    """Write count images into out/unlabelled (count // 2 crops, the rest generated); returns their paths."""
    folder = out / CLASS_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in itertools.chain(crops(count // 2, seed), generated(count - count // 2, generated_seed)):
        atomic_write_bytes(folder / name, data)
        written.append(folder / name)
    remove_stale(folder, set(written))
    return written


def remove_stale(folder: Path, kept: set[Path]) -> None:
    """Files an earlier run wrote that this one did not (only names this tool writes)."""
    for path in folder.iterdir():
        if OWN_FILE.match(path.name) and path not in kept:
            path.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, metavar="OUT_DIR")
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT,
                        help=f"images in all, half crops and half generated (default {DEFAULT_COUNT})")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"the crops' draw (default {DEFAULT_SEED})")
    parser.add_argument("--generated-seed", type=int, default=DEFAULT_GENERATED_SEED,
                        help=f"the generated images' seed (default {DEFAULT_GENERATED_SEED})")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be 1 or more")
    written = build_folder(args.out, args.count, args.seed, args.generated_seed)
    print(f"wrote {len(written)} images ({args.count // 2} photo crops, {args.count - args.count // 2} generated) "
          f"to {args.out / CLASS_FOLDER}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
