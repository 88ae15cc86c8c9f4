"""Where tracing silently goes wrong: every artifact against eager on inputs that take other paths.

`torch.jit.trace` records the ops one example ran; an `if` or a data-dependent loop becomes whatever
that example did. Scripting compiles the control flow. This module runs each artifact on probe inputs
(the first like the tracing example, the others taking another path) and says which ones are silently
wrong, which refuse the input loudly, and which stay right.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from export.checks.parity import Tolerance, compare_outputs
from runtime.base import ArtifactRunError, Backend

SILENTLY_WRONG = "silently wrong"
REJECTED = "rejected input"
MATCHES = "matches eager"


@dataclass
class ArtifactUnderTest:
    kind: str
    format: str
    runner: Backend
    control_flow: dict
    tolerance: Tolerance  # its kind's parity tolerance (export.forms.kinds)


def compare_paths(eager: Backend, artifacts: list[ArtifactUnderTest], probes: dict[str, torch.Tensor],
                  tracer_warnings: list[dict] | None = None, missing: dict[str, str] | None = None) -> dict:
    """Rows of model x artifact x probe; JSON-ready. Every artifact that exists is held to eager itself, never
    to another form, so a missing form (`missing`: kind -> why it was not made) hides nothing: a traced artifact
    that diverges is caught with or without a scripted one."""
    expected, skipped = {}, {}
    for name, tensor in probes.items():
        try:
            expected[name] = eager(tensor)
        except ArtifactRunError as error:  # the model itself does not take this input: not a probe for it
            skipped[name] = {"error": str(error)[:300], "traceback": error.cause_traceback()}
    rows = []
    for artifact in artifacts:
        results = []
        for name, reference in expected.items():
            results.append(_probe(artifact, name, probes[name], reference))
        rows.append({"artifact": artifact.kind, "format": artifact.format,
                     "control_flow": artifact.control_flow, "probes": results,
                     "verdict": _verdict(results)})
    return {"probes": list(expected), "skipped_probes": skipped, "rows": rows, "missing": dict(missing or {}),
            "tracer_warnings": tracer_warnings or [], "diverging": diverging(rows)}


def _probe(artifact: ArtifactUnderTest, name: str, tensor: torch.Tensor, reference: torch.Tensor) -> dict:
    base = {"probe": name, "shape": list(tensor.shape), "eager_mean": reference.double().mean().item()}
    try:
        output = artifact.runner(tensor)
    except ArtifactRunError as error:  # refused loudly: the reason for the report, the traceback for report.json
        return {**base, "status": REJECTED, "error": str(error)[:300], "traceback": error.cause_traceback()}
    metrics, passed = compare_outputs(reference, output, artifact.tolerance)
    return {**base, "status": MATCHES if passed else SILENTLY_WRONG, "max_abs": metrics["max_abs"],
            "output_mean": output.double().mean().item()}


def _verdict(results: list[dict]) -> str:
    wrong = [r["probe"] for r in results if r["status"] == SILENTLY_WRONG]
    rejected = [r["probe"] for r in results if r["status"] == REJECTED]
    if wrong:
        return f"WRONG without error on: {', '.join(wrong)}"
    if rejected:
        return f"right where it runs; refuses (loudly) {', '.join(rejected)}"
    return "right on every probe"


def diverging(rows: list[dict]) -> list[dict]:
    """(artifact, probe, max_abs) for every silent divergence: what users must be warned about."""
    return [{"artifact": row["artifact"], "probe": r["probe"], "max_abs": r["max_abs"]}
            for row in rows for r in row["probes"] if r["status"] == SILENTLY_WRONG]


def compact_table(model: str, result: dict) -> str:
    probes = result["probes"]
    lines = [f"{model}:  " + " | ".join(f"[{i + 1}] {p}" for i, p in enumerate(probes))]
    for row in result["rows"]:
        cells = []
        for r in row["probes"]:
            if r["status"] == MATCHES:
                cells.append("ok")
            elif r["status"] == REJECTED:
                cells.append("rejects")
            else:
                cells.append(f"WRONG {r['max_abs']:.2g}")
        flow = " ".join(f"{op.split(':')[-1]}={n}" for op, n in row["control_flow"].items() if n)
        lines.append(f"  {row['artifact']:<14} {flow or 'no control flow':<22} " +
                     "  ".join(f"[{i + 1}] {c}" for i, c in enumerate(cells)))
    lines += [f"  {kind:<14} MISSING: {why}" for kind, why in result.get("missing", {}).items()]
    return "\n".join(lines)


def markdown_section(model: str, description: str, result: dict) -> str:
    lines = [f"## {model}", "", description, "",
             "| artifact | control flow in graph | " + " | ".join(result["probes"]) + " | verdict |",
             "|---|---|" + "---|" * len(result["probes"]) + "---|"]
    for row in result["rows"]:
        flow = ", ".join(f"{op} x{n}" for op, n in row["control_flow"].items() if n) or "none"
        cells = []
        for r in row["probes"]:
            if r["status"] == REJECTED:
                cells.append(f"rejected: {r['error'][:80]}")
            else:
                mark = "matches" if r["status"] == MATCHES else "**WRONG**"
                cells.append(f"{mark} (mean {r['output_mean']:.4g} vs eager {r['eager_mean']:.4g}; "
                             f"max abs diff {r['max_abs']:.2g})")
        lines.append(f"| {row['artifact']} | {flow} | " + " | ".join(cells) + f" | {row['verdict']} |")
    if result.get("missing"):
        lines += ["", "Forms that are missing (not made, so not compared; every form above is still held to eager "
                      "on every probe):", ""]
        lines += [f"- **{kind} is missing**: {why}" for kind, why in result["missing"].items()]
    if result["skipped_probes"]:
        lines.append("")
        lines += [f"- probe `{name}` skipped: eager itself rejects it ({skip['error']})"
                  for name, skip in result["skipped_probes"].items()]
    if result["tracer_warnings"]:
        lines += ["", "Tracer warnings raised while tracing:", ""]
        lines += [f"- {w['category']} x{w['count']}: {w['message']}" for w in result["tracer_warnings"]]
    return "\n".join(lines) + "\n"


CONCLUSION = (
    "**Conclusion.** Traced artifacts (TorchScript and the ONNX made from them) run the one path their "
    "example took: on an input that takes another branch or another loop count they return a wrong answer "
    "without any error. Scripted artifacts (and ONNX from the scripted module, and torch.export with "
    "torch.cond / torch.while_loop) keep the `if` and the loop and stay right. Fixed-count loops "
    "(cf-repeat) are the case where tracing is safe. Serve a traced artifact only for inputs like its example."
)
