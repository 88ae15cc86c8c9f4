"""Version names in the model store and the run dir's default version (contract/versions.py)."""

from __future__ import annotations

import pytest

from contract.versions import (
    ModelVersion,
    VersionError,
    archive_name,
    parse_label,
    read_defaults,
    record_default,
    served_archive,
    split_versioned,
    stored_versions,
)


def test_versioned_names_are_told_from_plain_ones():
    assert split_versioned("resnet18.v12") == ("resnet18", 12)
    assert split_versioned("resnet18") is None
    assert split_versioned("my.model.v2") == ("my.model", 2)
    assert archive_name("resnet18", 3) == "resnet18.v3.mar"
    assert ModelVersion(3, "ab").label == "v3"


def test_stored_versions_are_the_names_own_in_order(tmp_path):
    for file in ("resnet18.v1.mar", "resnet18.v10.mar", "resnet18.v2.mar", "resnet18.mar", "resnet18x.v5.mar"):
        (tmp_path / file).write_bytes(b"")
    assert stored_versions(tmp_path, "resnet18") == [1, 2, 10]


def test_a_start_serves_the_recorded_default_while_the_store_keeps_it(tmp_path):
    store, run_dir = tmp_path / "store", tmp_path / "run"
    store.mkdir(), run_dir.mkdir()
    (store / "resnet18.mar").write_bytes(b"")
    assert served_archive(store, run_dir, "resnet18") == store / "resnet18.mar"
    record_default(run_dir, "resnet18", "v2")
    assert read_defaults(run_dir) == {"resnet18": "v2"}
    assert served_archive(store, run_dir, "resnet18") == store / "resnet18.mar"  # v2 is gone from the store
    (store / "resnet18.v2.mar").write_bytes(b"")
    assert served_archive(store, run_dir, "resnet18") == store / "resnet18.v2.mar"


def test_bad_labels_and_records_say_what_to_do(tmp_path):
    assert parse_label("v4") == 4 and parse_label("4") == 4
    with pytest.raises(VersionError, match="write vN"):
        parse_label("latest")
    (tmp_path / "model-versions.json").write_text("{not json")
    with pytest.raises(VersionError, match="delete it"):
        read_defaults(tmp_path)
