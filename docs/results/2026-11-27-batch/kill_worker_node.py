"""A worker node killed under a batch run: the two-node Ray cluster of measure/distributed/cluster.py (a head node
and a second node, each a `ray start` in a session of its own on this machine), `python -m serving batch ...
--address` onto it, the second node's every process SIGKILLed (as its machine dies) once KILL_AFTER_PARTS parts
are written; then the run either ends by itself (Ray Data retries the lost tasks and actors on the head) or the
same command is run again; either way OUT must end with exactly one row per photo. Prints what happened as JSON.

    python docs/results/2026-11-27-batch/kill_worker_node.py EXPORT PHOTOS_DIR OUT WORK_DIR
"""

import json
import subprocess
import sys
import time
from pathlib import Path

from measure.distributed.cluster import two_nodes_up
from serving.batch.output import read_rows
from serving.ray import cluster

KILL_AFTER_PARTS = 1
PART_SIZE = 16
GIVE_UP_S = 900

export, photos, out, work = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
happened: dict = {}
with two_nodes_up(work) as nodes:
    command = [
        sys.executable,
        "-m",
        "serving",
        "batch",
        export,
        photos,
        "--out",
        str(out),
        "--address",
        nodes.address,
        "--part-size",
        str(PART_SIZE),
    ]
    started = time.monotonic()
    with open(work / "first-run.log", "w") as log:
        first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        while len(list(out.glob("part-*.parquet"))) < KILL_AFTER_PARTS and first.poll() is None:
            time.sleep(0.2)
        happened["parts_before_kill"] = len(list(out.glob("part-*.parquet")))
        happened["killed_s"] = round(time.monotonic() - started, 1)
        happened["processes_killed"] = len(cluster.kill_session(nodes.second.pid))
        happened["first_run_exit"] = first.wait(timeout=GIVE_UP_S)
        happened["first_run_s"] = round(time.monotonic() - started, 1)
    happened["first_run_tail"] = (work / "first-run.log").read_text().strip().splitlines()[-3:]
    if happened["first_run_exit"] != 0:  # the same command again, on what is left of the cluster (the head)
        again = subprocess.run(command, capture_output=True, text=True, timeout=GIVE_UP_S)
        happened["second_run_exit"] = again.returncode
        happened["second_run_tail"] = again.stdout.strip().splitlines()[-3:]
names = read_rows(out).column("input").to_pylist()
expected = sorted(str(path) for path in Path(photos).rglob("*") if path.is_file())
happened["rows"], happened["photos"] = len(names), len(expected)
happened["exactly_one_row_per_photo"] = sorted(names) == expected
print(json.dumps(happened, indent=2))
sys.exit(0 if happened["exactly_one_row_per_photo"] else 1)
