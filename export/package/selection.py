"""Which artifact is served: a declared, deterministic rule, applied once at export.

The served artifact is the first kind of the serving preference (export.forms.kinds: each row's rank and its
reason) that
  (a) passed parity against eager PyTorch,
  (b) was not flagged by trace-vs-script as silently diverging from eager on any probe input,
  (c) for a reduced-precision variant (int8, bf16, fp16): passed the accuracy gate (export/precision/gate.py); it
      inherits (a) and (b) from the fp32 artifact it was made from, and
  (d) accepts the input the handler sends (N x C x crop height x crop width, from the image contract).
`--serve KIND` picks another kind instead, only among those that meet (a)-(d). Export timings are recorded
for information only and never choose: the same model always gets the same artifact. Kinds without a rank
(bf16, fp16: fast only on hardware the exporting machine may not be) are served only when asked for.

The decision is recorded in the manifest (contract.records.ServingDecision) and only read afterwards: by the
archive, the handler and the deployment writers. `redecide` applies the same rule to a recorded decision
for a requested kind (the benchmark packages several kinds of one export).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from contract.records import ServingDecision
from export.errors import ExportError
from export.forms import kinds
from export.precision.gate import GATE_PASSED

RULE = ("first of the preference order that passed parity, does not silently diverge from eager on any "
        "probe input (trace vs script), passed the accuracy gate if reduced-precision, and accepts the "
        "handler's input; or the kind asked for with --serve when it meets the same conditions")
SERVED = "served"
GATE_VERDICT_PREFIX = "accuracy gate"


@dataclass(frozen=True)
class Candidate:
    kind: str
    passed_parity: bool
    diverging_on: tuple[str, ...]  # probe inputs where it silently differs from eager
    spatial_dynamic: bool
    fixed_size: tuple[int, ...]  # (C, H, W) the artifact was exported at
    gate: str | None = None  # reduced-precision variants: the accuracy gate's verdict; None for fp32 artifacts


def exclusion(candidate: Candidate, handler_input: tuple[int, ...] | None) -> str | None:
    """Why a candidate may not be served, or None when it may."""
    if not candidate.passed_parity:
        return "failed parity"
    if candidate.diverging_on:
        return f"silently diverges from eager on: {', '.join(candidate.diverging_on)}"
    if candidate.gate is not None and candidate.gate != GATE_PASSED:
        return f"{GATE_VERDICT_PREFIX} {candidate.gate}"
    if handler_input is None:
        return "the model takes no image input the handler can send"
    if not candidate.spatial_dynamic and tuple(candidate.fixed_size) != tuple(handler_input):
        return (f"takes exactly {'x'.join(map(str, candidate.fixed_size))}, the handler sends "
                f"{'x'.join(map(str, handler_input))}")
    return None


def decide(candidates: list[Candidate], handler_input: tuple[int, ...] | None, requested: str | None = None,
           preference: tuple[str, ...] | None = None) -> ServingDecision:
    """The manifest's serving decision: the chosen kind and why every other one was not."""
    preference = kinds.serving_preference() if preference is None else preference
    reasons = {c.kind: exclusion(c, handler_input) for c in candidates}
    ordered = [k for k in preference if k in reasons] + [k for k in reasons if k not in preference]
    chosen = next((k for k in ordered if k in preference and reasons[k] is None), None)
    verdicts = {k: (SERVED if k == chosen else reasons[k] or _servable_note(k, preference)) for k in ordered}
    decision = ServingDecision(served=chosen, rule=RULE, preference=list(preference), candidates=verdicts,
                               servable=[k for k in ordered if reasons[k] is None])
    return redecide(decision, requested) if requested else decision


def redecide(decision: ServingDecision, requested: str, speed_only_ungated: bool = False) -> ServingDecision:
    """The same decision with `requested` served, if the rule allows it. speed_only_ungated (the benchmark
    only) lets through a variant whose one fault is a failed accuracy gate, marked speed_only."""
    verdict = decision.candidates.get(requested)
    if verdict is None:
        raise ExportError(f"cannot serve {requested!r}: this export has {', '.join(decision.candidates)}")
    speed_only = requested not in decision.servable
    if speed_only and not (speed_only_ungated and verdict.startswith(GATE_VERDICT_PREFIX)):
        raise ExportError(f"refusing to serve {requested!r}: {verdict}; servable here: "
                          f"{', '.join(decision.servable) or 'none'}")
    candidates = {k: (SERVED if k == requested else
                      "servable (not requested)" if v == SERVED else v) for k, v in decision.candidates.items()}
    return replace(decision, served=requested, requested=requested, speed_only=speed_only, candidates=candidates)


def _servable_note(kind: str, preference: tuple[str, ...]) -> str:
    if kind in preference:
        return "servable (later in the preference order)"
    return "servable when asked for (--serve): " + kinds.get(kind).rank_reason
