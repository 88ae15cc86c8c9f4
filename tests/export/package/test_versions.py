"""The model store keeps versions side by side: each commit writes NAME.vN.mar, NAME.mar is the newest, the
oldest beyond the kept count go (export/package/archive.py)."""

from __future__ import annotations

import tempfile

from export.package.archive import PendingArchive


def commit(store, number: int, keep: int, content: bytes) -> None:
    scratch = tempfile.TemporaryDirectory(dir=store, prefix=".mar-build-")
    built = store / scratch.name / "resnet18.mar"
    built.write_bytes(content)
    try:
        PendingArchive(scratch, built, store / "resnet18.mar", number, keep).commit()
    finally:
        scratch.cleanup()


def test_versions_are_kept_side_by_side_and_the_plain_name_is_the_newest(tmp_path):
    for number in (1, 2, 3, 4):
        commit(tmp_path, number, keep=3, content=f"v{number}".encode())
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "resnet18.mar", "resnet18.v2.mar", "resnet18.v3.mar", "resnet18.v4.mar"]
    assert (tmp_path / "resnet18.mar").read_bytes() == b"v4"
    assert (tmp_path / "resnet18.v2.mar").read_bytes() == b"v2"
    commit(tmp_path, 5, keep=1, content=b"v5")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["resnet18.mar", "resnet18.v5.mar"]
