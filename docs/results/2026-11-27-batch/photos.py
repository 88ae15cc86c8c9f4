"""N photo-sized JPEGs for the batch measurement: scikit-image's photographs (export/checks/phone_photos.py, with
grain, phone-like quality) at mixed sizes up to 12 MP, in turn by MIX's weights (default: equal shares of VGA, 2 MP,
6 MP, 12 MP); one encoding per (photo, size), copied under N names; one file per size in bodies/ for `python -m
measure pipeline`, and mix.json (each size's share of the N) for report.py's ceiling of the same mix.

    python docs/results/2026-11-27-batch/photos.py OUT N [vga:1,2mp:1,6mp:1,12mp:1]
"""

import json
import sys
from pathlib import Path

import numpy as np

from export.checks.phone_photos import phone_jpeg, upright_photo

SIZES = {"vga": (640, 480), "2mp": (1600, 1200), "6mp": (3000, 2000), "12mp": (4000, 3000)}
PHOTOS = ("chelsea", "coffee", "rocket", "astronaut")

out, count = Path(sys.argv[1]), int(sys.argv[2])
weights = dict(
    (name, int(share))
    for name, share in (part.split(":") for part in (sys.argv[3:] or ["vga:1,2mp:1,6mp:1,12mp:1"])[0].split(","))
)
photos_dir = out / "photos"
if photos_dir.exists():  # another N or mix before: start over
    for old in photos_dir.iterdir():
        old.unlink()
photos_dir.mkdir(parents=True, exist_ok=True)
(out / "bodies").mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
encoded = {}
for photo in PHOTOS:
    for size in weights:
        encoded[photo, size] = phone_jpeg(upright_photo(photo, SIZES[size], rng))
for size in weights:
    (out / "bodies" / f"{size}.jpg").write_bytes(encoded[PHOTOS[0], size])
turn = [size for size, share in weights.items() for _ in range(share)]
made = dict.fromkeys(weights, 0)
for index in range(count):
    size, photo = turn[index % len(turn)], PHOTOS[(index // len(turn)) % len(PHOTOS)]
    made[size] += 1
    (photos_dir / f"{index:05d}-{photo}-{size}.jpg").write_bytes(encoded[photo, size])
(out / "mix.json").write_text(json.dumps({f"{size}.jpg": made[size] / count for size in weights}) + "\n")
megabytes = sum(path.stat().st_size for path in photos_dir.iterdir()) / 1e6
print(f"{count} photos ({megabytes:.0f} MB) in {photos_dir}, by size {made}; bodies in {out / 'bodies'}")
