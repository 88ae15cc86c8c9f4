"""Match a form's taps to eager's by module call and find the first one out of the form's tolerance.

Matching: eager's value of a module call is its output; the form's is the last value the form made within that
module's scope (its own ops or its children's). Exporters fold some modules into others (the TorchScript-based
ONNX exporter folds BatchNorm into the Conv before it): a module with no value of its own in the form is
compared through the module it was folded into, whose value then equals eager's value of the folded one.
Comparators stay apart from runners (Polygraphy's split): this module never runs a form.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from export.divergence.taps import Tap
from export.forms.tolerances import Tolerance

DOWNSTREAM_ROWS = 10  # rows shown from the first divergence on: how the error grows
# An intermediate is also within tolerance when its error is this many times the tolerance, relative to the whole
# tensor (L2): ONNX Runtime's rounding deep in ResNet-50 reads far above the tolerance on single near-zero values
# while the output agrees (docs/results/2026-11-25-divergence-report/); the faults this report names are off by a large share of their
# tensor.
L2_FACTOR = 10
SHAPE_NOTE = "shape "  # a row whose values have other shapes than eager's: the form took another path


@dataclass
class Row:
    """One module call compared: eager's output against the form's value made within that module."""

    key: str
    module_type: str  # eager's module class
    op: str  # the form's op that made the value
    form_source: str  # the model's line the form kept ("" when lost)
    eager_source: str  # the model's line behind eager's value
    shape: tuple[int, ...]
    max_abs: float
    relative_l2: float  # |form - eager|_2 / |eager|_2: how much of the signal is error
    within: bool
    note: str = ""  # "bn1 folded in", "shape (1, 10), eager (2, 10)"

    @property
    def source(self) -> str:
        return self.form_source or self.eager_source

    @property
    def shape_differs(self) -> bool:
        return self.note.startswith(SHAPE_NOTE)

    def as_dict(self) -> dict:
        return {"module": self.key, "module_type": self.module_type, "op": self.op, "source": self.source,
                "form_source": self.form_source, "eager_source": self.eager_source, "shape": list(self.shape),
                "max_abs": self.max_abs, "relative_l2": self.relative_l2, "within_tolerance": self.within,
                "note": self.note}


@dataclass
class Matching:
    rows: list[Row] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # eager module calls the form has no value for (inlined away)

    @property
    def first(self) -> Row | None:
        return next((r for r in self.rows if not r.within), None)

    def downstream(self, count: int = DOWNSTREAM_ROWS) -> list[Row]:
        first = self.first
        return self.rows[self.rows.index(first):][:count] if first else []


def owners(form: list[Tap]) -> dict[str, int]:
    """key -> index of the last form tap within that module call's scope (its own key, or a child's). A parent's
    first call is closed once a value outside it is made: a child's later call (`pnet.conv1@1`, the next pyramid
    level) then belongs to a later call of the parent, not to the first."""
    last: dict[str, int] = {}
    open_parents: set[str] = set()
    for index, tap in enumerate(form):
        last[tap.key] = index
        parts = tap.module.split(".") if tap.module else []
        enclosing = {".".join(parts[:depth]) for depth in range(len(parts))}
        open_parents &= enclosing | {tap.module}
        if tap.key == tap.module:  # a first call's own value: its children's values that follow are its too
            open_parents.add(tap.module)
        for parent in enclosing:
            if parent not in last or parent in open_parents:
                last[parent] = index
                open_parents.add(parent)
    return last


def match(eager: list[Tap], form: list[Tap], tolerance: Tolerance) -> Matching:
    """Compare every eager module call the form kept, in execution order."""
    owner, claimed, result = owners(form), set(), Matching()
    for position, reference in enumerate(eager):
        index = owner.get(reference.key)
        if index is None:
            result.missing.append(reference.key)
            continue
        if index in claimed or reference.value is None or form[index].value is None:
            continue  # a parent whose value is its last child's (already compared), or not kept in this pass
        if not _comparable(reference, form[index]):
            result.missing.append(reference.key)
            continue
        claimed.add(index)
        result.rows.append(compare_tap(reference, form[index], tolerance, _folded_run(owner, eager, position)))
    return result


def _folded_run(owner: dict, eager: list[Tap], position: int) -> list[Tap]:
    """The eager module calls right after `position` that the form has no value for (folded into this one)."""
    run = []
    for tap in eager[position + 1:]:
        if tap.key in owner:
            break
        if tap.value is not None:
            run.append(tap)
    return run


def compare_tap(reference: Tap, candidate: Tap, tolerance: Tolerance, folded: list[Tap]) -> Row:
    """The row for one module call; when the value is off but equals a module folded into it, that one's row."""
    row = _row(reference, candidate, tolerance)
    if row.within:
        return row
    for later in folded:
        fused = _row(later, candidate, tolerance)
        if fused.within:
            fused.key, fused.note = reference.key, f"{later.key} folded in"
            return fused
    return row


def _row(reference: Tap, candidate: Tap, tolerance: Tolerance) -> Row:
    expected, actual = _same_output(reference, candidate).double(), candidate.value.double()
    base = dict(key=reference.key, module_type=reference.op, op=candidate.op, form_source=candidate.source,
                eager_source=reference.source, shape=tuple(reference.shape))
    if expected.shape != actual.shape:
        return Row(**base, max_abs=float("inf"), relative_l2=float("inf"), within=False,
                   note=f"{SHAPE_NOTE}{tuple(actual.shape)}, eager {tuple(expected.shape)}")
    diff = (actual - expected).abs()
    finite = bool(torch.isfinite(actual).all())
    norm = expected.norm().item()
    relative_l2 = diff.norm().item() / norm if norm else diff.norm().item()
    elementwise = bool((diff <= tolerance.atol * _scale(expected) + tolerance.rtol * expected.abs()).all())
    within = finite and (elementwise or relative_l2 <= L2_FACTOR * max(tolerance.atol, tolerance.rtol))
    return Row(**base, max_abs=diff.max().item() if diff.numel() else 0.0, relative_l2=relative_l2, within=within,
               note="" if finite else "non-finite values")


def _comparable(reference: Tap, candidate: Tap) -> bool:
    """False for a module answering a tuple whose value in the form has none of its outputs' shapes: the form's
    last value within it is then not one of its outputs (an ONNX Flatten after its heads), and says nothing."""
    shapes = {tuple(reference.value.shape)} | {tuple(o.shape) for o in reference.others}
    return not reference.others or tuple(candidate.value.shape) in shapes


def _same_output(reference: Tap, candidate: Tap) -> torch.Tensor:
    """Eager's value to hold the form's to: of a module answering a tuple, the output of the form's shape."""
    if reference.value.shape == candidate.value.shape:
        return reference.value
    return next((o for o in reference.others if o.shape == candidate.value.shape), reference.value)


def _scale(expected: torch.Tensor) -> float:
    """The atol multiplier of an intermediate: its largest magnitude (at least 1). Activations grow to tens where
    logits stay near 1, and rounding noise grows with them: held to the output's absolute tolerance, a correct
    Conv with BatchNorm folded in (ONNX) reads out of tolerance on ResNet-50's later blocks."""
    return max(1.0, expected.abs().max().item()) if expected.numel() else 1.0


def plan_passes(eager_layout: list[Tap], budget: int) -> list[set[str]]:
    """The eager keys split into passes whose values (eager's and the form's, ~2x) fit the memory budget."""
    passes, current, used = [], set(), 0
    for tap in eager_layout:
        cost = 2 * tap.nbytes
        if current and used + cost > budget:
            passes.append(current)
            current, used = set(), 0
        current.add(tap.key)
        used += cost
    return passes + [current] if current else passes
