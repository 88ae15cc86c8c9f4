"""Two Ray nodes against one, each node one core of this machine: `python -m serving batch ... --address` on a
one-node cluster (the head, pinned to CPU 0 with taskset, 1 CPU) and on a two-node cluster (the same head, and a
second node pinned to CPU 1, 1 CPU), the driver pinned to the head's CPU in both, the same first N photos. Every
process a node starts inherits its pinning, so each node computes on one core of its own, as two one-core machines
would; what they still share here (memory bandwidth, the L3 cache, the object store's transfers over loopback
instead of a network) is said beside the figures. Prints one JSON line per cluster, then the ratio.

    python docs/results/2026-11-28-batch-two-node/run.py EXPORT PHOTOS_DIR WORK [N]
"""

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import ray

from measure.distributed.cluster import short_temp_dir
from serving.ray import cluster
from serving.settings import HOST, free_port

export, photos, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
count = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
work.mkdir(parents=True, exist_ok=True)
table = work / "photos.csv"
with open(table, "w", newline="") as handle:
    writer = csv.writer(handle)
    writer.writerow(["path"])
    for path in sorted(photos.iterdir())[:count]:
        writer.writerow([str(path)])


def pinned(cpu: int, command: list[str]) -> list[str]:
    return ["taskset", "-c", str(cpu), *command]


def node(name: str, cpu: int, head_port: int | None = None, address: str | None = None):
    command = cluster.node_command(short_temp_dir(work, name), 1, head_port=head_port, address=address)
    return cluster.start_node(pinned(cpu, command), work / f"ray-{name}.log", new_session=True)


def batch_on(address: str, out: Path) -> dict:
    done = subprocess.run(pinned(0, [sys.executable, "-m", "serving", "batch", export, str(table), "--column",
                                     "path", "--out", str(out), "--address", address]),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def joined(address: str, nodes: int, timeout: float = 120) -> None:
    """Once the cluster has all its nodes (the batch sizes its actor pool by the CPUs it finds at its start)."""
    ray.init(address=address, logging_level="WARNING", log_to_driver=False, _node_ip_address=HOST)
    try:
        deadline = time.monotonic() + timeout
        while sum(n["Alive"] for n in ray.nodes()) < nodes:
            if time.monotonic() > deadline:
                raise SystemExit(f"the cluster at {address} did not reach {nodes} nodes within {timeout:.0f} s")
            time.sleep(0.5)
    finally:
        ray.shutdown()


def cluster_of(nodes: int, run: str) -> dict:
    port = free_port()
    address = f"{HOST}:{port}"
    started = [node(f"{run}-head", 0, head_port=port)]
    try:
        cluster.wait_for_gcs(address, started[0], work / f"ray-{run}-head.log")
        if nodes == 2:
            started.append(node(f"{run}-second", 1, address=address))
        joined(address, nodes)
        result = batch_on(address, work / f"out-{run}")
    finally:
        for process in reversed(started):
            process.kill()
            process.wait()
            cluster.end_session(process.pid)
    return {"nodes": nodes, **result}


one = cluster_of(1, "one")
print(json.dumps(one), flush=True)
two = cluster_of(2, "two")
print(json.dumps(two), flush=True)
print(json.dumps({"photos": count, "two_nodes_over_one": round(two["photos_per_s"] / one["photos_per_s"], 2),
                  "after_first_answers": round(two["photos_per_s_after_first_answers"]
                                               / one["photos_per_s_after_first_answers"], 2)}))
