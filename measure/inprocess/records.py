"""The in-process benchmark's records (peaks, rows, skips, the report) and the arithmetic on them: pure, no timing."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from contract.errors import VisionExportError
from runtime import machine


class BenchError(VisionExportError):
    """The benchmark cannot run as asked (no export there, a bad option); the message says what to do."""


@dataclass
class Peak:
    dtype: str  # the precision: "fp32", "bf16" or "int8" on the CPU; "cuda-fp32", "cuda-fp16", "cuda-bf16"
    threads: int
    gflops: float  # the best library's GFLOP/s (int8: GOP/s)
    library: str
    by_library: dict = field(default_factory=dict)
    note: str = ""
    kernels: dict = field(default_factory=dict)  # library -> the kernel it said it ran ("" where it does not say)


@dataclass
class Row:
    model: str
    artifact: str  # "eager" or the manifest's artifact kind
    format: str
    precision: str
    device: str
    threads: int
    batch: int
    ms_per_batch: float  # median of the timed runs
    images_per_s: float
    gflops: float
    peak_fraction: float | None  # of `peak`'s figure; None where that peak was not measured
    backend: str
    runs_ms: list = field(default_factory=list)
    peak: str = ""  # the peak the row is held to: its own precision's (peak_dtype), e.g. "bf16" or "cuda-fp16"
    peak_gflops: float | None = None  # that peak's figure at the row's thread count; None: not measured


@dataclass
class Skip:
    model: str
    artifact: str
    reason: str


@dataclass
class Report:
    machine: dict
    peaks: list = field(default_factory=list)
    flops_per_image: dict = field(default_factory=dict)  # model -> FLOPs of one image (2 per multiply-add)
    rows: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    settings: dict = field(default_factory=dict)


# ------------------------------------------------------------------ pure arithmetic and parsing
def parse_batches(text: str) -> list[int]:
    try:
        batches = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BenchError(f"--batches {text!r}: give positive integers separated by commas, e.g. 1,8,32") from None
    if not batches or min(batches) < 1:
        raise BenchError(f"--batches {text!r}: give positive integers separated by commas, e.g. 1,8,32")
    return batches


def parse_threads(text: str, cores: int) -> list[int]:
    """'1,all' -> [1, cores] (duplicates dropped, order kept)."""
    counts = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "all":
            counts.append(cores)
        elif part.isdigit() and int(part) >= 1:
            counts.append(int(part))
        else:
            raise BenchError(f"--threads {text!r}: give thread counts or 'all' separated by commas, e.g. 1,all")
    if not counts:
        raise BenchError("--threads is empty: give thread counts or 'all', e.g. 1,all")
    return list(dict.fromkeys(counts))


def gemm_flops(n: int) -> float:
    """A square n x n GEMM: n^3 multiply-adds, counted as 2 operations each (as flop_counter does)."""
    return 2.0 * n ** 3


def achieved_gflops(flops_per_image: float, batch: int, seconds: float) -> float:
    return flops_per_image * batch / seconds / 1e9


def peak_fraction(gflops: float, peak: Peak | None) -> float | None:
    return gflops / peak.gflops if peak and peak.gflops > 0 else None


def peak_dtype(precision: str, device: str = "cpu") -> str:
    """Which peak a row is held to: the GEMM of its own precision on its own device (CPU: fp32, bf16, int8;
    GPU: cuBLAS's "cuda-fp32", "cuda-fp16", "cuda-bf16"). A precision whose peak was not measured (fp16 on the
    CPU, int8 on a GPU) names a peak that is absent, and the row says so instead of borrowing another's."""
    return f"cuda-{precision}" if device.startswith("cuda") else precision


def merge_peaks(first: list[Peak], second: list[Peak]) -> list[Peak]:
    """Peaks measured at the start and at the end of a run: per precision and thread count, each library's
    best (a peak is the best the machine did; a neighbour's burst of load lowers one of the two)."""
    merged: dict[tuple[str, int], Peak] = {}
    for peak in first + second:
        key = (peak.dtype, peak.threads)
        if key not in merged:
            merged[key] = Peak(peak.dtype, peak.threads, peak.gflops, peak.library, dict(peak.by_library), peak.note,
                               dict(peak.kernels))
            continue
        by_library, kernels = merged[key].by_library, merged[key].kernels
        for library, value in peak.by_library.items():
            by_library[library] = max(value, by_library.get(library, 0.0))
        for library, kernel in peak.kernels.items():
            kernels[library] = kernels.get(library) or kernel
        library, best = best_of(by_library)
        merged[key] = Peak(peak.dtype, peak.threads, best, library, by_library,
                           merged[key].note + ("" if "start and end" in merged[key].note else
                                               "; best of the run's start and end"), kernels)
    return list(merged.values())


def hold_to_peak(row: Row, peaks: list[Peak]) -> Row:
    """The row's fraction of the peak of its own precision, thread count and device, and which peak that was."""
    row.peak = peak_dtype(row.precision, row.device)
    peak = find_peak(peaks, row.peak, row.threads)
    row.peak_gflops = peak.gflops if peak else None
    row.peak_fraction = peak_fraction(row.gflops, peak)
    return row


def apply_peaks(rows: list[Row], peaks: list[Peak]) -> None:
    for row in rows:
        hold_to_peak(row, peaks)


def held_to(row: Row) -> str:
    """'80% of bf16' / 'no int8 peak' (a row of an older bench.json, which did not record its peak: the fraction)."""
    if not row.peak:
        return f"{row.peak_fraction:.0%}" if row.peak_fraction is not None else "—"
    if row.peak_fraction is None:
        return f"no {row.peak} peak"
    return f"{row.peak_fraction:.0%} of {row.peak}"


def find_peak(peaks: list[Peak], dtype: str, threads: int) -> Peak | None:
    return next((p for p in peaks if p.dtype == dtype and p.threads == threads), None)


def best_of(by_library: dict[str, float]) -> tuple[str, float]:
    library = max(by_library, key=by_library.get)
    return library, by_library[library]


def has_vnni(cpuinfo: str) -> bool:
    return machine.has_vnni(set(re.split(r"\s+", cpuinfo)))


def best_rows(rows: list[Row], device: str = "cpu", precision: str | None = None,
              artifact: str | None = None) -> dict[int, Row]:
    """Per batch size: the fastest row (any thread count) on that device, of one precision and one artifact
    kind when given."""
    best: dict[int, Row] = {}
    for row in rows:
        if precision is not None and row.precision != precision:
            continue
        if artifact is not None and row.artifact != artifact:
            continue
        if row.device.startswith(device) and (row.batch not in best or row.images_per_s > best[row.batch].images_per_s):
            best[row.batch] = row
    return dict(sorted(best.items()))


