"""The in-process benchmark's outputs: bench.md (tables), bench.json (every row) and bench.png (the chart)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from contract.files import atomic_write_text
from measure.inprocess.records import BenchError, Peak, Report, Row, Skip, best_rows, has_vnni, held_to
from runtime import machine

# The CPU flags the peaks depend on, shown in the report: AVX2/AVX-512, VNNI (int8), BF16 and AMX.
ISA_FLAG = re.compile(r"^(avx2|avx512.*|avx_vnni|amx.*)$")

CHART = "bench.png"


# ------------------------------------------------------------------ reports
def machine_info() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                 "unknown CPU")
    import onnxruntime
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    flags = machine.cpu_flags()
    return {"cpu": model, "cores": cores, "vnni": has_vnni(cpuinfo),
            "isa": " ".join(sorted(flag for flag in flags if ISA_FLAG.match(flag))),
            "bf16_native": any(flag in flags for flag in machine.BF16_FLAGS),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "cuda": torch.cuda.is_available(),
            "torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
            "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def peaks_table(peaks: list[Peak]) -> str:
    """One row per precision and thread count: the best figure, its library and the kernel that library said it
    ran, and every library's figure."""
    libraries = list(dict.fromkeys(name for p in peaks for name in p.by_library))
    lines = ["| precision | threads | best GFLOP/s (int8: GOP/s) | best library | its kernel | " + " | ".join(libraries)
             + " |", "|---|---|---|---|---|" + "---|" * len(libraries)]
    for p in peaks:
        cells = [f"{p.by_library[name]:.1f}" if name in p.by_library else "—" for name in libraries]
        kernel = (p.kernels.get(p.library) or "not reported").split(" (isa:")[0]  # the ISA line: in the notes
        lines.append(f"| {p.dtype} | {p.threads} | {p.gflops:.1f} | {p.library} | {kernel} | " + " | ".join(cells)
                     + " |")
    return "\n".join(lines)


def peak_notes(peaks: list[Peak]) -> str:
    """What each precision's peak is (size, native or emulated, the flags its kernel is chosen by) and every
    library's kernel, once per precision."""
    lines = []
    for dtype in dict.fromkeys(p.dtype for p in peaks):
        mine = [p for p in peaks if p.dtype == dtype]
        kernels = {library: kernel for p in mine for library, kernel in p.kernels.items() if kernel}
        said = "; ".join(f"{library}: {kernel}" for library, kernel in kernels.items())
        lines.append(f"- {dtype}: {mine[0].note}" + (f". Kernels: {said}" if said else ""))
    return "\n".join(lines)


def rows_table(rows: list[Row]) -> str:
    lines = ["| model | artifact | format | precision | device | threads | batch | ms / batch | images/s | GFLOP/s | "
             "of peak |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.model} | {r.artifact} | {r.format} | {r.precision} | {r.device} | {r.threads} | {r.batch} | "
              f"{r.ms_per_batch:.1f} | {r.images_per_s:.1f} | {r.gflops:.1f} | {held_to(r)} |"
              for r in rows]
    return "\n".join(lines)


def best_table(rows: list[Row]) -> str:
    lines = ["| batch | best | threads | images/s | of peak |", "|---|---|---|---|---|"]
    for batch, row in best_rows(rows).items():
        lines.append(f"| {batch} | {row.artifact} ({row.format}, {row.precision}) | {row.threads} | "
                     f"{row.images_per_s:.1f} | {held_to(row)} |")
    return "\n".join(lines)


def render_markdown(report: Report) -> str:
    m = report.machine
    flops = ", ".join(f"{model} {value / 1e9:.2f} GFLOP" for model, value in report.flops_per_image.items())
    skipped = "\n".join(f"- {s.model} {s.artifact}: {s.reason}" for s in report.skipped) or "- none"
    load = m.get("load_average_at_start")
    bf16 = {True: "native", False: "emulated (no avx512_bf16 or amx_bf16)"}.get(m.get("bf16_native"), "n/a")
    return (f"# In-process benchmark\n\n{m['cpu']}, {m['cores']} cores, CPU capability {m['torch_cpu_capability']}, "
            f"ISA flags: {m.get('isa') or 'n/a'}; VNNI: {'yes' if m['vnni'] else 'no'}; bf16: {bf16}; "
            f"torch {m['torch']}, onnxruntime {m['onnxruntime']}, "
            f"numpy {m['numpy']}. Load average at start: {', '.join(f'{x:.2f}' for x in load) if load else 'n/a'}.\n"
            f"Per image: {flops} (torch.utils.flop_counter, 2 FLOPs per multiply-add). Median of "
            f">= {report.settings.get('repeats')} timed runs (and >= {report.settings.get('min_seconds')} s) after "
            f"{report.settings.get('warmup')} warm-up runs.\n\n"
            f"## This machine's peaks (measured in this run)\n\nEach row's \"of peak\" is its GFLOP/s over the "
            f"peak of its own precision at its thread count (fp32, bf16, int8; on a GPU cuBLAS's of the same "
            f"precision); a row whose precision has no measured peak says so.\n\n{peaks_table(report.peaks)}\n\n"
            f"{peak_notes(report.peaks)}\n\n"
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
        raise BenchError(f"{path} is not a bench.json from `python -m measure inprocess` ({error}); run it again") from None


