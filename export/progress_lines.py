"""What the export's steps print: a line per step with the elapsed time, a table per check's result, and the warnings
the user must see standing out."""

from __future__ import annotations

import sys
import time

from export.checks.parity import ParityReport
from export.checks.trace_vs_script import TraceVsScript
from export.interrupt import stop_if_interrupted
from export.precision.gate import GATE_REPORT, render_table
from export.precision.variants import PrecisionReport
from models.registry import ModelEntry


class Progress:
    """One line per step with the elapsed time; warnings the user must see stand out."""

    def __init__(self, stream=None, quiet: bool = False):
        self.stream = stream or sys.stdout
        self.quiet = quiet
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def step(self, message: str) -> None:
        stop_if_interrupted()
        if not self.quiet:
            print(f"[{self.elapsed():6.1f}s] {message}", file=self.stream, flush=True)

    def warn(self, message: str) -> None:
        print(f"\n  !!! WARNING: {message}\n", file=self.stream, flush=True)


def print_parity(parity: ParityReport, progress: Progress) -> None:
    summary = parity.summary()
    cells = ", ".join(f"{k} {'ok' if s['passed'] else 'FAIL'} ({s['max_abs']:.1e})" for k, s in summary.items())
    progress.step(f"parity vs eager (max abs): {cells}")


def print_second_opinion(second_opinion: dict, progress: Progress) -> None:
    progress.step("onnx.reference.ReferenceEvaluator vs ONNX Runtime: " + ", ".join(
        f"{k} {'agree' if v['agree'] else 'DISAGREE'} (max abs {v['max_abs']:.1e})"
        for k, v in second_opinion.items()))


def print_divergence(entry: ModelEntry, paths: TraceVsScript, progress: Progress) -> None:
    message = paths.warning()
    if message and entry.warn_on_divergence:
        progress.warn(message)
    elif message:
        progress.step("note: " + message)


def print_gate(variants: PrecisionReport, mode: str, progress: Progress) -> None:
    results = [v.gate for v in variants.variants.values() if v.gate]
    progress.step("accuracy gate (vs fp32 eager, held-out images):\n" + render_table(results))
    for note in variants.notes:
        progress.warn(note)
    kept = variants.failures if mode == GATE_REPORT else variants.set_aside
    if kept:
        why = "--gate report" if mode == GATE_REPORT else "the tool's addition, never fatal"
        progress.warn("ACCURACY GATE FAILED for " + ", ".join(r.kind for r in kept) + f" ({why}): kept in the "
                      "export but NOT servable:\n" + render_table(kept))
