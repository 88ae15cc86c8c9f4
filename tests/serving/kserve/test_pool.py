"""A rollout's candidate pool beside the live one (serving/kserve/pool.py), with real worker processes on the
session's resnet18 archive: it takes the live pool's spare as its first worker, told the candidate's placement,
serves from it at once, gets its other workers, and only then do both pools spawn their spares; without a live
spare it spawns its workers; one that refuses to open leaves no process behind."""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import shutil
import signal
import time

import pytest

from contract.errors import VisionExportError
from contract.policy import Machine, PolicyChoices, resolve_policy
from contract.records import Manifest
from handlers.kserve_model import v1_rows
from handlers.request_error import RequestError
from serving.kserve.pool import WorkerPool
from serving.processes import alive
from tests.answers import assert_same_answer
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # the session's resnet18 export
NAME, CANDIDATE = "resnet18", "resnet18-v2"  # the candidate's own served name: what its answers carry is its placement
TWO = resolve_policy(Machine(0, 2), flags=PolicyChoices(workers=2, threads_per_worker=1))
ROWS = v1_rows((ROOT / "examples" / "cat.jpg").read_bytes()) + v1_rows(b"not an image")
STARTED_S = 60  # a worker's start, imports included, on a busy 2-core machine: far more than it takes


@pytest.fixture(scope="module")
def live(resnet18_unpacked):
    pool = WorkerPool.open(NAME, resnet18_unpacked, "cpu", None, TWO)
    yield pool
    pool.close()


def eventually(what, check) -> dict:
    """The pool's description once check(description) holds."""
    deadline = time.monotonic() + STARTED_S
    while time.monotonic() < deadline:
        described = what.describe()
        if check(described):
            return described
        time.sleep(0.1)
    raise AssertionError(f"not within {STARTED_S} s: {what.describe()}")


def pids(pool: WorkerPool) -> list[int]:
    return [worker["pid"] for worker in pool.describe()["workers"]]


def assert_answers_as(pool: WorkerPool, live: WorkerPool) -> None:
    """The same rows answered by both pools alike: the photo's answer (under each one's served name) and the bad
    row's error."""
    ours, theirs = pool.run_batch(ROWS).answers, live.run_batch(ROWS).answers
    assert_same_answer(ours[0], theirs[0], atol=0)
    assert ours[0]["model"] == pool.model and theirs[0]["model"] == live.model
    assert isinstance(ours[1], RequestError) and (ours[1].code, ours[1].message) == (theirs[1].code, theirs[1].message)


def test_a_candidate_takes_the_live_spare_serves_at_once_then_both_pools_are_whole(live, resnet18_unpacked):
    spare = eventually(live, lambda described: described["spare"] is not None)["spare"]
    candidate = WorkerPool.open(CANDIDATE, resnet18_unpacked, "cpu", None, TWO, lender=live)
    try:
        assert [(worker["worker"], worker["pid"]) for worker in candidate.describe()["workers"]] == [(1, spare)]
        assert live.describe()["spare"] is None  # not renewed while the candidate's other worker starts
        assert not candidate.essential  # a candidate's breaking does not stop the server
        assert_answers_as(candidate, live)
        eventually(candidate, lambda described: len(described["workers"]) == 2 and described["spare"] is not None)
        eventually(live, lambda described: described["spare"] not in (None, spare))
        assert_answers_as(candidate, live)
        started = pids(candidate) + [candidate.describe()["spare"]]
    finally:
        candidate.close()
    assert not any(alive(pid) for pid in started)


def test_without_a_live_spare_the_candidate_spawns_its_workers(live, resnet18_unpacked):
    spare = eventually(live, lambda described: described["spare"] is not None)["spare"]
    os.kill(spare, signal.SIGKILL)
    eventually(live, lambda _: not alive(spare))
    candidate = WorkerPool.open(CANDIDATE, resnet18_unpacked, "cpu", None, TWO, lender=live)
    try:
        assert len(pids(candidate)) == 2 and spare not in pids(candidate)  # both spawned, and awaited
        assert_answers_as(candidate, live)
        eventually(live, lambda described: described["spare"] not in (None, spare))
    finally:
        candidate.close()


def test_a_candidate_that_refuses_to_open_leaves_no_process_behind(live, resnet18_unpacked, tmp_path):
    tampered = tmp_path / "tampered"
    shutil.copytree(resnet18_unpacked, tampered, copy_function=os.link)
    shipped = [tampered / record.path for record in Manifest.read(tampered).artifacts.values()]
    for artifact in filter(pathlib.Path.is_file, shipped):  # whichever form the machine chooses
        data = artifact.read_bytes()
        artifact.unlink()  # a link to the session's own file: written anew
        artifact.write_bytes(data[:-10])
    spare = eventually(live, lambda described: described["spare"] is not None)["spare"]
    with pytest.raises(VisionExportError, match="manifest records"):  # the core's reason, from the worker
        WorkerPool.open(CANDIDATE, tampered, "cpu", None, TWO, lender=live)
    assert not alive(spare)  # the lent spare refused and was joined
    renewed = live.describe()["spare"]
    assert renewed not in (None, spare)  # the live pool has a spare again
    assert {child.pid for child in multiprocessing.active_children()} == {*pids(live), renewed}
