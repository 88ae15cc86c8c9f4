"""Version names in the model store, the live version (the plain archive), pruning and refused candidates, and the
run dir's default version (contract/versions.py)."""

from __future__ import annotations

import pytest

from contract.versions import (
    KEEP_REFUSED,
    REFUSED_FOLDER,
    ModelVersion,
    VersionError,
    archive_name,
    live_version,
    make_live,
    newest_number,
    parse_label,
    protected_versions,
    prune_versions,
    read_defaults,
    record_default,
    served_archive,
    set_aside,
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


def test_the_plain_archive_is_the_live_version_hard_linked_or_copied(tmp_path):
    for number in (1, 2):
        (tmp_path / f"m.v{number}.mar").write_bytes(f"version {number}".encode())
    assert live_version(tmp_path, "m") is None
    make_live(tmp_path, "m", 2)
    assert live_version(tmp_path, "m") == 2 and (tmp_path / "m.mar").samefile(tmp_path / "m.v2.mar")
    (tmp_path / "m.mar").unlink()
    (tmp_path / "m.mar").write_bytes(b"version 1")  # a copy (a volume without hard links)
    assert live_version(tmp_path, "m") == 1
    assert sorted(path.name for path in tmp_path.iterdir()) == ["m.mar", "m.v1.mar", "m.v2.mar"]  # nothing staged left
    with pytest.raises(VersionError, match="keeps m's versions v1, v2"):
        make_live(tmp_path, "m", 7)


def test_pruning_spares_the_live_version_and_its_predecessor(tmp_path):
    for number in range(1, 7):
        (tmp_path / f"m.v{number}.mar").write_bytes(f"version {number}".encode())
    make_live(tmp_path, "m", 3)
    assert protected_versions(tmp_path, "m") == {2, 3}
    assert prune_versions(tmp_path, "m", keep=2) == [1, 4]
    assert stored_versions(tmp_path, "m") == [2, 3, 5, 6]


def test_a_refused_candidate_is_set_apart_and_its_number_never_reused(tmp_path):
    for number in range(1, 7):
        (tmp_path / f"m.v{number}.mar").write_bytes(b"")
    for number in range(2, 7):
        set_aside(tmp_path, "m", number)
    assert stored_versions(tmp_path, "m") == [1]
    assert stored_versions(tmp_path / REFUSED_FOLDER, "m") == [4, 5, 6]  # the newest KEEP_REFUSED
    assert KEEP_REFUSED == 3 and newest_number(tmp_path, "m") == 6
