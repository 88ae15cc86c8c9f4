"""Images for calibrating and checking reduced-precision artifacts, read the way users have them.

`--calibration DIR` / `--validation DIR` are image folders in torchvision's ImageFolder layout
(DIR/<class>/<image>), read with `torchvision.datasets.ImageFolder` and a `DataLoader` with worker
processes. Every file goes through exactly the handler's decoding and preprocessing (runtime.images), so
the ranges int8 is calibrated on are those of the tensors it will be served.

Without a folder, a documented default: real photographs that scikit-image ships (`skimage.data`), cut
into several crops each, plus photo-like generated images (export.checks.parity.structured_images). The
photographs are split in two named halves (gates.photos), so the held-out images of the accuracy gate are never
the calibration images. Every set records where each image came from (the manifest lists them).
"""

from __future__ import annotations

import os
import random
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torchvision.datasets import ImageFolder

from export.checks.parity import structured_images
from export.errors import ExportError
from gates.photos import (
    CALIBRATION_PHOTOS,
    HOLDOUT_PHOTOS,
    IMAGE_EXTENSIONS,
    PHOTO_CROPS,
    crop,
    is_image_file,
    png_bytes,
    sample_photo,
)
from runtime.images import ImageContract, ImageError, decode_upright, preprocess

# MinMax calibration ranges settle after a few dozen varied images; 100 keeps the calibration short (measured:
# docs/results/2026-11-23-precision-ladder/) while covering every class of a small folder several times.
DEFAULT_CALIBRATION_SAMPLES = 100
# The gate's resolution is 1 / count: 128 images let 98 % agreement tolerate 2 flipped images, while fp32 and
# two int8 candidates over them stay a small part of an export. A user's folder is read up to 1000.
DEFAULT_HOLDOUT_SAMPLES = 128
MAX_VALIDATION_SAMPLES = 1000
LOADER_BATCH = 16
SAMPLE_SEED = 0

GENERATED_SEEDS = {"calibration": 1000, "holdout": 2000}  # different seeds: different generated images


class CalibrationDataError(ExportError):
    """An image folder cannot be used for calibration or validation; the message says which file or why."""


@dataclass
class ImageSet:
    """Preprocessed images (N, 3, H, W) float32 in [0, 1], with where each came from."""

    images: torch.Tensor
    sources: list[str]
    origin: str  # "folder DIR" or "default: ..."
    labels: list[int] | None = None  # class index per image (ImageFolder's), folders only
    classes: list[str] | None = None
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.sources)

    def describe(self, listed: int = 1000) -> dict:
        return {"origin": self.origin, "count": len(self), "classes": self.classes,
                "images": self.sources[:listed], **({"notes": self.notes} if self.notes else {})}


# ---------------------------------------------------------------- folders (ImageFolder + DataLoader)

class HandlerTransform:
    """bytes -> the handler's input row; a class (not a lambda) so DataLoader workers can pickle it."""

    def __init__(self, contract: ImageContract):
        self.contract = contract

    def __call__(self, data: bytes) -> torch.Tensor:
        return preprocess(decode_upright(data), self.contract)


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def image_folder(root: Path, contract: ImageContract):
    """torchvision's ImageFolder over DIR/<class>/<image>, each file decoded as the handler decodes it."""
    root = Path(root)
    if not root.is_dir():
        raise CalibrationDataError(f"{root} is not a folder; give an ImageFolder layout: {root}/<class>/<image>")
    try:
        return _CheckedImageFolder(str(root), loader=read_bytes, transform=HandlerTransform(contract),
                                   is_valid_file=is_image_file)
    except (FileNotFoundError, RuntimeError) as error:  # no class folders / no images in them
        raise CalibrationDataError(f"{root}: {error}; expected {root}/<class>/<image> "
                                   f"({', '.join(IMAGE_EXTENSIONS)})") from None


class _CheckedImageFolder(ImageFolder):
    """ImageFolder whose items carry a decoding error instead of raising in a worker process, so the main
    process can name every unreadable file at once."""

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        try:
            return super().__getitem__(index)[0], label, index, ""
        except ImageError as error:
            return torch.empty(0), label, index, f"{path}: {error.message}"


def _collate(rows):
    return rows  # images of one folder share the contract's crop, but errors must survive: stack later


def balanced_indices(targets: list[int], count: int, seed: int = SAMPLE_SEED) -> list[int]:
    """`count` indices taking classes in turn (each class's files in a seeded order): a deliberate, repeatable
    sample that covers every class even when the folder is much larger than the sample."""
    by_class: dict[int, list[int]] = defaultdict(list)
    for index, target in enumerate(targets):
        by_class[target].append(index)
    generator = random.Random(seed)
    queues = []
    for target in sorted(by_class):
        indices = by_class[target][:]
        generator.shuffle(indices)
        queues.append(indices)
    chosen: list[int] = []
    while len(chosen) < count and any(queues):
        for queue in queues:
            if queue and len(chosen) < count:
                chosen.append(queue.pop(0))
    return sorted(chosen)


def load_folder(root: Path, contract: ImageContract, count: int, workers: int | None = None,
                exclude: set[str] | None = None) -> ImageSet:
    """Read up to `count` images of an ImageFolder through a DataLoader with worker processes."""
    from torch.utils.data import DataLoader, Subset
    dataset = image_folder(root, contract)
    if exclude:
        overlap = sorted(exclude & {str(Path(p).resolve()) for p, _ in dataset.samples})
        if overlap:
            raise CalibrationDataError(f"{len(overlap)} validation image(s) are also calibration images (e.g. "
                                       f"{overlap[0]}): the gate must check held-out images; use separate folders")
    indices = balanced_indices(dataset.targets, count)
    workers = default_workers() if workers is None else workers
    loader = DataLoader(Subset(dataset, indices), batch_size=LOADER_BATCH, num_workers=workers,
                        collate_fn=_collate, shuffle=False)
    rows = [row for batch in loader for row in batch]
    problems = [error for _, _, _, error in rows if error]
    if problems:
        raise CalibrationDataError(f"{len(problems)} file(s) in {root} are not images the handler can read: "
                                   + "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")
                                   + " - remove or fix them")
    images = torch.stack([image for image, _, _, _ in rows])
    sources = [str(Path(dataset.samples[index][0]).resolve()) for _, _, index, _ in rows]
    notes = [] if len(indices) == len(dataset) else [f"{len(indices)} of {len(dataset)} images, classes taken in turn"]
    return ImageSet(images, sources, f"folder {Path(root).resolve()}", [label for _, label, _, _ in rows],
                    list(dataset.classes), notes)


def default_workers() -> int:
    """Two loader processes at most: decoding is light next to the model, and the machine may be small."""
    return max(0, min(2, (os.cpu_count() or 1) - 1))


# ---------------------------------------------------------------- the default set (no folder given)

def default_images(contract: ImageContract, role: str, count: int) -> ImageSet:
    """role "calibration" or "holdout": crops of that half's scikit-image photographs, then generated images."""
    with single_thread():
        return _default_images(contract, role, count)


@contextmanager
def single_thread():
    """torch's antialiased resize of one image is many times slower on 2 threads than on 1 (thread hand-off
    costs more than the work); DataLoader workers run 1 thread each for the same reason."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _default_images(contract: ImageContract, role: str, count: int) -> ImageSet:
    names = CALIBRATION_PHOTOS if role == "calibration" else HOLDOUT_PHOTOS
    rows, sources = [], []
    for name in names:
        photo = sample_photo(name)
        for crop_index, box in enumerate(PHOTO_CROPS):
            if len(rows) < count:
                rows.append(preprocess(decode_upright(png_bytes(crop(photo, box))), contract))
                sources.append(f"skimage.data.{name}() crop {crop_index} {box}")
    generated = count - len(rows)
    if generated > 0:
        height, width = contract.crop
        seed = GENERATED_SEEDS[role]
        pictures = structured_images(generated, 3, height * 2, width * 2, seed=seed)  # then the handler's path
        for index, picture in enumerate(pictures):
            encoded = png_bytes((picture.permute(1, 2, 0).numpy() * 255 + 0.5).astype(np.uint8))
            rows.append(preprocess(decode_upright(encoded), contract))
            sources.append(f"export.checks.parity.structured_images(seed={seed}) #{index}")
    origin = (f"default {role} set: {min(count, len(names) * len(PHOTO_CROPS))} crops of scikit-image photographs "
              f"({', '.join(names)}) and {max(generated, 0)} photo-like generated images")
    return ImageSet(torch.stack(rows), sources, origin)


# ---------------------------------------------------------------- what an export uses

def calibration_set(contract: ImageContract, folder: Path | None, count: int = DEFAULT_CALIBRATION_SAMPLES,
                    workers: int | None = None) -> ImageSet:
    if folder is not None:
        return load_folder(folder, contract, count, workers)
    return default_images(contract, "calibration", count)


def holdout_set(contract: ImageContract, folder: Path | None, calibration: ImageSet | None,
                count: int = DEFAULT_HOLDOUT_SAMPLES, workers: int | None = None) -> ImageSet:
    """The gate's images: the user's validation folder (never overlapping calibration), else the default
    held-out half."""
    if folder is not None:
        calibration_files = set(calibration.sources) if calibration and calibration.labels is not None else set()
        return load_folder(folder, contract, MAX_VALIDATION_SAMPLES, workers, exclude=calibration_files)
    return default_images(contract, "holdout", count)


CALIBRATION_BATCH = 8


class TensorReader:
    """ONNX Runtime's CalibrationDataReader over preprocessed images, in batches."""

    def __init__(self, images: torch.Tensor, input_name: str, batch: int = CALIBRATION_BATCH):
        self.arrays = [images[i:i + batch].numpy() for i in range(0, len(images), batch)]
        self.input_name = input_name
        self.position = 0

    def get_next(self):
        if self.position >= len(self.arrays):
            return None
        self.position += 1
        return {self.input_name: self.arrays[self.position - 1]}

    def rewind(self):
        self.position = 0
