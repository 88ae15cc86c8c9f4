"""Which of an archive's gated candidates serves on a machine: the one place the choice is made, for the export's
--target and for every engine at load.

The export decides what MAY serve (export/package/selection.py: the gated candidates, in its declared order, each
with what it needs to run and to be fast). Here the machine chooses among them:

  declared_choice  the first candidate the machine meets (runtime.machine's needs): what the export records as
                   `served` for its --target, and what a worker serves when one candidate is met or
                   VISION_EXPORT_FORM_CHOICE=declared.
  choose           what the core opens at load (handlers/core.py from_folder, so every engine): among the
                   candidates this machine meets, each measured briefly under the serving policy's own setting (its
                   threads, its batch size), the first in the declared order within MARGIN of the fastest; or the
                   one a caller names (`form`: a test re-running the form a server named), refused unless this
                   machine may serve it.

What is fastest depends on the model as well as the machine (on an AMX Xeon OpenVINO's bf16 is twice its int8 for
ResNet-50 while int8 leads for EfficientNet-Lite0's depthwise convolutions: docs/hardware-choice.md), so no order
declared at export can be right everywhere. A measurement is kept in the user's cache folder (CACHE_DIR), keyed by
the candidates' sha256, the machine (its CPU, flags, cores, device and runtime versions) and the setting, so every
later start on this machine (a restart, another run dir, the other workers, a replaced worker) serves the same
choice without measuring again, and a change of either content or machine measures afresh; a lock makes the first
worker measure alone while the others wait for its result. The export keeps its own timing of the forms there
too (keep_export_measurement: the same setting, batch 1, on the machine that exported), so a first start there
reads it, and carries it in its archive with its key (FORM_TIMING_NAME), so a first start on any machine of that
kind does. VISION_EXPORT_FORM_CHOICE=remeasure measures again and replaces what was kept. Every candidate is
checked against the manifest's sha256 (runtime.integrity verify_artifact) before any of its code runs, and the
served one again before it serves (handlers/core.py); a kept choice whose form fails that check is forgotten
(forget). The measuring worker serves the backend it measured (taken_backend) instead of opening it twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import statistics
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from contract.files import atomic_write_text
from contract.records import FORM_TIMING_NAME, ContractError, Manifest
from runtime.base import RunOptions, backend_class, open_artifact
from runtime.integrity import mismatch, verify_artifact
from runtime.machine import CUDA, MachineProfile, Needs
from runtime.timing import time_runs

logger = logging.getLogger(__name__)

MARGIN = 0.10  # a candidate less than this much faster than an earlier one in the declared order does not displace it
WARMUP_CALLS = 3
MEASURE_SECONDS = 0.6  # per candidate: enough for a stable median at batch 1 on the forms measured here
CHOICE_ENV = "VISION_EXPORT_FORM_CHOICE"  # declared | remeasure (unset: measure once, then keep)
# Not the temporary folder: TorchServe points TMPDIR at each run dir, where a kept choice would not outlive the run.
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vision-export" / "form-choices"
FALLBACK_CACHE_DIR = Path(tempfile.gettempdir()) / "vision-export-form-choices"  # where the user's is not writable
RUNTIMES = ("torch", "onnxruntime", "openvino")  # a new version may change which form is fastest
MEASURED_BY_SUFFIX = ".by"  # beside KEY.json: who measured it (BY_A_START when absent)
BY_A_START, BY_THE_EXPORT = "at an earlier start", "by the export"
BY_THE_ARCHIVE = "by the archive's export, on a machine of this kind"


class FormChoiceError(ContractError):
    """No form of the archive can serve on this machine, or the choice names one the manifest does not record."""


@dataclass(frozen=True)
class Choice:
    """The form a machine serves: the first candidate whose needs it meets, and why each earlier one was not."""

    kind: str | None
    machine: MachineProfile
    skipped: dict[str, str]  # kind -> why this machine does not serve it

    def line(self) -> str:
        head = (f"serving {self.kind} on {self.machine.describe()}: the first of the export's candidates this "
                f"machine meets" if self.kind else f"no candidate can be served on {self.machine.describe()}")
        return head + "".join(f"; not {kind}: {why}" for kind, why in self.skipped.items())

    def as_dict(self) -> dict[str, Any]:
        return {"served": self.kind, "machine": self.machine.name, "device": self.machine.device,
                "skipped": dict(self.skipped)}


@dataclass(frozen=True)
class MeasuredChoice(Choice):
    """A Choice with the measured images/s of each candidate this machine meets."""

    measured: dict[str, float] = field(default_factory=dict)  # kind -> images/s at the policy's setting
    how: str = "declared order"
    key: str = ""  # where the measurement is kept (forget)
    # the served form's backend as measured in this process, with its RunOptions, until the core takes it
    opened: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def line(self) -> str:
        if not self.measured:
            return super().line()
        table = ", ".join(f"{kind} {rate:.1f}" for kind, rate in self.measured.items())
        skipped = "".join(f"; not {kind}: {why}" for kind, why in self.skipped.items())
        return f"serving {self.kind} on {self.machine.describe()}: {self.how} (images/s: {table}){skipped}"

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "measured_images_per_s": dict(self.measured), "how": self.how}


@dataclass(frozen=True)
class NamedChoice(Choice):
    """A form its caller named, among those this machine may serve (`allowed`)."""

    allowed: tuple[str, ...] = ()

    def line(self) -> str:
        return (f"serving {self.kind} on {self.machine.describe()}: named by the caller, one of the forms this "
                f"machine may serve ({', '.join(self.allowed)})")

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "how": "named by the caller", "allowed": list(self.allowed)}


def candidate_unmet(candidate: dict[str, Any], machine: MachineProfile) -> str | None:
    """Why `machine` may not serve a candidate ({"kind", "runs_on", "fast_on"}, as the manifest records it)."""
    why = Needs.from_dict(candidate.get("runs_on")).unmet(machine)
    if why:
        return f"cannot run here: {why}"
    why = Needs.from_dict(candidate.get("fast_on")).unmet(machine)
    return f"not fast here: {why}" if why else None


def runtime_unmet(record: Any, device: str) -> str | None:
    """Why this environment's runtime cannot run a recorded form on the GPU it serves on (`device`, the real one,
    whatever profile a test simulates) although the form could (ONNX Runtime without its CUDA provider); None on a
    CPU, whose runtimes the serving environment installs (a missing one is named when the form opens)."""
    if not device.startswith(CUDA):
        return None
    why = backend_class(record.format).unavailable(CUDA)
    return f"cannot run here: {why}" if why else None


def met_candidates(gated: list[dict[str, Any]], machine: MachineProfile, recorded: Any = None,
                   runtimes: Any = None, device: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The gated candidates this machine meets, in the declared order (only those `recorded` holds, when given),
    and why each one it does not meet is not served. `runtimes` (the manifest's records) and `device` (what this
    process serves on), when serving here: a candidate this environment's runtime cannot run there is not met."""
    met, skipped = [], {}
    for candidate in gated:
        why = candidate_unmet(candidate, machine)
        if why is None and runtimes is not None and device is not None and candidate["kind"] in runtimes:
            why = runtime_unmet(runtimes[candidate["kind"]], device)
        if why is not None:
            skipped[candidate["kind"]] = why
        elif recorded is None or candidate["kind"] in recorded:
            met.append(candidate["kind"])
    return met, skipped


def declared_choice(gated: list[dict[str, Any]], machine: MachineProfile, runtimes: Any = None,
                    device: str | None = None) -> Choice:
    """The first candidate, in the export's order, whose needs this machine meets (the export ends its list with a
    form that needs nothing, so some form always serves); with `runtimes` and `device` (serving here), also
    runnable here."""
    met, skipped = met_candidates(gated, machine, runtimes=runtimes, device=device)
    if not met:
        return Choice(None, machine, skipped)
    order = [candidate["kind"] for candidate in gated]
    earlier = set(order[:order.index(met[0])])
    return Choice(met[0], machine, {kind: why for kind, why in skipped.items() if kind in earlier})


def may_serve_here(manifest: Manifest, machine: MachineProfile, device: str | None = None) -> list[str]:
    """The kinds `choose` may open on this machine: the gated candidates it meets, or the decided kind of an export
    without them (older ones, or one form asked for)."""
    decision = manifest.decision()
    if not decision.gated:
        return [decision.served_kind()]
    return met_candidates(decision.gated, machine, manifest.artifacts, manifest.artifacts, device)[0]


def choose(folder: Path, manifest: Manifest, machine: MachineProfile, threads: int, batch: int, device: str,
           rebuild: str, measure: bool = True, form: str | None = None) -> Choice:
    """The form this machine serves: `form` when a caller names one this machine may serve (nothing is measured),
    else measured among the candidates it meets (`measure`, what the engines ask), else the first it meets; an
    export without gated candidates serves its decided kind."""
    if form is not None:
        return named_choice(manifest, machine, form, device)
    decision = manifest.decision()
    if not decision.gated:
        return Choice(decision.served_kind(), machine, {})
    measured = measured_choice(folder, manifest, machine, threads, batch, device, rebuild) if measure else None
    choice = measured or declared_choice(decision.gated, machine, manifest.artifacts, device)
    if choice.kind is None:
        raise FormChoiceError(f"none of this archive's forms can be served on {machine.describe()}: "
                              + "; ".join(f"{k}: {why}" for k, why in choice.skipped.items())
                              + "; re-export with --target naming this machine's profile")
    if choice.kind not in manifest.artifacts:
        raise FormChoiceError(f"the serving decision names {choice.kind!r}, which the manifest does not record; "
                              "rebuild the archive with `python -m export`")
    return choice


def named_choice(manifest: Manifest, machine: MachineProfile, form: str, device: str | None = None) -> NamedChoice:
    """The form a caller names, when it is one of the gated candidates this machine meets (may_serve_here): the
    same check a measured choice passes, so a name cannot open a form the export's gates kept out."""
    allowed = may_serve_here(manifest, machine, device)
    if form not in allowed:
        raise FormChoiceError(f"{form!r} is not among the forms this archive may serve on {machine.describe()} "
                              f"({', '.join(allowed) or 'none'}): name one of those, or leave the choice to the "
                              "machine")
    return NamedChoice(form, machine, {}, tuple(allowed))


def measured_choice(folder: Path, manifest: Manifest, machine: MachineProfile, threads: int, batch: int,
                    device: str, rebuild: str) -> MeasuredChoice | None:
    """The candidate to serve, measured (or read from an earlier measurement); None when there is nothing to choose
    between (one candidate or none met) or the environment asks for the declared order."""
    mode = os.environ.get(CHOICE_ENV, "")
    between = None if mode == "declared" else _candidates_to_time(manifest, machine, threads, batch, device)
    if between is None:
        return None
    met, skipped, shape, key = between
    opened: dict[str, tuple[RunOptions, Any]] = {}
    with _locked(key) as cache:
        kept = None if mode == "remeasure" else _kept(cache / f"{key}.json") or _carried(folder, manifest, key)
        if kept is None:
            measured = {kind: _rate(folder, manifest, kind, threads, shape, device, rebuild, opened) for kind in met}
            _keep(cache / f"{key}.json", measured, BY_A_START)
            how = "measured at this worker's start"
        else:
            measured, by = kept
            how = f"as measured {by}" + ("" if by == BY_THE_ARCHIVE else " on this machine")
    kind = within_margin(met, measured)
    backend = dict(zip(("options", "backend"), opened[kind])) if kind in opened else {}
    return MeasuredChoice(kind, machine, skipped, measured,
                          f"{how}; the first of the declared order within {MARGIN:.0%} of the fastest", key, backend)


def keep_export_measurement(manifest: Manifest, machine: MachineProfile, threads: int, device: str,
                            median_ms: dict[str, float]) -> dict[str, Any] | None:
    """The export's own timing of its forms (one call on the example input, under the serving policy's threads,
    on this machine) kept as the choice's measurement at batch 1, so that the first start on the machine that
    exported reads it instead of measuring the same forms again; a start's own measurement is never replaced. What
    the export carries (carry_timing); None when the timings miss a candidate met here, or there is no choice."""
    between = _candidates_to_time(manifest, machine, threads, 1, device)
    if between is None or not all(median_ms.get(kind) for kind in between[0]):
        return None
    met, _, _, key = between
    rates = {kind: round(1000 / median_ms[kind], 1) for kind in met}
    with _locked(key) as cache:
        if _kept(cache / f"{key}.json") is None:
            _keep(cache / f"{key}.json", rates, BY_THE_EXPORT)
    return {"key": key, "images_per_s": rates}


def carry_timing(folder: Path, timing: dict[str, Any]) -> None:
    """keep_export_measurement's result as the export folder's FORM_TIMING_NAME (the manifest records it)."""
    atomic_write_text(folder / FORM_TIMING_NAME, json.dumps(timing))


def _candidates_to_time(manifest: Manifest, machine: MachineProfile, threads: int, batch: int,
                        device: str) -> tuple[list[str], dict[str, str], tuple[int, ...], str] | None:
    """(the candidates this machine meets, why the others are not, the input timed, where their timing is kept),
    for measured_choice and keep_export_measurement alike; None when there is nothing to choose between (one
    candidate or none met) or no input shape (the core refuses such an archive by name: check_task)."""
    met, skipped = met_candidates(manifest.decision().gated, machine, manifest.artifacts, manifest.artifacts, device)
    handler_input = manifest.input.handler_input()
    if len(met) < 2 or handler_input is None:
        return None
    shape = (batch, *handler_input)
    return met, skipped, shape, _key(manifest, met, machine, threads, shape, device)


def taken_backend(choice: Choice | None, options: RunOptions) -> Any:
    """The backend the choice measured for its served form in this process, handed over once, when it ran under
    `options` (the core's device, threads and precision); None otherwise."""
    opened = choice.opened if isinstance(choice, MeasuredChoice) else {}
    if opened.get("options") != options:
        return None
    backend = opened.pop("backend", None)
    opened.clear()
    return backend


def forget(choice: Choice) -> None:
    """Drop a kept measurement (its served form failed its sha256 check): the next start measures afresh."""
    if isinstance(choice, MeasuredChoice) and choice.key:
        for folder in (CACHE_DIR, FALLBACK_CACHE_DIR):
            (folder / f"{choice.key}.json").unlink(missing_ok=True)
            (folder / f"{choice.key}{MEASURED_BY_SUFFIX}").unlink(missing_ok=True)


def within_margin(declared: list[str], rates: dict[str, float]) -> str:
    """The first kind of the declared order whose rate is within MARGIN of the fastest."""
    fastest = max(rates.values())
    return next(kind for kind in declared if rates[kind] >= (1 - MARGIN) * fastest)


def _rate(folder: Path, manifest: Manifest, kind: str, threads: int, shape: tuple[int, ...], device: str,
          rebuild: str, opened: dict[str, tuple[RunOptions, Any]]) -> float:
    """kind's images/s; its backend, with its options, kept in `opened` for the core to serve if it is chosen."""
    record = manifest.artifacts[kind]
    verify_artifact(folder, record, rebuild)  # before any of its code runs
    options = RunOptions(device=device, threads=threads, precision=record.run_precision)
    backend = open_artifact(record.format, folder / record.path, options, name=kind)
    batch = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    milliseconds = time_runs(lambda: backend(batch), WARMUP_CALLS, 3, min_seconds=MEASURE_SECONDS)
    opened[kind] = (options, backend)
    return round(shape[0] * 1000 / float(statistics.median(milliseconds)), 1)


def _key(manifest: Manifest, met: list[str], machine: MachineProfile, threads: int, shape: tuple[int, ...],
         device: str) -> str:
    """Each candidate by its kind and its file's sha256: kinds that run one file in two precisions (an int8 IR with
    its remainder in f32 or bf16) share the file, not the measurement."""
    facts = [f"{kind} {manifest.artifacts[kind].sha256}" for kind in met] + sorted(machine.flags) + [
        str(threads), str(shape), device, str(os.cpu_count()), machine.name, _cpu_model(),
        *(f"{name} {_version(name)}" for name in RUNTIMES)]
    return hashlib.sha256("\n".join(facts).encode()).hexdigest()[:24]


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown CPU"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown CPU")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def _kept(path: Path) -> tuple[dict[str, float], str] | None:
    """(images/s per candidate, who measured them) as kept at path; None when nothing readable is."""
    try:
        kept = json.loads(path.read_text())
        rates = {str(kind): float(rate) for kind, rate in kept.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    by = path.with_suffix(MEASURED_BY_SUFFIX)
    return rates, by.read_text().strip() if by.is_file() else BY_A_START


def _carried(folder: Path, manifest: Manifest, key: str) -> tuple[dict[str, float], str] | None:
    """(images/s per candidate, BY_THE_ARCHIVE) when the archive carries its export's timing made under this very
    key (a machine of this kind, the same setting); None otherwise, said when the file is not the one recorded."""
    record = manifest.files.get(FORM_TIMING_NAME)
    problem = mismatch(folder / FORM_TIMING_NAME, record.sha256) if record else None
    if record is None or problem:
        if problem:
            logger.warning("%s: %s; the forms are timed here instead", folder / FORM_TIMING_NAME, problem)
        return None
    carried = json.loads((folder / FORM_TIMING_NAME).read_text())  # the export's own file: its sha256 checked
    rates = {str(kind): float(rate) for kind, rate in carried["images_per_s"].items()}
    return (rates, BY_THE_ARCHIVE) if carried["key"] == key else None


def _keep(path: Path, rates: dict[str, float], by: str) -> None:
    """The rates as a flat {kind: images/s}, the form every release of this module reads (an archive carries the
    runtime it was exported with, and its workers share this cache), and who measured them beside it."""
    atomic_write_text(path.with_suffix(MEASURED_BY_SUFFIX), by)
    atomic_write_text(path, json.dumps(rates))


@contextmanager
def _locked(key: str) -> Iterator[Path]:
    """The cache folder, held: one worker measures at a time (the others would share its cores and skew its
    figures) and the rest read what it kept."""
    folder = _cache_folder()
    with open(folder / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _cache_folder() -> Path:
    """CACHE_DIR, or the temporary folder's where the user's cache cannot be written (a read-only home)."""
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        why = "" if os.access(CACHE_DIR, os.W_OK) else "not writable"
    except OSError as error:
        why = str(error)
    if not why:
        return CACHE_DIR
    logger.warning("%s: %s; form choices are kept in %s instead", CACHE_DIR, why, FALLBACK_CACHE_DIR)
    FALLBACK_CACHE_DIR.mkdir(parents=True, exist_ok=True)
    return FALLBACK_CACHE_DIR
