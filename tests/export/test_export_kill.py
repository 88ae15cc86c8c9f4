"""SIGKILL of `python -m export` during each step leaves the previous complete export and archive exactly as
they were (never a manifest beside incomplete artifacts, never a half-written .mar), and the next run succeeds.

The kills form one chain in step order: the run after a kill during step N is itself killed during step N+1,
so it went through every step the killed run had reached; the run after the last kill completes. Eight kills
(with the five kinds of the table) cost nine exports instead of sixteen. Every run is forked from one process that
imported the export command once (tests/export/preloaded_export.py): a real process SIGKILLed, without a torch
import per kill."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import pytest

from export.atomic import PARTIAL_MARK
from export.forms import kinds
from export.package.archive import SCRATCH_PREFIX
from tests.export.preloaded_export import PreloadedExport
from tests.export.user_models import USER_FILE

pytestmark = pytest.mark.slow
ARGS = ["module", f"{USER_FILE}:plain", "--input-shape", "1,3,16,16", "--model-name", "net"]
STORE = "store"
# step being run -> what appears just before it: a file in the run's staging folder ("." for the folder
# itself), or STORE for the run's scratch folder in the model store (the archive step). The kinds are built
# in table order, each one's file written before the next kind starts.
_BUILT = [kinds.get(k) for k in kinds.default_formats()]
KILL_DURING = {
    "build": ".",
    **{kind.name: before.file_name for before, kind in zip(_BUILT, _BUILT[1:])},
    "checks and parity": _BUILT[-1].file_name,
    "reports and manifest": "parity.md",
    "archive": STORE,
}


def fingerprint(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.relative_to(folder).parts[0].startswith(".")}


def reached(marker: str, pid: int, out: Path, store: Path) -> bool:
    """Whether the export with this pid has reached the step the marker announces."""
    if marker == STORE:
        return bool(list(store.glob(f"{SCRATCH_PREFIX}{pid}-*")))
    return (out.parent / f".{out.name}{PARTIAL_MARK}{pid}" / marker).exists()


@pytest.fixture
def exports():
    server = PreloadedExport()
    yield server
    server.close()


def run_to_the_end(exports: PreloadedExport, out: Path, store: Path) -> None:
    log = out.parent / "export-output.txt"
    exports.start([*ARGS, "--out", str(out), "--model-store", str(store)], log)
    assert exports.wait() == 0, log.read_text()[-3000:]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # the server reaps its child at once: an ended run's pid is gone
    except ProcessLookupError:
        return False
    return True


def kill_during(step: str, exports: PreloadedExport, out: Path, store: Path) -> None:
    pid = exports.start([*ARGS, "--out", str(out), "--model-store", str(store)], out.parent / f"killed-{step}.txt")
    deadline = time.monotonic() + 180
    while not reached(KILL_DURING[step], pid, out, store):
        assert _alive(pid) and time.monotonic() < deadline, f"export ended before {step} could be killed"
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    status = exports.wait()
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"export ended before {step} was killed"


def test_sigkill_during_each_step_changes_nothing_and_the_next_run_succeeds(tmp_path, exports):
    out, store = tmp_path / "net", tmp_path / "store"
    run_to_the_end(exports, out, store)
    before, archive = fingerprint(out), (store / "net.mar").read_bytes()
    for step in KILL_DURING:
        kill_during(step, exports, out, store)
        assert fingerprint(out) == before, step  # the previous complete export, manifest and all, untouched
        assert sorted(p.name for p in store.iterdir() if not p.name.startswith(".")) == ["net.mar", "net.v1.mar"], step
        assert (store / "net.mar").read_bytes() == archive, step  # never a half-written archive
    run_to_the_end(exports, out, store)
    assert fingerprint(out).keys() == before.keys()
    assert not list(tmp_path.glob(f".net{PARTIAL_MARK}*")) and not list(store.glob(f"{SCRATCH_PREFIX}*"))
