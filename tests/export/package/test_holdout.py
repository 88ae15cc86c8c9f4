"""--holdout-photos DIR: a user's held-out photos checked whole before anything is written (JPEG or PNG, each decoded
as a server decodes it, bounded in count and size), copied into the export folder and its archive and recorded in
the manifest, so that every sha256 check and the archive's signature cover them."""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from contract.records import MANIFEST_NAME, Manifest
from export.cli import build_parser
from export.package import holdout
from export.package.holdout import HoldoutError, carry_holdout, checked_holdout
from export.package.manifest import verify_hashes
from gates.photos import MAX_FOLDER_PHOTOS, png_bytes, sample_photo
from runtime.integrity import IntegrityError, verify_archive_signature
from tests.export.user_models import PLAIN, PLAIN_SHAPE
from tests.runtime.test_signatures import key_pair, rewritten
from tests.serving.manifests import manifest


def jpeg_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def faces_folder(folder: Path) -> Path:
    """Two photos of the astronaut's face (a PNG, a JPEG in a subfolder) and a desktop's hidden file."""
    (folder / "close").mkdir(parents=True)
    face = np.ascontiguousarray(sample_photo("astronaut")[:220, 140:360])
    (folder / "whole.png").write_bytes(png_bytes(face))
    (folder / "close" / "crop.jpg").write_bytes(jpeg_bytes(np.ascontiguousarray(face[20:180, 30:190])))
    (folder / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    return folder


def tiny_png() -> bytes:
    return png_bytes(np.full((8, 8, 3), 128, np.uint8))


def test_a_folder_of_photos_is_checked_then_carried_and_recorded_with_its_sha256(tmp_path):
    folder = faces_folder(tmp_path / "faces")
    photos = checked_holdout(folder)
    assert photos.names == ("close/crop.jpg", "whole.png")  # the hidden file is left behind
    stage = tmp_path / "stage"
    stage.mkdir()
    found = dataclasses.replace(manifest("traced", ("traced",)), artifacts={})  # its photos are all it records
    carry_holdout(stage, found, photos)
    assert list(found.holdout_photos) == ["holdout/close/crop.jpg", "holdout/whole.png"]
    for path, record in found.holdout_photos.items():
        copied = (stage / path).read_bytes()
        assert copied == (folder / path.removeprefix("holdout/")).read_bytes() and record.bytes == len(copied)
    verify_hashes(stage, found)
    assert Manifest.from_json(found.to_json()) == found  # written and read back
    (stage / "holdout" / "whole.png").write_bytes(tiny_png())  # another photo after the export
    with pytest.raises(IntegrityError, match="holdout/whole.png"):
        verify_hashes(stage, found)


def test_a_manifest_written_before_the_option_still_loads(tmp_path):
    written = json.loads(manifest("traced", ("traced",)).to_json())
    del written["holdout_photos"]
    assert Manifest.from_dict(written).holdout_photos == {}


def test_the_folder_is_bounded_in_count_and_size(tmp_path, monkeypatch):
    many = tmp_path / "many"
    many.mkdir()
    for index in range(MAX_FOLDER_PHOTOS + 1):
        (many / f"{index:03d}.png").write_bytes(tiny_png())
    with pytest.raises(HoldoutError, match=f"holds {MAX_FOLDER_PHOTOS + 1} files: at most {MAX_FOLDER_PHOTOS}"):
        checked_holdout(many)
    folder = faces_folder(tmp_path / "faces")
    sizes = {path.name: path.stat().st_size for path in folder.rglob("*.*g")}
    monkeypatch.setattr(holdout, "MAX_HOLDOUT_BYTES", sum(sizes.values()) - 1)
    with pytest.raises(HoldoutError, match="its photos take .* MiB, more than the 0 MiB an export carries"):
        checked_holdout(folder)
    monkeypatch.setattr(holdout, "MAX_BODY_BYTES", max(sizes.values()) - 1)  # a request could not carry it
    with pytest.raises(HoldoutError, match="whole.png: 0.1 MiB, more than one request may carry"):
        checked_holdout(folder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(HoldoutError, match="holds no photos"):
        checked_holdout(tmp_path / "empty")
    with pytest.raises(HoldoutError, match="not a folder"):
        checked_holdout(tmp_path / "missing")


@pytest.mark.parametrize("command", [["resnet", "--arch", "resnet18"], ["module", PLAIN, "--input-shape", PLAIN_SHAPE]])
def test_a_file_that_is_no_jpeg_or_png_photo_is_refused_by_name_before_anything_is_written(command, export_main,
                                                                                            tmp_path):
    folder = faces_folder(tmp_path / "faces")
    (folder / "notes.txt").write_text("taken at the zoo\n")
    (folder / "cut.jpg").write_bytes((folder / "close" / "crop.jpg").read_bytes()[:600])
    Image.fromarray(sample_photo("astronaut")[:64, :64]).save(folder / "icon.gif")
    ran = export_main(*command, "--out", tmp_path / "out", "--model-store", tmp_path / "store",
                      "--holdout-photos", folder)
    assert ran.returncode == 1 and "Traceback" not in ran.stderr
    assert f"{folder / 'notes.txt'}: not an image" in ran.stderr
    assert f"{folder / 'cut.jpg'}: image is corrupt or truncated" in ran.stderr
    assert f"{folder / 'icon.gif'}: a GIF image, not JPEG or PNG" in ran.stderr
    assert "whole.png" not in ran.stderr and "only JPEG and PNG photos travel" in ran.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "store").exists()


def test_every_command_that_makes_an_archive_takes_the_option():
    parser = build_parser()
    for argv in (["resnet"], ["efficientnet"], ["detection"], ["segmentation"], ["module", "n.py:f", "--input-shape",
                                                                                   "1,3,8,8"]):
        assert parser.parse_args([*argv, "--holdout-photos", "faces"]).holdout_photos == Path("faces")
        assert parser.parse_args(argv).holdout_photos is None


@pytest.mark.slow
def test_the_export_and_its_signed_archive_carry_the_photos(export_main, tmp_path):
    from serving.rollout.candidate import checked_manifest
    folder, (private, public) = faces_folder(tmp_path / "faces"), key_pair(tmp_path)
    out, store = tmp_path / "out", tmp_path / "store"
    ran = export_main("module", PLAIN, "--input-shape", PLAIN_SHAPE, "--formats", "traced", "--precision", "fp32",
                      "--no-benchmark", "--out", out, "--model-store", store, "--name", "net", "--holdout-photos",
                      folder, "--sign-key", private)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"held-out photos carried: 2 from {folder} in holdout/" in ran.stdout
    exported = Manifest.read(out)
    assert list(exported.holdout_photos) == ["holdout/close/crop.jpg", "holdout/whole.png"]
    verify_hashes(out, exported)
    with zipfile.ZipFile(store / "net.v1.mar") as archive:
        for path in exported.holdout_photos:
            assert archive.read(path) == (folder / path.removeprefix("holdout/")).read_bytes()
        assert Manifest.from_json(archive.read(MANIFEST_NAME).decode()).holdout_photos == exported.holdout_photos
    assert checked_manifest(store / "net.v1.mar").holdout_photos == exported.holdout_photos  # what a rollout reads
    verify_archive_signature(store / "net.v1.mar", public)
    swapped = rewritten(store / "net.v1.mar", tmp_path / "swapped.mar", {"holdout/whole.png": tiny_png()})
    with pytest.raises(IntegrityError, match="holdout/whole.png: changed after signing"):
        verify_archive_signature(swapped, public)
