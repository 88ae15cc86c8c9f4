"""report.html and the forms' table of a real detector export (MTCNN, traced and scripted: the export refuses the trace
at parity), opened in headless Chromium: one row per form, the photo where the refused trace answers something else
drawn beside eager's answer, the plots, and nothing fetched from the network. The table is printed last and kept in
report.json; --no-benchmark leaves latency out and says so.

Which forms the export makes and which one it serves depend on the CPU (with native bf16 it also makes and prefers
`scripted-bf16-backbone`), so these tests read both from the export's own manifest and report.json, never assume
them; tests/test_cpu_independence.py runs them under each simulated CPU."""

from __future__ import annotations

import json
import re

import pytest

from contract.records import Manifest
from export.checks.latency import skipped
from export.package.form_table import REFUSED, FormRow, terminal_table
from tests.browser import chromium, screenshot, wait_for

pytestmark = pytest.mark.slow
GRID = "lfw_subset's first 25 faces in a 5 x 5 grid (many faces)"  # where the frozen trace answers wrong


def test_the_table_is_printed_last_then_the_report_and_kept_in_report_json(mtcnn_faces_export):
    out = mtcnn_faces_export["out"]
    printed = mtcnn_faces_export["stdout"].read_text().strip().splitlines()
    assert printed[-1].endswith(f"report: {(out / 'report.html').resolve().as_uri()}")
    assert any(line.startswith("form ") and "latency ms" in line for line in printed[-8:])
    forms = json.loads((out / "report.json").read_text())["mtcnn"]["forms"]
    rows = {row["form"]: row for row in forms["rows"]}
    served = Manifest.read(out).decision().served_kind()  # the export's own choice on this CPU
    assert [name for name, row in rows.items() if row["served"] == "served"] == [served]
    assert rows[served]["status"] == "made" and rows[served]["latency_ms"] > 0
    assert set(rows[served]["probes"].values()) == {"ok"}
    assert rows["scripted"]["status"] == "made" and rows["scripted"]["parity_passed"]  # fp32: made on every CPU
    assert set(rows["scripted"]["probes"].values()) == {"ok"}
    assert rows["traced"]["status"] == REFUSED and rows["traced"]["reason"].startswith("parity: CannotRunError")
    header = max(i for i, line in enumerate(printed) if line.startswith("form ") and "latency ms" in line)
    table = {line.split()[0]: line for line in printed[header + 1:header + 1 + len(rows)]}
    assert list(table) == list(rows) and table[served].endswith(" served")  # the served form marked in the table
    assert forms["latency"]["threads"] >= 1 and forms["latency"]["seconds"] > 0
    manifest = Manifest.read(out)  # report.json rewritten and report.html added: both recorded with their sha256
    assert {"report.html", "report.json"} <= set(manifest.files)
    assert manifest.decision().latency_ms_batch1 == forms["latency"]["median_ms"]


def test_no_benchmark_leaves_latency_out_and_says_so():
    table = terminal_table([FormRow("scripted", "made", size_mb=2.1)], skipped())
    assert "latency: not measured (--no-benchmark)" in table and table.splitlines()[1].split()[6] == "-"


def test_the_report_opens_in_a_browser_and_shows_the_refused_trace_beside_eager(mtcnn_faces_export, tmp_path):
    html = mtcnn_faces_export["out"] / "report.html"
    report = json.loads(html.with_name("report.json").read_text())["mtcnn"]["forms"]
    made_and_refused = [row["form"] for row in report["rows"]]
    assert {"scripted", "traced"} <= set(made_and_refused)
    text = html.read_text()
    assert not re.search(r"""(src|href)=['"]?(https?:)?//""", text), "report.html must need no network"
    with chromium() as browser:
        browser.get(html.resolve().as_uri())
        rows = browser.find_elements("css selector", "#forms tr[data-form]")
        forms = {row.get_attribute("data-form"): row for row in rows}
        assert list(forms) == made_and_refused  # the export's own rows, whatever this CPU made
        assert "refused: parity" in forms["traced"].text
        disagreeing = browser.find_elements("css selector", "section.probe.disagree")
        assert [section.get_attribute("data-probe") for section in disagreeing] == [GRID]
        figures = disagreeing[0].find_elements("css selector", "figure")
        assert [f.get_attribute("data-forms") for f in figures] == ["eager, scripted", "traced"]
        assert "differs" in figures[1].get_attribute("class") and "refused by the export" in figures[1].text
        eager_boxes, traced_boxes = (int(f.text.split(": ")[1].split()[0]) for f in figures)
        assert eager_boxes == 25 and traced_boxes != eager_boxes
        images = disagreeing[0].find_elements("css selector", "img")
        wait_for(
            lambda: all(
                browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", i) for i in images
            )
        )
        assert len(browser.find_elements("css selector", "svg.chart")) == 2
        shot = screenshot(browser, tmp_path / "report.png", full_height=True)
    assert shot.stat().st_size > 50_000
