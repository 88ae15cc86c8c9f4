"""`python -m measure rollout`: a rollout and a rollback under load, as users see them.

Real HTTP clients (a thread pool, each with its own keep-alive connection: hey reports no response headers,
and every answer's version is the point) post the photo to /predictions/NAME throughout, on a TorchServe
started here from the store with the live version as default. Then `python -m serving rollout NAME CANDIDATE`
runs as a user runs it, then `rollback NAME`. Reported per phase (steady, rollout, rollback): requests, failures,
latency p50/p99, the versions that answered; and the switch time, from the command's start to the first request
after which every answer came from the new version.

  python -m measure rollout --model-store S --model NAME --candidate S/NAME.v2.mar --live v1 --out DIR
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from contract.policy import ServingPolicy
from contract.versions import VERSION_HEADER, label_of, record_default
from handlers.start_phases import read_phases
from measure.command import write_tables
from measure.loadgen import percentile
from measure.start import PHASES_NOTE, phases_rows
from serving.rollout.candidate import checked_manifest
from serving.settings import EXAMPLE_IMAGE, PROJECT_ROOT, REQUEST_TIMEOUT_S, ServingSettings

if TYPE_CHECKING:
    from serving.engine import Engine

CONCURRENCY = 8
STEADY_S = 20.0  # steady state measured before the rollout


@dataclass
class Sample:
    start: float
    end: float
    status: int  # 0: no answer (connection refused, reset, timeout)
    version: str | None  # the X-Model-Version header
    answer: dict | None
    error: str = ""


@dataclass
class VersionedLoad:
    """CONCURRENCY clients posting image to url until stop(); every answer kept with its version and times."""

    url: str
    image: bytes
    content_type: str = "image/jpeg"
    concurrency: int = CONCURRENCY
    engine: Engine | None = None  # how its clients post a photo and read the answer (None: the photo's bytes, the JSON)
    headers: dict = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.concurrency)]

    def start(self) -> VersionedLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT_S + 5)
        return self.samples

    def _client(self) -> None:
        import requests
        session = requests.Session()
        body, content_type = self.engine.client_body(self.image) if self.engine else (self.image, self.content_type)
        headers = {"Content-Type": content_type, **self.headers}
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                response = session.post(self.url, data=body, headers=headers, timeout=REQUEST_TIMEOUT_S)
                ok = response.status_code == 200
                answer = (self.engine.answer_of(response) if self.engine else response.json()) if ok else None
                sample = Sample(start, time.monotonic(), response.status_code, response.headers.get(VERSION_HEADER),
                                answer, "" if ok else response.text[:200])
            except (requests.RequestException, ValueError, KeyError, IndexError) as error:
                sample = Sample(start, time.monotonic(), 0, None, None, f"{type(error).__name__}: {error}"[:200])
            with self._lock:
                self.samples.append(sample)

    def between(self, start: float, end: float) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if start <= s.start < end]


def failures(samples: list[Sample]) -> list[Sample]:
    """Requests that failed, or whose answer does not name one version consistently (header and JSON)."""
    return [s for s in samples if s.status != 200 or s.answer is None or s.answer.get("version") != s.version]


def switch_seconds(samples: list[Sample], started: float, new: str) -> float | None:
    """From the command's start to the first request after which every answer came from the new version."""
    after = sorted((s for s in samples if s.start >= started), key=lambda s: s.start)
    last_old = max((i for i, s in enumerate(after) if s.status == 200 and s.version != new), default=-1)
    if last_old + 1 >= len(after):
        return None
    return after[last_old + 1].start - started


def phase_row(phase: str, samples: list[Sample], switch_s: float | None = None) -> dict:
    latencies = [1000 * (s.end - s.start) for s in samples if s.status == 200]
    versions = sorted({s.version or "none" for s in samples})
    return {"phase": phase, "requests": len(samples), "failed": len(failures(samples)),
            "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99),
            "versions": ", ".join(versions), "switch_s": switch_s}


def serving_command(*args: str) -> subprocess.CompletedProcess:
    """`python -m serving ...` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "serving", *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=900)


def markdown(rows: list[dict]) -> str:
    lines = ["| phase | requests | failed | p50 ms | p99 ms | versions answering | switch s |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        def number(value):
            return "-" if value is None else f"{value:.1f}"
        lines.append(f"| {row['phase']} | {row['requests']} | {row['failed']} | {number(row['p50_ms'])} | "
                     f"{number(row['p99_ms'])} | {row['versions']} | {number(row['switch_s'])} |")
    return "\n".join(lines) + "\n"


def engine_names() -> tuple[str, ...]:
    from serving import engine as engines
    return engines.names()


def engine_settings(engine: str, store: Path, run_dir: Path, name: str,
                    policy: ServingPolicy | None = None) -> tuple[ServingSettings, str]:
    """The engine's settings on free loopback ports serving name (policy: given whole, else this machine's), and
    the URL a client posts the photo to."""
    from serving import engine as engines
    kind = engines.get(engine)
    settings = kind.on_free_ports(store, run_dir, (name,), policy)
    return settings, next(iter(kind(settings).urls(name).values()))  # the URL its readiness probe asks first


def main(argv: list[str] | None = None) -> int:
    from contract.cli import run_command
    return run_command(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="python -m measure rollout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=engine_names(), default=engine_names()[0])
    parser.add_argument("--model-store", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--live", required=True, help="the version serving at the start (vN)")
    parser.add_argument("--candidate", type=Path, required=True, help="what `rollout` is given")
    parser.add_argument("--image", type=Path, default=EXAMPLE_IMAGE)
    parser.add_argument("--steady", type=float, default=STEADY_S, help="seconds of steady load before the rollout")
    parser.add_argument("--out", type=Path, default=Path("rollout-results"))
    parser.add_argument("--accept-weak-evidence", action="store_true",
                        help="passed to `rollout`: random-weight versions carry no evidence for its gate")
    args = parser.parse_args(argv)
    from serving import engine as engines
    run_dir = (args.out / f"run-{args.engine}").absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    record_default(run_dir, args.model, args.live)  # the start serves it
    settings, url = engine_settings(args.engine, args.model_store, run_dir, args.model)
    server = engines.get(args.engine)(settings)
    new = label_of(checked_manifest(args.candidate).model_version)  # checked before anything starts
    with server.running(args.image):
        rows, log, began = under_load(url, server, args, run_dir, new)
    candidate = [p for p in read_phases(run_dir) if p["version"] == new and p["born"] >= began]
    beside = loaded_beside(log, new, candidate, began)
    print(beside)
    context = {"model": args.model, "live": args.live, "candidate": str(args.candidate), "engine": args.engine,
               "concurrency": CONCURRENCY, "log": log, "candidate_phases": candidate}
    write_tables(args.out, f"rollout-{args.engine}", markdown(rows) + "\n\n" + beside, context, rows)
    return 0 if not any(row["failed"] for row in rows) else 1


def loaded_beside(log: str, new: str, processes: list[dict], began: float) -> str:
    """Where the candidate's load beside the live version went: the rollout's own figure and the phases of each
    process that opened the candidate, counted from the rollout command's start."""
    said = re.search(rf"^{re.escape(new)} loaded beside .*$", log, re.MULTILINE)
    return "\n".join([f"The rollout said: {said.group(0) if said else 'no load beside (see its output)'}", "",
                       *phases_rows(processes, began), "", PHASES_NOTE.replace("the command", "the rollout command")])


def under_load(url: str, server: Engine, args: argparse.Namespace, run_dir: Path,
               new: str) -> tuple[list[dict], str, float]:
    """The phases' rows, the commands' output, and when the rollout command began (a Unix time); `new`: the
    candidate's version label."""
    load = VersionedLoad(url, args.image.read_bytes(), engine=server).start()
    try:
        time.sleep(args.steady)
        steady_end, began = time.monotonic(), time.time()
        rolled = serving_command("rollout", args.model, str(args.candidate), "--run-dir", str(run_dir),
                                 *(["--accept-weak-evidence"] if args.accept_weak_evidence else []))
        rollback_start = time.monotonic()
        back = serving_command("rollback", args.model, "--run-dir", str(run_dir))
        end = time.monotonic()
        time.sleep(2.0)
    finally:
        samples = load.stop()
    rows = [phase_row("steady", [s for s in samples if s.start < steady_end]),
            phase_row("rollout", [s for s in samples if steady_end <= s.start < rollback_start],
                      switch_seconds([s for s in samples if s.start < rollback_start], steady_end, new)),
            phase_row("rollback", [s for s in samples if rollback_start <= s.start < end],
                      switch_seconds(samples, rollback_start, args.live))]
    log = rolled.stdout + rolled.stderr + back.stdout + back.stderr
    start = min(s.start for s in samples)
    log += "".join(f"failed: sent at {s.start - start:.1f} s, after {s.end - s.start:.1f} s: {s.error}\n"
                   for s in failures(samples))
    print(log)
    return rows, log, began
