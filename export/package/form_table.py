"""One row per form of an export, Ultralytics style: made or refused (with the exporter's reason), size, parity
against its tolerance, the trace-vs-script verdict per probe, the accuracy gate, in-process latency and whether it
is served (or why not). Printed at the end of an export, kept in report.json under "forms", shown in report.html."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from contract.records import Manifest
from export.checks.latency import Latency
from export.checks.trace_vs_script import MATCHES, REJECTED, TraceVsScript

MADE, REFUSED = "made", "refused"


@dataclass
class FormRow:
    form: str
    status: str  # MADE | REFUSED
    reason: str = ""  # refused: the step and the exporter's (or runtime's) reason
    precision: str = "fp32"
    size_mb: float | None = None
    parity_passed: bool | None = None  # None: not held to eager itself (a variant: its gate judges it)
    parity_max_abs: float | None = None
    tolerance: str = ""
    probes: dict[str, str] = field(default_factory=dict)  # probe -> ok | WRONG | rejects
    gate: str = ""
    latency_ms: float | None = None
    served: str = ""  # served | servable (...) | why not

    def parity_cell(self) -> str:
        if self.parity_passed is None:
            return "-"
        return f"{'ok' if self.parity_passed else 'FAIL'} {self.parity_max_abs:.1e}"

    def probes_cell(self) -> str:
        if not self.probes:
            return "-"
        right = sum(v == "ok" for v in self.probes.values())
        wrong = [str(i + 1) for i, v in enumerate(self.probes.values()) if v == "WRONG"]
        return f"{right}/{len(self.probes)} ok" + (f", WRONG on {','.join(wrong)}" if wrong else "")


def form_rows(manifest: Manifest, paths: TraceVsScript, latency: Latency) -> list[FormRow]:
    """The made forms in the manifest's order, then the refused ones."""
    decision, summary = manifest.decision(), manifest.parity.get("summary", {})
    gates = manifest.precision.get("gate", {})
    rows = []
    for kind, record in manifest.artifacts.items():
        checked = summary.get(kind)
        row = FormRow(
            kind,
            MADE,
            precision=record.precision,
            size_mb=round(_bytes(manifest, kind) / 1e6, 2),
            gate=gates.get(kind, ""),
            latency_ms=latency.median_ms.get(kind),
            served=decision.candidates.get(kind, ""),
        )
        if checked:
            row.parity_passed, row.parity_max_abs = checked["passed"], checked["max_abs"]
            row.tolerance = _tolerance_words(checked["tolerance"])
        row.probes = _probe_cells(paths, record.source or kind)
        rows.append(row)
    rows += [FormRow(kind, REFUSED, reason=refusal.line()) for kind, refusal in manifest.refused.items()]
    return rows


def _bytes(manifest: Manifest, kind: str) -> int:
    record = manifest.artifacts[kind]
    companions = sum(manifest.files[p].bytes for p in record.companions if p in manifest.files)
    return record.bytes + companions


def _tolerance_words(tolerance: dict) -> str:
    if "atol" in tolerance:
        return f"atol {tolerance['atol']:g}, rtol {tolerance['rtol']:g}"
    return f"box IoU >= {tolerance.get('box_iou', 0):g}, scores within {tolerance.get('score_atol', 0):g}"


def _probe_cells(paths: TraceVsScript, kind: str) -> dict[str, str]:
    row = next((r for r in paths.rows if r.artifact == kind), None)
    if row is None:
        return {}
    words = {MATCHES: "ok", REJECTED: "rejects"}
    return {r.probe: words.get(r.status, "WRONG") for r in row.probes}


def as_json(rows: list[FormRow], latency: Latency) -> dict:
    """report.json's "forms": the rows and how latency was measured."""
    return {"rows": [asdict(row) for row in rows], "latency": latency.as_dict()}


COLUMNS = ("form", "status", "size MB", "parity (max abs)", "trace vs script", "gate", "latency ms", "served")


def terminal_table(rows: list[FormRow], latency: Latency) -> str:
    """The table the export prints last: one line per form; a refused form's reason on its line."""
    cells = [
        [
            row.form,
            row.status,
            "-" if row.size_mb is None else f"{row.size_mb:.1f}",
            row.parity_cell(),
            row.probes_cell(),
            _short(row.gate) or "-",
            "-" if row.latency_ms is None else f"{row.latency_ms:.1f}",
            _short(row.served if row.status == MADE else row.reason, 60),
        ]
        for row in rows
    ]
    widths = [max(len(c[i]) for c in [list(COLUMNS), *cells]) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() for line in [list(COLUMNS), *cells]
    ]
    return "\n".join(lines) + "\n" + latency_note(latency)


def latency_note(latency: Latency) -> str:
    if "*" in latency.not_measured:
        return "latency: not measured (--no-benchmark)"
    return (
        f"latency: median of one call on the example input, {latency.threads} thread(s) per worker as served "
        f"({latency.reason}); measuring took {latency.seconds:.1f} s (--no-benchmark skips it)"
    )


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
