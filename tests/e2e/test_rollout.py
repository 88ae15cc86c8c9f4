"""A rollout (5 live requests mirrored, then a canary), a refused rollout and a rollback on a real running server of each engine
(TorchServe, KServe, Ray Serve), under load from 8 real HTTP clients:
no request fails, a random-weights version (sure of no photo) is refused for lack of evidence unless the operator
overrides it, every answer names exactly one version (header and JSON alike) and equals that version's
archive run in-process on the same photo, a refusal leaves the live version serving, and the store's NAME.mar is
always the version that takes the traffic. On TorchServe, a rollout stopped by SIGTERM and a canary that answered
nothing both end as refusals: the candidate unloaded, nothing routed or kept, the store as it was."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import requests

from contract.policy import ServingPolicy
from contract.records import Manifest
from contract.versions import REFUSED_FOLDER, live_version, read_defaults
from export.package.archive import build_archive
from handlers.routes import ROUTES_FOLDER, ModelRoutes
from measure.reliability.rollout import VersionedLoad, engine_settings, failures, serving_command
from serving import engine as engines
from serving.ray.config import gate_app
from serving.rollout.candidate import Candidate, checked_manifest
from tests.answers import assert_same_answer, expected_answer
from tests.conftest import ROOT

pytestmark = pytest.mark.slow
CAT = ROOT / "examples" / "cat.jpg"
NAME = "resnet18"


@pytest.fixture(scope="module")
def versioned_store(resnet18_export, tmp_path_factory) -> Path:
    """v1, the session's export as it was archived and live (NAME.mar), and v2, the same export archived again into
    the store as the next version, which waits for a rollout: two versions side by side (their content hash is the
    same; their version is not)."""
    store = tmp_path_factory.mktemp("versioned-store")
    shutil.copy2(resnet18_export["model_store"] / f"{NAME}.v1.mar", store / f"{NAME}.v1.mar")
    (store / f"{NAME}.mar").hardlink_to(store / f"{NAME}.v1.mar")
    written = build_archive(resnet18_export["out"], Manifest.read(resnet18_export["out"]), store, NAME)
    assert written == store / f"{NAME}.v2.mar" and live_version(store, NAME) == 1  # the export made no version live
    assert sorted(path.name for path in store.iterdir()) == [f"{NAME}.mar", f"{NAME}.v1.mar", f"{NAME}.v2.mar"]
    return store


def store_copy(store: Path, folder: Path) -> Path:
    """The store for one test (each rollout changes it), NAME.mar hard-linked to the version it is, as there."""
    copy = folder / "store"
    copy.mkdir()
    for number in (1, 2):
        shutil.copy2(store / f"{NAME}.v{number}.mar", copy / f"{NAME}.v{number}.mar")
    (copy / f"{NAME}.mar").hardlink_to(copy / f"{NAME}.v{live_version(store, NAME)}.mar")
    return copy


def tampered_copy(archive: Path, folder: Path) -> Path:
    """The archive with one byte of its served artifact changed, its manifest untouched."""
    served = Manifest.from_json(zipfile.ZipFile(archive).read("manifest.json").decode()).served_record().path
    target = folder / f"tampered-{archive.name}"
    with zipfile.ZipFile(archive) as source, zipfile.ZipFile(target, "w") as copy:
        for member in source.infolist():
            data = source.read(member)
            copy.writestr(member, data[:-1] + bytes([data[-1] ^ 1]) if member.filename == served else data)
    return target


# The rollout mirrors live requests to the candidate, then gives it half of them for a while, before the switch.
# Random weights are sure of no photo: the operator's override says the gate's photos carried no evidence.
WEAK = "--accept-weak-evidence"
MIRROR_AND_CANARY = ("--shadow", "5", "--canary", "50", "--canary-seconds", "5", WEAK)

# One worker of one thread: the candidate loads beside it on the machine's other core.
ONE_WORKER = ServingPolicy(workers=1, batch_size=1, max_batch_delay_ms=5, threads_per_worker=1, device="cpu",
                           reason="tests: one worker")


@pytest.mark.parametrize("engine", ["torchserve", "kserve", "ray"])
def test_rollout_refusal_and_rollback_under_load(engine, versioned_store, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    store = store_copy(versioned_store, tmp_path)  # the start serves NAME.mar, v1: the store alone says so
    if engine == "ray":
        pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install '.[ray]' (an optional extra)")
    settings, url = engine_settings(engine, store, run_dir, NAME, ONE_WORKER)
    server = engines.get(engine)(settings)
    with server.running(CAT):
        load = VersionedLoad(url, CAT.read_bytes(), engine=server).start()
        try:
            rolled = serving_command("rollout", NAME, str(store / f"{NAME}.v2.mar"), "--run-dir", str(run_dir),
                                     *MIRROR_AND_CANARY)
            live_after_rollout = live_version(store, NAME)
            unjudged = serving_command("rollout", NAME, str(store / f"{NAME}.v1.mar"), "--run-dir", str(run_dir))
            refused_at = time.monotonic()
            refused = serving_command("rollout", NAME, str(tampered_copy(store / f"{NAME}.v2.mar", tmp_path)),
                                      "--run-dir", str(run_dir))
            live_after_refusal = live_version(store, NAME)
            back_at = time.monotonic()
            back = serving_command("rollback", NAME, "--run-dir", str(run_dir))
            time.sleep(1.0)
        finally:
            samples = load.stop()
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert "v2 is the default" in rolled.stdout, rolled.stdout
    assert "resnet18: v2 took the traffic on weak evidence (--accept-weak-evidence)" in rolled.stdout, rolled.stdout
    mirrored = re.findall(r"^request \S+ +yes ", rolled.stdout, re.MULTILINE)  # the shadow's table: live requests
    assert len(mirrored) == 5, rolled.stdout
    served = re.search(r"canary: v2 answered (\d+) of resnet18's requests, none failed", rolled.stdout)
    assert served and int(served[1]) > 0, rolled.stdout  # a share of the live requests, before the switch
    assert unjudged.returncode == 1 and "TOO LITTLE EVIDENCE" in unjudged.stdout, unjudged.stdout + unjudged.stderr
    assert ("v1 cannot be judged against v2 on its photos: only 0 of the 10 photos carried evidence"
            in unjudged.stderr and "--photos DIR" in unjudged.stderr), unjudged.stderr  # random weights: unsure
    assert refused.returncode != 0 and "modified after export" in refused.stderr, refused.stdout + refused.stderr
    assert back.returncode == 0, back.stdout + back.stderr
    assert read_defaults(run_dir) == {NAME: "v1"}  # a restart serves v1 again
    assert (live_after_rollout, live_after_refusal, live_version(store, NAME)) == (2, 2, 1)  # NAME.mar: the live one
    assert sorted(path.name for path in store.iterdir()) == [f"{NAME}.mar", f"{NAME}.v1.mar", f"{NAME}.v2.mar"]

    assert samples and not failures(samples), [(s.status, s.error) for s in failures(samples)][:5]
    assert {s.version for s in samples} == {"v1", "v2"}
    during_refusal = [s for s in samples if refused_at <= s.start and s.end <= back_at]
    assert during_refusal and {s.version for s in during_refusal} == {"v2"}  # the live version serves on
    expected = {version: expected_answer(store / f"{NAME}.{version}.mar", CAT.read_bytes())
                for version in ("v1", "v2")}
    for sample in samples:
        assert_same_answer(sample.answer, expected[sample.version])
        in_process = expected[sample.version].for_served(sample.answer)
        assert sample.answer["version"] == in_process["version"] == sample.version


def test_a_stopped_or_unproven_rollout_leaves_the_server_and_the_store_as_they_were(versioned_store, tmp_path):
    """SIGTERM while the shadow keeps live photos: exit 130, the candidate unloaded, the photos deleted, the store
    untouched. Then a canary no request reached: refused, the candidate set apart, NAME.mar still the live one."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    store = store_copy(versioned_store, tmp_path)
    before = sorted(path.name for path in store.iterdir())
    settings, url = engine_settings("torchserve", store, run_dir, NAME, ONE_WORKER)
    routes = ModelRoutes(run_dir / ROUTES_FOLDER, NAME)
    with engines.get("torchserve")(settings).running(CAT):
        rollout = subprocess.Popen([sys.executable, "-m", "serving", "rollout", NAME, str(store / f"{NAME}.v2.mar"),
                                    "--run-dir", str(run_dir), "--shadow", "50", "--shadow-seconds", "600"],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            wait_for(lambda: routes.control_file.exists() or rollout.poll() is not None, 400, "the shadow's start")
            for _ in range(3):  # live requests, their photos kept on disk for the shadow
                assert requests.post(url, data=CAT.read_bytes(), timeout=60).status_code == 200
            wait_for(lambda: len(routes.captured()) == 3, 60, "three kept photos")
            rollout.send_signal(signal.SIGTERM)
            out, err = rollout.communicate(timeout=300)
        finally:
            if rollout.poll() is None:
                rollout.kill()
        stopped_versions = serving_command("versions", NAME, "--run-dir", str(run_dir))
        unproven = serving_command("rollout", NAME, str(store / f"{NAME}.v2.mar"), "--run-dir", str(run_dir),
                                   "--canary", "50", "--canary-seconds", "2", WEAK)
        served = requests.post(url, data=CAT.read_bytes(), timeout=60)
        refused_versions = serving_command("versions", NAME, "--run-dir", str(run_dir))
    assert rollout.returncode == 130, out + err
    assert ("the rollout of v2 was interrupted before the switch: v2 unloaded; resnet18.v2.mar stays in the store; "
            "v1 serves on") in err, out + err
    assert "Traceback" not in err
    assert not routes.control_file.exists() and routes.captured() == []  # no route left, no photo kept
    assert not [path for path in (run_dir / ROUTES_FOLDER).rglob("*") if path.is_file()]
    assert "default v1; loaded v1;" in stopped_versions.stdout, stopped_versions.stdout + stopped_versions.stderr
    assert unproven.returncode == 1, unproven.stdout + unproven.stderr
    assert "the canary v2 failed its check: it answered none of resnet18's requests in 2 s" in unproven.stderr
    assert f"v2 set apart in {store / REFUSED_FOLDER}" in unproven.stderr, unproven.stderr
    assert served.status_code == 200 and served.headers["X-Model-Version"] == "v1"
    assert sorted(path.name for path in store.iterdir()) == sorted({*before, REFUSED_FOLDER} - {f"{NAME}.v2.mar"})
    assert live_version(store, NAME) == 1 and (store / REFUSED_FOLDER / f"{NAME}.v2.mar").is_file()
    assert f"kept in {store}: v1; refused, set apart: v2" in refused_versions.stdout, refused_versions.stdout


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.2)


# Two workers a version on KServe: the candidate's run in processes of their own, which the test stops and kills.
TWO_WORKERS = ServingPolicy(workers=2, batch_size=1, max_batch_delay_ms=5, threads_per_worker=1, device="cpu",
                            reason="tests: a candidate's workers in processes of their own")
JOINED_S = 60  # a KServe candidate's workers after its first, started on a busy 2-core machine


def ray_replica_pids(server, application: str) -> list[int]:
    """The replica processes of application in this server's Ray session (serving/ray/cluster.py), titled by Ray
    with its actor's class, which Serve names after the application; the title is rewritten around every task the
    replica runs, so it is read until it shows."""
    from serving.ray.cluster import process_name, session_members
    title = f"ray::ServeReplica:{application}:"
    session = int(server.pid_file.read_text())  # the server process leads the session its Ray node runs in
    pids: list[int] = []

    def titles() -> dict[int, str]:
        return {pid: process_name(pid) for pid in session_members(session)}

    def titled() -> bool:
        pids[:] = [pid for pid, seen in titles().items() if seen.startswith(title)]
        return bool(pids)
    try:
        wait_for(titled, JOINED_S, f"process titled {title}")
    except AssertionError as error:
        raise AssertionError(f"{error}; the session's processes: {sorted(set(titles().values()))}") from None
    return pids


def candidate_pids(engine: str, server, board, settings, workers: int) -> list[int]:
    """The process ids of the candidate's (v2's) workers, as the engine describes them; on KServe once it has all
    of them (its pool serves from its first and the others join: serving/kserve/pool.py)."""
    if engine == "torchserve":
        return [worker["pid"] for worker in board.described(NAME, "v2")[0]["workers"]]
    if engine == "ray":
        return ray_replica_pids(server, gate_app(NAME))
    def described() -> list[dict]:
        return requests.get(f"{settings.url}/v2/models/{NAME}.v2/description", timeout=60).json()["workers"]
    wait_for(lambda: len(described()) == workers, JOINED_S, f"v2 with its {workers} workers")
    return [worker["pid"] for worker in described()]


def canary_while(board, action, engine: str) -> dict:
    """A canary of half the live requests for a few seconds, action done to the candidate as it starts; its
    counts. On Ray the action comes first: its canary settles only once every live replica polled it, and the
    candidate would answer the requests forwarded meanwhile."""
    if engine == "ray":
        action()
    board.canary(NAME, "v2", 50)
    if engine != "ray":
        action()
    time.sleep(8)
    return board.canary(NAME, "v2", 0)


@pytest.mark.parametrize("engine, policy", [("torchserve", ONE_WORKER), ("kserve", TWO_WORKERS), ("ray", ONE_WORKER)])
def test_a_candidate_that_hangs_or_crashes_never_fails_a_live_request(engine, policy, versioned_store, tmp_path):
    """Under load from 8 clients, the canary's candidate stopped (SIGSTOP: it hangs on every request), then
    killed (SIGKILL: it crashes; its requests fail while it restarts, unless the engine retries them): every live
    request is answered by v1, the hung candidate's failures are counted (a rollout would be refused), and the
    server serves on."""
    if engine == "ray":
        pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install '.[ray]' (an optional extra)")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    store = store_copy(versioned_store, tmp_path)
    settings, url = engine_settings(engine, store, run_dir, NAME, policy)
    server = engines.get(engine)(settings)
    with server.running(CAT):
        board = server.switchboard()
        archive = store / f"{NAME}.v2.mar"
        spare = ray_replica_pids(server, gate_app(NAME)) if engine == "ray" else None  # the gate's, standing by
        board.load_beside(NAME, Candidate(archive, checked_manifest(archive)))
        pids = candidate_pids(engine, server, board, settings, policy.workers)
        assert pids, f"no process of {NAME}'s v2 on {engine}"
        assert spare is None or pids == spare, "Ray's candidate opened in a new process, not in the gate's spare"
        load = VersionedLoad(url, CAT.read_bytes(), engine=server).start()
        try:
            hung = canary_while(board, lambda: [os.kill(pid, signal.SIGSTOP) for pid in pids], engine)
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
            crashed = canary_while(board, lambda: [os.kill(pid, signal.SIGKILL) for pid in pids], engine)
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            samples = load.stop()
        board.unload(NAME, "v2")
    assert hung["failed"] >= 1 and hung["served"] == 0, hung
    # a killed candidate: an engine may replace the worker and retry its jobs, so that none of them fails
    assert crashed["served"] + crashed["failed"] >= 1, crashed
    assert samples and not failures(samples), [(s.status, s.error) for s in failures(samples)][:5]
    # the candidate may still answer, in its bound, a request it held when it was resumed, and a replaced worker
    # the second canary's share: what matters is that no live request failed or waited past the bound
    assert {s.version for s in samples} <= {"v1", "v2"}
    assert max(s.end - s.start for s in samples) < 45  # a hung forward held a request no longer than its bound
