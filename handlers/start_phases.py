"""Where a start's seconds go: each process that opens a model (a TorchServe worker, KServe's server or one of
its workers, a Ray replica, a batch actor) times its phases and reports them twice: one structured log line,
`start phases model=NAME ... ready=S`, once its first real answer is given, and a JSON file per process in the
run dir's START_PHASES_DIR, which `python -m measure start` reads (measure/start.py).

The phases, in their order (seconds each):
  process_and_imports  from the process's birth to the start of opening (the engine's launch, Python, imports)
  archive              the archive unpacked, its manifest and config read, the served form's sha256 checked
  choice               which gated form serves here: measured, or read from an earlier start (runtime/form_choice.py)
  form_opened          the served form opened by its runtime
  warm_up              one call of the form at batch 1, so that the first client does not pay its first call
  first_answer         the first real request, decode to encode, inside the process
Each phase's CPU time is kept beside its seconds (the process's, every thread's): on a busy machine the seconds
grow with the wait for a core, the CPU time much less, so it says what a cut saved.
"""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from contract.files import atomic_write_text
from handlers.metrics import MULTIPROC_ENV

logger = logging.getLogger(__name__)

PHASES = ("process_and_imports", "archive", "choice", "form_opened", "warm_up", "first_answer")
START_PHASES_DIR = "start-phases"  # in the run dir, beside the metrics folder every engine's processes share


def process_started() -> float:
    """This process's birth as a Unix time (Linux's /proc: its start in clock ticks after boot); without /proc,
    the import of this module, which leaves the earlier imports out of process_and_imports."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return _IMPORTED
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


_IMPORTED = time.time()


def engine_run_dir() -> Path | None:
    """The run dir of the engine that started this process, found from the metrics folder it gave every process
    (PROMETHEUS_MULTIPROC_DIR, RUN_DIR/metrics); None in-process."""
    metrics_dir = os.environ.get(MULTIPROC_ENV)
    return Path(metrics_dir).parent if metrics_dir else None


def phases_folder() -> Path | None:
    """Where this process writes its phases: the run dir's START_PHASES_DIR; None in-process."""
    run_dir = engine_run_dir()
    return run_dir / START_PHASES_DIR if run_dir else None


@dataclass
class StartPhases:
    """One process's start of one model: begin() when opening starts, timed(PHASE) around each phase, answered()
    at the first real answer."""

    model: str = ""
    version: str = ""
    born: float = field(default_factory=process_started)  # Unix time of the process's birth
    seconds: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # the process's CPU time in each phase
    ready_at: float | None = None  # Unix time of the first real answer
    folder: Path | None = field(default_factory=phases_folder)

    @classmethod
    def begin(cls, model: str = "") -> "StartPhases":
        phases = cls(model=model)
        phases.seconds["process_and_imports"] = max(0.0, time.time() - phases.born)
        phases.cpu_seconds["process_and_imports"] = time.process_time()  # all of it since the process began
        return phases

    @contextmanager
    def timed(self, phase: str):
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start
            self.cpu_seconds[phase] = self.cpu_seconds.get(phase, 0.0) + time.process_time() - cpu

    def opened(self, model: str, version: str) -> None:
        """The model is open (every phase but the first answer): kept on disk, for a worker that never answers."""
        self.model, self.version = model, version
        self.write()

    def answered(self, seconds: float) -> None:
        """The first real answer took `seconds` in this process: the start is complete; later answers change
        nothing."""
        if self.ready_at is not None:
            return
        self.seconds["first_answer"] = seconds
        self.ready_at = time.time()
        logger.info(self.line())
        self.write()

    def ready_after(self) -> float | None:
        """Seconds from the process's birth to its first real answer."""
        return None if self.ready_at is None else self.ready_at - self.born

    def line(self) -> str:
        shown = " ".join(f"{phase}={self.seconds[phase]:.2f}s" for phase in PHASES if phase in self.seconds)
        ready = self.ready_after()
        return (f"start phases model={self.model} version={self.version} pid={os.getpid()} {shown}"
                + (f" ready={ready:.2f}s" if ready is not None else ""))

    def as_dict(self) -> dict:
        return {"model": self.model, "version": self.version, "pid": os.getpid(), "born": self.born,
                "ready_at": self.ready_at, "seconds": {phase: round(value, 4) for phase, value in self.seconds.items()},
                "cpu_seconds": {phase: round(value, 4) for phase, value in self.cpu_seconds.items()}}

    def write(self) -> None:
        if self.folder is None:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.folder / f"{self.model}-{self.version}-{os.getpid()}.json", json.dumps(self.as_dict()))
        except OSError as error:  # the phases are a report: a read-only run dir must not stop the model serving
            logger.warning("start phases not written to %s: %s", self.folder, error)


def read_phases(run_dir: Path) -> list[dict]:
    """Every process's phases written under run_dir, oldest process first."""
    folder = Path(run_dir) / START_PHASES_DIR
    found = [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return sorted(found, key=lambda phases: phases["born"])
