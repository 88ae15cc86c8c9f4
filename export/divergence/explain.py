"""One form explained: eager and the form run on the same rows with every intermediate kept (in passes within
MEMORY_BUDGET_BYTES), matched by module call, the first one out of the form's tolerance reported.

Runners by format (each a TapRunner): ONNX (export.divergence.onnx_taps), ExportedProgram and AOTInductor
(export.divergence.program_taps), TorchScript (export.divergence.torchscript_taps). The int8 variant is held
to its fp32 source, not eager, tensor by tensor (export.divergence.int8)."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import torch
from torch import nn

from export.divergence.compare import Matching, match, owners, plan_passes
from export.divergence.eager import EagerTaps
from export.divergence.report import Divergence
from export.divergence.sets import SetVerdict, compare_set_outputs, diagnose, without_root
from export.divergence.taps import MAX_ROWS, MEMORY_BUDGET_BYTES, TapRunner
from export.errors import ExportError
from export.forms.tolerances import SetTolerance, Tolerance

EXPORTED_PROGRAM_FILE = "model.exported.pt2"  # the kind "exported": what an AOTInductor package was compiled from


def runner_for(format: str, path: Path, module: nn.Module, example: torch.Tensor) -> TapRunner:
    """The tap runner that reads this form's intermediates."""
    known = {p for p, _ in module.named_modules()}
    if format == "onnx":
        from export.divergence.onnx_taps import OnnxTaps
        return OnnxTaps(path, known)
    if format == "torch-export":
        from export.divergence.program_taps import ProgramTaps
        return ProgramTaps.from_file(path, known=known)
    if format == "aoti":
        return _aoti_source(path, module, example, known)
    if format == "torchscript":
        from export.divergence.torchscript_taps import TorchScriptTaps
        return TorchScriptTaps.from_file(path)
    raise ExportError(f"no intermediates runner for format {format!r}")


def _aoti_source(path: Path, module: nn.Module, example: torch.Tensor, known: set[str]) -> TapRunner:
    """The ExportedProgram an AOTInductor package was made from: the export's own file when it is there, else
    the module exported again (torch.export is deterministic for the same module and example)."""
    from export.divergence.program_taps import NOTE_AOTI, ProgramTaps
    from export.forms.exporters import export_program, torch_export_form
    sibling = path.parent / EXPORTED_PROGRAM_FILE
    if sibling.is_file():
        return ProgramTaps.from_file(sibling, NOTE_AOTI, known)
    return ProgramTaps(export_program(torch_export_form(module), example, spatial_dynamic=False), NOTE_AOTI, known)


def explain(kind: str, runner: TapRunner, module: nn.Module, form_output, batch: torch.Tensor, inputs: str,
            tolerance: Tolerance, budget: int = MEMORY_BUDGET_BYTES, sets: SetTolerance | None = None) -> Divergence:
    """The divergence report of a form whose output on `batch` was `form_output` (as served). With `sets` (a
    detector) the output is compared as a set and the model's own call is left out of the element-wise rows."""
    started, batch = time.perf_counter(), batch[:MAX_ROWS]
    eager = EagerTaps(module.eval())
    matching, passes, kept = _matched(eager, runner, batch, tolerance, budget)
    expected = eager.output(batch)
    verdict = None
    if sets is not None:
        matching = without_root(matching)
        comparison = compare_set_outputs(expected, form_output, sets)
        verdict = SetVerdict(comparison, sets, diagnose(kind, matching, comparison))
        output_max_abs = (comparison.worst_score_diff or 0.0) if comparison.passed else float("inf")
    else:
        output = form_output[:MAX_ROWS]
        output_max_abs = ((output.double() - expected.double()).abs().max().item()
                          if output.shape == expected.shape else float("inf"))
    first = matching.first
    divergence = Divergence(kind, f"'{inputs}', {len(batch)} row(s)", tolerance, matching, output_max_abs,
                            runner.note, definition=eager.definition(first.key.split("@")[0]) if first else "",
                            sets=verdict)
    divergence.notes += [] if verdict else _notes(matching, output_max_abs, tolerance)
    divergence.cost = {"seconds": round(time.perf_counter() - started, 2), "passes": passes,
                       "intermediates_mb": round(kept / 2**20, 1), "peak_rss_mb": _peak_rss_mb()}
    return divergence


def _matched(eager: EagerTaps, runner: TapRunner, batch, tolerance, budget) -> tuple[Matching, int, int]:
    """Match in passes: every key at once when eager's intermediates fit the budget, else slices of them."""
    layout = eager.taps(batch, lambda key: False)
    passes = plan_passes(layout, budget)
    if len(passes) == 1:
        eager_taps, form_taps = eager.taps(batch, lambda key: True), runner.taps(batch, lambda key: True)
        return match(eager_taps, form_taps, tolerance), 1, _bytes(eager_taps) + _bytes(form_taps)
    combined, kept = Matching(), 0
    form_layout = runner.taps(batch, lambda key: False)
    owner = owners(form_layout)
    for keys in passes:
        wanted = {form_layout[owner[k]].key for k in keys if k in owner}
        eager_taps = eager.taps(batch, keys.__contains__)
        form_taps = runner.taps(batch, wanted.__contains__)
        part = match(eager_taps, form_taps, tolerance)
        combined.rows += part.rows
        combined.missing += [k for k in part.missing if k in keys]
        kept = max(kept, _bytes(eager_taps) + _bytes(form_taps))
    return combined, len(passes), kept


def _bytes(taps) -> int:
    return sum(t.value.numel() * 4 for t in taps if t.value is not None)


def _notes(matching: Matching, output_max_abs: float, tolerance: Tolerance) -> list[str]:
    if matching.first is not None or output_max_abs <= tolerance.atol:
        return []
    return ["every module output matches with the runner above, yet the form's own output (as served) differs: "
            "the cause is outside the modules' own values (for ONNX, a graph optimization ONNX Runtime applies "
            "when serving; try the session with optimizations off)"]


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def explain_failures(parity, module: nn.Module, artifacts: dict, backends: dict, inputs: list,
                     example: torch.Tensor) -> dict[str, Divergence | str]:
    """A report for every form that failed parity, on the first parity input it failed (kind -> report, or the
    reason none could be made: the export's failure stands either way)."""
    by_name = {batch.name: batch.tensor for batch in inputs}
    found: dict[str, Divergence | str] = {}
    for comparison in parity.failures:
        kind = comparison.artifact
        if kind in found or kind not in artifacts or comparison.inputs not in by_name:
            continue
        artifact, batch = artifacts[kind], by_name[comparison.inputs]
        try:
            runner = runner_for(artifact.format, artifact.path, module, example)
            found[kind] = explain(kind, runner, module, backends[kind](batch[:MAX_ROWS]), batch, comparison.inputs,
                                  *_tolerances(kind, comparison.tolerance))
        except Exception as error:  # noqa: BLE001 - the report is help on top of a failure; say why it is missing
            found[kind] = f"{kind}: no divergence report ({type(error).__name__}: {str(error)[:300]})"
    return found


def _tolerances(kind: str, held_to: Tolerance | SetTolerance) -> tuple:
    """(the element-wise tolerance of the tensors inside, the budget default, the set tolerance or None)."""
    if isinstance(held_to, SetTolerance):  # a detector: its tensors inside are held to its kind's tolerance
        from export.forms import kinds
        return kinds.get(kind).tolerance, MEMORY_BUDGET_BYTES, held_to
    return held_to, MEMORY_BUDGET_BYTES, None
