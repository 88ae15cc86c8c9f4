"""CPU seconds of every process of one command, by role (utime + stime from /proc/PID/stat, polled), per photo:
a figure that depends little on what else the machine runs, unlike photos per second.

    python docs/results/2026-11-28-batch-cpu/cpu_by_process.py PHOTOS LABEL -- COMMAND...

COMMAND runs in a session of its own; every process of that session or descending from it is read every
POLL_S seconds until the command ends (a process's CPU after its last reading is lost: at most POLL_S each). Prints
a Markdown table (role, processes, CPU s, CPU ms per photo) and a JSON line with the same figures and the wall time.
"""

import json
import os
import subprocess
import sys
import time
from collections import defaultdict

POLL_S = 0.1
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def stat(pid: int) -> tuple[int, int, float] | None:
    """(ppid, session id, CPU seconds) of a live process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[3]), (int(fields[11]) + int(fields[12])) * TICK_S


def title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def role(pid: int, root: int, titles: set[str]) -> str:
    if pid == root:
        return "driver (the command's process)"
    text = " ".join(sorted(titles))
    for marker, name in (  # the first that any of its command lines holds (Ray renames its workers as they run)
        ("Scorer", "model actor workers"),
        ("decode_batch", "decode task workers"),
        ("_StatsActor", "Ray Data stats actor"),
        ("ray::DashboardAgent", "dashboard agent"),
        ("ray::RuntimeEnvAgent", "runtime env agent"),
        ("ray/gcs/gcs_server", "gcs_server"),
        ("ray/raylet/raylet", "raylet"),
        ("log_monitor.py", "log_monitor"),
        ("dashboard/dashboard.py", "dashboard"),
        ("autoscaler/_private/monitor.py", "autoscaler monitor"),
        ("default_worker.py", "other Ray workers (Ray Data's coordinators, idle)"),
        ("resource_tracker", "multiprocessing resource tracker"),
        ("multiprocessing", "local pool workers"),
    ):
        if marker in text:
            return name
    return text.split(" ")[0].rsplit("/", 1)[-1] or "?"


def main() -> None:
    photos, label = int(sys.argv[1]), sys.argv[2]
    command = sys.argv[sys.argv.index("--") + 1 :]
    started = time.monotonic()
    child = subprocess.Popen(command, start_new_session=True)
    cpu: dict[int, float] = {}
    titles: dict[int, set[str]] = defaultdict(set)
    while True:
        done = child.poll() is not None
        tracked = set(cpu) | {child.pid}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            found = stat(pid)
            if found is None:
                continue
            ppid, session, seconds = found
            if pid in tracked or ppid in tracked or session == child.pid:
                cpu[pid] = max(cpu.get(pid, 0.0), seconds)
                tracked.add(pid)
                titles[pid].add(title(pid))
        if done:
            break
        time.sleep(POLL_S)
    wall = time.monotonic() - started
    by_role: dict[str, list[float]] = defaultdict(list)
    for pid, seconds in cpu.items():
        by_role[role(pid, child.pid, titles[pid])].append(seconds)
    rows = sorted(((name, len(v), sum(v)) for name, v in by_role.items()), key=lambda row: -row[2])
    total = sum(row[2] for row in rows)
    print(f"\n{label}: {photos} photos, exit {child.returncode}, wall {wall:.1f} s\n")
    print("| process(es) | count | CPU s | CPU ms per photo |\n|---|---|---|---|")
    for name, count, seconds in rows:
        print(f"| {name} | {count} | {seconds:.1f} | {1000 * seconds / photos:.1f} |")
    print(f"| **total** | {len(cpu)} | {total:.1f} | {1000 * total / photos:.1f} |")
    figures = {name: round(1000 * seconds / photos, 1) for name, _, seconds in rows}
    print(
        json.dumps(
            {
                "label": label,
                "photos": photos,
                "exit": child.returncode,
                "wall_s": round(wall, 1),
                "cpu_ms_per_photo": figures,
                "total_cpu_ms_per_photo": round(1000 * total / photos, 1),
            }
        )
    )
    if os.environ.get("CPU_TITLES"):  # which command lines fell in which role
        with open(os.environ["CPU_TITLES"], "w") as handle:
            json.dump({pid: [role(pid, child.pid, titles[pid]), sorted(titles[pid])] for pid in cpu}, handle, indent=1)
    sys.exit(child.returncode)


if __name__ == "__main__":
    main()
