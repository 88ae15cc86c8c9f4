"""The photos gates compare on: the held-out photographs as PNG, never the calibration ones, and a folder of the
model's own domain, refused with what to give when it holds no photo."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gates.photos import CALIBRATION_PHOTOS, HOLDOUT_PHOTOS, PhotoFolderError, folder_photos, held_out_photos
from tests.conftest import ROOT


def test_held_out_photos_are_pngs_of_the_held_out_half():
    photos = held_out_photos(10)
    assert len(photos) == 10 and all(image[:4] == b"\x89PNG" for _, image in photos)
    assert {name.split("#")[0] for name, _ in photos} <= set(HOLDOUT_PHOTOS)
    assert not set(HOLDOUT_PHOTOS) & set(CALIBRATION_PHOTOS)


def test_a_folder_gives_its_photos_and_an_empty_one_is_refused(tmp_path):
    (tmp_path / "faces").mkdir()
    (tmp_path / "faces" / "a.png").write_bytes(held_out_photos(1)[0][1])
    (tmp_path / "notes.txt").write_text("not a photo")
    assert [name for name, _ in folder_photos(tmp_path, 5)] == ["faces/a.png"]
    with pytest.raises(PhotoFolderError, match="is not a folder"):
        folder_photos(tmp_path / "missing", 5)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PhotoFolderError, match="holds no photos .* own domain"):
        folder_photos(tmp_path / "empty", 5)


def test_reading_the_photos_imports_no_torch():
    """A rollout reads its photos while the candidate loads, before its comparator needs torch: a fresh interpreter
    reads them and has not imported it."""
    code = "import sys; from gates.photos import held_out_photos; held_out_photos(2); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr[-2000:]
