"""What the GPU check records and how it reports it: a dataclass per row, a Step per stage with its Status,
the GPU path's two targets, fp16 agreement and GPU throughput (recorded, never asserted), gpu-results.md and
.json. Standard library only."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import Enum

SERVED_ARTIFACT = "scripted"  # TorchScript: the artifact the handler runs under fp16 autocast
TARGET_CONCURRENCY = 32  # served requests in flight, held against the in-process batch of the same size
SERVED_TO_INPROCESS_FP16_MIN = 0.8
FP16_TOP1_AGREEMENT_MIN = 0.99


class Status(str, Enum):
    RAN = "ran"
    SKIPPED = "skipped"  # something it needs is not on this machine
    FAILED = "failed"  # it broke: a finding


@dataclass
class ParityRow:
    artifact: str
    parity_on: str
    passed: bool
    max_abs: float
    top1: float | None
    top5: float | None


@dataclass
class AgreementRow:
    artifact: str
    precision: str
    ran_on: str  # the device, or ONNX Runtime's providers as it reports them
    images: int
    top1_agreement: float | None
    top5_agreement: float | None
    max_abs: float
    within_parity_tolerance: bool | None = None  # fp32 runs: the kind's parity tolerance (export.forms.kinds)


@dataclass
class BenchRow:
    variant: str
    batch: int
    ms_median: float
    images_per_s: float


@dataclass
class ServingRow:
    policy: str  # the serving policy's arm: the machine's own, or a variant beside it
    concurrency: int
    requests: int
    errors: int
    req_per_s: float
    p50_ms: float | None
    p99_ms: float | None  # the slowest request when there were too few answers for a 99th percentile
    load: str  # which load generator


@dataclass
class Step:
    name: str
    status: Status
    rows: list = field(default_factory=list)  # one dataclass per row
    notes: list[str] = field(default_factory=list)  # why skipped or failed, and what was substituted


@dataclass
class Target:
    name: str
    value: float
    target: str
    met: bool
    basis: str


@dataclass
class Report:
    when: str
    environment: dict
    steps: list[Step]
    targets: list[Target] = field(default_factory=list)


def rows_of(steps: list[Step], name: str) -> list:
    return [row for step in steps if step.name == name and step.status is Status.RAN for row in step.rows]


def compute_targets(steps: list[Step]) -> list[Target]:
    """The two targets (fp16 agreement, GPU throughput) from whatever rows exist; a target whose rows are missing is left out."""
    return [t for t in (agreement_target(steps), throughput_target(steps)) if t is not None]


def agreement_target(steps: list[Step]) -> Target | None:
    fp16 = [r for r in rows_of(steps, "backends") if r.artifact == SERVED_ARTIFACT and r.precision == "fp16"]
    if not fp16 or fp16[0].top1_agreement is None:
        return None
    value = fp16[0].top1_agreement
    return Target("fp16 top-1 agreement with fp32", round(value, 4), f">= {FP16_TOP1_AGREEMENT_MIN}",
                  value >= FP16_TOP1_AGREEMENT_MIN,
                  f"{SERVED_ARTIFACT} fp16 on cuda:0 vs CPU eager fp32, {fp16[0].images} images")


def throughput_target(steps: list[Step]) -> Target | None:
    bench = {(r.variant, r.batch): r for r in rows_of(steps, "inprocess")}
    reference = (bench.get(("torchscript fp16", TARGET_CONCURRENCY))
                 or bench.get(("eager fp16 autocast", TARGET_CONCURRENCY)))
    served = [r for r in rows_of(steps, "serving") if r.concurrency == TARGET_CONCURRENCY and r.requests]
    if not (reference and served):
        return None
    ratio = served[0].req_per_s / reference.images_per_s
    return Target(f"served fp16 c={TARGET_CONCURRENCY} / in-process fp16 b={TARGET_CONCURRENCY}", round(ratio, 3),
                  f">= {SERVED_TO_INPROCESS_FP16_MIN}", ratio >= SERVED_TO_INPROCESS_FP16_MIN,
                  f"{served[0].req_per_s:.1f} req/s vs {reference.variant} {reference.images_per_s:.1f} images/s")


def exit_status(steps: list[Step]) -> int:
    return 1 if any(step.status is Status.FAILED for step in steps) else 0


def render_markdown(report: Report) -> str:
    lines = [f"# GPU check ({report.when})", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {_cell(value)} |" for key, value in report.environment.items()] + [""]
    for step in report.steps:
        lines += [f"## {step.name}: {step.status.value}", ""]
        lines += [f"- {note}" for note in step.notes] + ([""] if step.notes else [])
        lines += table(step.rows)
    lines += ["## Targets (recorded, not asserted)", ""]
    lines += [f"- {t.name}: {t.value} (target {t.target}): {'met' if t.met else 'NOT met'} ({t.basis})"
              for t in report.targets] or ["- not computed: the steps they need did not run"]
    return "\n".join(lines) + "\n"


def table(rows: list) -> list[str]:
    if not rows:
        return []
    keys = [f.name for f in fields(rows[0])]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_cell(getattr(row, key)) for key in keys) + " |" for row in rows]
    return lines + [""]


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value).replace("|", "\\|")  # a pipe would split the table cell


def report_json(report: Report) -> str:
    return json.dumps(asdict(report), indent=2, default=str)
