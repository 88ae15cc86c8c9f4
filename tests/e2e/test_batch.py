"""`python -m serving batch` end to end, as a scheduled job runs it: real photographs and bad files in a folder,
scored by resnet18.mar through Ray Data on a Ray of its own (`--address local`, the cluster's path), the driver
killed with SIGKILL once a part is written, then resumed by the run on this machine alone (no `--address`: a process
pool, no Ray). The output holds exactly one row per photo; the parts written before the kill are kept as they were;
every row, from either path, equals the answer (or the error) the shared TorchServe gives for the same bytes.
A table naming a FIFO, a device and paths outside its folder ends with an error row for each."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from serving.batch.output import read_rows
from tests.answers import assert_same_answer
from tests.conftest import ROOT
from tests.e2e.test_bad_input import CASES
from tests.photos import photo_jpeg

pytest.importorskip("ray.data", reason="Ray Data is not installed: pip install '.[ray]' (an optional extra)")
pytestmark = pytest.mark.slow
PHOTOS = ("chelsea", "coffee", "rocket")
BAD = ("truncated JPEG", "random bytes", "1x1 image")
PART_SIZE = 2
RUN_TIMEOUT_S = 600


def batch_command(archive, folder, out, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "serving",
        "batch",
        str(archive),
        str(folder),
        "--out",
        str(out),
        "--part-size",
        str(PART_SIZE),
        "--workers",
        "1",
        *extra,
    ]


def killed_once_a_part_is_written(command: list[str], out) -> dict:
    """Start the run, SIGKILL its driver as soon as a part exists, then what is left of the Ray it started (its
    process group). {part name: its inode and mtime} at the kill."""
    driver = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while not list(out.glob("part-*.parquet")) and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.05)
    finally:
        driver.kill()  # SIGKILL, the driver alone
        driver.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # what is left of the Ray it started (its agents outlive it)
    parts = {path.name: (path.stat().st_ino, path.stat().st_mtime_ns) for path in out.glob("part-*.parquet")}
    assert parts, f"no part was written before the kill: {driver.stderr.read().decode()[-3000:]}"
    return parts


@pytest.fixture(scope="module")
def scored(resnet18_export, tmp_path_factory):
    folder, out = tmp_path_factory.mktemp("photos"), tmp_path_factory.mktemp("batch") / "scores"
    bodies = {}
    for index in range(12):
        name = PHOTOS[index % len(PHOTOS)]
        bodies[folder / f"{index:02d}-{name}.jpg"] = photo_jpeg(name, quality=70 + 2 * index)
    for index, case in enumerate(BAD):
        bodies[folder / "bad" / f"{index}.jpg"] = CASES[case][0]
    (folder / "bad").mkdir()
    for path, body in bodies.items():
        path.write_bytes(body)
    command = batch_command(resnet18_export["archive"], folder, out)
    before_kill = killed_once_a_part_is_written(command + ["--address", "local"], out)
    temporary = tmp_path_factory.mktemp("batch-tmp")  # the run's TMPDIR: what it leaves there is seen
    resumed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                             env={**os.environ, "TMPDIR": str(temporary)})
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    return {
        "temporary": temporary,
        "bodies": bodies,
        "out": out,
        "before_kill": before_kill,
        "command": command,
        "summary": json.loads(resumed.stdout.strip().splitlines()[-1]),
    }


def test_killed_and_resumed_ends_with_exactly_one_row_per_photo(scored):
    rows = read_rows(scored["out"]).to_pylist()
    assert sorted(row["input"] for row in rows) == sorted(str(path) for path in scored["bodies"])
    total = len(scored["bodies"])
    assert scored["summary"]["photos"] == total and 0 < scored["summary"]["scored_now"] < total, scored["summary"]
    assert scored["summary"]["decoding"]["tasks"] == 0, scored["summary"]  # resumed without Ray: no decode tasks
    for name, (inode, mtime) in scored["before_kill"].items():  # what was written before the kill is kept as it was
        path = scored["out"] / name
        assert (path.stat().st_ino, path.stat().st_mtime_ns) == (inode, mtime), name
    assert not list(scored["out"].glob(".*.tmp"))


def test_a_run_on_this_machine_leaves_no_unpacked_archive_behind(scored):
    assert list(scored["temporary"].glob("batch-model-*")) == []


def test_each_row_equals_the_endpoints_answer_or_error(scored, resnet18_server):
    rows = {row["input"]: row for row in read_rows(scored["out"]).to_pylist()}
    for path, body in scored["bodies"].items():
        served = requests.post(
            resnet18_server.predictions_url(), data=body, timeout=60, headers={"Content-Type": "image/jpeg"}
        )
        row = rows[str(path)]
        assert row["status"] == served.status_code, (path.name, row, served.text)
        if served.status_code == 200:
            answer = json.loads(row["answer"])
            assert_same_answer(answer, served.json())
            assert (row["label"], row["artifact"]) == (answer["predictions"][0]["label"], answer["artifact"])
        else:
            assert (row["error"], row["answer"]) == (served.json()["error"], None), path.name
        assert row["model"] == "resnet18" and row["version"]


def test_fail_on_error_exits_non_zero_when_rows_failed_without_scoring_again(scored):
    again = subprocess.run(
        scored["command"] + ["--fail-on-error"], cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert again.returncode == 1, again.stdout + again.stderr
    summary = json.loads(again.stdout.strip().splitlines()[-1])
    assert summary["scored_now"] == 0 and summary["failed"] == len(BAD), summary
    assert "error rows: status != 200" in again.stdout


def test_a_table_naming_a_fifo_a_device_and_paths_outside_its_folder_gets_error_rows_and_ends(
    resnet18_export, tmp_path
):
    """The command on this machine, as a job runs it: a FIFO without a writer and a link to /dev/zero would have
    blocked or filled a worker; each is an error row saying why, and a path outside the table's folder is one
    too unless --allow-outside-paths."""
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "cat.jpg").write_bytes(photo_jpeg("chelsea", quality=80))
    (tmp_path / "outside.jpg").write_bytes(photo_jpeg("coffee", quality=80))
    os.mkfifo(folder / "pipe.jpg")
    (folder / "zero.jpg").symlink_to("/dev/zero")
    paths = ["cat.jpg", "pipe.jpg", "zero.jpg", "../outside.jpg"]
    (folder / "photos.csv").write_text("path\n" + "\n".join(paths) + "\n")

    def statuses(out, *extra: str) -> dict:
        command = [sys.executable, "-m", "serving", "batch", str(resnet18_export["out"]), str(folder / "photos.csv"),
                   "--out", str(out), "--workers", "1", *extra]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return {row["input"]: (row["status"], row["error"] or "") for row in read_rows(out).to_pylist()}

    inside = statuses(tmp_path / "inside")
    assert inside["cat.jpg"][0] == 200 and inside["pipe.jpg"][0] == 400 and "a FIFO" in inside["pipe.jpg"][1]
    for name in ("zero.jpg", "../outside.jpg"):
        assert inside[name][0] == 403 and "--allow-outside-paths" in inside[name][1], inside[name]
    anywhere = statuses(tmp_path / "anywhere", "--allow-outside-paths")
    assert anywhere["zero.jpg"][0] == 400 and "a character device" in anywhere["zero.jpg"][1]
    assert (anywhere["cat.jpg"][0], anywhere["../outside.jpg"][0], anywhere["pipe.jpg"][0]) == (200, 200, 400)
