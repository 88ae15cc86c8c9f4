"""What the KServe and Triton writers share: reading an export, the measured per-replica numbers, and an
output folder that appears whole or not at all."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from handlers.policy import GPU_BATCH_SIZE
from models.errors import VisionExportError

BENCH_RESULTS = Path("bench-results") / "results.json"  # written by `python -m serving.bench`
BENCH_CONFIGURATION = "default"  # the policy `python -m serving` decides: what a replica runs
BATCHED_CONFIGURATION = "batched"  # one worker, batches of 8 within 50 ms, on the same CPU

# Measured in this project, used when no bench-results/results.json is at hand (resnet50, random weights,
# ONNX Runtime, the default policy of 2 workers x 1 thread on this 2-core machine):
# - README: about 16 req/s at concurrency 8 (the soak: 12-16 req/s at 16) on a quiet machine;
# - `python -m serving.bench --configurations default,batched --concurrency 1,2,4,8 --duration 15
#   --inprocess none` (machine shared with other jobs, so 4.3 req/s at best): throughput flat from
#   concurrency 2 on (3.9, 4.3, 4.1, 4.0 req/s at 1, 2, 4, 8) -- two requests fill the two workers; the
#   batched configuration (batches of up to 8 within 50 ms) reached 3.1 req/s, x0.73 of the default.
MEASURED_REPLICA_RPS = 16.0
MEASURED_BUSY_CONCURRENCY = 2
MEASURED_SERVICE_MS = 125.0  # Little's law on the README figure: 2 requests in flight / 16 req/s
MEASURED_BATCHING_GAIN = 0.73  # batched / default, best req/s each: batching costs a CPU throughput
MEASURED_SOURCE = ("figures measured in this project (serving/deploy_common.py MEASURED_*): resnet50, "
                   "2 CPU cores, `python -m serving.bench`")

SATURATION = 0.9  # a replica is busy from the concurrency that reaches 90 % of its best throughput
BATCHING_WORTH_IT = 1.1  # batching must add 10 % throughput to be worth a queue delay
GPU_TARGET_CONCURRENCY = 2 * GPU_BATCH_SIZE  # not measured (no GPU here): one batch running, one gathering
CPU_REPLICA_CORES = 2  # a CPU replica asks for the cores the measurements were taken on


class DeployError(VisionExportError):
    """Deployment material cannot be written as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Measurements:
    """One replica's behaviour under load, and where the figures come from (written into every YAML)."""
    replica_rps: float  # best requests/s of one replica
    busy_concurrency: int  # the smallest concurrency reaching SATURATION of that
    service_ms: float  # p50 at the lowest measured concurrency: one request's time through a replica
    batching_gain: float  # best req/s batched / not batched on the same CPU
    source: str


MEASURED = Measurements(MEASURED_REPLICA_RPS, MEASURED_BUSY_CONCURRENCY, MEASURED_SERVICE_MS,
                        MEASURED_BATCHING_GAIN, MEASURED_SOURCE)


def measurements(results: Path | None = None) -> Measurements:
    """From the serving benchmark's rows (`results`, else bench-results/results.json when it has run here),
    else the figures measured in this project."""
    if results is not None and not Path(results).is_file():
        raise DeployError(f"{results} not found: run `python -m serving.bench --out {Path(results).parent}`, "
                          "or leave out --bench-results")
    results = BENCH_RESULTS if results is None else Path(results)
    if not results.is_file():
        return MEASURED
    try:
        rows = json.loads(Path(results).read_text())
    except ValueError as error:
        raise DeployError(f"{results} is not JSON ({error}): re-run `python -m serving.bench` or remove it") from None
    measured = [r for r in rows if isinstance(r, dict) and r.get("configuration") == BENCH_CONFIGURATION
                and r.get("req_per_s")] if isinstance(rows, list) else []
    if not measured:
        raise DeployError(f"{results} has no rows of configuration {BENCH_CONFIGURATION!r}: run `python -m "
                          f"serving.bench --configurations {BENCH_CONFIGURATION},{BATCHED_CONFIGURATION}`")
    best = max(r["req_per_s"] for r in measured)
    busy = min(r["concurrency"] for r in measured if r["req_per_s"] >= SATURATION * best)
    lowest = min(measured, key=lambda r: r["concurrency"])
    service_ms = lowest.get("p50_ms") or 1000.0 * lowest["concurrency"] / lowest["req_per_s"]  # Little's law
    batched = [r["req_per_s"] for r in rows if r.get("configuration") == BATCHED_CONFIGURATION and r.get("req_per_s")]
    gain = max(batched) / best if batched else MEASURED_BATCHING_GAIN
    return Measurements(best, busy, float(service_ms), gain, f"{results} (configuration {BENCH_CONFIGURATION!r}"
                        + (f", batching gain from {BATCHED_CONFIGURATION!r})" if batched else
                           "; batching gain: the figure measured in this project)"))


def scale_target(device: str, numbers: Measurements) -> int:
    """Knative's concurrency target per replica: add a replica once each one holds what saturates it."""
    return GPU_TARGET_CONCURRENCY if device == "gpu" else numbers.busy_concurrency


MANIFEST_KEYS = ("model", "input", "output", "artifacts")


def read_manifest(export_dir: Path) -> dict:
    path = Path(export_dir) / "manifest.json"
    if not path.is_file():
        raise DeployError(f"{path} not found: run `python -m export resnet` first, or pass --export-dir")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as error:
        raise DeployError(f"{path} is not JSON ({error}): re-run `python -m export resnet`") from None
    missing = [k for k in MANIFEST_KEYS if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise DeployError(f"{path} has no {', '.join(missing)}: it is not an export manifest; "
                          "re-run `python -m export resnet`")
    return manifest


def check_out(out: Path, force: bool) -> None:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DeployError(f"{out} is a file, not a folder: choose another OUT")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise DeployError(f"{out} exists and is not empty: choose another OUT, or pass --force to replace it")


@contextlib.contextmanager
def staged_output(out: Path, force: bool):
    """Yield a hidden sibling folder to write into; on success it replaces OUT whole (a reader sees the old
    folder or the new one, never half of either), on failure it is removed and OUT is untouched."""
    out = Path(out)
    check_out(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        yield staging
        if out.exists():
            retired = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(retired)
            staging.rename(out)
            shutil.rmtree(retired)
        else:
            staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)  # our own scratch; the original error propagates


def link_or_copy(source: Path, target: Path) -> None:
    """Several folders hold the same large file: a hard link where the file system allows it."""
    try:
        target.hardlink_to(source)
    except OSError:
        shutil.copy2(source, target)


def dump_yaml(documents: list[dict], header: str) -> str:
    import yaml
    return header + "".join(("---\n" if i else "") + yaml.safe_dump(d, sort_keys=False)
                            for i, d in enumerate(documents))
