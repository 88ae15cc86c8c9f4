"""In-process benchmark: every artifact of an export through runtime/, against this machine's measured peak.

  python -m measure inprocess [EXPORT_DIR ...] [--batches 1,8,32] [--threads 1,all] [--repeats 5] [--out bench-results]

For each export folder: eager PyTorch (rebuilt from the manifest) and every artifact record in the
manifest (whatever formats and precisions it lists, so new variants appear by themselves), each opened
with runtime.open_artifact, at every batch size and thread count: WARMUP runs, then the median of timed
runs. Reported: ms per batch, images/s, achieved GFLOP/s (the model's FLOPs counted once on eager with
torch.utils.flop_counter) and the fraction of this machine's peak of the row's own precision, measured in the
same run at the same thread count (measure/inprocess/peak.py): fp32 rows against the best large fp32 GEMM among
the libraries installed (ONNX Runtime's MatMul, NumPy's BLAS, torch.mm), bf16 rows against the bf16 GEMM
(torch.mm in bfloat16 through oneDNN, OpenVINO's MatMul), int8 rows against the int8 GEMM (ONNX Runtime's
MatMulInteger, torch._int_mm); a row whose precision has no measured peak says so. A format whose backend
cannot be opened here is skipped with its reason. With CUDA: fp16 autocast and cudnn.benchmark for eager
and TorchScript, ONNX Runtime's CUDA provider with IO binding (skipped on a machine without a GPU).
Writes bench.md, bench.json and bench.png; compare rows of one run only (the machine may be shared).
"""

from __future__ import annotations

import os
import statistics
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from contract.errors import VisionExportError
from contract.records import CLASSIFICATION, DETECTION, MANIFEST_NAME, Manifest
from export.package.rebuild import entry_from_manifest, weights_from_manifest

# Re-exported: the CLI's defaults, and what serving's benchmark and the tests use as `measure.inprocess.bench`.
from measure.inprocess.peak import GEMM_SIZE, gpu_peaks, measure_peaks
from measure.inprocess.records import (  # noqa: F401
    BenchError,
    Peak,
    Report,
    Row,
    Skip,
    achieved_gflops,
    apply_peaks,
    best_rows,
    find_peak,
    held_to,
    hold_to_peak,
    merge_peaks,
    parse_batches,
    parse_threads,
    peak_dtype,
    peak_fraction,
)
from measure.inprocess.report import (  # noqa: F401
    best_table,
    load_report,
    machine_info,
    peak_notes,
    peaks_table,
    render_markdown,
    write_outputs,
)
from runtime import RunOptions, open_artifact
from runtime.eager import EagerBackend
from runtime.timing import MIN_TIMED_S, time_runs

DEFAULT_BATCHES = (1, 8, 32)
DEFAULT_THREADS = "1,all"  # 1: one worker's share under the CPU serving policy on <= 4 cores; all: every core
DEFAULT_REPEATS = 5
DEFAULT_WARMUP = 2


# ------------------------------------------------------------------ timing
def count_flops(module: torch.nn.Module, example: torch.Tensor) -> float:
    """FLOPs of one forward pass of `example` (torch's counter: 2 per multiply-add of conv/matmul)."""
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        module(example)
    return float(counter.get_total_flops())


# ------------------------------------------------------------------ one export folder
@dataclass
class Target:
    """Something to time: eager or one artifact record, opened per thread count."""
    name: str
    format: str
    precision: str  # what it computes in (the manifest's `precision`)
    open: Callable[[RunOptions], object]
    run_precision: str = "fp32"  # RunOptions.precision it needs (bf16: autocast; int8 ONNX runs as-is: fp32)
    batches: tuple[int, ...] = ()  # the batch sizes it takes (empty: the export's, batches_for)


class ImagesInOneCall(torch.nn.Module):
    """A torchvision detector given N same-size images in one call (its transform pads them into one tensor):
    the most that batching requests could buy, which the exported one-image graphs cannot take."""

    def __init__(self, detector: torch.nn.Module):
        super().__init__()
        self.detector = detector

    def forward(self, batch: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(found["scores"] for found in self.detector(list(batch)))


LIST_BATCH_CAP = 8  # images per call of ImagesInOneCall: enough to show whether batching pays, short enough to run


def targets_for(folder: Path, manifest: Manifest, module: torch.nn.Module,
                batches: tuple[int, ...] = ()) -> list[Target]:
    """Eager, every artifact of the manifest, and for a torchvision detector (with `batches`) eager with several
    images in one call."""
    targets = [Target("eager", "eager", "fp32", lambda options: EagerBackend(module, options))]
    listed = tuple(b for b in batches if b <= LIST_BATCH_CAP)
    if manifest.task == DETECTION and hasattr(module, "model") and len(listed) > 1:
        targets.append(Target("eager-list", "eager", "fp32", listed_backend(module.model), batches=listed))
    for kind, record in manifest.artifacts.items():
        path = folder / record.path
        targets.append(Target(kind, record.format, record.precision,
                              lambda options, r=record, p=path, k=kind: open_artifact(r.format, p, options, k),
                              record.run_precision))
    return targets


def listed_backend(detector: torch.nn.Module) -> Callable[[RunOptions], object]:
    return lambda options: EagerBackend(ImagesInOneCall(detector), options, name="eager-list")


def eager_module(manifest: Manifest) -> torch.nn.Module:
    built = entry_from_manifest(manifest).build(weights_from_manifest(manifest))
    return built.module.eval().requires_grad_(False)


@dataclass
class Plan:
    batches: list[int]
    threads: list[int]
    warmup: int = DEFAULT_WARMUP
    repeats: int = DEFAULT_REPEATS
    min_seconds: float = MIN_TIMED_S
    rounds: int = 1  # > 1: the targets take turns, each round timing every one (medians over all rounds)


def bench_export(folder: Path, plan: Plan, peaks: list[Peak], report: Report, say: Callable[[str], None]) -> None:
    if not (folder / MANIFEST_NAME).is_file():
        raise BenchError(f"{folder} has no manifest.json: export a model there first "
                         "(python -m export resnet --out FOLDER)")
    manifest = Manifest.read(folder)
    model = manifest.model.name
    module = eager_module(manifest)
    sample_shape = manifest.input.example_shape[1:]
    flops = count_flops(module, torch.rand(1, *sample_shape))
    report.flops_per_image[model] = flops
    batches = batches_for(manifest, plan.batches, say)
    targets = targets_for(folder, manifest, module, tuple(plan.batches))
    say(f"{model}: {flops / 1e9:.2f} GFLOP per image (torch.utils.flop_counter), "
        f"{len(targets)} targets x {len(plan.threads)} thread counts x {len(batches)} batches")
    inputs = {b: torch.rand(b, *sample_shape, generator=torch.Generator().manual_seed(b))
              for b in {*batches, *(b for t in targets for b in t.batches)}}
    total, done = sum(len(t.batches or batches) for t in targets) * len(plan.threads), 0
    for threads in plan.threads:
        opened = open_targets(model, targets, threads, report, say, first=threads == plan.threads[0])
        runs: dict[tuple[str, int], list[float]] = {}
        for round_index in range(plan.rounds):  # every target once per round: a neighbour's load hits them alike
            last = round_index == plan.rounds - 1
            for target, backend in opened:
                for batch in target.batches or batches:
                    timed = runs.setdefault((target.name, batch), [])
                    timed.extend(time_runs(lambda b=backend, x=inputs[batch]: b.predict(x),
                                           plan.warmup if round_index == 0 else 0, plan.repeats, plan.min_seconds))
                    if last:  # the row and its progress line as soon as its last round is timed
                        row = time_row(model, target, backend, threads, inputs[batch], flops, plan, peaks, runs=timed)
                        report.rows.append(row)
                        done += 1
                        say(f"  [{done}/{total}] {progress_line(row)}")
        done += sum(len(t.batches or batches) for t in targets) - sum(len(t.batches or batches) for t, _ in opened)
        del opened


def batches_for(manifest: Manifest, batches: list[int], say: Callable[[str], None]) -> list[int]:
    """The batch sizes a model's forms take: a detector's or segmenter's graphs take one image of any size (their
    outputs are per image), so batch 1 alone, said once."""
    if manifest.task == CLASSIFICATION or batches == [1]:
        return batches
    say(f"{manifest.model.name}: a {manifest.task} model's forms take one image at a time: batch 1 only "
        f"(not {', '.join(str(b) for b in batches if b != 1)})"
        + ("; eager-list times torchvision's own list of same-size images per call, what batching could buy"
           if manifest.task == DETECTION else ""))
    return [1]


def open_targets(model: str, targets: list[Target], threads: int, report: Report, say, first: bool) -> list:
    """(target, backend) for each target that opens here; one that does not is recorded and shown once."""
    opened = []
    for target in targets:
        try:
            with warnings.catch_warnings():  # torch.jit.load's deprecation notice, once per artifact: noise here
                warnings.simplefilter("ignore", FutureWarning)
                opened.append((target, target.open(RunOptions(device="cpu", threads=threads,
                                                              precision=target.run_precision))))
        except (VisionExportError, ImportError) as error:  # recorded, shown, and the run goes on
            if first:
                report.skipped.append(Skip(model, target.name, f"{type(error).__name__}: {error}"))
                say(f"  skipped {target.name}: {error}")
    return opened


def time_row(model: str, target: Target, backend, threads: int, batch: torch.Tensor, flops: float, plan: Plan,
             peaks: list[Peak], device: str = "cpu", synchronize: Callable[[], None] = lambda: None,
             runs: list[float] | None = None) -> Row:
    """The median of `runs` (timed here when not given)."""
    if runs is None:
        runs = time_runs(lambda: backend.predict(batch), plan.warmup, plan.repeats, plan.min_seconds,
                         synchronize=synchronize)
    ms = statistics.median(runs)
    size = batch.shape[0]
    gflops = achieved_gflops(flops, size, ms / 1000)
    return hold_to_peak(Row(model, target.name, target.format, target.precision, device, threads, size, ms,
                            size / (ms / 1000), gflops, None, backend.describe()["backend"],
                            [round(r, 3) for r in runs]), peaks)


def progress_line(row: Row) -> str:
    fraction = f" ({held_to(row)}{' peak' if row.peak_fraction is not None else ''})" if row.peak else ""
    return (f"{row.artifact:<14} {row.precision:<5} {row.device:<6} threads={row.threads:<2} batch={row.batch:<3} "
            f"{row.ms_per_batch:9.1f} ms/batch {row.images_per_s:8.1f} img/s {row.gflops:7.1f} GFLOP/s{fraction}")


# ------------------------------------------------------------------ GPU (written for CUDA hosts; skipped here)
def bench_export_gpu(folder: Path, plan: Plan, peaks: list[Peak], report: Report, say) -> None:
    """fp16 autocast + cudnn.benchmark (eager, TorchScript) and ONNX Runtime's CUDA provider with IO binding."""
    manifest = Manifest.read(folder)
    model, module = manifest.model.name, eager_module(manifest)
    sample_shape = manifest.input.example_shape[1:]
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
    return hold_to_peak(Row(model, target.name + " (IO binding)", target.format, target.precision, "cuda:0", 0, size,
                            ms, size / (ms / 1000), gflops, None, "OnnxRuntimeBackend+CUDAExecutionProvider",
                            [round(r, 3) for r in runs]), peaks)


# ------------------------------------------------------------------ entry point
def run(folders: list[Path], plan: Plan, gemm_size: int = GEMM_SIZE, say: Callable[[str], None] = print) -> Report:
    report = Report(machine=machine_info(), settings={**asdict(plan), "gemm_size": gemm_size})
    say(f"machine: {report.machine['cpu']}, {report.machine['cores']} cores; {report.machine['isa'] or 'no AVX2'}; "
        f"load average {report.machine['load_average_at_start']}")
    say("measuring this machine's GEMM peaks (fp32, bf16, int8) ...")
    report.peaks = measure_peaks(plan.threads, gemm_size, say=say)
    for folder in folders:
        bench_export(Path(folder), plan, report.peaks, report, say)
    say("measuring this machine's GEMM peaks again (the run's peak is the best of start and end) ...")
    report.peaks = merge_peaks(report.peaks, measure_peaks(plan.threads, gemm_size, say=say))
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
    if args.repeats < 1 or args.warmup < 0 or args.gemm_size < 64 or args.rounds < 1:
        raise BenchError("--repeats and --rounds must be >= 1, --warmup >= 0 and --gemm-size >= 64")
    plan = Plan(parse_batches(args.batches), parse_threads(args.threads, cores), args.warmup, args.repeats,
                args.min_seconds, args.rounds)
    folders = args.folders or [Path("artifacts/resnet50")]
    for folder in folders:
        if not (Path(folder) / MANIFEST_NAME).is_file():
            raise BenchError(f"{folder} has no manifest.json: export a model there first "
                             "(python -m export resnet --out FOLDER)")
    report = run(folders, plan, args.gemm_size, say=lambda line: print(line, flush=True))
    written = write_outputs(report, args.out)
    print("\n" + best_table(report.rows) + "\n\n" + peaks_table(report.peaks) + "\n\n" + peak_notes(report.peaks))
    print("\nwrote " + ", ".join(str(p) for p in written))
    return 0
