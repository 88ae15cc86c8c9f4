"""Each KServe worker's share of the requests of each measured row, from a kserve.log kept while
`python -m measure bench` ran (copied from the bench's scratch folder while it ran).

The core logs one "batch of N: ..." line per batch with the pid of the process that ran it (handlers/core.py,
handlers/kserve_model.py's LOG_FORMAT): before, each KServe worker process; after, each inference worker. The
bench leaves the server idle for 2 s between its rows (1 s before and after each, measure/served/rows.py) and
1 s between its warm-up and its first row, so the rows are the log's stretches of batches apart by more than
GAP_S; the last `rows` stretches are the measured rows, in the bench's order (its --concurrency).

    python docs/results/2026-11-26-kserve-balance/shares.py KSERVE_LOG ROWS [REQ_PER_S ...]

prints, for each row, its seconds, rows answered, and each worker's share (and req/s: the share of the bench's
req/s for that row, when given).
"""

from __future__ import annotations

import sys
from collections import Counter
from datetime import datetime

GAP_S = 0.8


def batches(path: str) -> list[tuple[float, int, int]]:
    """(time, pid, rows) of each batch line."""
    found = []
    for line in open(path, errors="replace"):
        if " batch of " not in line:
            continue
        parts = line.split()
        stamp = datetime.strptime(f"{parts[0]} {parts[1]}", "%Y-%m-%d %H:%M:%S,%f").timestamp()
        found.append((stamp, int(parts[2]), int(line.split(" batch of ")[1].split(":")[0])))
    return found


def stretches(found: list[tuple[float, int, int]]) -> list[list[tuple[float, int, int]]]:
    runs: list[list] = []
    for batch in found:
        if runs and batch[0] - runs[-1][-1][0] <= GAP_S:
            runs[-1].append(batch)
        else:
            runs.append([batch])
    return runs


def main(argv: list[str]) -> int:
    path, count, rates = argv[0], int(argv[1]), [float(r) for r in argv[2:]]
    rows = stretches(batches(path))[-count:]
    for index, run in enumerate(rows):
        seconds = run[-1][0] - run[0][0]
        per_pid = Counter()
        for _, pid, size in run:
            per_pid[pid] += size
        total = sum(per_pid.values())
        shares = ", ".join(f"pid {pid} {n / total:.0%}" + (f" {n / total * rates[index]:.1f} req/s" if rates else "")
                           for pid, n in sorted(per_pid.items()))
        print(f"row {index + 1}: {seconds:.1f} s, {total} rows: {shares}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
