"""In-process benchmark: every artifact of an export through runtime/, against this machine's measured peak.

  python -m export bench [EXPORT_DIR ...] [--batches 1,8,32] [--threads 1,all] [--repeats 5] [--out bench-results]

For each export folder: eager PyTorch (rebuilt from the manifest) and every artifact record in the
manifest (whatever formats and precisions it lists, so new variants appear by themselves), each opened
with runtime.open_artifact, at every batch size and thread count: WARMUP runs, then the median of timed
runs. Reported: ms per batch, images/s, achieved GFLOP/s (the model's FLOPs counted once on eager with
torch.utils.flop_counter) and the fraction of this machine's peak, which is measured in the same run: the
best large GEMM among the libraries installed (ONNX Runtime's MatMul, NumPy's BLAS, torch.mm) at the same
thread count, and the int8 GEMM (ONNX Runtime's MatMulInteger) for int8 artifacts. A format whose backend
cannot be opened here is skipped with its reason. With CUDA: fp16 autocast and cudnn.benchmark for eager
and TorchScript, ONNX Runtime's CUDA provider with IO binding (skipped on a machine without a GPU).
Writes bench.md, bench.json and bench.png; compare rows of one run only (the machine may be shared).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from export.atomic import atomic_write_text
from export.manifest import load_manifest
from models.errors import VisionExportError
from runtime import RunOptions, open_artifact
from runtime.eager import EagerBackend

DEFAULT_BATCHES = (1, 8, 32)
DEFAULT_THREADS = "1,all"  # 1: one worker's share under the CPU serving policy on <= 4 cores; all: every core
DEFAULT_REPEATS = 5
DEFAULT_WARMUP = 2
MIN_TIMED_S = 1.0  # small batches run more than REPEATS times, so a median is not of a few milliseconds
MAX_RUNS = 50
GEMM_SIZE = 2048  # 2 * 2048^3 = 17 GFLOP: seconds-long on 2 cores, big enough to reach the kernel's steady state
GEMM_REPEATS = 5  # the peak is the best of these (a peak is the best the machine did, not its median)
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
CHART = "bench.png"


class BenchError(VisionExportError):
    """The benchmark cannot run as asked (no export there, a bad option); the message says what to do."""


@dataclass
class Peak:
    dtype: str  # "fp32" or "int8"
    threads: int
    gflops: float  # the best library's GFLOP/s (int8: GOP/s)
    library: str
    by_library: dict = field(default_factory=dict)
    note: str = ""


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
    peak_fraction: float | None
    backend: str
    runs_ms: list = field(default_factory=list)


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
    """Which peak a row is measured against. CPU: int8 artifacts against the int8 GEMM, the rest fp32 (no
    native fp16/bf16 matrix units on the CPUs this targets). GPU: the cuBLAS GEMM of the same precision."""
    if device.startswith("cuda"):
        return "cuda-fp16" if precision in ("fp16", "bf16") else "cuda-fp32"
    return "int8" if precision == "int8" else "fp32"


def merge_peaks(first: list[Peak], second: list[Peak]) -> list[Peak]:
    """Peaks measured at the start and at the end of a run: per precision and thread count, each library's
    best (a peak is the best the machine did; a neighbour's burst of load lowers one of the two)."""
    merged: dict[tuple[str, int], Peak] = {}
    for peak in first + second:
        key = (peak.dtype, peak.threads)
        if key not in merged:
            merged[key] = Peak(peak.dtype, peak.threads, peak.gflops, peak.library, dict(peak.by_library), peak.note)
            continue
        by_library = merged[key].by_library
        for library, value in peak.by_library.items():
            by_library[library] = max(value, by_library.get(library, 0.0))
        library, best = best_of(by_library)
        merged[key] = Peak(peak.dtype, peak.threads, best, library, by_library,
                           merged[key].note + ("" if "start and end" in merged[key].note else
                                               "; best of the run's start and end"))
    return list(merged.values())


def apply_peaks(rows: list[Row], peaks: list[Peak]) -> None:
    for row in rows:
        row.peak_fraction = peak_fraction(row.gflops, find_peak(peaks, peak_dtype(row.precision, row.device),
                                                                 row.threads))


def find_peak(peaks: list[Peak], dtype: str, threads: int) -> Peak | None:
    return next((p for p in peaks if p.dtype == dtype and p.threads == threads), None)


def best_of(by_library: dict[str, float]) -> tuple[str, float]:
    library = max(by_library, key=by_library.get)
    return library, by_library[library]


def has_vnni(cpuinfo: str) -> bool:
    flags = set(re.split(r"\s+", cpuinfo))
    return any(flag in flags for flag in VNNI_FLAGS)


def best_rows(rows: list[Row], device: str = "cpu", precision: str | None = None) -> dict[int, Row]:
    """Per batch size: the fastest row (any artifact, any thread count) on that device, of one precision
    when given."""
    best: dict[int, Row] = {}
    for row in rows:
        if precision is not None and row.precision != precision:
            continue
        if row.device.startswith(device) and (row.batch not in best or row.images_per_s > best[row.batch].images_per_s):
            best[row.batch] = row
    return dict(sorted(best.items()))


# ------------------------------------------------------------------ timing
def time_runs(run: Callable[[], object], warmup: int, repeats: int, min_seconds: float = MIN_TIMED_S,
              max_runs: int = MAX_RUNS, synchronize: Callable[[], None] = lambda: None) -> list[float]:
    """ms of each timed run after `warmup` untimed ones: at least `repeats` runs and `min_seconds` in all."""
    for _ in range(warmup):
        run()
    synchronize()
    times: list[float] = []
    while len(times) < repeats or (sum(times) < min_seconds * 1000 and len(times) < max_runs):
        start = time.perf_counter()
        run()
        synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return times


def count_flops(module: torch.nn.Module, example: torch.Tensor) -> float:
    """FLOPs of one forward pass of `example` (torch's counter: 2 per multiply-add of conv/matmul)."""
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        module(example)
    return float(counter.get_total_flops())


# ------------------------------------------------------------------ the machine's peak
def _ort_gemm_session(n: int, threads: int, int8: bool):
    """A one-node ONNX model: MatMul (fp32) or MatMulInteger (uint8 x int8), B a constant like a weight."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    if int8:
        b = rng.integers(-127, 128, (n, n), dtype=np.int8)
        node = helper.make_node("MatMulInteger", ["A", "B"], ["C"])
        a_type, c_type = TensorProto.UINT8, TensorProto.INT32
    else:
        b = rng.standard_normal((n, n), dtype=np.float32)
        node = helper.make_node("MatMul", ["A", "B"], ["C"])
        a_type = c_type = TensorProto.FLOAT
    graph = helper.make_graph([node], "gemm", [helper.make_tensor_value_info("A", a_type, [n, n])],
                              [helper.make_tensor_value_info("C", c_type, [n, n])],
                              [numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), sess_options=options,
                                providers=["CPUExecutionProvider"])


def _best_gflops(run: Callable[[], object], n: int, repeats: int) -> float:
    times = time_runs(run, warmup=1, repeats=repeats, min_seconds=0)
    return gemm_flops(n) / (min(times) / 1000) / 1e9


def gemm_ort(n: int, threads: int, repeats: int, int8: bool = False) -> float:
    session = _ort_gemm_session(n, threads, int8)
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (n, n), dtype=np.uint8) if int8 else rng.standard_normal((n, n), dtype=np.float32)
    return _best_gflops(lambda: session.run(None, {"A": a}), n, repeats)


def gemm_numpy(n: int, threads: int, repeats: int) -> float:
    from threadpoolctl import threadpool_limits
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    with threadpool_limits(limits=threads, user_api="blas"):
        return _best_gflops(lambda: a @ b, n, repeats)


def gemm_torch(n: int, threads: int, repeats: int) -> float:
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(3)
    a, b = torch.randn(n, n, generator=generator), torch.randn(n, n, generator=generator)
    with torch.inference_mode():
        return _best_gflops(lambda: torch.mm(a, b), n, repeats)


def measure_peaks(thread_counts: list[int], n: int = GEMM_SIZE, repeats: int = GEMM_REPEATS,
                  say: Callable[[str], None] = print, vnni: bool = False) -> list[Peak]:
    peaks = []
    fp32 = {"onnxruntime MatMul": lambda t: gemm_ort(n, t, repeats), "numpy BLAS": lambda t: gemm_numpy(n, t, repeats),
            "torch.mm": lambda t: gemm_torch(n, t, repeats)}
    int8_note = ("VNNI" if vnni else "no VNNI on this CPU: the AVX2 u8 x s8 path (vpmaddubsw)")
    for threads in thread_counts:
        by_library = {}
        for library, measure in fp32.items():
            try:
                by_library[library] = measure(threads)
            except ImportError as error:  # a library that is not installed simply does not compete
                say(f"  peak: {library} not measured ({error})")
        library, best = best_of(by_library)
        peaks.append(Peak("fp32", threads, best, library, by_library, f"{n}x{n} GEMM, best of {repeats}"))
        int8 = gemm_ort(n, threads, repeats, int8=True)
        peaks.append(Peak("int8", threads, int8, "onnxruntime MatMulInteger", {"onnxruntime MatMulInteger": int8},
                          f"{n}x{n} uint8 x int8 -> int32 GEMM (GOP/s); {int8_note}"))
        say(f"  peak, {threads} thread(s): fp32 {best:.1f} GFLOP/s ({library}; "
            + ", ".join(f"{k} {v:.1f}" for k, v in by_library.items()) + f"), int8 {int8:.1f} GOP/s")
    return peaks


def gpu_peaks(n: int = 8192, repeats: int = GEMM_REPEATS) -> list[Peak]:
    """fp32 and fp16 torch.mm on the GPU (only called when CUDA is present)."""
    peaks = []
    for dtype, name in ((torch.float32, "fp32"), (torch.float16, "fp16")):
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        value = _best_gflops_cuda(lambda: torch.mm(a, b), n, repeats)
        peaks.append(Peak(f"cuda-{name}", 0, value, "torch.mm (cuBLAS)", {"torch.mm (cuBLAS)": value}))
    return peaks


def _best_gflops_cuda(run, n, repeats) -> float:
    times = time_runs(run, warmup=2, repeats=repeats, min_seconds=0, synchronize=torch.cuda.synchronize)
    return gemm_flops(n) / (min(times) / 1000) / 1e9


# ------------------------------------------------------------------ one export folder
@dataclass
class Target:
    """Something to time: eager or one artifact record, opened per thread count."""
    name: str
    format: str
    precision: str  # what it computes in (the manifest's `precision`)
    open: Callable[[RunOptions], object]
    run_precision: str = "fp32"  # RunOptions.precision it needs (bf16: autocast; int8 ONNX runs as-is: fp32)


def targets_for(folder: Path, manifest, module: torch.nn.Module) -> list[Target]:
    targets = [Target("eager", "eager", "fp32", lambda options: EagerBackend(module, options))]
    for kind, record in manifest.artifacts.items():
        path = folder / record["path"]
        targets.append(Target(kind, record["format"], record.get("precision", "fp32"),
                              lambda options, r=record, p=path, k=kind: open_artifact(r["format"], p, options, k),
                              record.get("run_precision", "fp32")))
    return targets


def eager_module(manifest) -> torch.nn.Module:
    from export.commands import entry_from_manifest, weights_from_manifest
    built = entry_from_manifest(manifest).build(weights_from_manifest(manifest))
    return built.module.eval().requires_grad_(False)


@dataclass
class Plan:
    batches: list[int]
    threads: list[int]
    warmup: int = DEFAULT_WARMUP
    repeats: int = DEFAULT_REPEATS
    min_seconds: float = MIN_TIMED_S


def bench_export(folder: Path, plan: Plan, peaks: list[Peak], report: Report, say: Callable[[str], None]) -> None:
    if not (folder / "manifest.json").is_file():
        raise BenchError(f"{folder} has no manifest.json: export a model there first "
                         "(python -m export resnet --out FOLDER)")
    manifest = load_manifest(folder)
    model = manifest.model["name"]
    module = eager_module(manifest)
    sample_shape = tuple(manifest.input["example_shape"])[1:]
    flops = count_flops(module, torch.rand(1, *sample_shape))
    report.flops_per_image[model] = flops
    say(f"{model}: {flops / 1e9:.2f} GFLOP per image (torch.utils.flop_counter), "
        f"{len(manifest.artifacts) + 1} targets x {len(plan.threads)} thread counts x {len(plan.batches)} batches")
    inputs = {b: torch.rand(b, *sample_shape, generator=torch.Generator().manual_seed(b)) for b in plan.batches}
    targets = targets_for(folder, manifest, module)
    total, done = len(targets) * len(plan.threads) * len(plan.batches), 0
    for threads in plan.threads:
        for target in targets:
            try:
                with warnings.catch_warnings():  # torch.jit.load's deprecation notice, once per artifact: noise here
                    warnings.simplefilter("ignore", FutureWarning)
                    backend = target.open(RunOptions(device="cpu", threads=threads, precision=target.run_precision))
            except (VisionExportError, ImportError) as error:  # recorded, shown, and the run goes on
                if threads == plan.threads[0]:
                    report.skipped.append(Skip(model, target.name, f"{type(error).__name__}: {error}"))
                    say(f"  skipped {target.name}: {error}")
                done += len(plan.batches)
                continue
            for batch in plan.batches:
                done += 1
                row = time_row(model, target, backend, threads, inputs[batch], flops, plan, peaks)
                report.rows.append(row)
                say(f"  [{done}/{total}] {progress_line(row)}")
            del backend


def time_row(model: str, target: Target, backend, threads: int, batch: torch.Tensor, flops: float, plan: Plan,
             peaks: list[Peak], device: str = "cpu", synchronize: Callable[[], None] = lambda: None) -> Row:
    runs = time_runs(lambda: backend.predict(batch), plan.warmup, plan.repeats, plan.min_seconds,
                     synchronize=synchronize)
    ms = statistics.median(runs)
    size = batch.shape[0]
    gflops = achieved_gflops(flops, size, ms / 1000)
    peak = find_peak(peaks, peak_dtype(target.precision, device), threads)
    return Row(model, target.name, target.format, target.precision, device, threads, size, ms, size / (ms / 1000),
               gflops, peak_fraction(gflops, peak), backend.describe()["backend"], [round(r, 3) for r in runs])


def progress_line(row: Row) -> str:
    fraction = f" ({row.peak_fraction:.0%} of {peak_dtype(row.precision, row.device)} peak)" if row.peak_fraction else ""
    return (f"{row.artifact:<14} {row.precision:<5} {row.device:<6} threads={row.threads:<2} batch={row.batch:<3} "
            f"{row.ms_per_batch:9.1f} ms/batch {row.images_per_s:8.1f} img/s {row.gflops:7.1f} GFLOP/s{fraction}")


# ------------------------------------------------------------------ GPU (written for CUDA hosts; skipped here)
def bench_export_gpu(folder: Path, plan: Plan, peaks: list[Peak], report: Report, say) -> None:
    """fp16 autocast + cudnn.benchmark (eager, TorchScript) and ONNX Runtime's CUDA provider with IO binding."""
    manifest = load_manifest(folder)
    model, module = manifest.model["name"], eager_module(manifest)
    sample_shape = tuple(manifest.input["example_shape"])[1:]
    flops = report.flops_per_image.get(model) or count_flops(module, torch.rand(1, *sample_shape))
    for target in targets_for(folder, manifest, module):
        for precision in (("fp32", "fp16") if target.format in ("eager", "torchscript") else ("fp32",)):
            try:
                backend = target.open(RunOptions(device="cuda:0", precision=precision))
            except (VisionExportError, ImportError) as error:
                report.skipped.append(Skip(model, f"{target.name} cuda {precision}", f"{type(error).__name__}: {error}"))
                continue
            for batch in plan.batches:
                x = torch.rand(batch, *sample_shape)
                gpu_target = Target(target.name, target.format, precision, target.open)
                if target.format == "onnx":
                    row = time_onnx_io_binding(model, gpu_target, backend, x, flops, plan, peaks)
                else:
                    row = time_row(model, gpu_target, backend, 0, x, flops, plan, peaks, "cuda:0",
                                   torch.cuda.synchronize)
                report.rows.append(row)
                say(f"  {progress_line(row)}")


def time_onnx_io_binding(model: str, target: Target, backend, batch: torch.Tensor, flops: float, plan: Plan,
                         peaks: list[Peak]) -> Row:
    """Input and output stay on the GPU (IO binding): what a GPU server that decodes on the device sees."""
    session = backend.session
    x = batch.to("cuda:0").contiguous()
    binding = session.io_binding()
    binding.bind_input(session.get_inputs()[0].name, "cuda", 0, np.float32, tuple(x.shape), x.data_ptr())
    binding.bind_output(session.get_outputs()[0].name, "cuda", 0)
    runs = time_runs(lambda: session.run_with_iobinding(binding), plan.warmup, plan.repeats, plan.min_seconds,
                     synchronize=binding.synchronize_outputs)
    ms, size = statistics.median(runs), x.shape[0]
    gflops = achieved_gflops(flops, size, ms / 1000)
    return Row(model, target.name + " (IO binding)", target.format, target.precision, "cuda:0", 0, size, ms,
               size / (ms / 1000), gflops, peak_fraction(gflops, find_peak(peaks, "cuda-fp32", 0)),
               "OnnxRuntimeBackend+CUDAExecutionProvider", [round(r, 3) for r in runs])


# ------------------------------------------------------------------ reports
def machine_info() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                 "unknown CPU")
    import onnxruntime
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"cpu": model, "cores": cores, "vnni": has_vnni(cpuinfo),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "cuda": torch.cuda.is_available(),
            "torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
            "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def _fraction(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "—"


def peaks_table(peaks: list[Peak]) -> str:
    libraries = list(dict.fromkeys(name for p in peaks for name in p.by_library))
    lines = ["| precision | threads | best GFLOP/s | best library | " + " | ".join(libraries) + " |",
             "|---|---|---|---|" + "---|" * len(libraries)]
    for p in peaks:
        cells = [f"{p.by_library[name]:.1f}" if name in p.by_library else "—" for name in libraries]
        lines.append(f"| {p.dtype} | {p.threads} | {p.gflops:.1f} | {p.library} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rows_table(rows: list[Row]) -> str:
    lines = ["| model | artifact | format | precision | device | threads | batch | ms / batch | images/s | GFLOP/s | "
             "of peak |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.model} | {r.artifact} | {r.format} | {r.precision} | {r.device} | {r.threads} | {r.batch} | "
              f"{r.ms_per_batch:.1f} | {r.images_per_s:.1f} | {r.gflops:.1f} | {_fraction(r.peak_fraction)} |"
              for r in rows]
    return "\n".join(lines)


def best_table(rows: list[Row]) -> str:
    lines = ["| batch | best | threads | images/s | of peak |", "|---|---|---|---|---|"]
    for batch, row in best_rows(rows).items():
        lines.append(f"| {batch} | {row.artifact} ({row.format}, {row.precision}) | {row.threads} | "
                     f"{row.images_per_s:.1f} | {_fraction(row.peak_fraction)} |")
    return "\n".join(lines)


def render_markdown(report: Report) -> str:
    m = report.machine
    flops = ", ".join(f"{model} {value / 1e9:.2f} GFLOP" for model, value in report.flops_per_image.items())
    skipped = "\n".join(f"- {s.model} {s.artifact}: {s.reason}" for s in report.skipped) or "- none"
    load = m.get("load_average_at_start")
    return (f"# In-process benchmark\n\n{m['cpu']}, {m['cores']} cores, CPU capability {m['torch_cpu_capability']}, "
            f"VNNI: {'yes' if m['vnni'] else 'no'}; torch {m['torch']}, onnxruntime {m['onnxruntime']}, "
            f"numpy {m['numpy']}. Load average at start: {', '.join(f'{x:.2f}' for x in load) if load else 'n/a'}.\n"
            f"Per image: {flops} (torch.utils.flop_counter, 2 FLOPs per multiply-add). Median of "
            f">= {report.settings.get('repeats')} timed runs (and >= {report.settings.get('min_seconds')} s) after "
            f"{report.settings.get('warmup')} warm-up runs.\n\n"
            f"## This machine's peak (measured in this run)\n\n{peaks_table(report.peaks)}\n\n"
            f"## Best per batch\n\n{best_table(report.rows)}\n\n## Every artifact\n\n{rows_table(report.rows)}\n\n"
            f"## Skipped\n\n{skipped}\n")


def chart(report: Report, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cpu_rows = [r for r in report.rows if r.device == "cpu"]
    thread_counts = list(dict.fromkeys(r.threads for r in cpu_rows)) or [0]
    figure, axes = plt.subplots(1, len(thread_counts), figsize=(6 * len(thread_counts), 4.2), squeeze=False,
                                sharey=True)
    for axis, threads in zip(axes[0], thread_counts):
        mine = [r for r in cpu_rows if r.threads == threads]
        names = list(dict.fromkeys(f"{r.model}\n{r.artifact}" if len(report.flops_per_image) > 1 else r.artifact
                                   for r in mine))
        batches = list(dict.fromkeys(r.batch for r in mine))
        width = 0.8 / max(1, len(batches))
        for i, batch in enumerate(batches):
            values = {(f"{r.model}\n{r.artifact}" if len(report.flops_per_image) > 1 else r.artifact): r.images_per_s
                      for r in mine if r.batch == batch}
            axis.bar([x + i * width for x in range(len(names))], [values.get(n, 0) for n in names], width,
                     label=f"batch {batch}")
        axis.set_xticks([x + width * (len(batches) - 1) / 2 for x in range(len(names))], names, rotation=30,
                        ha="right", fontsize=8)
        axis.set_title(f"{threads} thread(s)")
        axis.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("images / second")
    axes[0][0].legend(fontsize=8)
    figure.suptitle("In-process throughput by artifact and batch (CPU, one run)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_outputs(report: Report, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "bench.md", render_markdown(report))
    atomic_write_text(out / "bench.json", json.dumps(asdict(report), indent=2))
    chart(report, out / CHART)
    return [out / "bench.md", out / "bench.json", out / CHART]


def load_report(path: Path) -> Report:
    """A bench.json written by this module (the serving benchmark compares against it)."""
    try:
        data = json.loads(Path(path).read_text())
        return Report(machine=data["machine"], peaks=[Peak(**p) for p in data["peaks"]],
                      flops_per_image=data["flops_per_image"], rows=[Row(**r) for r in data["rows"]],
                      skipped=[Skip(**s) for s in data["skipped"]], settings=data.get("settings", {}))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise BenchError(f"{path} is not a bench.json from `python -m export bench` ({error}); run it again") from None


# ------------------------------------------------------------------ entry point
def run(folders: list[Path], plan: Plan, gemm_size: int = GEMM_SIZE, say: Callable[[str], None] = print) -> Report:
    report = Report(machine=machine_info(), settings={**asdict(plan), "gemm_size": gemm_size})
    say(f"machine: {report.machine['cpu']}, {report.machine['cores']} cores, VNNI "
        f"{'yes' if report.machine['vnni'] else 'no'}; load average {report.machine['load_average_at_start']}")
    say("measuring this machine's GEMM peak ...")
    report.peaks = measure_peaks(plan.threads, gemm_size, say=say, vnni=report.machine["vnni"])
    for folder in folders:
        bench_export(Path(folder), plan, report.peaks, report, say)
    say("measuring this machine's GEMM peak again (the run's peak is the best of start and end) ...")
    report.peaks = merge_peaks(report.peaks, measure_peaks(plan.threads, gemm_size, say=say,
                                                           vnni=report.machine["vnni"]))
    apply_peaks(report.rows, report.peaks)
    if torch.cuda.is_available():
        report.peaks += gpu_peaks()
        for folder in folders:
            bench_export_gpu(Path(folder), plan, report.peaks, report, say)
    else:
        report.skipped.append(Skip("*", "GPU variants", "no CUDA device here: fp16 autocast, cudnn.benchmark and "
                                                        "ONNX Runtime's CUDA provider with IO binding not run"))
    return report


def bench_command(args) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if args.repeats < 1 or args.warmup < 0 or args.gemm_size < 64:
        raise BenchError("--repeats must be >= 1, --warmup >= 0 and --gemm-size >= 64")
    plan = Plan(parse_batches(args.batches), parse_threads(args.threads, cores), args.warmup, args.repeats,
                args.min_seconds)
    folders = args.folders or [Path("artifacts/resnet50")]
    for folder in folders:
        if not (Path(folder) / "manifest.json").is_file():
            raise BenchError(f"{folder} has no manifest.json: export a model there first "
                             "(python -m export resnet --out FOLDER)")
    report = run(folders, plan, args.gemm_size, say=lambda line: print(line, flush=True))
    written = write_outputs(report, args.out)
    print("\n" + best_table(report.rows) + "\n\n" + peaks_table(report.peaks))
    print("\nwrote " + ", ".join(str(p) for p in written))
    return 0
