"""The box-level gate for a detector's reduced-precision variant: its boxes against fp32 eager's on held-out photos.

Each photo's boxes are matched to fp32's with parity's comparator (gates.boxes.compare_detections:
same label, box IoU from the precision's bound, greedy from fp32's best score). Over all photos the gate counts
recall (fp32's boxes matched), precision (the variant's boxes matched), the matched boxes' mean IoU and the
largest score difference of a matched pair, and holds each to its bound (export.precision.gate.BOX_TOLERANCE_BY_PRECISION). A failure names the
photo and how many boxes it lost or added. When fp32 finds no box on any held-out photo the gate cannot judge,
and says so: a variant it cannot judge is never served.

The metrics are pure functions of two answers per photo (gates.boxes.Detections), tested on their own.
"""

from __future__ import annotations

from contract.records import DetectionLimits
from export.precision.gate import BOX_TOLERANCE_BY_PRECISION, BoxGateTolerance, GateResult
from gates.boxes import Detections, SetComparison, SetTolerance, compare_detections


def judge_boxes(kind: str, precision: str, reference: dict[str, Detections], candidate: dict[str, Detections],
                limits: DetectionLimits, tolerance: BoxGateTolerance | None = None) -> GateResult:
    """Every check of the box-level gate on the photos of `reference` (fp32's answers, by photo name)."""
    tolerance = tolerance or BOX_TOLERANCE_BY_PRECISION[precision]
    sets = SetTolerance(box_iou=tolerance.box_iou, score_atol=tolerance.max_score_diff,
                        edge=tolerance.max_score_diff, mask_iou=tolerance.min_mask_iou, limits=limits)
    found = {name: compare_detections(reference[name], candidate[name], sets, limits) for name in reference}
    matched = [c for c in found.values() if c.matched]
    mean_iou = (sum(c.mean_box_iou * c.matched for c in matched) / sum(c.matched for c in matched)
                if matched else None)  # over every matched pair of every photo
    metrics = {**box_metrics(found), "mean_box_iou": mean_iou}
    return GateResult(kind, precision, len(reference), tolerance, metrics, box_failures(metrics, tolerance))


def box_metrics(found: dict[str, SetComparison]) -> dict:
    """Counts over all photos, recall and precision of the matched boxes, the worst pair, and each photo's row."""
    photos = [photo_row(name, comparison) for name, comparison in found.items()]
    fp32, variant, matched = (sum(row[key] for row in photos) for key in ("fp32_boxes", "boxes", "matched"))
    scores = [row["worst_score_diff"] for row in photos if row["worst_score_diff"] is not None]
    ious = [row["worst_box_iou"] for row in photos if row["worst_box_iou"] is not None]
    return {"fp32_boxes": fp32, "boxes": variant, "matched": matched,
            "recall": matched / fp32 if fp32 else None, "precision": matched / variant if variant else None,
            "worst_score_diff": max(scores, default=None), "worst_box_iou": min(ious, default=None),
            "photos": photos}


def photo_row(name: str, comparison: SetComparison) -> dict:
    return {"photo": name, "fp32_boxes": comparison.reference_count, "boxes": comparison.candidate_count,
            "matched": comparison.matched, "lost": comparison.reference_count - comparison.matched,
            "added": comparison.candidate_count - comparison.matched, "worst_box_iou": comparison.worst_box_iou,
            "worst_score_diff": comparison.worst_score_diff, "worst_mask_iou": comparison.worst_mask_iou}


def box_failures(metrics: dict, tolerance: BoxGateTolerance) -> list[str]:
    """Each check out of bounds, naming the photos where boxes were lost or added; or why the gate cannot judge."""
    if not metrics["fp32_boxes"]:
        return [f"cannot judge: fp32 finds no box on any of the {len(metrics['photos'])} held-out photos"]
    failures = []
    if metrics["recall"] < tolerance.min_recall:
        failures.append(f"recall {_pct(metrics['recall'])} < {_pct(tolerance.min_recall)}: "
                        + _where(metrics, "lost", "fp32_boxes"))
    precision = metrics["precision"] if metrics["precision"] is not None else 0.0
    if precision < tolerance.min_precision:
        failures.append(f"precision {_pct(precision)} < {_pct(tolerance.min_precision)}: "
                        + _where(metrics, "added", "boxes"))
    if metrics["mean_box_iou"] is not None and metrics["mean_box_iou"] < tolerance.min_mean_box_iou:
        failures.append(f"matched boxes overlap fp32's by IoU {metrics['mean_box_iou']:.3f} on average < "
                        f"{tolerance.min_mean_box_iou:g}")
    worst = metrics["worst_score_diff"]
    if worst is not None and worst > tolerance.max_score_diff:
        photo = max((row for row in metrics["photos"] if row["worst_score_diff"] is not None),
                    key=lambda row: row["worst_score_diff"])["photo"]
        failures.append(f"a matched score differs by {worst:.3g} > {tolerance.max_score_diff:g} on {photo}")
    if tolerance.min_mask_iou and any(row["worst_mask_iou"] is not None and row["worst_mask_iou"] < tolerance.min_mask_iou
                                      for row in metrics["photos"]):
        failures.append(f"a matched mask overlaps fp32's by less than IoU {tolerance.min_mask_iou:g}")
    return failures


def _where(metrics: dict, key: str, of: str) -> str:
    rows = [row for row in metrics["photos"] if row[key]]
    return "; ".join(f"{row['photo']}: {row[key]} of {row[of]} boxes {key}" for row in rows)


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def render_box_table(results: list[GateResult]) -> str:
    """One row per variant and photo, then the variant's totals and verdict."""
    lines = ["| artifact | photo | fp32 boxes | boxes | matched | worst IoU | worst score diff | verdict |",
             "|" + "---|" * 8]
    for result in results:
        m = result.metrics
        for row in m["photos"]:
            lines.append(f"| {result.kind} | {row['photo']} | {row['fp32_boxes']} | {row['boxes']} | {row['matched']} "
                         f"| {_number(row['worst_box_iou'])} | {_number(row['worst_score_diff'])} | |")
        recall = _pct(m["recall"]) if m["recall"] is not None else "-"
        precision = _pct(m["precision"]) if m["precision"] is not None else "-"
        mean = _number(m.get("mean_box_iou"))
        lines.append(f"| {result.kind} | **all {result.images}: recall {recall}, precision {precision}, mean IoU {mean}** "
                     f"| {m['fp32_boxes']} | {m['boxes']} | {m['matched']} | {_number(m['worst_box_iou'])} "
                     f"| {_number(m['worst_score_diff'])} | {'pass' if result.passed else 'FAIL: ' + '; '.join(result.failures)} |")
    return "\n".join(lines)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def tolerance_lines() -> list[str]:
    return [f"- {precision}: boxes matched to fp32's of the same label from IoU {t.box_iou:g}, their mean IoU >= "
            f"{t.min_mean_box_iou:g}; recall >= "
            f"{_pct(t.min_recall)} and precision >= {_pct(t.min_precision)} over all held-out photos; matched scores "
            f"within {t.max_score_diff:g}; masks from IoU {t.min_mask_iou:g}"
            for precision, t in BOX_TOLERANCE_BY_PRECISION.items()]
