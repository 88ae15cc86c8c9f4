"""The serving benchmark's numbers made readable: the handler's stage times from its log, ratios to the naive
row and to the in-process ceiling, issue 10's and 11's targets, the tables, results.md and throughput.png."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from handlers.core import STAGES
from serving.measure.bench_configurations import CONFIGURATIONS, INT8, NAIVE

TARGET_VS_INPROCESS = 0.9  # issue 10: served at concurrency 8 >= 0.9 x the best in-process batch-8 throughput
TARGET_VS_NAIVE = 4.0  # ... and >= 4 x the naive baseline at concurrency 8
TARGET_PEAK_FRACTION = 0.7  # the best fp32 backend at >= 70 % of the measured fp32 GEMM peak
TARGET_CONCURRENCY = 8
TARGET_INT8_REQ_PER_S = 100  # issue 11: the int8 artifact served at concurrency 8, zero errors
TARGET_TAIL_RATIO = 2.0  # ... with p99 <= 2 x p50
STAGE_LINE = re.compile(r"batch of (\d+): (.*)$")
STAGE_VALUE = re.compile(r"(\w+)=([\d.]+)ms")


@dataclass
class Target:
    name: str
    value: float | None
    threshold: float
    met: bool | None  # None: not measured in this run
    detail: str
    at_most: bool = False  # the value must be <= threshold (else >=)


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


# ------------------------------------------------------------------ ratios and targets
def inprocess_batch_for(concurrency: int, batches: list[int]) -> int | None:
    """The largest in-process batch <= the concurrency: at most that many requests can be in one batch."""
    fitting = [b for b in batches if b <= concurrency]
    return max(fitting) if fitting else None


def ratio(value: float, reference: float | None) -> float | None:
    return value / reference if reference else None


def add_ratios(rows: list[dict], best_by_precision: dict[str, dict[int, float]]) -> list[dict]:
    """Each row gains vs_naive (same concurrency) and vs_inprocess (the best in-process row of the served
    artifact's precision at the largest batch <= the concurrency: an int8 row is held to int8's ceiling)."""
    naive = {r["concurrency"]: r["req_per_s"] for r in rows if r["configuration"] == NAIVE}
    for row in rows:
        best_inprocess = best_by_precision.get(row.get("precision", "fp32"), {})
        batch = inprocess_batch_for(row["concurrency"], sorted(best_inprocess))
        row["vs_naive"] = ratio(row["req_per_s"], naive.get(row["concurrency"]))
        row["inprocess_batch"] = batch
        row["vs_inprocess"] = ratio(row["req_per_s"], best_inprocess.get(batch)) if batch else None
    return rows


def evaluate_targets(rows: list[dict], best_inprocess: dict[int, float], fp32_peak_fraction: float | None,
                     configuration: str = "default") -> list[Target]:
    """Issue 10's targets, as ratios from this run."""
    served = next((r for r in rows if r["configuration"] == configuration and r["concurrency"] == TARGET_CONCURRENCY),
                  None)
    naive = next((r for r in rows if r["configuration"] == NAIVE and r["concurrency"] == TARGET_CONCURRENCY), None)
    vs_inprocess = ratio(served["req_per_s"], best_inprocess.get(TARGET_CONCURRENCY)) if served else None
    vs_naive = ratio(served["req_per_s"], naive["req_per_s"]) if served and naive else None

    def target(name, value, threshold, detail):
        return Target(name, value, threshold, None if value is None else value >= threshold, detail)

    return precision_targets(rows) + [
        target(f"served ({configuration}) at c={TARGET_CONCURRENCY} / best in-process batch {TARGET_CONCURRENCY}",
               vs_inprocess, TARGET_VS_INPROCESS,
               f"{served['req_per_s']:.1f} req/s vs {best_inprocess[TARGET_CONCURRENCY]:.1f} img/s"
               if vs_inprocess is not None else "not measured"),
        target(f"served ({configuration}) / naive at c={TARGET_CONCURRENCY}", vs_naive, TARGET_VS_NAIVE,
               f"{served['req_per_s']:.1f} vs {naive['req_per_s']:.1f} req/s" if vs_naive is not None
               else "not measured"),
        target("best fp32 in-process backend / measured fp32 GEMM peak", fp32_peak_fraction, TARGET_PEAK_FRACTION,
               "from the in-process benchmark" if fp32_peak_fraction is not None else "not measured"),
    ]


def precision_targets(rows: list[dict]) -> list[Target]:
    """Issue 11's: the int8 row at concurrency 8 (only when the run has one)."""
    int8 = next((r for r in rows if r["configuration"] == INT8 and r["concurrency"] == TARGET_CONCURRENCY), None)
    if int8 is None:
        return []
    label = f"int8 served at c={TARGET_CONCURRENCY}" + (f" ({int8['gate']})" if int8.get("gate") else "")
    tail = int8["p99_ms"] / int8["p50_ms"] if int8.get("p99_ms") and int8.get("p50_ms") else None
    return [Target(f"{label}: req/s, 0 errors", int8["req_per_s"], TARGET_INT8_REQ_PER_S,
                   int8["req_per_s"] >= TARGET_INT8_REQ_PER_S and int8["failed"] == 0,
                   f"{int8['req_per_s']:.1f} req/s, {int8['failed']} errors"),
            Target(f"{label}: p99 / p50", tail, TARGET_TAIL_RATIO, None if tail is None else tail <= TARGET_TAIL_RATIO,
                   f"p50 {int8['p50_ms']:.0f} ms, p99 {cell(int8.get('p99_ms'), '{:.0f}')} ms", at_most=True)]


# ------------------------------------------------------------------ tables, chart, results.md
def cell(value: float | None, fmt: str = "{:.2f}") -> str:
    return fmt.format(value) if value is not None else "—"


def table(rows: list[dict]) -> str:
    stage_headers = " | ".join(f"{s} ms" for s in STAGES)
    lines = [f"| configuration | c | req/s | p50 ms | p90 ms | p99 ms | errors | × naive | × in-process (batch) | "
             f"{stage_headers} | batch |", "|---|---|---|---|---|---|---|---|---|" + "---|" * len(STAGES) + "---|"]
    for r in rows:
        stages = r.get("stages_ms") or {}
        inprocess_cell = (f"{r['vs_inprocess']:.2f} ({r['inprocess_batch']})" if r.get("vs_inprocess") is not None
                          else "—")
        name = r["configuration"] + (" (speed only, gate failed)" if r.get("gate") else "")
        lines.append(f"| {name} | {r['concurrency']} | {r['req_per_s']:.1f} | {cell(r['p50_ms'], '{:.0f}')} | "
                     f"{cell(r['p90_ms'], '{:.0f}')} | {cell(r['p99_ms'], '{:.0f}')} | {r['failed']} | "
                     f"{cell(r.get('vs_naive'))} | "
                     f"{inprocess_cell} | " + " | ".join(cell(stages.get(s), "{:.1f}") for s in STAGES)
                     + f" | {cell(stages.get('batch'), '{:.0f}')} |")
    return "\n".join(lines)


def targets_table(targets: list[Target]) -> str:
    lines = ["| target | measured | needed | met | numbers |", "|---|---|---|---|---|"]
    lines += [f"| {t.name} | {cell(t.value)} | {'≤' if t.at_most else '≥'} {t.threshold:g} | "
              f"{'yes' if t.met else 'no' if t.met is not None else '—'} | {t.detail} |" for t in targets]
    return "\n".join(lines)


def progress_line(name: str, row: dict) -> str:
    """One printed line per measured row, while the benchmark runs."""
    stages = row["stages_ms"]
    return (f"  {name:<15} c={row['concurrency']:<3} {row['req_per_s']:7.1f} req/s  p50 {cell(row['p50_ms'], '{:.0f}'):>5}  "
            f"p90 {cell(row['p90_ms'], '{:.0f}'):>5}  p99 {cell(row['p99_ms'], '{:.0f}'):>5} ms  errors {row['failed']}"
            + ("  per request: " + " ".join(f"{s} {stages[s]:.1f}" for s in STAGES)
               + f" ms (median batch {stages['batch']:.0f})" if stages else ""))


def chart(rows: list[dict], best_inprocess: dict[int, float], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(7.5, 4.2))
    for name in dict.fromkeys(r["configuration"] for r in rows):
        mine = [r for r in rows if r["configuration"] == name]
        axis.plot([r["concurrency"] for r in mine], [r["req_per_s"] for r in mine], marker="o", label=name,
                  linestyle="--" if name == NAIVE else "-")
    for batch, value in best_inprocess.items():
        axis.axhline(value, color="grey", linewidth=0.8, linestyle=":")
        axis.annotate(f"in-process best fp32, batch {batch}", (axis.get_xlim()[0], value), fontsize=7, color="grey",
                      va="bottom")
    axis.set_xlabel("concurrent clients")
    axis.set_ylabel("requests / second")
    axis.set_title("TorchServe throughput by configuration (one run)")
    axis.set_xscale("log", base=2)
    axis.set_ylim(bottom=0)
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def ungated_note(rows: list[dict]) -> str:
    gates = sorted({f"`{r['configuration']}`: {r['gate']}" for r in rows if r.get("gate")})
    return ("Rows marked *speed only* served a variant that failed its accuracy gate, to measure its speed; "
            "`python -m serving` and the export's archive never serve it. " + "; ".join(gates) + "\n\n") if gates else ""


def render_markdown(rows: list[dict], targets: list[Target], names: list[str], header: str) -> str:
    described = "\n".join(f"- `{n}`: {CONFIGURATIONS[n].description}" for n in names)
    return (f"{header}\n\n{described}\n\n{table(rows)}\n\nStage columns: medians per request from the handler's "
            f"log (a batch's time divided by its size); `batch` is the median batch size. The naive handler logs "
            f"no stages.\n\n{ungated_note(rows)}## Targets (issue 10)\n\n{targets_table(targets)}\n")
