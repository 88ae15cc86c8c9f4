"""A 1000-image held-out folder for the accuracy gate (export --validation DIR): random crops of the default
held-out half's scikit-image photographs (never the calibration half's) and photo-like generated images of a seed
neither default set uses. One class folder: agreement with fp32 only, no labels."""
import io, sys
from pathlib import Path
import numpy as np
from PIL import Image
from export.precision.calibration import HOLDOUT_PHOTOS, sample_photo
from export.checks.parity import structured_images

out = Path(sys.argv[1]) / "unlabelled"
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(7)
count = 0
for index in range(500):
    photo = sample_photo(HOLDOUT_PHOTOS[index % len(HOLDOUT_PHOTOS)])
    h, w = photo.shape[:2]
    side = rng.uniform(0.3, 1.0)
    ch, cw = int(h * side), int(w * side)
    top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
    Image.fromarray(photo[top:top + ch, left:left + cw]).save(out / f"crop-{index:04d}.png", compress_level=1)
for index, picture in enumerate(structured_images(500, 3, 448, 448, seed=5000)):
    Image.fromarray((picture.permute(1, 2, 0).numpy() * 255 + 0.5).astype(np.uint8)).save(out / f"generated-{index:04d}.png", compress_level=1)
print(len(list(out.iterdir())), "images in", out)
