"""A small labelled validation folder from real photographs, for `python -m export ... --validation DIR`.

    python -m examples.validation_folder OUT_DIR [--crops N] [--seed S]

Writes a torchvision ImageFolder, OUT_DIR/<ImageNet label>/<photo>-<nnn>.<jpg|png>: each of scikit-image's
sample photographs that shows an ImageNet-1k class (installed with scikit-image, no download), as it is
(`-000.png`) and as N seeded augmentations of it: a random resized crop, a horizontal flip half the time,
a small brightness/contrast/saturation jitter, then JPEG at one of several qualities or PNG. The folder
names are the labels exactly as the models list them, so the export's accuracy report maps them onto the
model's outputs (export.precision.gate.label_targets) and reports top-1/top-5 per precision and the drop.

Which photographs, and the label each honestly is:
- chelsea -> "tabby": a ginger tabby cat. ImageNet's tabby / tiger cat / Egyptian cat are confused by its
  own annotators; EfficientNet-Lite0 says "tiger cat" first and "tabby" third, so top-1 on this class is
  expected to miss while top-5 holds.
- coffee -> "espresso": a small cup of coffee on a saucer.
- rocket -> "missile": a launch vehicle on its pad; ImageNet-1k has no rocket class and "missile" is its
  nearest ("projectile" and "space shuttle" are the runners-up a classifier gives).
- camera -> "tripod": the cameraman photograph (greyscale, written as RGB), a camera on a tripod in front.
Left out: astronaut (no ImageNet class), clock (motion-blurred, wall or analog clock?), hubble_deep_field,
coins, retina, moon and the textures (no class, or none a person would give).

The export's default calibration set also takes crops of coffee and camera: for accuracy on photographs
the int8 calibration never saw, pass --calibration with other images (or count on chelsea and rocket only).

Same seed, same files, byte for byte. Every file is written atomically (a temporary file, then renamed), and
files of an earlier run that this one does not write again (a larger --crops) are removed.
"""

from __future__ import annotations

import argparse
import io
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

from contract.files import atomic_write_bytes
from gates.photos import sample_photo

DEFAULT_CROPS = 12
DEFAULT_SEED = 0
PHOTOS = {"chelsea": "tabby", "coffee": "espresso", "rocket": "missile", "camera": "tripod"}  # skimage.data -> label
CROP_SCALE = (0.35, 1.0)  # share of the photo's area a crop keeps: the class stays in view
CROP_RATIO = (3 / 4, 4 / 3)
JITTER = 0.15  # brightness, contrast and saturation factors within 1 +- JITTER
ENCODINGS = (("jpg", 60), ("jpg", 75), ("jpg", 90), ("png", None))
ORIGINAL = 0  # file number of the unaugmented photograph
OWN_FILE = re.compile(r"^(?P<photo>[a-z_]+)-\d{3}\.(jpg|png)$")  # names this tool writes (and may remove)


@dataclass(frozen=True)
class Written:
    path: Path
    label: str


def photo(name: str) -> Image.Image:
    return Image.fromarray(sample_photo(name))


def random_resized_crop(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """torchvision's RandomResizedCrop draw (area share, log-uniform aspect ratio), kept at the crop's size."""
    width, height = image.size
    for _ in range(10):
        area = width * height * rng.uniform(*CROP_SCALE)
        ratio = np.exp(rng.uniform(*np.log(CROP_RATIO)))
        crop_w, crop_h = round(np.sqrt(area * ratio)), round(np.sqrt(area / ratio))
        if 0 < crop_w <= width and 0 < crop_h <= height:
            left, top = int(rng.integers(0, width - crop_w + 1)), int(rng.integers(0, height - crop_h + 1))
            return image.crop((left, top, left + crop_w, top + crop_h))
    return image  # no crop of that shape fits: the whole photograph


def augmented(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    image = random_resized_crop(image, rng)
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    for enhancer in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        image = enhancer(image).enhance(rng.uniform(1 - JITTER, 1 + JITTER))
    return image


def encoded(image: Image.Image, extension: str, quality: int | None) -> bytes:
    buffer = io.BytesIO()
    if extension == "jpg":
        image.save(buffer, format="JPEG", quality=quality)
    else:
        image.save(buffer, format="PNG")
    return buffer.getvalue()


def photo_files(name: str, crops: int, seed: int, index: int) -> list[tuple[str, bytes]]:
    """(file name, bytes) for one photograph: the original, then its augmentations."""
    rng = np.random.default_rng([seed, index])  # one stream per photograph: adding one changes no other
    original = photo(name)
    files = [(f"{name}-{ORIGINAL:03d}.png", encoded(original, "png", None))]
    for number in range(1, crops + 1):
        image = augmented(original, rng)
        extension, quality = ENCODINGS[int(rng.integers(len(ENCODINGS)))]
        files.append((f"{name}-{number:03d}.{extension}", encoded(image, extension, quality)))
    return files


def build_folder(out: Path, crops: int = DEFAULT_CROPS, seed: int = DEFAULT_SEED) -> list[Written]:
    written = []
    for index, (name, label) in enumerate(PHOTOS.items()):
        folder = out / label
        folder.mkdir(parents=True, exist_ok=True)
        for file_name, data in photo_files(name, crops, seed, index):
            atomic_write_bytes(folder / file_name, data)
            written.append(Written(folder / file_name, label))
    remove_stale(out, {w.path for w in written})
    return written


def remove_stale(out: Path, kept: set[Path]) -> None:
    """Files an earlier run wrote that this one did not (only names this tool writes, only in its folders)."""
    for label in set(PHOTOS.values()):
        for path in (out / label).iterdir():
            if OWN_FILE.match(path.name) and path not in kept:
                path.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, metavar="OUT_DIR")
    parser.add_argument("--crops", type=int, default=DEFAULT_CROPS, help="augmented crops per photograph "
                        f"(default {DEFAULT_CROPS}), besides the photograph itself")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"default {DEFAULT_SEED}")
    args = parser.parse_args(argv)
    if args.crops < 0:
        parser.error("--crops must be 0 or more")
    written = build_folder(args.out, args.crops, args.seed)
    print(f"wrote {len(written)} images in {len(PHOTOS)} classes ({', '.join(PHOTOS.values())}) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
