"""Which input a form is explained on: an image the user names, else the export's own inputs (the probes the
export recorded this form silently wrong on first, then parity's inputs and the other probes), the first one
out of tolerance, else the one where it comes closest. An input the form cannot run at all (a trace that froze
a size indexes out of range) is noted and passed over: an error leaves no intermediates to compare."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from export.checks.parity import compare_outputs, parity_inputs
from export.divergence.taps import MAX_ROWS
from export.errors import ExportError


@dataclass
class Found:
    name: str
    batch: torch.Tensor
    output: object  # the form's output as served: a tensor, or a detector's tuple
    failed: bool  # out of tolerance (False: the closest call of inputs that all pass)
    not_run: list[str] = field(default_factory=list)  # "'random': RuntimeError ..." for inputs the form raised on


def candidates(manifest, entry, kind: str, spatial_dynamic: bool, image: Path | None) -> list[tuple[str, object]]:
    """(name, batch) in the order they are tried."""
    if image is not None:
        return [(image.name, image_input(image, entry))]
    inputs = [(b.name, b.tensor) for b in parity_inputs(manifest.input.example_shape, manifest.input.value_range,
                                                         spatial_dynamic=spatial_dynamic,
                                                         dynamic_batch=manifest.input.dynamic_batch)]
    inputs += list((entry.probe_inputs() or {}).items()) if entry.probe_inputs else []
    recorded = [d.get("probe") for d in manifest.trace_vs_script.get("diverging", []) if d.get("artifact") == kind]
    return sorted(inputs, key=lambda item: item[0] not in recorded)  # stable: recorded failures first


def image_input(path: Path, entry) -> torch.Tensor:
    """A photo as the served path makes it the model's input: a whole-image model's by its resize rule, a
    classifier's by its preprocessing."""
    from runtime.images import ImageError, decode_upright, preprocess, resize_whole
    spec = entry.input_spec
    try:
        photo = decode_upright(path.read_bytes())
    except (OSError, ImageError) as error:
        raise ExportError(f"--image {path}: cannot be read as an image ({error}); pass a JPEG or PNG file") from None
    if spec.resize_rule is not None:
        return resize_whole(photo, spec.resize_rule)[None]
    if spec.preprocessing is not None:
        return preprocess(photo, spec.preprocessing)[None]
    raise ExportError(f"--image {path}: this model takes no image (no preprocessing recorded); run explain "
                      "without --image to use the export's own inputs")


def failing_input(module, backend, tolerance, inputs: list[tuple[str, object]], progress) -> Found:
    """The first input whose output is out of tolerance, else the closest call."""
    worst, not_run = None, []
    for name, tensor in inputs:
        batch = tensor[:MAX_ROWS]
        try:
            output = backend(batch)
        except Exception as error:  # noqa: BLE001 - an input this form cannot run: noted, the next one is tried
            not_run.append(f"'{name}': {type(error).__name__}: {_first_line(error)}")
            progress.step(f"not explained on '{name}': the form does not run it ({type(error).__name__})")
            continue
        with torch.inference_mode():
            metrics, passed = compare_outputs(module(batch), output, tolerance)
        if not passed:
            return Found(name, batch, output, True, not_run)
        if worst is None or metrics["max_abs"] > worst[0]:
            worst = (metrics["max_abs"], Found(name, batch, output, False, not_run))
    if worst is None:
        raise ExportError("the form ran none of the inputs tried (" + "; ".join(not_run)[:600] + "); nothing to "
                          "compare layer by layer: pass an image it takes with --image")
    return worst[1]


def _first_line(error: BaseException) -> str:
    while error.__cause__ is not None:  # the runtime's error wraps the interpreter's, which says what failed
        error = error.__cause__
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    # TorchScript's errors end with the cause after its own traceback: the last line says what failed
    return (lines[-1] if lines else "")[:200]
