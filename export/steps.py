"""The pipeline's steps that a form may fail, each refusing that form while the others go on: building it
(its exporter), inspecting it (ONNX checker, control-flow census), loading it (runtime/), running the parity
inputs. A refused form leaves the export (its file is removed) and is recorded by export.refusals with one
record shape. `require_servable` is the one place an export with too few forms fails."""

from __future__ import annotations

import time

from contract.records import ServingDecision
from export.checks.inspection import inspect_artifact
from export.checks.parity import ParityReport, UnderTest, parity_inputs, run_parity
from export.errors import ExportError
from export.forms import exporters, kinds
from export.forms.tolerances import held_to
from export.refusals import EXPORT_LOG, Refusals
from models.registry import ModelEntry
from runtime import RunOptions, open_artifact


def build_artifacts(context: exporters.BuildContext, timed, refusals: Refusals, chosen: list[str]) -> None:
    """The chosen fp32 kinds (export.forms.kinds.chosen_formats), in table order, into context.built. An exporter that
    fails refuses its kind (recorded with its reason, traceback in export.log) and the others go on; a kind
    made from a refused one is skipped with the reason."""
    for kind in map(kinds.get, chosen):
        missing = [n for n in kind.needs if n not in context.built]
        if missing:
            refusals.skip(kind.name, "needs", f"made from {', '.join(missing)}, which was not made")
            continue
        if kind.announce:  # a slow exporter says so before it starts
            refusals.progress.step(f"{kind.name}: {kind.announce} ...")
        started = time.perf_counter()
        try:
            with timed(kind.name, native=True):
                context.built[kind.name] = kind.build(context, kind)
        except Exception as error:  # noqa: BLE001 - any exporter may refuse a user's model: recorded, not raised
            refusals.refuse(kind.name, "build", error)
            continue
        refusals.progress.step(f"{kind.name}: {kind.exporter} -> {kind.file_name} "
                               f"({time.perf_counter() - started:.1f} s)")


def inspect_artifacts(artifacts: dict, refusals: Refusals) -> None:
    """Each kind's structural checks (ONNX checker, control-flow census); a form failing them is refused."""
    for kind, artifact in list(artifacts.items()):
        try:
            inspect_artifact(artifact)
        except Exception as error:  # noqa: BLE001 - a malformed file refuses its form only
            refusals.refuse(kind, "inspect", error)
            _drop(artifacts, kind)


def open_artifacts(artifacts: dict, device: str, refusals: Refusals) -> dict:
    """Each artifact opened through runtime/; one its runtime cannot load is refused."""
    backends = {}
    for kind, artifact in list(artifacts.items()):
        try:
            backends[kind] = open_artifact(artifact.format, artifact.path, RunOptions(device=device), name=kind)
        except Exception as error:  # noqa: BLE001 - the runtime refuses this file: its form is refused
            refusals.refuse(kind, "load", error)
            _drop(artifacts, kind)
    return backends


def parity_step(entry: ModelEntry, eager, artifacts: dict, backends: dict, refusals: Refusals) -> ParityReport:
    """Every artifact against eager. One that cannot run a parity input at all (its runtime raises on a batch
    size, or a size its kind claims) is refused; one that runs and differs fails parity (export.checks.parity)."""
    spec = entry.input_spec
    inputs = parity_inputs(spec.shape, spec.value_range, spatial_dynamic=spec.resizes_in_graph,
                           dynamic_batch=spec.dynamic_batch)
    parity = run_parity(eager, {k: UnderTest(backends[k], held_to(kinds.get(k).tolerance, entry.task,
                                                                        entry.limits), a.spatial_dynamic)
                                for k, a in artifacts.items()}, inputs)
    for kind, comparison in parity.unrunnable().items():
        parity.drop(kind)
        backends.pop(kind)
        refusals.refuse(kind, "parity", CannotRunError(
            f"its runtime cannot run parity input '{comparison.inputs}' of shape {comparison.shape}: "
            f"{comparison.metrics['error']}\n{comparison.metrics.get('traceback', '')}"))
        _drop(artifacts, kind)
    return parity


class CannotRunError(ExportError):
    """An artifact was made but its runtime cannot run an input its kind claims (traceback in export.log)."""


def _drop(artifacts: dict, kind: str) -> None:
    """A refused form leaves the export: its file is removed from the stage."""
    artifacts.pop(kind).path.unlink(missing_ok=True)


def require_servable(entry: ModelEntry, parity: ParityReport, serving: ServingDecision, refusals: Refusals) -> None:
    """The export succeeds when a form passed parity and, for an image model, one may be served."""
    passed = [k for k in parity.summary() if parity.passed(k)]
    image_model = entry.input_spec.preprocessing is not None or entry.input_spec.resize_rule is not None
    if passed and (serving.served or not image_model):
        return
    lines = [f"  {k}: {r.line()}" for k, r in refusals.records.items()]
    lines += [f"  {k}: {why}" for k, why in serving.candidates.items()]
    what = "no form could be made that passed parity" if not passed else "no form may be served"
    raise ExportError(f"{entry.name}: {what}:\n" + "\n".join(lines) + f"\nfull tracebacks: {EXPORT_LOG} in the "
                      "failed export folder")
