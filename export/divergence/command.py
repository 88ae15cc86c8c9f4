"""`python -m export explain FOLDER --kind KIND [--image PHOTO]`: one form of a finished export explained on
request, on the photo given, else on the first of the export's inputs (the probes it recorded the form wrong on,
then parity's, then the other probes) where it leaves its tolerance, else on the one where it comes closest; a
detector's output compared as a set (export.divergence.sets); a form the export refused is made again to be
explained (export.divergence.remake); the int8 form against its fp32 source on calibration images."""

from __future__ import annotations

from pathlib import Path

from contract.records import DETECTION
from export.divergence.explain import explain, runner_for
from export.divergence.inputs import candidates, failing_input
from export.divergence.remake import Form
from export.errors import ExportError
from export.forms import kinds
from export.forms.tolerances import held_to
from runtime import RunOptions, open_artifact


def explain_folder(folder: Path, manifest, entry, module, kind: str, progress, image: Path | None = None):
    records = manifest.artifacts
    if kind not in records and kind in manifest.refused:
        from export.divergence.remake import remade
        with remade(kind, manifest, entry, module, progress) as form:
            report = explain_form(kind, form, manifest, entry, module, progress, image)
        report.notes.insert(0, form.note)
        return report
    if kind not in records:
        refused = f"; refused: {', '.join(manifest.refused)}" if manifest.refused else ""
        raise ExportError(f"--kind {kind}: not in this export; its kinds: {', '.join(records)}{refused}")
    record = records[kind]
    if record.precision == "int8":
        return _explain_int8(folder, manifest, entry, module, record, progress)
    if record.precision != kinds.FP32:
        raise ExportError(f"--kind {kind}: a {record.precision} variant is gated on accuracy, not held to eager "
                          "layer by layer; explain its fp32 source instead (--kind "
                          f"{record.source})")
    form = Form(record.format, folder / record.path, record.spatial_dynamic)
    return explain_form(kind, form, manifest, entry, module, progress, image)


def explain_form(kind: str, form: Form, manifest, entry, module, progress, image: Path | None):
    tolerance = kinds.get(kind).tolerance
    sets = held_to(tolerance, DETECTION, entry.limits) if entry.task == DETECTION else None
    backend = open_artifact(form.format, form.path, RunOptions(), kind)
    tried = candidates(manifest, entry, kind, form.spatial_dynamic, image)
    found = failing_input(module, backend, sets or tolerance, tried, progress)
    progress.step(f"explaining {kind} on '{found.name}' (every intermediate of eager and the form kept)")
    runner = runner_for(form.format, form.path, module, entry.example_input())
    try:
        report = explain(kind, runner, module, found.output, found.batch, found.name, tolerance, sets=sets)
    except (RuntimeError, ValueError, IndexError) as error:  # the runtime with every value kept refused the input
        raise ExportError(f"{kind}: its intermediates could not be read on '{found.name}' ({type(error).__name__}: "
                          f"{str(error).strip().splitlines()[-1][:200] if str(error).strip() else ''}); try "
                          "another input with --image, or another kind") from None
    if found.not_run:
        report.notes.append("inputs the form does not run at all (an error, no intermediates to compare): "
                            + "; ".join(found.not_run))
    return report


def _explain_int8(folder: Path, manifest, entry, module, record, progress):
    from export.divergence.int8 import MAX_IMAGES, explain_int8
    from export.precision.calibration import calibration_set
    contract = entry.input_spec.preprocessing
    if contract is None:
        raise ExportError("the int8 form is explained on calibration images; this model takes no image")
    images = calibration_set(contract, None, MAX_IMAGES).images
    source = manifest.artifacts[record.source]
    progress.step(f"explaining {record.kind} against {record.source} on {len(images)} calibration images (SQNR)")
    fallback = record.details.get("made_by", {}).get("fp32_fallback")
    return explain_int8(folder / source.path, folder / record.path, images, fallback_record=fallback, module=module)
