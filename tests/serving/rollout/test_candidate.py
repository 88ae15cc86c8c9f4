"""A candidate is checked before anything loads: its files are the ones its manifest recorded, its task is the
live version's, and a version number the store holds with other content is never overwritten."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace

import pytest

from contract.records import DETECTION
from contract.versions import ModelVersion
from serving.rollout.candidate import RolloutRefused, check_task, prepare
from tests.serving.manifests import manifest

PAYLOAD = b"the served artifact"


def archive(path, number: int, content: str = "c1", payload: bytes = PAYLOAD, task: str | None = None):
    found = manifest("onnx-dynamo", ("onnx-dynamo",))
    record = replace(found.artifacts["onnx-dynamo"], sha256=hashlib.sha256(PAYLOAD).hexdigest())
    found = replace(found, artifacts={"onnx-dynamo": record}, model_version=ModelVersion(number, content),
                    **({"task": task} if task else {}))
    with zipfile.ZipFile(path, "w") as members:
        members.writestr("manifest.json", found.to_json())
        members.writestr(record.path, payload)
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


def test_another_content_under_a_kept_number_is_refused(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    archive(store / "resnet18.v2.mar", 2, content="c1")
    with pytest.raises(RolloutRefused, match="holds another resnet18 v2"):
        prepare(archive(tmp_path / "other.mar", 2, content="c2"), "resnet18", store)
