"""Where tracing silently goes wrong: every artifact against eager on inputs that take other paths.

`torch.jit.trace` records the ops one example ran; an `if` or a data-dependent loop becomes whatever
that example did. Scripting compiles the control flow. This module runs each artifact on probe inputs
(the first like the tracing example, the others taking another path) and says which ones are silently
wrong, which refuse the input loudly, and which stay right. The result is a `TraceVsScript` record: report.json
holds its `as_dict()`, manifest.json its `manifest_record()`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from export.checks.parity import compare_outputs
from export.forms.tolerances import SetTolerance, Tolerance
from runtime.base import ArtifactRunError, Backend

SILENTLY_WRONG = "silently wrong"
REJECTED = "rejected input"
MATCHES = "matches eager"
ERROR_CHARS = 300  # of a refusal's message kept in the report (the traceback is kept whole)


@dataclass
class ArtifactUnderTest:
    kind: str
    format: str
    runner: Backend
    control_flow: dict
    tolerance: Tolerance | SetTolerance  # what parity holds it to (export.forms.tolerances.held_to)


@dataclass
class ProbeResult:
    """One artifact on one probe: how it compared with eager, or why it refused the input."""

    probe: str
    shape: list[int]
    eager_mean: float
    status: str  # MATCHES | SILENTLY_WRONG | REJECTED
    measure: str = "mean"  # what eager_mean and output_mean are: an output's mean, or a detector's boxes
    max_abs: float | None = None  # ran: the largest difference from eager
    output_mean: float | None = None
    error: str | None = None  # REJECTED: the runtime's reason and traceback
    traceback: str | None = None
    detail: str | None = None  # SILENTLY_WRONG: how it differs, when the comparison says (a detector's boxes)
    answer: Any = field(default=None, repr=False, compare=False)  # what it answered, as `keep` reduced it (pictures)

    def as_dict(self) -> dict:
        base = {"probe": self.probe, "shape": self.shape, "eager_mean": self.eager_mean, "status": self.status,
                "measure": self.measure}
        if self.status == REJECTED:
            return {**base, "error": self.error, "traceback": self.traceback}
        return {**base, "max_abs": self.max_abs, "output_mean": self.output_mean, "detail": self.detail}


@dataclass
class ArtifactPaths:
    """One artifact on every probe, with its verdict."""

    artifact: str
    format: str
    control_flow: dict  # op -> count in its graph
    probes: list[ProbeResult]

    @property
    def verdict(self) -> str:
        wrong = [r.probe for r in self.probes if r.status == SILENTLY_WRONG]
        rejected = [r.probe for r in self.probes if r.status == REJECTED]
        if wrong:
            return f"WRONG without error on: {', '.join(wrong)}"
        if rejected:
            return f"right where it runs; refuses (loudly) {', '.join(rejected)}"
        return "right on every probe"

    def on(self, probe: str) -> ProbeResult:
        return next(r for r in self.probes if r.probe == probe)

    def as_dict(self) -> dict:
        return {"artifact": self.artifact, "format": self.format, "control_flow": self.control_flow,
                "probes": [r.as_dict() for r in self.probes], "verdict": self.verdict}


@dataclass
class Divergence:
    """An artifact silently wrong on a probe: what users must be warned about."""

    artifact: str
    probe: str
    max_abs: float

    def as_dict(self) -> dict:
        return {"artifact": self.artifact, "probe": self.probe, "max_abs": self.max_abs}


@dataclass
class SkippedProbe:
    """A probe eager itself refuses: it says nothing about the artifacts."""

    error: str
    traceback: str

    def as_dict(self) -> dict:
        return {"error": self.error, "traceback": self.traceback}


@dataclass
class TraceVsScript:
    probes: list[str]  # the probes eager took, in order (the first is like the tracing example)
    rows: list[ArtifactPaths]
    skipped_probes: dict[str, SkippedProbe] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # kind -> why it was not made
    tracer_warnings: list[dict] = field(default_factory=list)
    eager_answers: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # as `keep` reduced them

    @property
    def diverging(self) -> list[Divergence]:
        return [Divergence(row.artifact, r.probe, r.max_abs)
                for row in self.rows for r in row.probes if r.status == SILENTLY_WRONG]

    def diverging_probes(self) -> dict[str, list[str]]:
        """kind -> the probes it silently diverges on (kinds that never diverge are absent)."""
        found: dict[str, list[str]] = {}
        for item in self.diverging:
            found.setdefault(item.artifact, []).append(item.probe)
        return found

    def verdicts(self) -> dict[str, str]:
        return {row.artifact: row.verdict for row in self.rows}

    def warning(self) -> str | None:
        """What a user must be told when an artifact silently diverges (None when none does)."""
        items = self.diverging
        if not items:
            return None
        first = items[0]
        names = sorted({d.artifact for d in items})
        return (f"{', '.join(names)} silently diverge from eager on input '{first.probe}' "
                f"(max abs diff {first.max_abs:.3g}): the trace recorded one path of this model's control flow; "
                "serve the scripted artifact (or ONNX from it) for such inputs")

    def as_dict(self) -> dict:
        """report.json's record of one model."""
        return {"probes": self.probes, "skipped_probes": {k: s.as_dict() for k, s in self.skipped_probes.items()},
                "rows": [row.as_dict() for row in self.rows], "missing": self.missing,
                "tracer_warnings": self.tracer_warnings, "diverging": [d.as_dict() for d in self.diverging]}

    def manifest_record(self) -> dict:
        """manifest.json's `trace_vs_script`."""
        return {"diverging": [d.as_dict() for d in self.diverging], "verdicts": self.verdicts(),
                "missing": self.missing, "warning": self.warning() or ""}

    def table(self, model: str) -> str:
        """The terminal's compact table: one line per artifact, a cell per probe."""
        lines = [f"{model}:  " + " | ".join(f"[{i + 1}] {p}" for i, p in enumerate(self.probes))]
        for row in self.rows:
            cells = [_cell(r) for r in row.probes]
            flow = " ".join(f"{op.split(':')[-1]}={n}" for op, n in row.control_flow.items() if n)
            lines.append(f"  {row.artifact:<14} {flow or 'no control flow':<22} " +
                         "  ".join(f"[{i + 1}] {c}" for i, c in enumerate(cells)))
        lines += [f"  {kind:<14} MISSING: {why}" for kind, why in self.missing.items()]
        return "\n".join(lines)

    def markdown(self, model: str, description: str) -> str:
        """report.md's section of one model."""
        lines = [f"## {model}", "", description, "",
                 "| artifact | control flow in graph | " + " | ".join(self.probes) + " | verdict |",
                 "|---|---|" + "---|" * len(self.probes) + "---|"]
        for row in self.rows:
            flow = ", ".join(f"{op} x{n}" for op, n in row.control_flow.items() if n) or "none"
            cells = [_markdown_cell(r) for r in row.probes]
            lines.append(f"| {row.artifact} | {flow} | " + " | ".join(cells) + f" | {row.verdict} |")
        if self.missing:
            lines += ["", "Forms that are missing (not made, so not compared; every form above is still held to "
                          "eager on every probe):", ""]
            lines += [f"- **{kind} is missing**: {why}" for kind, why in self.missing.items()]
        if self.skipped_probes:
            lines.append("")
            lines += [f"- probe `{name}` skipped: eager itself rejects it ({skip.error})"
                      for name, skip in self.skipped_probes.items()]
        if self.tracer_warnings:
            lines += ["", "Tracer warnings raised while tracing:", ""]
            lines += [f"- {w['category']} x{w['count']}: {w['message']}" for w in self.tracer_warnings]
        return "\n".join(lines) + "\n"


def report_json(results: dict[str, TraceVsScript]) -> str:
    """report.json: model name -> its record (one model for an export, several for `controlflow`)."""
    return json.dumps({name: result.as_dict() for name, result in results.items()}, indent=2, default=str)


def compare_paths(eager: Backend, artifacts: list[ArtifactUnderTest], probes: dict[str, torch.Tensor],
                  tracer_warnings: list[dict] | None = None, missing: dict[str, str] | None = None,
                  keep: Callable[[Any], Any] | None = None) -> TraceVsScript:
    """Every artifact x probe. Every artifact that exists is held to eager itself, never to another form, so a
    missing form (`missing`: kind -> why it was not made) hides nothing: a traced artifact that diverges is
    caught with or without a scripted one. `keep` reduces each answer to what report.html draws (None: none kept)."""
    expected, skipped = {}, {}
    for name, tensor in probes.items():
        try:
            expected[name] = eager(tensor)
        except ArtifactRunError as error:  # the model itself does not take this input: not a probe for it
            skipped[name] = SkippedProbe(str(error)[:ERROR_CHARS], error.cause_traceback())
    rows = [ArtifactPaths(artifact.kind, artifact.format, artifact.control_flow,
                          [_probe(artifact, name, probes[name], reference, keep) for name, reference in expected.items()])
            for artifact in artifacts]
    kept = {name: keep(reference) for name, reference in expected.items()} if keep else {}
    return TraceVsScript(list(expected), rows, skipped, dict(missing or {}), tracer_warnings or [], kept)


def summary(outputs) -> float:
    """One number per answer for the report: an output's mean, or a detector's count of boxes."""
    if isinstance(outputs, tuple):
        return float(outputs[0].shape[0])
    return outputs.double().mean().item()


def _probe(artifact: ArtifactUnderTest, name: str, tensor: torch.Tensor, reference,
           keep: Callable[[Any], Any] | None = None) -> ProbeResult:
    seen = {"probe": name, "shape": list(tensor.shape), "eager_mean": summary(reference),
            "measure": "boxes" if isinstance(reference, tuple) else "mean"}
    try:
        output = artifact.runner(tensor)
    except ArtifactRunError as error:  # refused loudly: the reason for the report, the traceback for report.json
        return ProbeResult(**seen, status=REJECTED, error=str(error)[:ERROR_CHARS], traceback=error.cause_traceback())
    metrics, passed = compare_outputs(reference, output, artifact.tolerance)
    return ProbeResult(**seen, status=MATCHES if passed else SILENTLY_WRONG, max_abs=metrics["max_abs"],
                       output_mean=summary(output), detail=metrics.get("error"), answer=keep(output) if keep else None)


def _cell(result: ProbeResult) -> str:
    if result.status == MATCHES:
        return "ok"
    if result.status == REJECTED:
        return "rejects"
    return f"WRONG {result.max_abs:.2g}"


def _markdown_cell(result: ProbeResult) -> str:
    if result.status == REJECTED:
        return f"rejected: {result.error[:80]}"
    mark = "matches" if result.status == MATCHES else "**WRONG**"
    if result.measure == "boxes":
        return f"{mark} ({result.output_mean:.0f} boxes vs eager {result.eager_mean:.0f}" + (
            f"; {result.detail})" if result.detail else ")")
    return (f"{mark} (mean {result.output_mean:.4g} vs eager {result.eager_mean:.4g}; "
            f"max abs diff {result.max_abs:.2g})")


CONCLUSION = (
    "**Conclusion.** Traced artifacts (TorchScript and the ONNX made from them) run the one path their "
    "example took: on an input that takes another branch or another loop count they return a wrong answer "
    "without any error. Scripted artifacts (and ONNX from the scripted module, and torch.export with "
    "torch.cond / torch.while_loop) keep the `if` and the loop and stay right. Fixed-count loops "
    "(cf-repeat) are the case where tracing is safe. Serve a traced artifact only for inputs like its example."
)
