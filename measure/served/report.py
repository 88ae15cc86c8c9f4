"""The serving benchmark's numbers made readable: the handler's stage times from its log, each row's ratios to the
naive row, to its pipeline ceiling and to the model alone, the tables, results.md and throughput.png (how the
rows compare with what bounds them: comparisons.py)."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from handlers.core import STAGES
from measure.served.configurations import NAIVE

STAGE_LINE = re.compile(r"batch of (\d+): (.*)$")
STAGE_VALUE = re.compile(r"(\w+)=([\d.]+)ms")
MIX = "mix"  # the body name of the rows that send every body at once (rows.py)


# ------------------------------------------------------------------ where the time goes
def parse_stage_lines(text: str) -> list[tuple[int, dict[str, float]]]:
    """(batch size, {stage: ms for the batch}) for each `batch of N: decode=..ms ...` line the handler logged."""
    found = []
    for line in text.splitlines():
        match = STAGE_LINE.search(line)
        if match:
            values = {name: float(ms) for name, ms in STAGE_VALUE.findall(match.group(2)) if name in STAGES}
            if set(values) == set(STAGES):
                found.append((int(match.group(1)), values))
    return found


def stage_medians(batches: list[tuple[int, dict[str, float]]]) -> dict:
    """Median per request of each stage (a batch's time divided by its size), and the median batch size."""
    if not batches:
        return {}
    medians = {stage: statistics.median(values[stage] / size for size, values in batches) for stage in STAGES}
    return {**medians, "batch": statistics.median(size for size, _ in batches), "batches": len(batches)}


# ------------------------------------------------------------------ ratios beside each row
def inprocess_batch_for(concurrency: int, batches: list[int]) -> int | None:
    """The largest in-process batch <= the concurrency: at most that many requests can be in one batch."""
    fitting = [b for b in batches if b <= concurrency]
    return max(fitting) if fitting else None


def ratio(value: float, reference: float | None) -> float | None:
    return value / reference if reference else None


def add_ratios(rows: list[dict], best_by_precision: dict[str, dict[int, float]], ceiling=None,
               best_by_artifact: dict[str, dict[int, float]] | None = None) -> list[dict]:
    """Each row gains vs_naive (same body and concurrency), vs_inprocess (the model alone: the served artifact's
    own best in-process row where the run timed it, else the best of its precision, at the largest batch <= the
    concurrency; an int8 row is held to int8's ceiling) and, given ceiling(row) -> images/s or None,
    pipeline_ceiling and vs_pipeline."""
    naive = {(r.get("body"), r["concurrency"]): r["req_per_s"] for r in rows if r["configuration"] == NAIVE}
    for row in rows:
        best_inprocess = ((best_by_artifact or {}).get(row.get("artifact"))
                          or best_by_precision.get(row.get("precision", "fp32"), {}))
        batch = inprocess_batch_for(row["concurrency"], sorted(best_inprocess))
        row["vs_naive"] = ratio(row["req_per_s"], naive.get((row.get("body"), row["concurrency"])))
        row["inprocess_batch"] = batch
        row["inprocess_per_s"] = best_inprocess.get(batch) if batch else None
        row["vs_inprocess"] = ratio(row["req_per_s"], row["inprocess_per_s"])
        if ceiling is not None:
            row["pipeline_ceiling"] = ceiling(row)
            row["vs_pipeline"] = ratio(row["req_per_s"], row["pipeline_ceiling"])
    return rows


# ------------------------------------------------------------------ tables, chart, results.md
def cell(value: float | None, fmt: str = "{:.2f}") -> str:
    return fmt.format(value) if value is not None else "—"


def table(rows: list[dict]) -> str:
    """Where the time goes: every row with p90, the ratio to naive and the handler's stage medians."""
    stage_headers = " | ".join(f"{s} ms" for s in STAGES)
    lines = [(f"| body | configuration | c | req/s | p50 ms | p90 ms | p99 ms | errors | × naive | "
              f"× in-process (batch) | {stage_headers} | batch | server CPU ms/req |"),
             "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(STAGES) + "---|---|"]
    for r in rows:
        stages = r.get("stages_ms") or {}
        inprocess_cell = (f"{r['vs_inprocess']:.2f} ({r['inprocess_batch']})" if r.get("vs_inprocess") is not None
                          else "—")
        lines.append(f"| {r.get('body', '—')} | {row_name(r)} | {r['concurrency']} | {r['req_per_s']:.1f} | "
                     f"{latency(r, 'p50_ms')} | {latency(r, 'p90_ms')} | {latency(r, 'p99_ms')} | {r['failed']} | "
                     f"{cell(r.get('vs_naive'))} | "
                     f"{inprocess_cell} | " + " | ".join(cell(stages.get(s), "{:.1f}") for s in STAGES)
                     + f" | {cell(stages.get('batch'), '{:.0f}')} | {cell(r.get('server_cpu_ms'), '{:.1f}')} |")
    return "\n".join(lines)


def row_name(row: dict) -> str:
    return row["configuration"] + (" (speed only, gate failed)" if row.get("gate") else "")


def latency(row: dict, key: str) -> str:
    """Milliseconds; a mix row's are the largest of its bodies' percentiles, an upper bound: marked <=."""
    value = cell(row.get(key), "{:.0f}")
    return f"≤{value}" if row.get("body") == MIX and row.get(key) is not None else value


def sizes_table(rows: list[dict]) -> str:
    """The per-size table: each served row beside the pipeline ceiling of its body and the model alone."""
    lines = [("| body | configuration | c | served req/s | p50 ms | p99 ms | errors | pipeline ceiling | "
              "model-only (batch) | served / pipeline | served / model |"), "|" + "---|" * 11]
    for r in rows:
        model = (f"{r['inprocess_per_s']:.1f} ({r['inprocess_batch']})" if r.get("inprocess_per_s") is not None
                 else "—")
        lines.append(f"| {r.get('body', '—')} | {row_name(r)} | {r['concurrency']} | {r['req_per_s']:.1f} | "
                     f"{latency(r, 'p50_ms')} | {latency(r, 'p99_ms')} | {r['failed']} | "
                     f"{cell(r.get('pipeline_ceiling'), '{:.1f}')} | {model} | {cell(r.get('vs_pipeline'))} | "
                     f"{cell(r.get('vs_inprocess'))} |")
    return "\n".join(lines)


def progress_line(name: str, row: dict) -> str:
    """One printed line per measured row, while the benchmark runs."""
    stages = row["stages_ms"]
    return (f"  {name:<15} c={row['concurrency']:<3} {row['req_per_s']:7.1f} req/s  p50 {cell(row['p50_ms'], '{:.0f}'):>5}  "
            f"p90 {cell(row['p90_ms'], '{:.0f}'):>5}  p99 {cell(row['p99_ms'], '{:.0f}'):>5} ms  errors {row['failed']}"
            + (f"  server CPU {row['server_cpu_ms']:.1f} ms/req" if row.get("server_cpu_ms") is not None else "")
            + ("  per request: " + " ".join(f"{s} {stages[s]:.1f}" for s in STAGES)
               + f" ms (median batch {stages['batch']:.0f})" if stages else ""))


def chart(rows: list[dict], best_inprocess: dict[int, float], path: Path) -> None:
    """Per concurrency, a group of bars per body (one per configuration), each bar with its pipeline ceiling
    as a black tick and the best fp32 model-only rate at the compared batch as a dotted line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    levels = sorted({r["concurrency"] for r in rows})
    figure, axes = plt.subplots(len(levels), 1, figsize=(9, 3.6 * len(levels)), squeeze=False)
    for axis, level in zip(axes[:, 0], levels):
        bar_group(axis, [r for r in rows if r["concurrency"] == level])
        batch = inprocess_batch_for(level, sorted(best_inprocess))
        if batch:
            axis.axhline(best_inprocess[batch], color="grey", linewidth=0.8, linestyle=":",
                         label=f"model alone, best fp32, batch {batch}")
        axis.set_title(f"served requests/s at concurrency {level} (one run; black tick: pipeline ceiling)",
                       fontsize=9)
        axis.set_ylabel("requests / second")
        axis.legend(fontsize=7, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.12))
        axis.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def bar_group(axis, rows: list[dict]) -> None:
    bodies = list(dict.fromkeys(r.get("body", "—") for r in rows))
    names = list(dict.fromkeys(r["configuration"] for r in rows))
    width = 0.8 / len(names)
    for n, name in enumerate(names):
        for i, r in enumerate(r for r in rows if r["configuration"] == name):
            x = bodies.index(r.get("body", "—")) + (n - (len(names) - 1) / 2) * width
            axis.bar(x, r["req_per_s"], width, color=f"C{n}", label=None if i else name,
                     hatch="//" if name == NAIVE else None)
            if r.get("pipeline_ceiling"):
                axis.plot([x - width / 2, x + width / 2], [r["pipeline_ceiling"]] * 2, color="black", linewidth=1.5)
    axis.set_xticks(range(len(bodies)), bodies, fontsize=8)


def ungated_note(rows: list[dict]) -> str:
    gates = sorted({f"`{r['configuration']}`: {r['gate']}" for r in rows if r.get("gate")})
    return ("Rows marked *speed only* served a variant that failed its accuracy gate, to measure its speed; "
            "`python -m serving` and the export's archive never serve it. " + "; ".join(gates) + "\n\n") if gates else ""


SIZES_NOTE = ("*pipeline ceiling*: `python -m measure pipeline`'s request path (our handler's decode, "
              "preprocess, inference, encode in one process) for the artifact the row serves and the same body, at "
              "one worker's thread budget, times the serving policy's workers, measured in this run (pipeline.md); "
              "for `mix` the ceiling of the same composition of bodies the row served. *model-only*: the best "
              "in-process throughput of the model alone (bench.md) at the largest batch <= the concurrency, of the "
              "row's artifact (else its precision): one process at any thread count, or the policy's workers at "
              "their thread budget, whichever is more. `mix` rows send every body at once (one hey per body, the clients split between "
              "them); their latencies are the largest of the bodies' percentiles, an upper bound (`≤`).")


def render_markdown(rows: list[dict], compared: str, descriptions: dict[str, str], header: str) -> str:
    """results.md; `compared` is the section of how each row compares (comparisons.section)."""
    described = "\n".join(f"- `{n}`: {text}" for n, text in descriptions.items())
    return (f"{header}\n\n{described}\n\n## Per size\n\n{sizes_table(rows)}\n\n{SIZES_NOTE}\n\n"
            f"## Where the time goes\n\n{table(rows)}\n\nStage columns: medians per request from the handler's "
            f"log (a batch's time divided by its size); `batch` is the median batch size. The naive handler and "
            f"the LitServe peer log no stages. `server CPU ms/req`: CPU time of the server's processes (frontend and "
            f"workers) per answered request during the row, steadier than req/s on a shared machine.\n\n"
            f"{ungated_note(rows)}{compared}")
