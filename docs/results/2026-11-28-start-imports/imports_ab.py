"""Before/after, alternating: `BEFORE=DIR AFTER=DIR python imports_ab.py RUNS [ARCHIVE]`.

BEFORE and AFTER are two checkouts (each with its .venv): the code without and with the cut. Each run is a fresh
interpreter that imports an engine worker's modules (with ARCHIVE: then opens it and answers examples/cat.jpg);
printed: the median (and range) of its CPU seconds (user + sys) and of its wall seconds, per path and code.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time

TREES = {"before": os.environ["BEFORE"], "after": os.environ["AFTER"]}
PATHS = {"torchserve": "handlers.torchserve_entry", "kserve-worker": "serving.kserve.worker,handlers.tasks"}
OPEN = """
import importlib, sys
from pathlib import Path
for name in sys.argv[1].split(","):
    importlib.import_module(name)
if len(sys.argv) > 2:
    from handlers.opening import open_archive
    core = open_archive(Path(sys.argv[2]), "cpu", scratch=Path(sys.argv[3]), measure=True)
    core.answer(Path("examples/cat.jpg").read_bytes())
"""


def once(tree: str, modules: str, archive: str | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one fresh interpreter."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    opening = [archive, f"{tree}/.scratch-imports-ab"] if archive else []
    subprocess.run([f"{tree}/.venv/bin/python", "-c", OPEN, modules, *opening], cwd=tree,
                   env={**os.environ, "PYTHONPATH": tree}, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    runs, archive = int(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else None)
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(runs):
        for path, modules in PATHS.items():
            for name, tree in TREES.items():
                results.setdefault((path, name), []).append(once(tree, modules, archive))
    print(f"load average {os.getloadavg()}")
    print("| path | code | CPU s, median (range) | wall s, median (range) |\n|---|---|---:|---:|")
    for (path, name), values in results.items():
        walls, cpus = [v[0] for v in values], [v[1] for v in values]
        print(f"| {path} | {name} | {statistics.median(cpus):.2f} ({min(cpus):.2f}-{max(cpus):.2f}) | "
              f"{statistics.median(walls):.2f} ({min(walls):.2f}-{max(walls):.2f}) |")


if __name__ == "__main__":
    main()
