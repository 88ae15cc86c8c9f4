"""The export's last step before its manifest: what a person looks at. Each form timed briefly (unless
--no-benchmark), one row per form (report.json's "forms", the table printed last), the probes drawn with each
form's answer, and report.html, all inside the stage, so that a failed or interrupted export leaves none half-made."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from contract.files import atomic_write_text
from contract.records import FORM_TIMING_NAME, Manifest
from export.checks.latency import Latency, measure_forms, skipped
from export.checks.trace_vs_script import TraceVsScript
from export.forms import kinds
from export.forms.tolerances import held_to
from export.package import form_table, report_html
from export.package.manifest import file_record
from export.package.pictures import Drawer, draw_probes
from models.registry import ModelEntry
from runtime.form_choice import carry_timing, keep_export_measurement
from runtime.machine import this_machine_profile

TRACE_VS_SCRIPT_JSON = "report.json"


@dataclass
class Looked:
    """What the step made: the forms' rows and the table the export prints last."""

    rows: list[form_table.FormRow]
    latency: Latency
    table: str
    html: Path


@dataclass
class FormsRun:
    """What the pipeline still holds of the forms: those refused after they were opened (kind -> backend, drawn for
    what they would have answered) and where the failing forms diverge."""

    refused_backends: dict
    divergence: list[str]


def write_look(
    stage: Path,
    entry: ModelEntry,
    labels: list[str] | None,
    manifest: Manifest,
    paths: TraceVsScript,
    forms: FormsRun,
    benchmark: bool,
    device: str = "cpu",
) -> Looked:
    latency = measure_forms(stage, manifest, entry.example_input(), device) if benchmark else skipped()
    manifest.decision().latency_ms_batch1 = dict(latency.median_ms)
    if benchmark:  # a first start on this machine, or one of its kind, chooses its form from these timings
        _carry_timing(stage, manifest, latency, device)
    rows = form_table.form_rows(manifest, paths, latency)
    _add_to_report_json(stage, manifest, entry.name, form_table.as_json(rows, latency))
    pictures = draw_probes(
        Drawer(entry.task, labels),
        paths,
        entry.probe_inputs() if entry.probe_inputs else {},
        forms.refused_backends,
        _tolerances(entry, list(forms.refused_backends)),
        {k: r.line() for k, r in manifest.refused.items()},
    )
    html = stage / report_html.REPORT_HTML
    atomic_write_text(html, report_html.render(manifest, rows, latency, pictures, forms.divergence))
    manifest.files[report_html.REPORT_HTML] = file_record(stage, report_html.REPORT_HTML)
    return Looked(rows, latency, form_table.terminal_table(rows, latency), html)


def _carry_timing(stage: Path, manifest: Manifest, latency: Latency, device: str) -> None:
    """The timings kept as this machine's choice, and carried in the folder (hence the archive) with their key."""
    timing = keep_export_measurement(manifest, this_machine_profile(device), latency.threads, device,
                                     latency.median_ms)
    if timing is not None:
        carry_timing(stage, timing)
        manifest.files[FORM_TIMING_NAME] = file_record(stage, FORM_TIMING_NAME)


def _tolerances(entry: ModelEntry, names: list[str]) -> dict:
    return {kind: held_to(kinds.get(kind).tolerance, entry.task, entry.limits) for kind in names}


def _add_to_report_json(stage: Path, manifest: Manifest, model: str, record: dict) -> None:
    """report.json keeps its shape (model -> its trace-vs-script record); the forms' rows join the model's record."""
    path = stage / TRACE_VS_SCRIPT_JSON
    report = json.loads(path.read_text())
    report.setdefault(model, {})["forms"] = record
    atomic_write_text(path, json.dumps(report, indent=2, default=str))
    if TRACE_VS_SCRIPT_JSON in manifest.files:
        manifest.files[TRACE_VS_SCRIPT_JSON] = file_record(stage, TRACE_VS_SCRIPT_JSON)
