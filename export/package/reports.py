"""The human- and machine-readable reports an export folder carries beside its artifacts: the labels, parity
(parity.md / parity.json, with the reference evaluator's opinion) and trace vs script (report.md / report.json)."""

from __future__ import annotations

import json
from pathlib import Path

from contract.files import atomic_write_text
from contract.records import LABELS_NAME
from export.checks.parity import ParityReport, report_json, report_markdown
from export.checks.second_opinion import second_opinion_markdown
from export.checks.trace_vs_script import CONCLUSION, TraceVsScript
from export.checks.trace_vs_script import report_json as trace_vs_script_json
from models.registry import ModelEntry

REPORTS = ("parity.md", "parity.json", "report.md", "report.json")


def write_reports(stage: Path, entry: ModelEntry, labels: list[str] | None, parity: ParityReport,
                  second_opinion: dict, paths: TraceVsScript) -> list[str]:
    """Each report written into the stage; returns their names (the labels file first, when there are labels)."""
    written = []
    if labels:
        atomic_write_text(stage / LABELS_NAME, json.dumps({str(i): name for i, name in enumerate(labels)}, indent=1))
        written.append(LABELS_NAME)
    parity_md, parity_json, paths_md, paths_json = REPORTS
    atomic_write_text(stage / parity_md, report_markdown(parity, entry.name) + second_opinion_markdown(second_opinion))
    atomic_write_text(stage / parity_json, report_json(parity))
    section = paths.markdown(entry.name, entry.description)
    atomic_write_text(stage / paths_md, f"# Trace vs script: {entry.name}\n\n{section}\n{CONCLUSION}\n")
    atomic_write_text(stage / paths_json, trace_vs_script_json({entry.name: paths}))
    return written + list(REPORTS)
