"""The held-out photos an export carries (`--holdout-photos DIR`): a user's photos of the model's own domain (a face
detector's faces), copied into the export folder's holdout/ and so into its archive, each recorded in manifest.json
(path, sha256, bytes) so that the export's and the rollout's sha256 checks and the archive's signature cover them.
`python -m serving rollout` judges a version on the photos its archive carries (serving/rollout/gate.py).

The folder is checked whole before anything is written, every problem named with its file: JPEG or PNG only, each
decoded as the server decodes a request, each within one request's body, and the set bounded in count and size."""

from __future__ import annotations

import io
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from PIL import Image

from contract.errors import ImageError, ImageProblem
from contract.policy import MAX_BODY_BYTES
from contract.records import Manifest
from export.errors import ExportError
from export.package.manifest import file_record
from gates.photos import MAX_FOLDER_PHOTOS
from runtime.images import decode_upright

HOLDOUT_FOLDER = "holdout"  # in the export folder and the archive
HOLDOUT_FORMATS = ("JPEG", "PNG")  # photos as cameras and clients send them
MAX_HOLDOUT_BYTES = 64 * 2**20  # all of them together: every archive of the name carries them to every server
OPTION = "--holdout-photos"


class HoldoutError(ExportError):
    """A held-out folder that cannot travel with the export; the message names each file and what to do."""


@dataclass(frozen=True)
class HeldOutPhotos:
    """A checked folder: the photos' paths within it (POSIX, in name order)."""

    folder: Path
    names: tuple[str, ...]


def checked_holdout(folder: Path | None) -> HeldOutPhotos | None:
    """--holdout-photos DIR, every photo checked (None: not asked for). Hidden files (a desktop's .DS_Store) are
    no photos and are left behind; any other file must be a photo."""
    if folder is None:
        return None
    folder = Path(folder)
    if not folder.is_dir():
        raise HoldoutError(f"{OPTION} {folder}: not a folder; give a folder of JPEG or PNG photos of the model's "
                           "own domain")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not _hidden(p.relative_to(folder)))
    if not files:
        raise HoldoutError(f"{OPTION} {folder} holds no photos: give a folder of JPEG or PNG photos of the model's "
                           "own domain")
    if len(files) > MAX_FOLDER_PHOTOS:
        raise HoldoutError(f"{OPTION} {folder} holds {len(files)} files: at most {MAX_FOLDER_PHOTOS} photos travel "
                           "with an export (a rollout sends each to both versions); keep the most telling ones")
    problems = {str(path): why for path in files if (why := photo_problem(path))}
    if problems:
        raise HoldoutError(f"{OPTION} {folder}: " + "; ".join(f"{path}: {why}" for path, why in problems.items())
                           + f"; remove or convert them (only {' and '.join(HOLDOUT_FORMATS)} photos travel)")
    total = sum(path.stat().st_size for path in files)
    if total > MAX_HOLDOUT_BYTES:
        raise HoldoutError(f"{OPTION} {folder}: its photos take {total / 2**20:.1f} MiB, more than the "
                           f"{MAX_HOLDOUT_BYTES / 2**20:.0f} MiB an export carries; keep fewer or smaller ones")
    return HeldOutPhotos(folder, tuple(path.relative_to(folder).as_posix() for path in files))


def photo_problem(path: Path) -> str | None:
    """What keeps a file from travelling as a held-out photo, or None."""
    try:
        data = path.read_bytes()
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if len(data) > MAX_BODY_BYTES:
        return f"{len(data) / 2**20:.1f} MiB, more than one request may carry ({MAX_BODY_BYTES / 2**20:.0f} MiB)"
    try:
        decode_upright(data)  # what a server does with it: a photo it refuses would fail the rollout instead
    except ImageError as error:
        return "not an image" if error.problem is ImageProblem.NOT_AN_IMAGE else error.message
    with Image.open(io.BytesIO(data)) as image:
        found = image.format
    return None if found in HOLDOUT_FORMATS else f"a {found} image, not {' or '.join(HOLDOUT_FORMATS)}"


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def carry_holdout(stage: Path, manifest: Manifest, photos: HeldOutPhotos | None,
                  say: Callable[[str], None] = print) -> None:
    """The checked photos copied into the export folder being built and recorded in its manifest, said in a line."""
    if photos is None:
        return
    for name in photos.names:
        target = Path(stage) / HOLDOUT_FOLDER / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(photos.folder / name, target)
        manifest.holdout_photos[f"{HOLDOUT_FOLDER}/{name}"] = file_record(stage, f"{HOLDOUT_FOLDER}/{name}")
    say(f"held-out photos carried: {len(photos.names)} from {photos.folder} in {HOLDOUT_FOLDER}/ and the archive "
        "(a rollout judges this version on them)")
