"""Request bodies the way users send them, for the serving benchmark and the decoder's tests.

    python -m examples.photo_sizes OUT_DIR [--seed S]

Writes, from scikit-image's photographs (installed offline), the sizes and formats a serving path meets:

| file | stored pixels | shown as | what it stands for |
|---|---|---|---|
| vga.jpg | 640x480 | 640x480 | a web image, a thumbnail upload |
| 2mp.jpg | 1600x1200 | 1600x1200 | a resized phone photo, a messaging app's copy |
| 12mp-sideways.jpg | 4032x3024, EXIF Orientation 6 | 3024x4032 | a phone photo taken upright: the sensor's raster stored sideways with the tag that turns it |
| screenshot.png | 1600x1200 | 1600x1200 | a lossless upload |

The photographs are export/checks/phone_photos.py's (seeded grain, phone-like JPEG quality 90 4:2:0, the same ones
the export's decode check measures draft decoding on); sizes.json lists every fact of every file. Same seed,
same bytes. Every file is written atomically (a temporary file, then renamed).
"""

from __future__ import annotations

import argparse
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from contract.files import atomic_write_bytes, atomic_write_text
from export.checks.phone_photos import phone_jpeg, png, upright_photo

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


def encode(body: Body, rng: np.random.Generator) -> bytes:
    image = upright_photo(body.photo, body.shown, rng)
    return png(image) if body.format == "PNG" else phone_jpeg(image, sideways=body.sideways)


def write_bodies(out: Path, seed: int = 0) -> list[dict]:
    """Write every body into out; returns (and writes to sizes.json) what each one is."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    index = []
    for body in BODIES:
        data = encode(body, rng)
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
