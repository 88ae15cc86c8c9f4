"""Request bodies the way users send them, for the serving benchmark and the decoder's tests.

    python -m examples.photo_sizes OUT_DIR [--seed S]

Writes, from scikit-image's photographs (installed offline), the sizes and formats a serving path meets:

| file | stored pixels | shown as | what it stands for |
|---|---|---|---|
| vga.jpg | 640x480 | 640x480 | a web image, a thumbnail upload |
| 2mp.jpg | 1600x1200 | 1600x1200 | a resized phone photo, a messaging app's copy |
| 12mp-sideways.jpg | 4032x3024, EXIF Orientation 6 | 3024x4032 | a phone photo taken upright: the sensor's raster stored sideways with the tag that turns it |
| screenshot.png | 1600x1200 | 1600x1200 | a lossless upload |

Phone-like JPEG: quality 90, 4:2:0 chroma. A photograph enlarged to 12 MP is smoother than a camera's, so
seeded sensor grain is added before encoding: the file sizes (listed in sizes.json with every other fact)
then land where phone JPEGs do (megabytes, not hundreds of kilobytes), which is what decoding cost follows.
Same seed, same bytes. Every file is written atomically (a temporary file, then renamed).
"""

from __future__ import annotations

import argparse
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from export.atomic import atomic_write_bytes, atomic_write_text
from export.calibration import sample_photo

EXIF_ORIENTATION = 0x0112
ROTATED_90_CW = 6  # the viewer turns the stored raster 90 degrees clockwise to show it upright
JPEG_QUALITY = 90
GRAIN_STD = 4.0  # in 0..255 levels: a phone sensor's noise after its denoiser, roughly
INDEX_FILE = "sizes.json"


@dataclass(frozen=True)
class Body:
    file: str
    photo: str  # the skimage.data photograph it is made from
    shown: tuple[int, int]  # width, height a viewer shows (after the EXIF orientation)
    format: str
    sideways: bool = False


BODIES = (
    Body("vga.jpg", "chelsea", (640, 480), "JPEG"),
    Body("2mp.jpg", "coffee", (1600, 1200), "JPEG"),
    Body("12mp-sideways.jpg", "astronaut", (3024, 4032), "JPEG", sideways=True),
    Body("screenshot.png", "rocket", (1600, 1200), "PNG"),
)


def upright_image(body: Body, rng: np.random.Generator) -> Image.Image:
    """The photograph centre-cropped to the body's aspect, resized to its shown size, with grain."""
    photo = Image.fromarray(sample_photo(body.photo))
    width, height = body.shown
    scale = min(photo.width / width, photo.height / height)
    crop_w, crop_h = round(width * scale), round(height * scale)
    left, top = (photo.width - crop_w) // 2, (photo.height - crop_h) // 2
    resized = photo.crop((left, top, left + crop_w, top + crop_h)).resize((width, height), Image.LANCZOS)
    pixels = np.asarray(resized, dtype=np.float32) + rng.normal(0.0, GRAIN_STD, (height, width, 3))
    return Image.fromarray(np.clip(pixels + 0.5, 0, 255).astype(np.uint8))


def encode(body: Body, image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    if body.format == "PNG":
        image.save(buffer, format="PNG")
        return buffer.getvalue()
    exif = Image.Exif()
    if body.sideways:  # store the raster turned back, so that Orientation 6 shows it upright
        image = image.transpose(Image.Transpose.ROTATE_90)
        exif[EXIF_ORIENTATION] = ROTATED_90_CW
    image.save(buffer, format="JPEG", quality=JPEG_QUALITY, subsampling="4:2:0", exif=exif)
    return buffer.getvalue()


def write_bodies(out: Path, seed: int = 0) -> list[dict]:
    """Write every body into out; returns (and writes to sizes.json) what each one is."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    index = []
    for body in BODIES:
        data = encode(body, upright_image(body, rng))
        atomic_write_bytes(out / body.file, data)
        stored = Image.open(io.BytesIO(data)).size
        index.append({**asdict(body), "shown": list(body.shown), "stored": list(stored), "bytes": len(data), "seed": seed})
    atomic_write_text(out / INDEX_FILE, json.dumps(index, indent=2) + "\n")
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, metavar="OUT_DIR")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for row in write_bodies(args.out, args.seed):
        shown = "x".join(map(str, row["shown"]))
        stored = "x".join(map(str, row["stored"]))
        print(f"{row['file']:<20} {row['format']:<4} stored {stored:<10} shown {shown:<10} {row['bytes'] / 1e6:.2f} MB")
    print(f"wrote {len(BODIES)} files and {INDEX_FILE} to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
