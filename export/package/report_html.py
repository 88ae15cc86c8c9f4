"""report.html: one self-contained page beside every export (inline CSS, inline SVG plots, pictures as data URIs;
it opens from disk with no network). The forms' table, the served choice and why, latency and parity plots, each
probe with what each form answered drawn on it (side by side where forms disagree), and where a form diverges."""

from __future__ import annotations

import math
from html import escape

from contract.records import Manifest
from export.checks.latency import Latency
from export.package.form_table import MADE, FormRow, latency_note
from export.package.pictures import Answer, ProbePictures

REPORT_HTML = "report.html"
BAR_HEIGHT, BAR_GAP, LABEL_WIDTH, PLOT_WIDTH = 18, 6, 190, 360

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1180px;padding:0 16px;color:#1d2330}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde}
table{border-collapse:collapse;width:100%}th,td{padding:4px 8px;border-bottom:1px solid #e4e6ee;text-align:left;
vertical-align:top}th{background:#f3f4f8}tr.refused td{color:#8a5a00;background:#fff8e6}
.ok{color:#17803d}.bad{color:#b42318;font-weight:600}.muted{color:#667}.served{font-weight:600}
.plots{display:flex;gap:28px;flex-wrap:wrap}.probe{margin:14px 0;padding:10px;border:1px solid #e4e6ee;
border-radius:6px}.probe.disagree{border-color:#b42318;background:#fff5f4}.answers{display:flex;gap:14px;
flex-wrap:wrap}figure{margin:0;max-width:380px}figure img{display:block;border:1px solid #ccd;max-width:100%}
figcaption{font-size:13px;margin-top:4px}.differs figcaption b{color:#b42318}.bars div{display:flex;gap:6px;
align-items:center;font-size:12px}.bars span.bar{background:#3563c9;height:10px;display:inline-block}
.legend span.swatch{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:middle}
code{background:#f3f4f8;padding:1px 4px;border-radius:3px}
"""


def render(
    manifest: Manifest, rows: list[FormRow], latency: Latency, pictures: list[ProbePictures], divergence: list[str]
) -> str:
    name = manifest.model.name
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{escape(name)}: export report"
        f"</title><style>{STYLE}</style></head><body>",
        _header(manifest),
        _table(rows, latency),
        _plots(rows),
        _pictures(pictures),
        _divergence(rows, divergence),
        _files(manifest),
        "</body></html>",
    ]
    return "\n".join(parts)


def _header(manifest: Manifest) -> str:
    decision = manifest.decision()
    weights = manifest.weights.get("kind", "")
    return (
        f"<h1>{escape(manifest.model.name)}</h1><p class='muted'>{escape(manifest.task)} · weights: "
        f"{escape(str(weights))} · serving order decided for {escape(decision.target or 'this machine')}</p>"
        f"<p id='served'>Served: <b>{escape(decision.served or 'nothing')}</b>"
        f"{' (asked for with --serve)' if decision.requested else ''}. Why: {escape(decision.rule)}.</p>"
    )


def _table(rows: list[FormRow], latency: Latency) -> str:
    head = (
        "<h2>Forms</h2><table id='forms'><tr><th>form</th><th>made</th><th>size MB</th><th>parity (max abs, "
        "tolerance)</th><th>trace vs script per probe</th><th>gate</th><th>latency ms</th><th>served</th></tr>"
    )
    body = "".join(_row(row) for row in rows)
    return head + body + f"</table><p class='muted'>{escape(latency_note(latency))}</p>"


def _row(row: FormRow) -> str:
    if row.status != MADE:
        return (
            f"<tr class='refused' data-form='{escape(row.form)}'><td>{escape(row.form)}</td>"
            f"<td colspan='7'>refused: {escape(row.reason)}</td></tr>"
        )
    parity = (
        "-"
        if row.parity_passed is None
        else (
            f"<span class='{'ok' if row.parity_passed else 'bad'}'>{row.parity_cell()}</span> "
            f"<span class='muted'>({escape(row.tolerance)})</span>"
        )
    )
    probes = (
        " ".join(
            f"<span class='{'ok' if v == 'ok' else 'bad'}' title='{escape(p)}'>[{i + 1}] {v}</span>"
            for i, (p, v) in enumerate(row.probes.items())
        )
        or "-"
    )
    served = f"<span class='served'>{escape(row.served)}</span>" if row.served == "served" else escape(row.served)
    latency = "-" if row.latency_ms is None else f"{row.latency_ms:.1f}"
    size = "-" if row.size_mb is None else f"{row.size_mb:.1f}"
    return (
        f"<tr data-form='{escape(row.form)}'><td>{escape(row.form)}</td><td>made ({escape(row.precision)})</td>"
        f"<td>{size}</td><td>{parity}</td><td>{probes}</td><td>{escape(row.gate) or '-'}</td><td>{latency}</td>"
        f"<td>{served}</td></tr>"
    )


def _plots(rows: list[FormRow]) -> str:
    timed = [(r.form, r.latency_ms) for r in rows if r.latency_ms is not None]
    errors = [(r.form, r.parity_max_abs) for r in rows if r.parity_max_abs is not None]
    plots = []
    if timed:
        plots.append(bar_chart("latency per form (ms, one call)", timed, lambda v: f"{v:.1f}"))
    if errors:
        plots.append(
            bar_chart(
                "parity: largest difference from eager (log scale)", errors, lambda v: f"{v:.1e}", logarithmic=True
            )
        )
    return "<h2>Speed and parity</h2><div class='plots'>" + "".join(plots) + "</div>" if plots else ""


def bar_chart(title: str, values: list[tuple[str, float]], words, logarithmic: bool = False) -> str:
    """A horizontal bar chart as inline SVG (no library, no script)."""
    lengths = [_log_length(v) if logarithmic else v for _, v in values]
    top = max(lengths) or 1.0
    height = 24 + len(values) * (BAR_HEIGHT + BAR_GAP)
    width = LABEL_WIDTH + PLOT_WIDTH + 80
    parts = [
        f"<svg class='chart' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"role='img' aria-label='{escape(title)}'><text x='0' y='14' font-size='13' font-weight='600'>"
        f"{escape(title)}</text>"
    ]
    for index, ((label, value), length) in enumerate(zip(values, lengths)):
        y = 24 + index * (BAR_HEIGHT + BAR_GAP)
        bar = max(1.0, PLOT_WIDTH * length / top)
        parts.append(
            f"<text x='{LABEL_WIDTH - 6}' y='{y + 13}' font-size='12' text-anchor='end'>{escape(label)}</text>"
            f"<rect x='{LABEL_WIDTH}' y='{y}' width='{bar:.1f}' height='{BAR_HEIGHT}' fill='#3563c9'/>"
            f"<text x='{LABEL_WIDTH + bar + 4:.1f}' y='{y + 13}' font-size='12'>{escape(words(value))}</text>"
        )
    return "".join(parts) + "</svg>"


def _log_length(value: float) -> float:
    """A bar length for a difference from eager: decades above 1e-9 (an exact 0 draws the shortest bar)."""
    return max(0.0, math.log10(max(value, 1e-9)) + 9) if math.isfinite(value) else 12.0


def _pictures(pictures: list[ProbePictures]) -> str:
    if not pictures:
        return ""
    ordered = sorted(pictures, key=lambda p: not p.disagree)  # where forms disagree first
    return (
        "<h2>What each form answered on each probe</h2><p class='muted'>Forms that agree with eager share its "
        "picture; a form that answers something else is drawn beside it.</p>" + "".join(map(_probe, ordered))
    )


def _probe(probe: ProbePictures) -> str:
    mark = " disagree" if probe.disagree else ""
    badge = " <span class='bad'>forms disagree</span>" if probe.disagree else ""
    rejected = "".join(
        f"<p class='muted'>{escape(k)} rejects this input: {escape(why)}</p>" for k, why in probe.rejected.items()
    )
    size = " x ".join(str(d) for d in probe.shape[2:])
    return (
        f"<section class='probe{mark}' data-probe='{escape(probe.probe)}'><h3>{escape(probe.probe)} "
        f"<span class='muted'>({size})</span>{badge}</h3><div class='answers'>"
        + "".join(map(_answer, probe.answers))
        + "</div>"
        + rejected
        + "</section>"
    )


def _answer(answer: Answer) -> str:
    who = ", ".join(answer.forms)
    state = "agrees" if answer.agrees else "differs"
    caption = f"<b>{escape(who)}</b>: {escape(answer.summary)}"
    if answer.refused:
        caption += f" <span class='muted'>(refused by the export: {escape(answer.refused)})</span>"
    if answer.detail:
        caption += f"<br><span class='muted'>{escape(answer.detail)}</span>"
    top = max((p for _, p in answer.bars), default=0) or 1.0  # bars relative to the top class: random weights too
    bars = "".join(
        f"<div><span class='bar' style='width:{max(2, round(p / top * 160))}px'></span>{escape(label)} {p:.3g}</div>"
        for label, p in answer.bars
    )
    legend = "".join(
        f"<div><span class='swatch' style='background:{colour}'></span>{escape(label)} {share:.1%}</div>"
        for label, colour, share in answer.legend
    )
    extra = (f"<div class='bars'>{bars}</div>" if bars else "") + (
        f"<div class='legend'>{legend}</div>" if legend else ""
    )
    return (
        f"<figure class='answer {state}' data-forms='{escape(who)}'><img alt='{escape(who)}: "
        f"{escape(answer.summary)}' src='{answer.picture}'><figcaption>{caption}</figcaption>{extra}</figure>"
    )


def _divergence(rows: list[FormRow], divergence: list[str]) -> str:
    refused = [r for r in rows if r.status != MADE]
    if not divergence and not refused:
        return ""
    lines = [f"<li><code>{escape(line)}</code></li>" for line in divergence]
    lines += [f"<li><b>{escape(r.form)}</b> refused: {escape(r.reason)}</li>" for r in refused]
    return (
        "<h2>Where forms go wrong</h2><p class='muted'>The first layer out of tolerance and its line "
        "(<code>python -m export explain FOLDER --kind KIND</code> for any form), and why refused forms were "
        "not kept.</p><ul id='divergence'>" + "".join(lines) + "</ul>"
    )


def _files(manifest: Manifest) -> str:
    names = ["manifest.json", *manifest.files]
    links = " · ".join(f"<a href='{escape(n)}'>{escape(n)}</a>" for n in names)
    return f"<h2>Files</h2><p>{links}</p>"
