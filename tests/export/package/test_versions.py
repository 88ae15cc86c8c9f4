"""The model store keeps versions side by side: each commit writes NAME.vN.mar; only the name's first export makes
NAME.mar (the live version), later ones wait for a rollout; the oldest beyond the kept count go, never the live
one nor the one before it, and refused candidates (kept apart) count for nothing (export/package/archive.py)."""

from __future__ import annotations

import tempfile

from contract.versions import live_version, make_live, set_aside, stored_versions
from export.package.archive import PendingArchive


def commit(store, number: int, keep: int, content: bytes, candidate: bool = False):
    scratch = tempfile.TemporaryDirectory(dir=store, prefix=".mar-build-")
    built = store / scratch.name / "resnet18.mar"
    built.write_bytes(content)
    try:
        return PendingArchive(scratch, built, store / "resnet18.mar", number, keep, candidate).commit()
    finally:
        scratch.cleanup()


def names(store) -> list[str]:
    return sorted(path.name for path in store.iterdir())


def test_the_first_export_is_live_and_later_ones_wait_for_a_rollout(tmp_path):
    assert commit(tmp_path, 1, keep=3, content=b"v1") == tmp_path / "resnet18.mar"
    for number in (2, 3, 4):
        assert commit(tmp_path, number, keep=3, content=f"v{number}".encode()) == tmp_path / f"resnet18.v{number}.mar"
    assert (tmp_path / "resnet18.mar").read_bytes() == b"v1" and live_version(tmp_path, "resnet18") == 1
    # v1 is beyond the newest 3, but it is live: kept
    assert names(tmp_path) == ["resnet18.mar", "resnet18.v1.mar", "resnet18.v2.mar", "resnet18.v3.mar",
                               "resnet18.v4.mar"]


def test_the_live_version_and_the_one_before_it_are_never_pruned(tmp_path):
    for number in (1, 2, 3, 4):
        commit(tmp_path, number, keep=3, content=f"v{number}".encode())
    make_live(tmp_path, "resnet18", 3)  # a rollout's switch
    commit(tmp_path, 5, keep=1, content=b"v5")
    assert stored_versions(tmp_path, "resnet18") == [2, 3, 5]  # v5 the newest, v3 live, v2 the rollback's target
    assert (tmp_path / "resnet18.mar").read_bytes() == b"v3"


def test_refused_candidates_are_apart_and_never_push_the_rollback_target_out(tmp_path):
    commit(tmp_path, 1, keep=3, content=b"v1")
    commit(tmp_path, 2, keep=3, content=b"v2")
    make_live(tmp_path, "resnet18", 2)
    for number in (3, 4):  # two candidates refused by their rollouts
        commit(tmp_path, number, keep=3, content=f"v{number}".encode(), candidate=True)
        set_aside(tmp_path, "resnet18", number)
    commit(tmp_path, 5, keep=2, content=b"v5")
    assert stored_versions(tmp_path, "resnet18") == [1, 2, 5]  # keep 2 would have removed v1: it is v2's rollback
    assert stored_versions(tmp_path / "refused", "resnet18") == [3, 4]
    assert (tmp_path / "resnet18.mar").read_bytes() == b"v2"


def test_a_rollouts_candidate_only_lands(tmp_path):
    assert commit(tmp_path, 1, keep=1, content=b"v1", candidate=True) == tmp_path / "resnet18.v1.mar"
    assert names(tmp_path) == ["resnet18.v1.mar"]  # no plain archive until it takes the traffic
