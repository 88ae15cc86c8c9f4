"""`python -m export explain FOLDER --kind KIND`: one form of a finished export explained on request, on the
first input (parity's, then the trace-vs-script probes) where it leaves its tolerance, else on the one where it
comes closest; the int8 form against its fp32 source on calibration images."""

from __future__ import annotations

from pathlib import Path

import torch

from export.checks.parity import compare_outputs, parity_inputs
from export.divergence.explain import explain, runner_for
from export.divergence.taps import MAX_ROWS
from export.errors import ExportError
from export.forms import kinds
from runtime import RunOptions, open_artifact


def explain_folder(folder: Path, manifest, entry, module: torch.nn.Module, kind: str, progress):
    records = manifest.artifacts
    if kind not in records:
        raise ExportError(f"--kind {kind}: not in this export; its kinds: {', '.join(records)}")
    record = records[kind]
    if record.precision == "int8":
        return _explain_int8(folder, manifest, entry, module, record, progress)
    if record.precision != kinds.FP32:
        raise ExportError(f"--kind {kind}: a {record.precision} variant is gated on accuracy, not held to eager "
                          "layer by layer; explain its fp32 source instead (--kind "
                          f"{record.source})")
    tolerance = kinds.get(kind).tolerance
    backend = open_artifact(record.format, folder / record.path, RunOptions(), kind)
    name, batch, output = _failing_input(manifest, entry, module, backend, tolerance, record.spatial_dynamic,
                                         progress)
    progress.step(f"explaining {kind} on '{name}' (every intermediate of eager and the form kept)")
    runner = runner_for(record.format, folder / record.path, module, entry.example_input())
    return explain(kind, runner, module, output, batch, name, tolerance)


def _failing_input(manifest, entry, module, backend, tolerance, spatial_dynamic: bool, progress):
    """(name, batch, the form's output) of the first input out of tolerance, else of the closest call."""
    candidates = [(b.name, b.tensor) for b in parity_inputs(manifest.input.example_shape, manifest.input.value_range,
                                                            spatial_dynamic=spatial_dynamic)]
    candidates += list((entry.probe_inputs() or {}).items()) if entry.probe_inputs else []
    worst = None
    for name, tensor in candidates:
        batch = tensor[:MAX_ROWS]
        try:
            output = backend(batch)
        except Exception as error:  # noqa: BLE001 - an input this form does not take (a size it does not claim)
            progress.step(f"not explained on '{name}': the form does not run it ({type(error).__name__})")
            continue
        with torch.inference_mode():
            metrics, passed = compare_outputs(module(batch), output, tolerance)
        if not passed:
            return name, batch, output
        if worst is None or metrics["max_abs"] > worst[0]:
            worst = (metrics["max_abs"], name, batch, output)
    if worst is None:
        raise ExportError("the form ran none of the parity or probe inputs; run python -m export parity FOLDER")
    return worst[1:]


def _explain_int8(folder: Path, manifest, entry, module, record, progress):
    from export.divergence.int8 import MAX_IMAGES, explain_int8
    from export.precision.calibration import calibration_set
    contract = entry.input_spec.preprocessing
    if contract is None:
        raise ExportError("the int8 form is explained on calibration images; this model takes no image")
    images = calibration_set(contract, None, MAX_IMAGES).images
    source = manifest.artifacts[record.source]
    progress.step(f"explaining {record.kind} against {record.source} on {len(images)} calibration images (SQNR)")
    fallback = record.details.get("made_by", {}).get("fp32_fallback")
    return explain_int8(folder / source.path, folder / record.path, images, fallback_record=fallback, module=module)
