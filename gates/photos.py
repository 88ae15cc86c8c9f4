"""The photographs gates compare answers on: scikit-image's (installed offline), split in two named halves so that
what calibrates a reduced-precision variant is never what judges it, cut into crops for varied framings; and a
user's folder of photos of the model's own domain.

export.precision.calibration preprocesses them into tensors; the rollout sends them as a client does (PNG bytes).
"""

from __future__ import annotations

import functools
import io
from pathlib import Path

import numpy as np
from PIL import Image

from contract.errors import VisionExportError
from contract.policy import ACCEPTED_FORMATS  # not runtime.images: a rollout reads photos without torch

# scikit-image's bundled photographs (no download), split so that calibration and held-out never share one.
CALIBRATION_PHOTOS = ("astronaut", "coffee", "hubble_deep_field", "retina", "camera", "coins", "brick", "grass")
HOLDOUT_PHOTOS = ("chelsea", "rocket", "immunohistochemistry", "clock", "moon", "gravel", "page", "cell")
# Crops of each photograph as (top, left, height, width) fractions: the whole frame and four overlapping
# views, so a handful of photographs gives varied framings and scales after the handler's resize.
PHOTO_CROPS = ((0.0, 0.0, 1.0, 1.0), (0.0, 0.0, 0.6, 0.6), (0.0, 0.4, 0.6, 0.6), (0.4, 0.0, 0.6, 0.6),
               (0.2, 0.2, 0.6, 0.6))
# Photos of a user's folder a gate compares on, at most: what a rollout's --photos DIR sends to both versions, and
# what an export carries (--holdout-photos DIR).
MAX_FOLDER_PHOTOS = 50
IMAGE_EXTENSIONS = tuple(f".{e.lower()}" for e in ACCEPTED_FORMATS if e != "MPO") + (".jpg", ".tif")


def is_image_file(path: str) -> bool:
    return path.lower().endswith(IMAGE_EXTENSIONS)


class PhotoFolderError(VisionExportError):
    """A folder of photos cannot be read; the message says which and what to give instead."""


@functools.cache
def sample_photo(name: str) -> np.ndarray:
    """scikit-image's photograph `name` as uint8 RGB (H, W, 3), greyscale ones repeated; cached, since each read
    decodes an image file, and so read-only."""
    import skimage.data
    array = getattr(skimage.data, name)()
    if array.ndim == 2:
        array = np.stack([array] * 3, axis=-1)
    array = np.ascontiguousarray(array[..., :3]).astype(np.uint8)
    array.setflags(write=False)
    return array


def crop(photo: np.ndarray, box: tuple[float, float, float, float]) -> np.ndarray:
    """The region `box` (top, left, height, width as fractions) of a photo."""
    height, width = photo.shape[:2]
    top, left, h, w = box
    return photo[int(top * height): int((top + h) * height), int(left * width): int((left + w) * width)]


def png_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG", compress_level=1)  # lossless either way; level 1 is fast
    return buffer.getvalue()


def held_out_photos(count: int) -> list[tuple[str, bytes]]:
    """(name, PNG bytes): the held-out half's photographs, whole then cropped, as a client would send them."""
    photos: list[tuple[str, bytes]] = []
    for crop_index, box in enumerate(PHOTO_CROPS):
        for name in HOLDOUT_PHOTOS:
            if len(photos) < count:
                photos.append((f"{name}#{crop_index}", png_bytes(crop(sample_photo(name), box))))
    return photos


def folder_photos(folder: Path, count: int) -> list[tuple[str, bytes]]:
    """(path within the folder, file bytes): up to `count` image files under `folder`, any layout, in name order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PhotoFolderError(f"{folder} is not a folder: give a folder of photos of the model's own domain")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and is_image_file(p.name))
    if not files:
        raise PhotoFolderError(f"{folder} holds no photos ({', '.join(IMAGE_EXTENSIONS)}): give a folder of photos "
                               "of the model's own domain")
    return [(str(path.relative_to(folder)), path.read_bytes()) for path in files[:count]]
