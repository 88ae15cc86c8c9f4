"""Which of an archive's gated candidates serves on this machine: the fastest, measured where it serves.

What is fastest depends on the model as well as the machine (on an AMX Xeon OpenVINO's bf16 is twice its int8 for
ResNet-50 while int8 leads for EfficientNet-Lite0's depthwise convolutions: docs/hardware-choice.md), so no order
declared at export can be right everywhere. The export still decides what MAY serve (the gated candidates, in its
declared order) and what this machine can run fast (runtime.machine's needs); among those, the worker measures each
one briefly under the serving policy's own setting (its threads, its batch size) and serves the first in the
declared order within MARGIN of the fastest. A measurement is kept on disk, keyed by the candidates' files, the CPU
and the setting, so restarts and the other workers serve the same choice without measuring again; a lock makes
the first worker measure alone while the others wait for its result.

VISION_EXPORT_FORM_CHOICE=declared serves the first candidate met, unmeasured (the rule before this module);
VISION_EXPORT_FORM_CHOICE=remeasure measures again and replaces what was kept.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import statistics
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from contract.files import atomic_write_text
from contract.records import Manifest
from runtime import RunOptions, open_artifact, verify_file
from runtime.machine import Choice, MachineProfile, candidate_unmet
from runtime.timing import time_runs

logger = logging.getLogger(__name__)

MARGIN = 0.10  # a candidate less than this much faster than an earlier one in the declared order does not displace it
WARMUP_CALLS = 3
MEASURE_SECONDS = 0.6  # per candidate: enough for a stable median at batch 1 on the forms measured here
CHOICE_ENV = "VISION_EXPORT_FORM_CHOICE"  # declared | remeasure (unset: measure once, then keep)
CACHE_DIR = Path(tempfile.gettempdir()) / "vision-export-form-choices"


@dataclass(frozen=True)
class MeasuredChoice(Choice):
    """runtime.machine's Choice with the measured images/s of each candidate this machine meets."""

    measured: dict = field(default_factory=dict)  # kind -> images/s at the policy's setting
    how: str = "declared order"

    def line(self) -> str:
        if not self.measured:
            return super().line()
        table = ", ".join(f"{kind} {rate:.1f}" for kind, rate in self.measured.items())
        skipped = "".join(f"; not {kind}: {why}" for kind, why in self.skipped.items())
        return (f"serving {self.kind} on {self.machine.describe()}: {self.how} (images/s: {table}){skipped}")

    def as_dict(self) -> dict:
        return {**super().as_dict(), "measured_images_per_s": dict(self.measured), "how": self.how}


def met_candidates(manifest: Manifest, machine: MachineProfile) -> tuple[list[str], dict]:
    """The gated candidates this machine meets, in the declared order, and why each other one is not served."""
    met, skipped = [], {}
    for candidate in manifest.decision().gated:
        why = candidate_unmet(candidate, machine)
        if why is None and candidate["kind"] in manifest.artifacts:
            met.append(candidate["kind"])
        elif why is not None:
            skipped[candidate["kind"]] = why
    return met, skipped


def measured_choice(folder: Path, manifest: Manifest, machine: MachineProfile, threads: int, batch: int,
                    device: str, rebuild: str) -> MeasuredChoice | None:
    """The candidate to serve, measured (or read from an earlier measurement); None when there is nothing to choose
    between (one candidate or none met) or the environment asks for the declared order."""
    met, skipped = met_candidates(manifest, machine)
    mode = os.environ.get(CHOICE_ENV, "")
    if len(met) < 2 or mode == "declared":
        return None
    shape = (batch, *manifest.input.handler_input())
    key = _key(manifest, met, machine, threads, shape, device)
    with _locked(key):
        measured = None if mode == "remeasure" else _kept(key)
        if measured is None:
            measured = {kind: _rate(folder, manifest, kind, threads, shape, device, rebuild) for kind in met}
            atomic_write_text(CACHE_DIR / f"{key}.json", json.dumps(measured))
            how = "measured at this worker's start"
        else:
            how = "as measured at an earlier start on this machine"
    kind = within_margin(met, measured)
    return MeasuredChoice(kind, machine, skipped, measured,
                          f"{how}; the first of the declared order within {MARGIN:.0%} of the fastest")


def within_margin(declared: list[str], rates: dict[str, float]) -> str:
    """The first kind of the declared order whose rate is within MARGIN of the fastest."""
    fastest = max(rates.values())
    return next(kind for kind in declared if rates[kind] >= (1 - MARGIN) * fastest)


def _rate(folder: Path, manifest: Manifest, kind: str, threads: int, shape: tuple, device: str, rebuild: str) -> float:
    record = manifest.artifacts[kind]
    verify_file(folder / record.path, record.sha256, rebuild)  # before any of its code runs
    for path, sha256 in record.companions.items():
        verify_file(folder / path, sha256, rebuild)
    backend = open_artifact(record.format, folder / record.path,
                            RunOptions(device=device, threads=threads, precision=record.run_precision), name=kind)
    batch = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    milliseconds = time_runs(lambda: backend(batch), WARMUP_CALLS, 3, min_seconds=MEASURE_SECONDS)
    return round(shape[0] * 1000 / statistics.median(milliseconds), 1)


def _key(manifest: Manifest, met: list[str], machine: MachineProfile, threads: int, shape: tuple, device: str) -> str:
    """Each candidate by its kind and its file's sha256: kinds that run one file in two precisions (an int8 IR with
    its remainder in f32 or bf16) share the file, not the measurement."""
    facts = [f"{kind} {manifest.artifacts[kind].sha256}" for kind in met] + sorted(machine.flags) + [
        str(threads), str(shape), device, str(os.cpu_count())]
    return hashlib.sha256("\n".join(facts).encode()).hexdigest()[:24]


def _kept(key: str) -> dict | None:
    try:
        return json.loads((CACHE_DIR / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


@contextmanager
def _locked(key: str):
    """One worker measures at a time (the others would share its cores and skew its figures) and the rest read
    what it kept."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
