"""N photo-sized JPEGs for the batch measurement: scikit-image's photographs (export/checks/phone_photos.py, with
grain, phone-like quality) at mixed sizes up to 12 MP, the sizes in turn; one encoding per (photo, size), copied
under N names; one file per size in bodies/ for `python -m measure pipeline`.

    python docs/results/2026-11-27-batch/photos.py OUT N
"""

import sys
from pathlib import Path

import numpy as np

from export.checks.phone_photos import phone_jpeg, upright_photo

SIZES = {"vga": (640, 480), "2mp": (1600, 1200), "6mp": (3000, 2000), "12mp": (4000, 3000)}
PHOTOS = ("chelsea", "coffee", "rocket", "astronaut")

out, count = Path(sys.argv[1]), int(sys.argv[2])
(out / "photos").mkdir(parents=True, exist_ok=True)
(out / "bodies").mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
encoded = {}
for photo in PHOTOS:
    for size, shown in SIZES.items():
        encoded[photo, size] = phone_jpeg(upright_photo(photo, shown, rng))
for size in SIZES:
    (out / "bodies" / f"{size}.jpg").write_bytes(encoded[PHOTOS[0], size])
keys = [(photo, size) for size in SIZES for photo in PHOTOS]
for index in range(count):
    photo, size = keys[index % len(keys)]
    (out / "photos" / f"{index:05d}-{photo}-{size}.jpg").write_bytes(encoded[photo, size])
print(f"{count} photos in {out / 'photos'}, sizes {', '.join(SIZES)} in turn; bodies in {out / 'bodies'}")
