"""The face detector's bodies: scikit-image's astronaut as a JPEG, lfw_subset's first 25 faces in a 5 x 5 grid
(models/mtcnn_entry.face_grid), and the astronaut as a 12 MP portrait phone JPEG stored sideways with its EXIF tag.

    python docs/results/2026-11-26-detectors-served/face_photos.py /tmp/m/faces
"""
import sys
from pathlib import Path

import numpy as np
import skimage.data
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from export.checks.phone_photos import phone_jpeg, upright_photo  # noqa: E402
from models import mtcnn_entry  # noqa: E402

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
Image.fromarray(skimage.data.astronaut()).save(out / "astronaut.jpg", quality=90)
Image.fromarray(np.stack([np.asarray(mtcnn_entry.face_grid())] * 3, -1)).save(out / "faces25.jpg", quality=90)
(out / "astronaut-12mp-sideways.jpg").write_bytes(
    phone_jpeg(upright_photo("astronaut", (3024, 4032), np.random.default_rng(0)), sideways=True))
