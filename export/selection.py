"""Which artifact is served: a declared, deterministic rule.

The served artifact is the first entry of SERVING_PREFERENCE that
  (a) passed parity against eager PyTorch,
  (b) was not flagged by trace-vs-script as silently diverging from eager on any probe input,
  (c) for a reduced-precision variant (int8, bf16, fp16): passed the accuracy gate (export/accuracy.py); it
      inherits (a) and (b) from the fp32 artifact it was made from, and
  (d) accepts the input the handler sends (N x C x crop height x crop width, from the manifest's
      preprocessing contract).
Export timings are recorded for information only and never choose: the same model always gets the same
artifact. The order puts ONNX Runtime first (measured about 2x TorchScript's throughput on CPU in
`python -m serving.bench`), and the torch.export-based ONNX before the legacy exporter's. A gated int8 ONNX
comes first of all: about 2x fp32 ONNX Runtime on CPU (docs/precision.md), within the gate's tolerance.
bf16 and fp16 variants are not in the order: they are fast only on hardware the exporting machine may not
be (native bf16, a GPU), so they are served when asked for with --serve.
"""

from __future__ import annotations

from dataclasses import dataclass

from export.accuracy import GATE_PASSED

SERVING_PREFERENCE = ("onnx-int8", "onnx-dynamo", "onnx-scripted", "onnx-traced", "scripted", "traced")
RULE = ("first of the preference order that passed parity, does not silently diverge from eager on any "
        "probe input (trace vs script), passed the accuracy gate if reduced-precision, and accepts the "
        "handler's input")


@dataclass(frozen=True)
class Candidate:
    kind: str
    passed_parity: bool
    diverging_on: tuple[str, ...]  # probe inputs where it silently differs from eager
    spatial_dynamic: bool
    fixed_size: tuple[int, ...]  # (C, H, W) the artifact was exported at
    gate: str | None = None  # reduced-precision variants: the accuracy gate's verdict; None for fp32 artifacts


def exclusion(candidate: Candidate, handler_input: tuple[int, ...] | None) -> str | None:
    """Why a candidate may not be served, or None when it may."""
    if not candidate.passed_parity:
        return "failed parity"
    if candidate.diverging_on:
        return f"silently diverges from eager on: {', '.join(candidate.diverging_on)}"
    if candidate.gate is not None and candidate.gate != GATE_PASSED:
        return f"accuracy gate {candidate.gate}"
    if handler_input is None:
        return "the model takes no image input the handler can send"
    if not candidate.spatial_dynamic and tuple(candidate.fixed_size) != tuple(handler_input):
        return (f"takes exactly {'x'.join(map(str, candidate.fixed_size))}, the handler sends "
                f"{'x'.join(map(str, handler_input))}")
    return None


def decide(candidates: list[Candidate], handler_input: tuple[int, ...] | None,
           preference: tuple[str, ...] = SERVING_PREFERENCE) -> dict:
    """The manifest's `serving` decision: the chosen artifact and why every other one was not."""
    reasons = {c.kind: exclusion(c, handler_input) for c in candidates}
    ordered = [k for k in preference if k in reasons] + sorted(k for k in reasons if k not in preference)
    chosen = next((k for k in ordered if reasons[k] is None), None)
    verdicts = {k: ("served" if k == chosen else reasons[k] or "servable (later in the preference order)")
                for k in ordered}
    return {"default_artifact": chosen, "rule": RULE, "preference": list(preference), "candidates": verdicts,
            "servable": [k for k in ordered if reasons[k] is None]}
