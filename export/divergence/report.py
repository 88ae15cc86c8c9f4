"""The divergence report of one form: the first module call out of tolerance, named with its op, module path and
the model's line, the error there and how it grows downstream. Markdown for parity.md, a dict for parity.json,
and one line for the failure message."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from export.divergence.compare import Matching, Row
from export.divergence.taps import short_source
from export.forms.tolerances import Tolerance

if TYPE_CHECKING:
    from export.divergence.sets import SetVerdict


@dataclass
class Divergence:
    kind: str
    inputs: str  # the parity input it was run on (and the rows of it)
    tolerance: Tolerance
    matching: Matching
    output_max_abs: float  # the form's own output against eager on the same rows (as served, optimizations on)
    runner_note: str
    definition: str = ""  # where the first diverging module's class defines forward (user modules)
    notes: list[str] = field(default_factory=list)
    cost: dict = field(default_factory=dict)  # seconds, peak_rss_mb, passes
    sets: SetVerdict | None = None  # a detector: its output compared as a set, and where the difference lies

    @property
    def first(self) -> Row | None:
        return self.matching.first

    def line(self) -> str:
        first = self.first
        if self.sets is not None:
            verdict = "the set agrees" if self.sets.passed else "the set differs"
            return f"{self.kind}: {verdict} ({self.sets.comparison.line()}); {self.sets.diagnosis}"
        if first is None and self.output_max_abs <= self.tolerance.atol:
            return f"{self.kind}: agrees with eager on these rows (every module output and the output within tolerance)"
        if first is None:
            return (f"{self.kind}: every module output within tolerance, the output off by max abs "
                    f"{self.output_max_abs:.3g}: the divergence is after the last module or outside them (see notes)")
        where = short_source(first.source) or "source line not kept"
        return (f"{self.kind}: first diverges at {first.key or '(model root)'} ({first.module_type}, {first.op}; "
                f"{where}): max abs {first.max_abs:.3g}" + (f" ({first.note})" if first.note else ""))

    def as_dict(self) -> dict:
        first = self.first
        return {"kind": self.kind, "inputs": self.inputs, "tolerance": vars(self.tolerance),
                "first": first.as_dict() if first else None, "definition": self.definition,
                "downstream": [r.as_dict() for r in self.matching.downstream()],
                "compared": len(self.matching.rows), "not_in_form": self.matching.missing,
                "output_max_abs": self.output_max_abs, "runner": self.runner_note, "notes": self.notes,
                "cost": self.cost, "summary": self.line(),
                "set": self.sets.as_dict() if self.sets is not None else None}

    def markdown(self) -> str:
        lines = [f"### Where {self.kind} diverges", "", f"**{self.line()}**", ""]
        if self.sets is not None:
            lines += self.sets.markdown() + [""]
        first = self.first
        if first is not None:
            lines += self._first_lines(first)
        output = ("" if self.sets is not None else
                  f"; the form's own output differs by max abs {self.output_max_abs:.3g}")
        lines += [f"Run on {self.inputs}; {len(self.matching.rows)} module outputs compared "
                  f"(tolerance atol {self.tolerance.atol:g} / rtol {self.tolerance.rtol:g}){output}. "
                  f"Intermediates: {self.runner_note}."]
        lines += [f"- {note}" for note in self.notes]
        if self.matching.missing:
            lines.append(f"- {len(self.matching.missing)} module call(s) left no value of their own in the form "
                         f"(folded or inlined): {', '.join(self.matching.missing[:8])}"
                         + (" ..." if len(self.matching.missing) > 8 else ""))
        if self.cost:
            lines.append(f"- cost: {self.cost.get('seconds')} s, peak RSS {self.cost.get('peak_rss_mb')} MB, "
                         f"{self.cost.get('passes')} pass(es)")
        return "\n".join(lines) + "\n"

    def _first_lines(self, first: Row) -> list[str]:
        lines = [f"- module: `{first.key or '(model root)'}` ({first.module_type}); op in the form: `{first.op}`",
                 f"- line in the form: {short_source(first.form_source) or 'not kept by this exporter'}; "
                 f"eager's: {short_source(first.eager_source) or '-'}"]
        if first.form_source and first.eager_source and first.form_source != first.eager_source:
            lines.append("  (the form's value comes from another line than eager's: it may have taken another path)")
        if self.definition:
            lines.append(f"- the module's forward: {short_source(self.definition)}")
        lines += ["", "| module | type | op | line | max abs | rel. L2 | within |", "|---|---|---|---|---|---|---|"]
        lines += [f"| `{r.key or '(root)'}` | {r.module_type} | {r.op} | {short_source(r.source)} | {_abs(r)} "
                  f"| {_l2(r)} | {'yes' if r.within else 'NO'}{' - ' + r.note if r.note else ''} |"
                  for r in self.matching.downstream()]
        return lines + [""]


def _abs(row: Row) -> str:
    return "-" if row.shape_differs else f"{row.max_abs:.3g}"  # no element-wise difference between other shapes


def _l2(row: Row) -> str:
    return "-" if row.shape_differs else f"{row.relative_l2:.3g}"
