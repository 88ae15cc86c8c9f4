"""A form whose output is a set (a detector's boxes, labels, scores, masks): the output is compared as parity
compares it (gates.boxes, the family's SetTolerance), the tensors inside (backbone, FPN, heads)
element-wise as any model's, and the report says which part holds the difference: a layer, a control flow
that differs (the first module whose output shape differs: what a trace that froze a size or a count looks
like), or the data-dependent part after the last tensor of a fixed shape (thresholds, NMS, the cap)."""

from __future__ import annotations

from dataclasses import dataclass

from export.divergence.compare import Matching, Row
from export.forms.tolerances import SetTolerance
from gates.boxes import Detections, SetComparison, compare_detections

ROOT = ""  # the model's own call: its value is the set, compared as a set, never element-wise
SHOWN_BOXES = 5  # boxes listed of those only on one side


@dataclass
class SetVerdict:
    comparison: SetComparison
    tolerance: SetTolerance
    diagnosis: str

    @property
    def passed(self) -> bool:
        return self.comparison.passed

    def as_dict(self) -> dict:
        return {**self.comparison.as_dict(), "tolerance": self.tolerance.describe(), "diagnosis": self.diagnosis}

    def markdown(self) -> list[str]:
        found = self.comparison
        lines = [f"- the output as a set ({self.tolerance.describe()}, as parity): {found.line()}",
                 f"- worst matched box IoU {_g(found.worst_box_iou)}, worst score difference "
                 f"{_g(found.worst_score_diff)}" + (f", worst mask IoU {_g(found.worst_mask_iou)}"
                                                    if found.worst_mask_iou is not None else "")]
        for side, boxes in (("only eager's", found.missing), ("only the form's", found.extra)):
            if boxes:
                shown = ", ".join(f"label {b['label']} score {b['score']} at {b['box']}" for b in boxes[:SHOWN_BOXES])
                lines.append(f"- {len(boxes)} box(es) {side}: {shown}" + (" ..." if len(boxes) > SHOWN_BOXES else ""))
        return lines + [f"- **{self.diagnosis}**"]


def is_set(tolerance) -> bool:
    return isinstance(tolerance, SetTolerance)


def compare_set_outputs(eager_output, form_output, tolerance: SetTolerance) -> SetComparison:
    return compare_detections(Detections.of(eager_output), Detections.of(form_output), tolerance, tolerance.limits)


def without_root(matching: Matching) -> Matching:
    """The module calls compared element-wise: all but the model's own, whose value is the set."""
    return Matching([r for r in matching.rows if r.key.split("@")[0] != ROOT], matching.missing)


def diagnose(kind: str, matching: Matching, comparison: SetComparison) -> str:
    """Which part of the model holds the difference, in one sentence."""
    first = matching.first
    agreed = _last_agreeing(matching, first)
    before = (f"every tapped layer before it agrees (up to `{agreed.key}`)" if agreed else
              "it is the first layer tapped: what differs is computed before it, outside any module")
    if first is not None and first.shape_differs:
        return (f"the control flow differs from eager's at `{first.key}` ({first.module_type}), the first module "
                f"whose output shape differs ({first.note}): a size or a count was fixed when the form was made{_frozen(kind)}; {before}; no "
                "element-wise difference is meaningful from there on")
    if first is not None and comparison.passed and _isolated(matching, first):
        return (f"the set agrees and every layer after `{first.key}` agrees: its one row out of tolerance is more "
                "likely a value the runner attributed to that module (the form's line differs from eager's) "
                "than a divergence")
    if first is not None:
        return (f"the first tensor out of tolerance is `{first.key}` ({first.module_type}), with the same shape "
                f"as eager's: a numeric divergence there, which the set inherits; {before}")
    if comparison.passed:
        return f"the set agrees with eager's and every tapped layer ({len(matching.rows)}) agrees"
    where = f" after `{agreed.key}`" if agreed else ""
    return (f"every tapped layer agrees ({len(matching.rows)} compared, up to `{agreed.key if agreed else '-'}`) "
            f"but the set differs: the difference is in the data-dependent part{where} (box decoding, the score "
            f"threshold, NMS, the cap on boxes), which keeps no tensor of a fixed shape to compare{_frozen(kind)}")


def _isolated(matching: Matching, first: Row) -> bool:
    return all(r.within for r in matching.rows[matching.rows.index(first) + 1:])


def _last_agreeing(matching: Matching, first: Row | None) -> Row | None:
    rows = matching.rows[:matching.rows.index(first)] if first is not None else matching.rows
    return next((r for r in reversed(rows) if r.within), None)


def _frozen(kind: str) -> str:
    if "traced" in kind:
        return (" (a trace records the sizes and loop counts of the image it was traced on: the pyramid's levels, "
                "the number of candidates an NMS loop ran over)")
    return ""


def _g(value) -> str:
    return "-" if value is None else f"{value:.6g}"
