"""A candidate is checked before anything loads: its files are the ones its manifest recorded, its task is the
live version's, and a version number the store holds with other content is never overwritten."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace

import pytest

from contract.records import DETECTION, FileRecord
from contract.versions import ModelVersion
from serving.rollout.candidate import RolloutRefused, carried_photos, check_task, leave_store, prepare
from tests.serving.manifests import manifest

PAYLOAD = b"the served artifact"


def archive(path, number: int, content: str = "c1", payload: bytes = PAYLOAD, task: str | None = None,
            photos: dict[str, bytes] | None = None, carried: dict[str, bytes] | None = None):
    """A hand-made archive of one artifact; `photos` the held-out photos its manifest records (path -> bytes),
    `carried` what the archive holds under those paths instead (default: the same)."""
    found = manifest("onnx-dynamo", ("onnx-dynamo",))
    record = replace(found.artifacts["onnx-dynamo"], sha256=hashlib.sha256(PAYLOAD).hexdigest())
    holdout = {path: FileRecord(path, hashlib.sha256(data).hexdigest(), len(data)) for path, data in (photos or {}).items()}
    found = replace(found, artifacts={"onnx-dynamo": record}, model_version=ModelVersion(number, content),
                    holdout_photos=holdout, **({"task": task} if task else {}))
    with zipfile.ZipFile(path, "w") as members:
        members.writestr("manifest.json", found.to_json())
        members.writestr(record.path, payload)
        for name, data in (photos or {} if carried is None else carried).items():
            members.writestr(name, data)
    return path


def test_a_checked_candidate_lands_in_the_store_as_its_version(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    candidate = prepare(archive(tmp_path / "new.mar", 2), "resnet18", store)
    assert candidate.label == "v2" and candidate.archive == store / "resnet18.v2.mar"
    check_task(candidate, "classification", "resnet18")
    with pytest.raises(RolloutRefused, match="is a classification model; resnet18 serves a detection model"):
        check_task(candidate, DETECTION, "resnet18")


def test_a_tampered_archive_is_refused_before_it_reaches_the_store(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    with pytest.raises(RolloutRefused, match="modified after export: onnx-dynamo.file"):
        prepare(archive(tmp_path / "bad.mar", 2, payload=b"something else"), "resnet18", store)
    assert not list(store.iterdir())
    (tmp_path / "cut.mar").write_bytes(archive(tmp_path / "whole.mar", 2).read_bytes()[:100])
    with pytest.raises(RolloutRefused, match="not a readable archive"):
        prepare(tmp_path / "cut.mar", "resnet18", store)


def test_the_held_out_photos_an_archive_carries_are_checked_and_read(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    photos = {"holdout/faces/a.png": b"face a", "holdout/b.jpg": b"face b"}
    candidate = prepare(archive(tmp_path / "new.mar", 2, photos=photos), "faces", store)
    assert carried_photos(candidate, 50) == [("faces/a.png", b"face a"), ("b.jpg", b"face b")]
    assert carried_photos(candidate, 1) == [("faces/a.png", b"face a")]
    swapped = {"holdout/faces/a.png": b"no face", "holdout/b.jpg": b"face b"}
    with pytest.raises(RolloutRefused, match="modified after export: holdout/faces/a.png: its sha256"):
        prepare(archive(tmp_path / "swapped.mar", 3, photos=photos, carried=swapped), "faces", store)
    with pytest.raises(RolloutRefused, match="modified after export: holdout/b.jpg: missing"):
        prepare(archive(tmp_path / "lost.mar", 3, photos=photos, carried={"holdout/faces/a.png": b"face a"}),
                "faces", store)
    assert sorted(path.name for path in store.iterdir()) == ["faces.v2.mar"]  # neither reached the store


def test_another_content_under_a_kept_number_is_refused(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    archive(store / "resnet18.v2.mar", 2, content="c1")
    with pytest.raises(RolloutRefused, match="holds another resnet18 v2"):
        prepare(archive(tmp_path / "other.mar", 2, content="c2"), "resnet18", store)


def test_a_candidate_that_never_takes_the_traffic_leaves_the_store_as_it_was(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    archive(store / "resnet18.v1.mar", 1, content="c1")
    (store / "resnet18.mar").hardlink_to(store / "resnet18.v1.mar")
    before = sorted(path.name for path in store.iterdir())
    interrupted = prepare(archive(tmp_path / "new.mar", 2, content="c2"), "resnet18", store)
    assert interrupted.added and leave_store(interrupted, "resnet18", 1, refused=False) == "resnet18.v2.mar removed " \
                                                                                         "from the store"
    assert sorted(path.name for path in store.iterdir()) == before
    kept = prepare(archive(store / "resnet18.v3.mar", 3, content="c3"), "resnet18", store)  # exported there before
    assert not kept.added and leave_store(kept, "resnet18", 1, refused=False) == "resnet18.v3.mar stays in the store"
    refused = leave_store(kept, "resnet18", 1, refused=True)
    assert refused == f"v3 set apart in {store / 'refused'} (resnet18.v3.mar)"
    assert sorted(path.name for path in store.iterdir()) == sorted([*before, "refused"])
    assert (store / "resnet18.mar").samefile(store / "resnet18.v1.mar")  # the live version, untouched throughout
