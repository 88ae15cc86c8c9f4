"""How the served rows of one benchmark run compare with what bounds them, as ratios of that run's own numbers.

The served choice (`default`, what `python -m serving` serves) at COMPARED_AT requests in flight, against:
- its artifact alone in-process, on the reference body (the model alone: no HTTP, no decoding);
- per body: its request path in one process (the pipeline ceiling), the naive TorchServe, the LitServe peer,
  and its own median (p99 / p50);
- the fp32 ONNX served (`fp32-onnx`): what the hardware-aware choice bought; each speed-only row (a variant that
  failed its accuracy gate) beside it is shown, never judged, since nothing serves it;
and, for the run: the errors in our configurations' rows, the best fp32 backend against this machine's GEMM peak.

A comparison carries a Bar that a healthy deployment clears; one whose rows the run did not measure says
`not measured` and what to add. The per-size table of results.md has every row's ratios; what runs measured is
in docs/benchmarks.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from measure.served.configurations import CONFIGURATIONS, DEFAULT, LITSERVE, NAIVE
from measure.served.report import cell, ratio

COMPARED_AT = 8  # requests in flight: every worker of the CPU policy busy, held against the in-process batch of 8
FP32_ONNX = "fp32-onnx"
NOT_OURS = (NAIVE, LITSERVE)  # the baseline and the peer: their errors are not ours


@dataclass(frozen=True)
class Bar:
    """What a healthy deployment clears: the ratio `compares` at least (or, at_most, at most) `limit`, because
    `means`."""
    compares: str
    limit: float
    means: str
    at_most: bool = False

    def cleared_by(self, value: float) -> bool:
        return value <= self.limit if self.at_most else value >= self.limit

    def __str__(self) -> str:
        return f"{'≤' if self.at_most else '≥'} {self.limit:g}"


MODEL_ALONE = Bar("served / its artifact alone in-process", 0.9, "serving costs at most 10 % of the model alone")
REQUEST_PATH = Bar("served / its request path in one process", 0.9,
                   "the server costs at most 10 % of the request path it runs")
NAIVE_BASELINE = Bar(f"served / {NAIVE}", 1.0,
                     "tuned serving is at least as fast as TorchServe as its documentation teaches")
PEER = Bar(f"served / {LITSERVE}", 1.0, "ours is at least as fast as the server a user would write instead")
CHOICE = Bar(f"served / {FP32_ONNX}", 1.0, "the hardware-aware choice is never slower than the fp32 ONNX it replaces")
TAIL = Bar("p99 / p50", 2.0, "the slowest 1 % of requests take at most twice the median", at_most=True)
NO_ERRORS = Bar("errors in our rows", 0, "every request to our configurations is answered", at_most=True)
GEMM_PEAK = Bar("best fp32 backend / fp32 GEMM peak", 0.7,
                "the backend wastes little of the machine: it runs the model at 70 % of the matrix units' peak or more")


@dataclass(frozen=True)
class Comparison:
    name: str
    value: float | None  # None: the run did not measure it
    bar: Bar
    detail: str  # the numbers compared, or what to add to measure it
    judged: bool = True  # False: shown beside the others, never held to the bar (a speed-only row)

    @property
    def cleared(self) -> bool | None:
        return None if self.value is None or not self.judged else self.bar.cleared_by(self.value)

    def record(self) -> dict:
        """What comparisons.json holds for it."""
        return {"name": self.name, "value": self.value, "bar": str(self.bar), "bar_means": self.bar.means,
                "cleared": self.cleared, "detail": self.detail}


def not_measured(name: str, bar: Bar, needs: str) -> Comparison:
    return Comparison(name, None, bar, f"not measured: {needs}")


# ------------------------------------------------------------------ the rows compared
def at_compared(rows: list[dict], configuration: str) -> dict[str | None, dict]:
    """{body: row} of one configuration at COMPARED_AT requests in flight."""
    return {r.get("body"): r for r in rows if r["configuration"] == configuration and r["concurrency"] == COMPARED_AT}


def on_body(rows: list[dict], body: str) -> list[dict]:
    """Every row on `body` at COMPARED_AT requests in flight."""
    return [r for r in rows if r.get("body") == body and r["concurrency"] == COMPARED_AT]


def label(row: dict) -> str:
    where = f" on {row['body']}" if row.get("body") else ""
    return f"{row['configuration']} ({row.get('artifact', '?')}){where} at c={COMPARED_AT}"


def needs_row(configuration: str) -> str:
    return f"a {configuration} row: --configurations with {configuration}, --concurrency with {COMPARED_AT}"


# ------------------------------------------------------------------ each comparison
def versus_model_alone(served: dict | None) -> Comparison:
    """served / its artifact alone in-process at the largest batch <= the concurrency (the row's vs_inprocess)."""
    name = "served / its artifact alone in-process"
    if served is None:
        return not_measured(f"{DEFAULT}: {name}", MODEL_ALONE, needs_row(DEFAULT))
    if served.get("vs_inprocess") is None:
        return not_measured(f"{label(served)} / its artifact alone", MODEL_ALONE,
                            "the in-process benchmark (--inprocess run, or its bench.json)")
    return Comparison(f"{label(served)} / {served['artifact']} alone in-process at batch {served['inprocess_batch']}",
                      served["vs_inprocess"], MODEL_ALONE,
                      f"{served['req_per_s']:.1f} req/s vs {served['inprocess_per_s']:.1f} img/s")


def versus_request_path(served: dict[str | None, dict]) -> list[Comparison]:
    """Each body's served / its request path in one process (the row's vs_pipeline)."""
    found = [Comparison(f"{label(row)} / its request path in one process", row["vs_pipeline"], REQUEST_PATH,
                        f"{row['req_per_s']:.1f} req/s vs {row['pipeline_ceiling']:.1f} images/s")
             for row in served.values() if row.get("vs_pipeline") is not None]
    return found or [not_measured(f"{DEFAULT} / its request path in one process", REQUEST_PATH,
                                  f"{needs_row(DEFAULT)}, and --pipeline run")]


def versus_other(served: dict[str | None, dict], rows: list[dict], other: str, bar: Bar) -> list[Comparison]:
    """Each body's served / the `other` configuration's row on the same body, where the run measured both."""
    theirs = at_compared(rows, other)
    found = [Comparison(f"{label(row)} / {other}", ratio(row["req_per_s"], theirs[body]["req_per_s"]), bar,
                        f"{row['req_per_s']:.1f} vs {theirs[body]['req_per_s']:.1f} req/s")
             for body, row in served.items() if body in theirs]
    return found or [not_measured(f"{DEFAULT} / {other}", bar, f"--configurations with {DEFAULT} and {other}, "
                                                               f"--concurrency with {COMPARED_AT}")]


def tail(row: dict) -> Comparison:
    """p99 / p50. With fewer than 100 answers hey prints no p99: the slowest request, an upper bound of it,
    then clears the bar when within it, and leaves the comparison unmeasured otherwise."""
    name, p50, p99, slowest = f"{label(row)}: p99 / p50", row.get("p50_ms"), row.get("p99_ms"), row.get("slowest_ms")
    if p50 and p99:
        return Comparison(name, p99 / p50, TAIL, f"p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    if p50 and slowest and TAIL.cleared_by(slowest / p50):
        return Comparison(name, slowest / p50, TAIL, f"p50 {p50:.0f} ms, slowest {slowest:.0f} ms (under 100 "
                                                     "answers: no p99; the slowest bounds it)")
    return not_measured(name, TAIL, f"{row['requests']} answers, hey prints a p99 from 100; a longer --duration "
                                    "gives one")


def tails(served: dict[str | None, dict]) -> list[Comparison]:
    return [tail(row) for row in served.values()] or [not_measured(f"{DEFAULT}: p99 / p50", TAIL, needs_row(DEFAULT))]


def fp32_onnx_row(rows: list[dict], served: dict, body: str) -> dict | None:
    """The fp32 ONNX served on `body`; the served row itself where the choice is the fp32 ONNX (the benchmark
    then skips the configuration that repeats it)."""
    row = at_compared(rows, FP32_ONNX).get(body)
    if row is None and served.get("artifact") == CONFIGURATIONS[FP32_ONNX].artifact:
        return served
    return row


def versus_fp32_onnx(rows: list[dict], served: dict | None, body: str) -> list[Comparison]:
    """What the hardware-aware choice bought on the reference body: the served row, and beside it every
    speed-only row (never judged: nothing serves a variant that failed its gate), / the fp32 ONNX served."""
    name = f"/ {FP32_ONNX} on {body}"
    if served is None:
        return [not_measured(f"{DEFAULT} {name}", CHOICE, needs_row(DEFAULT))]
    baseline = fp32_onnx_row(rows, served, body)
    if baseline is None:
        return [not_measured(f"{label(served)} {name}", CHOICE, f"add {FP32_ONNX} to --configurations")]
    speed_only = [r for r in on_body(rows, body) if r.get("gate")]
    return [versus_baseline(row, baseline) for row in [served] + speed_only]


def versus_baseline(row: dict, baseline: dict) -> Comparison:
    """One row / the fp32 ONNX served; a speed-only row is shown, never judged."""
    not_servable = f" ({row['gate']}: not servable)" if row.get("gate") else ""
    return Comparison(f"{label(row)} / {FP32_ONNX} ({baseline['artifact']})",
                      ratio(row["req_per_s"], baseline["req_per_s"]), CHOICE,
                      f"{row['req_per_s']:.1f} vs {baseline['req_per_s']:.1f} req/s{not_servable}",
                      judged=not row.get("gate"))


def errors(rows: list[dict]) -> Comparison:
    """The failed requests in every row of our configurations (the naive baseline and the peer are not ours)."""
    ours = [r for r in rows if r["configuration"] not in NOT_OURS]
    if not ours:
        return not_measured("errors in our configurations' rows", NO_ERRORS, "a configuration of ours")
    failed = sum(r["failed"] for r in ours)
    return Comparison("errors in our configurations' rows", failed, NO_ERRORS,
                      f"{failed} of {sum(r['requests'] for r in ours)} requests")


def versus_gemm_peak(fraction: float | None) -> Comparison:
    name = "best fp32 in-process backend / this machine's fp32 GEMM peak"
    if fraction is None:
        return not_measured(name, GEMM_PEAK, "the in-process benchmark (--inprocess run, or its bench.json)")
    return Comparison(name, fraction, GEMM_PEAK, "from the in-process benchmark")


# ------------------------------------------------------------------ the run, compared
def compare(rows: list[dict], reference: str, gemm_peak_fraction: float | None,
            classifier: bool = True) -> list[Comparison]:
    """Every comparison of one run; `reference` is the body the model-alone and fp32-ONNX comparisons use. A
    detector's or segmenter's run has no naive baseline, peer or fp32-ONNX choice to compare with (the benchmark
    refuses those rows for it): its bounds are its model alone and its request path."""
    served = at_compared(rows, DEFAULT)
    classifier_only = (versus_other(served, rows, NAIVE, NAIVE_BASELINE) + versus_other(served, rows, LITSERVE, PEER)
                       + versus_fp32_onnx(rows, served.get(reference), reference)) if classifier else []
    peak = [versus_gemm_peak(gemm_peak_fraction)] if classifier or gemm_peak_fraction is not None else []
    return ([versus_model_alone(served.get(reference))] + versus_request_path(served) + tails(served)
            + classifier_only + [errors(rows)] + peak)


def table(comparisons: list[Comparison]) -> str:
    lines = ["| comparison | ratio | bar | cleared | numbers |", "|---|---|---|---|---|"]
    lines += [f"| {c.name} | {shown(c.value)} | {c.bar} | {verdict(c)} | {c.detail} |" for c in comparisons]
    return "\n".join(lines)


def shown(value: float | None) -> str:
    """A ratio to two places; a count (the errors) as it is."""
    return str(value) if isinstance(value, int) else cell(value)


def verdict(comparison: Comparison) -> str:
    if comparison.cleared is None:
        return "—" if comparison.judged else "not judged"
    return "yes" if comparison.cleared else "no"


def bars_note(comparisons: list[Comparison]) -> str:
    """What each bar in the table means, once per bar."""
    bars = dict.fromkeys(c.bar for c in comparisons)
    return ("Each bar is what a healthy deployment clears:\n\n"
            + "\n".join(f"- {b.compares} `{b}`: {b.means}" for b in bars))


def section(comparisons: list[Comparison]) -> str:
    """results.md's section."""
    return f"## How each row compares\n\n{table(comparisons)}\n\n{bars_note(comparisons)}\n"
