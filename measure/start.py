"""Where a start's seconds go: `python -m measure start`.

  python -m measure start --store DIR [--engine torchserve|kserve|ray] [--port 18200] [--runs 2] [--out DIR]

Runs the user's own command, `python -m serving --detach`, on a fresh run dir with the store (its ports from --port
up, on loopback), times it until it returns (every model gave a real answer), reads the phases each process that
opened a model wrote (handlers/start_phases.py), stops the server, and prints one table per run with the CPU named.
The first run is as a new machine's (the default): the servers get an empty cache folder of their own (XDG_CACHE_HOME),
so the first worker of each model measures the choice at load and the others read what it kept, as on a machine
that never served; the next runs find what the first kept. --warm: the user's own cache, on every run. --out
writes start.json and start.md.
A benchmark, not a test: the figures go to docs/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from contract.files import atomic_write_text
from handlers.start_phases import PHASES, read_phases
from measure.distributed.report import cpu_name

ENGINES = ("torchserve", "kserve", "ray")
# the engine's port options, in the order --port, --port + 1, ... fills them
PORT_OPTIONS = {
    "torchserve": ("--inference-port", "--management-port", "--metrics-port", "--signals-port",
                   "--grpc-inference-port", "--grpc-management-port"),
    "kserve": ("--inference-port",),
    "ray": ("--inference-port", "--signals-port"),
}
START_TIMEOUT_S = 600  # the serving command's own --timeout bounds the wait; this only stops a hung command
SHOWN = {"process_and_imports": "process and imports", "archive": "archive read and verified", "choice": "choice at load",
         "form_opened": "form opened", "warm_up": "warm-up", "first_answer": "first answer"}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m measure start", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--store", type=Path, required=True, help="the model store to serve (every archive in it)")
    top.add_argument("--engine", choices=ENGINES, default="torchserve")
    top.add_argument("--port", type=int, default=18200, help="the first of the engine's loopback ports")
    top.add_argument("--runs", type=int, default=2, help="starts, one after the other (default: 2)")
    top.add_argument("--warm", action="store_true",
                     help="keep the choice an earlier start on this machine measured, also on the first run")
    top.add_argument("--out", type=Path, help="where start.json and start.md are written")
    return top


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if not args.store.is_dir() or not list(args.store.glob("*.mar")):
        print(f"{args.store} holds no archive: export one first, e.g. `python -m export efficientnet "
              f"--model-store {args.store}`", file=sys.stderr)
        return 2
    new_machine_cache = None if args.warm else Path(tempfile.mkdtemp(prefix="measure-start-cache-"))
    try:
        runs = []
        for index in range(args.runs):
            run = start_once(args, new_machine_cache, cold=index == 0 and not args.warm)
            if run["returncode"] != 0:
                print(run["output"][-3000:], file=sys.stderr)
                print(f"`{' '.join(run['command'])}` failed (exit {run['returncode']})", file=sys.stderr)
                return 1
            runs.append(run)
            print(report(run), flush=True)
    finally:
        if new_machine_cache is not None:
            shutil.rmtree(new_machine_cache)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out / "start.json", json.dumps({"cpu": cpu_name(), "runs": runs}, indent=2))
        atomic_write_text(args.out / "start.md", "\n\n".join(report(run) for run in runs) + "\n")
    return 0


def start_once(args: argparse.Namespace, cache_home: Path | None, cold: bool) -> dict:
    """One `python -m serving --detach` on a fresh run dir (its caches in cache_home when given, else the user's),
    timed, its processes' phases read, then stopped."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"measure-start-{args.engine}-"))
    ports = [f"{option}={args.port + offset}" for offset, option in enumerate(PORT_OPTIONS[args.engine])]
    command = [sys.executable, "-m", "serving", "--engine", args.engine, "--model-store", str(args.store),
               "--run-dir", str(run_dir), "--detach", *ports]
    env = {**os.environ, **({"XDG_CACHE_HOME": str(cache_home)} if cache_home else {})}
    began = time.time()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=START_TIMEOUT_S)
        returned = time.time() - began
    finally:
        subprocess.run([sys.executable, "-m", "serving", "stop", "--engine", args.engine, "--run-dir", str(run_dir)],
                       capture_output=True, text=True, timeout=START_TIMEOUT_S)
    run = {"engine": args.engine, "store": str(args.store), "cold": cold, "command": command,
           "returncode": done.returncode, "output": done.stdout + done.stderr, "returned_s": round(returned, 3),
           "began": began, "processes": read_phases(run_dir), "cpu": cpu_name(), "cores": os.cpu_count()}
    if done.returncode == 0:
        shutil.rmtree(run_dir)  # its phases are read; a failed start keeps its logs, named in the output
    else:
        run["run_dir"] = str(run_dir)
    return run


def report(run: dict) -> str:
    """The run as a markdown table: a row per process that opened a model, its phases in seconds."""
    head = (f"{run['engine']}, {'cold (a new machine: no choice kept yet)' if run['cold'] else 'warm (the kept choice)'}"
            f", on {run['cpu']} ({run['cores']} cores): `python -m serving --detach` returned after "
            f"{run['returned_s']:.1f} s")
    if "run_dir" in run:
        head += f" and FAILED (exit {run['returncode']}): its logs are kept in {run['run_dir']}"
    return "\n".join([head, "", *phases_rows(run["processes"], run["began"]), "", PHASES_NOTE])


PHASES_NOTE = ("seconds; started after and ready after: since the command began; a process with no first answer got "
               "no request (one real answer per model makes it ready); CPU to open: the process's CPU seconds from "
               "its birth to the start of opening (its imports), which a busy machine inflates far less than their "
               "wall-clock seconds")


def phases_rows(processes: list[dict], began: float) -> list[str]:
    """A markdown table's lines: a row per process that opened a model, its phases in seconds, its birth and its
    first answer counted from `began` (a Unix time: when the command that started it began)."""
    rows = ["| process | model | started after | " + " | ".join(SHOWN[phase] for phase in PHASES)
            + " | ready after | CPU to open |",
            "|---|---|" + "---:|" * (len(PHASES) + 3)]
    for process in processes:
        seconds = process["seconds"]
        ready = "" if process["ready_at"] is None else f"{process['ready_at'] - began:.2f}"
        rows.append(f"| pid {process['pid']} | {process['model']} {process['version']} | "
                    f"{process['born'] - began:.2f} | "
                    + " | ".join(f"{seconds[phase]:.2f}" if phase in seconds else "" for phase in PHASES)
                    + f" | {ready} | {imports_cpu(process)} |")
    return rows


def imports_cpu(process: dict) -> str:
    """The CPU seconds of the process's phase before opening, where its phases record it."""
    cpu = process.get("cpu_seconds", {}).get("process_and_imports")
    return "" if cpu is None else f"{cpu:.2f}"
