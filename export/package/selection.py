"""Which artifacts may serve: the gated candidates the archive ships, decided at export by a declared rule; which
of them serves is chosen on the serving machine at load (runtime/form_choice.py).

A kind may serve when, in the serving preference (export.forms.kinds: each row's rank and its reason), it
  (a) passed parity against eager PyTorch,
  (b) was not flagged by trace-vs-script as silently diverging from eager on any probe input,
  (c) for a reduced-precision variant (int8, bf16, fp16): passed the accuracy gate (export/precision/gate.py); it
      inherits (a) and (b) from the fp32 artifact it was made from, and
  (d) accepts the input the handler sends (N x C x crop height x crop width, from the image contract).
`--serve KIND` makes one kind, among those that meet (a)-(d), the archive's only candidate. Export timings are
recorded for information only: the same model always gets the same candidates. Kinds without a rank are served
only when asked for.

Hardware: every kind declares what it needs to run and to be fast (export.forms.kinds: runs_on, fast_on; an
artifact may add needs of its own, e.g. int8 made with 8-bit weights needs VNNI to be exact). The servable kinds,
in preference order and cut after the first that needs nothing (every machine meets it, so the list ends there),
are the gated candidates the archive ships. The manifest's `served` is the first the target machine
meets (`--target PROFILE`, runtime.machine.PROFILES; default: this machine: runtime.form_choice.declared_choice).
At load the engine serves, among the candidates its machine meets, the first of this order within a margin of the
fastest, measured there (runtime.form_choice.choose).

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
from runtime import machine
from runtime.form_choice import candidate_unmet, declared_choice
from runtime.machine import CPU, CUDA, MachineProfile, Needs, this_machine_profile

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
    runs_on: Needs | None = None  # this artifact's own needs to run, where they are stricter than its kind's


def exclusion(candidate: Candidate, handler_input: tuple[int, ...] | None, any_size: bool = False) -> str | None:
    """Why a candidate may not be served, or None when it may (any_size: the handler sends whole images of any
    size, a detector's or a segmenter's)."""
    if not candidate.passed_parity:
        return "failed parity"
    if candidate.diverging_on:
        return f"silently diverges from eager on: {', '.join(candidate.diverging_on)}"
    if candidate.gate is not None and candidate.gate != GATE_PASSED:
        return f"{GATE_VERDICT_PREFIX} {candidate.gate}"
    if handler_input is None:
        return "the model takes no image input the handler can send"
    if any_size and not candidate.spatial_dynamic:
        return (f"takes exactly {'x'.join(map(str, candidate.fixed_size[1:]))}, the handler sends whole images of "
                "any size")
    if not candidate.spatial_dynamic and tuple(candidate.fixed_size) != tuple(handler_input):
        return (f"takes exactly {'x'.join(map(str, candidate.fixed_size))}, the handler sends "
                f"{'x'.join(map(str, handler_input))}")
    return None


def decide(candidates: list[Candidate], handler_input: tuple[int, ...] | None, requested: str | None = None,
           preference: tuple[str, ...] | None = None, target: MachineProfile | None = None,
           any_size: bool = False) -> ServingDecision:
    """The manifest's serving decision for the target machine (default: this one): the gated candidates in order,
    the first the target meets, and why every other kind is not a candidate there."""
    preference = kinds.serving_preference() if preference is None else preference
    target = target or this_machine_profile()
    reasons = {c.kind: exclusion(c, handler_input, any_size) for c in candidates}
    ordered = [k for k in preference if k in reasons] + [k for k in reasons if k not in preference]
    gated = gated_candidates([c for c in candidates if reasons[c.kind] is None], preference)
    chosen = declared_choice(gated, target).kind
    verdicts = {k: (SERVED if k == chosen else reasons[k] or _servable_note(k, preference, gated, target))
                for k in ordered}
    decision = ServingDecision(served=chosen, rule=RULE, preference=list(preference), candidates=verdicts,
                               servable=[k for k in ordered if reasons[k] is None], target=target.name,
                               gated=gated)
    return redecide(decision, requested) if requested else decision


def gated_candidates(servable: list[Candidate], preference: tuple[str, ...]) -> list[dict]:
    """The servable kinds in preference order, each with its needs, cut after the first that needs nothing."""
    by_kind = {c.kind: c for c in servable}
    gated = []
    for name in (k for k in preference if k in by_kind):
        gated.append(candidate_entry(name, by_kind[name].runs_on))
        if gated[-1]["runs_on"] == Needs().as_dict() and gated[-1]["fast_on"] == Needs().as_dict():
            break
    return gated


def candidate_entry(name: str, runs_on: Needs | None = None) -> dict:
    """A gated candidate as the manifest records it: the kind, what it needs to run (the artifact's own needs
    where it has them, else its kind's) and to be fast."""
    kind = kinds.get(name)
    return {"kind": name, "runs_on": (runs_on or kind.runs_on).as_dict(), "fast_on": kind.fast_on.as_dict(),
            "fast_why": kind.fast_why}


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
    return replace(decision, served=requested, requested=requested, speed_only=speed_only, candidates=candidates,
                   gated=[_requested_candidate(decision, requested)])


def _requested_candidate(decision: ServingDecision, requested: str) -> dict:
    """A kind asked for is the archive's one candidate, with the needs the export recorded for it."""
    recorded = next((c for c in decision.gated if c["kind"] == requested), None)
    return recorded if recorded is not None else candidate_entry(requested)


def _servable_note(kind: str, preference: tuple[str, ...], gated: list[dict], target: MachineProfile) -> str:
    candidate = next((c for c in gated if c["kind"] == kind), None)
    unmet = candidate_unmet(candidate, target) if candidate is not None else None
    if unmet:
        return f"servable on another machine ({target.name}: {unmet})"
    if kind in preference:
        return "servable (later in the preference order)"
    return "servable when asked for (--serve): " + kinds.get(kind).rank_reason


def artifact_needs(kind: str, made_by: dict, device: str) -> Needs | None:
    """An artifact's own needs to run correctly, where they are stricter than its kind's: an AOTInductor package
    runs only on the device and CPU instruction set it was compiled for; int8 made with 8-bit weights is exact
    only where ONNX Runtime's kernels do not saturate (VNNI)."""
    row = kinds.get(kind)
    if row.format == kinds.AOTI:
        isa = "avx512f" if "avx512f" in machine.cpu_flags() else "avx2"
        return Needs(CUDA if device.startswith(CUDA) else CPU, ((isa,),))
    if made_by.get("reduce_range") is False and machine.is_x86():
        return replace(row.runs_on, cpu_any=row.runs_on.cpu_any + (machine.VNNI_FLAGS,))
    return None
