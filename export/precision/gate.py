"""The accuracy gate for reduced-precision artifacts, in the spirit of MMDeploy's regression test.

Every int8 / bf16 / fp16 artifact is compared with fp32 eager PyTorch on held-out images (never the
calibration images): top-1 agreement on the images where fp32 is confident (see CONFIDENT_MARGIN), top-5
agreement on all of them, mean and max logit error, and, when a labelled validation folder's classes match the
model's outputs, top-1/top-5 accuracy of fp32 and of the variant with the drop.
A variant is servable only when every check is within its precision's named tolerance. Otherwise the
export fails with `AccuracyGateError`, carrying the numbers (or, with a report-only gate, the variant is
recorded as not servable).

The metrics are pure functions of two logit tensors (and labels), tested on their own.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import torch

from export.errors import ExportError
from gates.topk import CONFIDENT_MARGIN, agreement_metrics

EXIT_ACCURACY_GATE = 5
GATE_PASSED = "passed"
GATE_ENFORCE = "enforce"  # a variant failing the gate fails the export
GATE_REPORT = "report"  # record failures (not servable) but finish the export with exit 0
GATE_MODES = (GATE_ENFORCE, GATE_REPORT)
GATE_BATCH = 16


@dataclass(frozen=True)
class GateTolerance:
    min_top1_agreement: float  # fraction of held-out images whose top-1 class equals fp32's
    min_top5_agreement: float  # fraction whose fp32 top-1 class is among the variant's top 5
    max_relative_logit_error: float  # mean |variant - fp32| / mean per-image std of fp32 logits
    max_accuracy_drop_points: float  # fp32 accuracy - variant accuracy, in percentage points (labelled data)


# Why these bounds (the published and measured figures behind them: docs/results/2026-11-23-precision-ladder/). int8: published post-training
# int8 ResNet-50s lose a fraction of an ImageNet top-1 point, so 1 point of drop is a generous but still meaningful
# bound (MMDeploy's regression test uses the same order). Agreement: a flipped top-1 only happens on images where
# fp32's two best classes are close, which is also where labels are least reliable; 98 % allows 2 flips in 128
# held-out images while broken calibration flips far more (all-black calibration: most of them). fp32's answer must
# stay in the top 5 on 99 % of images. The mean logit error is relative to the spread (std) of fp32's logits, so it
# reads the same for any model; it is a backstop for outputs that are wrong everywhere, since rankings are already
# checked by agreement: 0.3 passes the good int8 models measured while a broken calibration, whose errors are of the
# order of the spread, fails.
INT8_TOLERANCE = GateTolerance(min_top1_agreement=0.98, min_top5_agreement=0.99, max_relative_logit_error=0.3,
                               max_accuracy_drop_points=1.0)
# bf16 keeps 8 mantissa bits (relative rounding 2^-9 per operation, about int8's resolution), so it gets
# int8's bounds; fp16 keeps 11 bits (2^-12), about 8x finer, so its bounds are tighter.
BF16_TOLERANCE = INT8_TOLERANCE
FP16_TOLERANCE = GateTolerance(min_top1_agreement=0.99, min_top5_agreement=0.995, max_relative_logit_error=0.05,
                               max_accuracy_drop_points=0.5)
TOLERANCE_BY_PRECISION = {"int8": INT8_TOLERANCE, "bf16": BF16_TOLERANCE, "fp16": FP16_TOLERANCE}


@dataclass(frozen=True)
class BoxGateTolerance:
    """A detector's gate (export.precision.detections): its boxes matched to fp32's as parity matches them."""

    box_iou: float  # a box is fp32's box of the same label (the same object) from this IoU
    min_mean_box_iou: float  # the matched boxes' mean IoU with fp32's: where the objects are
    min_recall: float  # fp32's boxes matched, over all held-out photos
    min_precision: float  # the variant's boxes matched, over all held-out photos
    max_score_diff: float  # the largest score difference of a matched pair; also the edge of the score threshold
    min_mask_iou: float  # a matched mask (Mask R-CNN) overlaps fp32's from this IoU


# Why these bounds. The same object: IoU 0.5, the match detection benchmarks count (PASCAL VOC, WIDER FACE), because
# a cascade's NMS may keep a neighbouring candidate when two scores are close, and that box overlaps fp32's by less
# than rounding would (docs/results/2026-11-26-detection-exports/mtcnn.md#reduced-precision); where the boxes are: their mean IoU with fp32's >= 0.9, which
# a network that shifts or resizes every box fails. 98 % recall and precision allow one box in 50 to cross the score
# threshold, as parity excuses a box at the edge, while a broken network loses or invents many. bf16 rounds each value
# to 2^-9 of itself; through a detector's networks a probability moves by thousandths, and 0.02 leaves headroom while
# a broken layer moves scores by tenths.
BF16_BOX_TOLERANCE = BoxGateTolerance(box_iou=0.5, min_mean_box_iou=0.9, min_recall=0.98, min_precision=0.98,
                                      max_score_diff=0.02, min_mask_iou=0.9)
BOX_TOLERANCE_BY_PRECISION = {"bf16": BF16_BOX_TOLERANCE}
# Top-1 agreement is counted where fp32 is confident (gates.topk.CONFIDENT_MARGIN); on fewer than this
# many confident images (e.g. a random-weight model) it is counted on every image.
MIN_CONFIDENT_IMAGES = 32


class AccuracyGateError(ExportError):
    """Reduced-precision artifacts that are not accurate enough to serve; carries every number."""

    exit_code = EXIT_ACCURACY_GATE

    def __init__(self, results: list["GateResult"], table: str):
        self.results = results
        self.table = table
        reasons = "; ".join(f"{r.kind}: {', '.join(r.failures)}" for r in results)
        super().__init__(f"accuracy gate FAILED - {reasons}. These artifacts are not servable. Calibrate on "
                         "images like the ones you serve (--calibration DIR), or pass --gate report to keep "
                         f"the export with them marked not servable; see accuracy.md{_few_confident_hint(results)}")


def _few_confident_hint(results: list["GateResult"]) -> str:
    """What to do when top-1 agreement was counted on every image: fp32 is confident on too few of them (random or
    barely trained weights), so near ties decide it; more held-out images give the gate enough confident ones."""
    if not any(too_few_confident(r.metrics) for r in results):
        return ""
    return (f". fp32 is confident on fewer than {MIN_CONFIDENT_IMAGES} held-out images, so top-1 agreement was "
            "counted on near ties too: a larger --validation DIR (up to 1000 images) lets the gate judge it where "
            "fp32 is confident")


@dataclass
class GateResult:
    """A variant's verdict: a classifier's (top-1 agreement, GateTolerance) or a detector's (boxes, BoxGateTolerance)."""
    kind: str
    precision: str
    images: int
    tolerance: GateTolerance | BoxGateTolerance
    metrics: dict
    failures: list[str] = field(default_factory=list)
    ran_in: str = ""  # the precision the backend actually computed in (see ran_in_precision); "" before it was asked

    def ran_in_precision(self, actual: str) -> None:
        """Record what the backend ran in: a runtime may ignore a precision the CPU lacks (OpenVINO runs a bf16
        hint in f32 without native bf16), and a gate run in another precision did not measure this one."""
        self.ran_in = actual
        if actual != self.precision:
            self.failures.append(f"ran in {actual}, not {self.precision}: the gate did not measure {self.precision}")

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def verdict(self) -> str:
        return GATE_PASSED if self.passed else "failed: " + "; ".join(self.failures)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "precision": self.precision, "ran_in": self.ran_in, "images": self.images,
                "passed": self.passed,
                "verdict": self.verdict, "tolerance": asdict(self.tolerance), "metrics": self.metrics}


# ---------------------------------------------------------------- verdicts

def too_few_confident(metrics: dict) -> bool:
    """Whether top-1 agreement is counted on every image: fp32 is confident on fewer than MIN_CONFIDENT_IMAGES."""
    return metrics.get("confident_images", MIN_CONFIDENT_IMAGES) < MIN_CONFIDENT_IMAGES


def gated_top1(metrics: dict) -> tuple[float, str]:
    """The top-1 agreement the gate checks, and on which images."""
    if not too_few_confident(metrics):
        return metrics["top1_agreement_confident"], f"on the {metrics['confident_images']} confident images"
    return metrics["top1_agreement"], (f"on every image (too few confident ones: {metrics['confident_images']} < "
                                       f"{MIN_CONFIDENT_IMAGES})")


def accuracy(logits: torch.Tensor, targets: torch.Tensor) -> dict:
    """Top-1 / top-5 accuracy in percent."""
    k = min(5, logits.shape[1])
    top = logits.topk(k, dim=1).indices
    return {"top1": 100.0 * (top[:, 0] == targets).double().mean().item(),
            "top5": 100.0 * (top == targets[:, None]).any(dim=1).double().mean().item()}


def judge(kind: str, precision: str, reference: torch.Tensor, candidate: torch.Tensor,
          targets: torch.Tensor | None = None, tolerance: GateTolerance | None = None) -> GateResult:
    """Every check of the gate; failures name the number and its bound."""
    tolerance = tolerance or TOLERANCE_BY_PRECISION[precision]
    metrics = agreement_metrics(reference, candidate)
    failures = []
    top1, counted = gated_top1(metrics)
    if top1 < tolerance.min_top1_agreement:
        failures.append(f"top-1 agreement {_pct(top1)} {counted} < {_pct(tolerance.min_top1_agreement)}")
    if metrics["top5_agreement"] < tolerance.min_top5_agreement:
        failures.append(f"top-5 agreement {_pct(metrics['top5_agreement'])} < {_pct(tolerance.min_top5_agreement)}")
    if not metrics["relative_logit_error"] <= tolerance.max_relative_logit_error:
        failures.append(f"mean logit error {metrics['relative_logit_error']:.3f} of the fp32 logit spread "
                        f"> {tolerance.max_relative_logit_error:g}")
    if targets is not None:
        fp32, variant = accuracy(reference, targets), accuracy(candidate, targets)
        drop = {k: fp32[k] - variant[k] for k in fp32}
        metrics.update(fp32_accuracy=fp32, accuracy=variant, accuracy_drop_points=drop)
        if drop["top1"] > tolerance.max_accuracy_drop_points:
            failures.append(f"top-1 accuracy {variant['top1']:.2f}% vs fp32 {fp32['top1']:.2f}%: drop "
                            f"{drop['top1']:.2f} points > {tolerance.max_accuracy_drop_points:g}")
    return GateResult(kind, precision, reference.shape[0], tolerance, metrics, failures)


def label_targets(classes: list[str] | None, labels: list[int] | None, model_labels: list[str] | None,
                  outputs: int) -> tuple[torch.Tensor | None, str]:
    """Map an ImageFolder's class indices to the model's output indices: by label name (case, '_' and '-'
    ignored), or by folder names that are output indices ("0", "1", ...). (None, why) when they do not match."""
    if not classes or labels is None:
        return None, "no labelled validation folder: agreement with fp32 only"
    by_name = {_normalise(name): index for index, name in enumerate(model_labels or [])}
    if all(_normalise(c) in by_name for c in classes):
        mapping = [by_name[_normalise(c)] for c in classes]
        how = "class folders named after the model's labels"
    elif all(c.isdigit() and int(c) < outputs for c in classes):
        mapping = [int(c) for c in classes]
        how = "class folders named by output index"
    else:
        unknown = [c for c in classes if _normalise(c) not in by_name][:3]
        return None, (f"class folders ({', '.join(unknown)}, ...) are neither the model's labels nor output indices: "
                      "accuracy not computed, agreement with fp32 only")
    return torch.tensor([mapping[label] for label in labels]), how


def _normalise(name: str) -> str:
    return " ".join(name.lower().replace("_", " ").replace("-", " ").split())


# ---------------------------------------------------------------- reports

def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def render_table(results: list[GateResult]) -> str:
    lines = ["| artifact | precision | images | top-1 agree (confident) | top-5 agree | mean logit err (rel) | max logit err "
             "| top-1 acc (fp32) | top-5 acc (fp32) | drop top-1 / top-5 (points) | verdict |", "|" + "---|" * 11]
    for r in results:
        m = r.metrics
        acc = m.get("accuracy")
        top1 = f"{acc['top1']:.2f}% ({m['fp32_accuracy']['top1']:.2f}%)" if acc else "-"
        top5 = f"{acc['top5']:.2f}% ({m['fp32_accuracy']['top5']:.2f}%)" if acc else "-"
        drop = m.get("accuracy_drop_points")
        drops = f"{drop['top1']:.2f} / {drop['top5']:.2f}" if drop else "-"
        lines.append(f"| {r.kind} | {r.precision} | {r.images} | {_pct(m['top1_agreement'])} "
                     f"({_confident(m)}) | {_pct(m['top5_agreement'])} | {m['mean_logit_error']:.3g} ({m['relative_logit_error']:.3f}) "
                     f"| {m['max_logit_error']:.3g} | {top1} | {top5} | {drops} | {'pass' if r.passed else 'FAIL: ' + '; '.join(r.failures)} |")
    return "\n".join(lines)


def _confident(metrics: dict) -> str:
    count = metrics.get("confident_images", 0)
    return f"{_pct(metrics['top1_agreement_confident'])} of {count}" if count else "none"


def tolerance_lines() -> list[str]:
    return [f"- {p}: top-1 agreement >= {_pct(t.min_top1_agreement)} where fp32 is confident (top-1 ahead by "
            f">= {100 * CONFIDENT_MARGIN:g} probability points, when >= {MIN_CONFIDENT_IMAGES} such images; "
            "else on every image), fp32 top-1 in the top 5 >= "
            f"{_pct(t.min_top5_agreement)}, mean logit error <= {t.max_relative_logit_error:g} of the fp32 logit "
            f"spread, accuracy drop <= {t.max_accuracy_drop_points:g} point(s) (labelled folders)"
            for p, t in TOLERANCE_BY_PRECISION.items()]


def report_markdown(title: str, results: list[GateResult], context: dict) -> str:
    lines = [f"# Accuracy gate: {title}", "",
             "Each reduced-precision artifact against fp32 eager PyTorch on held-out images (not the calibration "
             "images). A variant is servable only if it passes.", "", render_table(results), "",
             "## Tolerances (export/precision/gate.py)", "", *tolerance_lines(), ""]
    for key, value in context.items():
        lines.append(f"- {key}: {value if not isinstance(value, (dict, list)) else json.dumps(value, default=str)}")
    return "\n".join(lines) + "\n"
