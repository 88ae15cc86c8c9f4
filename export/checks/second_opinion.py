"""A second opinion on ONNX Runtime for small models: onnx.reference.ReferenceEvaluator runs the same ONNX
files on every probe input (registry entries with reference_check, such as the control-flow demos)."""

from __future__ import annotations

from export.checks.parity import compare_outputs
from export.forms import kinds
from runtime import ArtifactRunError, open_artifact


def second_opinion_markdown(second_opinion: dict) -> str:
    if not second_opinion:
        return ""
    lines = ["", "## Second opinion: onnx.reference.ReferenceEvaluator vs ONNX Runtime", ""]
    for k, v in second_opinion.items():
        lines.append(f"- {k}: {'agree' if v['agree'] else 'DISAGREE'} (max abs {v['max_abs']:.2e} over {v['inputs']} inputs)")
        lines += [f"  - probe `{probe}` not run by the reference evaluator: {why}" for probe, why in v["skipped"].items()]
    return "\n".join(lines) + "\n"


def reference_agreement(artifacts, backends, probes: dict) -> dict:
    """ONNX Runtime against the spec-level reference evaluator on every probe (small models only)."""
    out = {}
    for kind, artifact in artifacts.items():
        if artifact.format != kinds.ONNX:
            continue
        reference = open_artifact("onnx-reference", artifact.path)
        worst, agree, count, skipped = 0.0, True, 0, {}
        for probe, tensor in probes.items():
            try:
                expected = reference(tensor)
            except ArtifactRunError as error:  # e.g. a fixed-shape graph refuses other shapes: recorded, not hidden
                skipped[probe] = str(error)[:300]
                continue
            metrics, passed = compare_outputs(expected, backends[kind](tensor), kinds.get(kind).tolerance)
            worst, agree, count = max(worst, metrics["max_abs"]), agree and passed, count + 1
        out[kind] = {"agree": agree and count > 0, "max_abs": worst, "inputs": count, "skipped": skipped}
    return out
