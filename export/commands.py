"""The commands behind `python -m export`: each builds a registry entry and runs the pipeline."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from contract.files import atomic_write_text
from contract.policy import EXPORT_PINS, OPTIONS, PolicyChoices
from contract.records import Manifest
from contract.versions import split_versioned
from export.atomic import ensure_writable_dir
from export.checks.parity import UnderTest, parity_inputs, report_json, report_markdown, run_parity
from export.checks.trace_vs_script import CONCLUSION, MATCHES, REJECTED, TraceVsScript
from export.checks.trace_vs_script import report_json as trace_vs_script_json
from export.errors import ExportError
from export.forms import kinds
from export.forms.tolerances import held_to
from export.package.archive import ArchiveRequest
from export.package.holdout import checked_holdout
from export.package.manifest import verify_hashes
from export.package.rebuild import entry_from_manifest, weights_from_manifest
from export.pipeline import ExportOptions, Progress, export_model
from export.precision.gate import GATE_ENFORCE, GATE_REPORT
from export.precision.request import (
    AUTO_PRECISION,
    PrecisionRequest,
    check_hardware,
    parse_precisions,
    target_precisions,
)
from runtime import RunOptions, open_artifact
from runtime.eager import EagerBackend
from runtime.machine import PROFILES, MachineProfile, Needs, this_machine_profile

CONTROLFLOW_MODELS = ("cf-branch", "cf-loop", "cf-repeat", "resnet18")


def family_command(args) -> int:
    """python -m export FAMILY --arch ARCH (families come from the registry)."""
    import models
    from models.fine_tuned import own_checkpoint_entry
    own = own_checkpoint_entry(args.family, args.arch, args.weights, getattr(args, "labels", None),
                               getattr(args, "num_classes", None))
    entry = own or models.entry_of(args.family, args.arch)
    device, overrides = _device(args.device), _config_overrides(args)
    out = args.out or Path("artifacts") / entry.name
    progress = Progress()
    if own:
        progress.step(f"your model: {own.description}")
    archive = None if args.no_archive else ArchiveRequest(args.model_store, args.name or entry.name, overrides,
                                                          keep_versions=args.keep_versions, sign_key=args.sign_key)
    result = export_model(entry, _options(args, out, device, archive), progress)
    _print_resize_line(result.trace_vs_script, progress)
    _print_serving(result, progress)
    _print_refused(result, progress)
    _print_files(out, progress)
    _print_forms(result, out, progress)
    return 0


def module_command(args) -> int:
    from models.user_module import parse_input_shape
    from models.user_tasks import NOT_SERVED, module_entry
    device = _device(args.device)
    entry, found = module_entry(args.reference, parse_input_shape(args.input_shape), args.labels, args.task)
    out = args.out or Path("artifacts") / entry.name
    progress = Progress()
    progress.step(f"task: {found.task or 'none fits'} ({found.why}); {entry.description}")
    if found.task is None:
        progress.warn(f"exported but not served: {found.why}; {NOT_SERVED}"
                      + ("; no archive is written to --model-store" if args.model_store else ""))
    archive = (ArchiveRequest(args.model_store, args.name or entry.name, keep_versions=args.keep_versions,
                              sign_key=args.sign_key)
               if args.model_store and found.task else None)
    result = export_model(entry, _options(args, out, device, archive), progress)
    _print_serving(result, progress)
    _print_refused(result, progress)
    _print_files(out, progress)
    _print_forms(result, out, progress)
    return 0


def _options(args, out: Path, device: str, archive: ArchiveRequest | None) -> ExportOptions:
    """The export options of the family and module commands."""
    target = target_profile(args)
    return ExportOptions(out=out, weights=args.weights, opset=args.opset, device=device, archive=archive,
                         precision=precision_request(args, device, target), serve=args.serve, decode=args.decode,
                         formats=args.formats, target=target, benchmark=not args.no_benchmark,
                         holdout=checked_holdout(args.holdout_photos))


def target_profile(args) -> MachineProfile | None:
    """--target PROFILE -> the profile (None: this machine, decided at the serving step)."""
    return PROFILES[args.target] if getattr(args, "target", None) else None


def controlflow_command(args) -> int:
    import models
    progress = Progress()
    ensure_writable_dir(args.out)
    sections, tables, combined = [], [], {}
    for name in CONTROLFLOW_MODELS:
        entry = models.get(name)
        progress.step(f"--- {name}: {entry.description}")
        result = export_model(entry, ExportOptions(out=args.out / name, weights="random", opset=args.opset),
                              Progress(quiet=True))
        combined[name] = result.trace_vs_script
        sections.append(result.trace_vs_script.markdown(name, entry.description))
        tables.append(result.trace_vs_script.table(name))
        progress.step(f"{name} exported to {args.out / name}")
    header = ("# Trace vs script on control flow\n\nEach artifact is run on probe inputs: [1] is like the "
              "tracing example, the others take another path. WRONG = differs from eager with no error.\n\n")
    atomic_write_text(args.out / "report.md", header + "\n".join(sections) + "\n" + CONCLUSION + "\n")
    atomic_write_text(args.out / "report.json", trace_vs_script_json(combined))
    print("\n" + "\n\n".join(tables) + "\n\n" + CONCLUSION.replace("**", "") + "\n")
    progress.step(f"report: {args.out / 'report.md'} and report.json")
    return 0


def parity_command(args) -> int:
    """Re-check an export folder: hashes first (a modified file is named), then parity against eager."""
    folder, device = args.folder, _device(args.device)
    manifest, _, module, progress = _rebuilt(folder)
    candidates = {k: UnderTest(open_artifact(r.format, folder / r.path, RunOptions(device=device), k),
                               held_to(kinds.get(k).tolerance, manifest.task, manifest.limits),  # boxes as sets
                               r.spatial_dynamic)
                  for k, r in manifest.fp32_artifacts().items()}  # reduced-precision variants are gated instead
    report = run_parity(EagerBackend(module), candidates,
                        parity_inputs(manifest.input.example_shape, manifest.input.value_range,
                                      spatial_dynamic=manifest.input.resizes_in_graph,
                                      dynamic_batch=manifest.input.dynamic_batch))
    print(report.table())
    atomic_write_text(folder / "parity.recheck.md", report_markdown(report, manifest.model.name + " (re-check)"))
    atomic_write_text(folder / "parity.recheck.json", report_json(report))
    report.raise_on_failure()
    progress.step(f"parity passed for {', '.join(report.summary())}; wrote parity.recheck.md")
    return 0


def _rebuilt(folder: Path):
    """(manifest, entry, eval module, progress) of an export folder whose files match their sha256."""
    manifest = Manifest.read(folder)
    verify_hashes(folder, manifest)
    progress = Progress()
    progress.step(f"sha256 of {len(manifest.recorded_files())} files match manifest.json")
    entry = entry_from_manifest(manifest)
    built = entry.build(weights_from_manifest(manifest))
    _same_weights(manifest, built.module, progress)
    return manifest, entry, built.module.eval().requires_grad_(False), progress


def explain_command(args) -> int:
    """Where one form of an export diverges (export.divergence), on the first input it fails, else the worst."""
    from export.divergence.command import explain_folder
    manifest, entry, module, progress = _rebuilt(args.folder)
    report = explain_folder(args.folder, manifest, entry, module, args.kind, progress, args.image)
    print(report.markdown())
    for suffix, text in (("md", report.markdown()), ("json", json.dumps(report.as_dict(), indent=2, default=str))):
        atomic_write_text(args.folder / f"divergence.{args.kind}.{suffix}", text)
    progress.step(f"{report.line()}\nwrote {args.folder / f'divergence.{args.kind}.md'} and .json")
    return 0


def _same_weights(manifest: Manifest, module, progress: Progress) -> None:
    """The rebuilt weights are the exported ones (state_dict fingerprint), or parity would compare with others."""
    from models.weights import state_dict_fingerprint
    recorded, rebuilt = manifest.weights.get("state_dict_sha256"), state_dict_fingerprint(module)
    if recorded and recorded != rebuilt:
        raise ExportError(f"the rebuilt weights are not the exported ones (state_dict sha256 {rebuilt[:16]}, the "
                          f"manifest records {recorded[:16]}): the factory or its checkpoint changed since the "
                          "export; re-export, or restore the weights it was made from")
    if recorded:
        progress.step(f"rebuilt weights are the exported ones (state_dict sha256 {recorded[:16]})")


def precision_request(args, device: str, target: MachineProfile | None) -> PrecisionRequest:
    """--precision/--calibration/--validation/--gate -> the request, checked against this machine now, not after
    a minute of exporting."""
    for name in ("calibration", "validation"):
        folder = getattr(args, name)
        if folder is not None and not folder.is_dir():
            raise ExportError(f"--{name} {folder}: not a folder; give an ImageFolder layout DIR/<class>/<image>")
    if args.calibration_samples < 1:
        raise ExportError("--calibration-samples must be at least 1")
    automatic = args.precision == AUTO_PRECISION
    precisions = (_target_precisions(target, device, quiet=automatic) if args.precision in ("target", AUTO_PRECISION)
                  else parse_precisions(args.precision))
    if "int8" not in precisions and args.calibration is not None:
        raise ExportError("--calibration is for int8: add int8 to --precision (e.g. --precision fp32,int8)")
    check_hardware(precisions, device)
    gate = args.gate or (GATE_REPORT if automatic else GATE_ENFORCE)  # what the tool chose is set aside, not fatal
    return PrecisionRequest(precisions=precisions, calibration=args.calibration, validation=args.validation,
                            calibration_samples=args.calibration_samples, gate=gate,
                            target_flags=target.flags if target else None, automatic=automatic)


def _target_precisions(target: MachineProfile | None, device: str, quiet: bool = False) -> tuple[str, ...]:
    """--precision target, saying what is left out and why (quiet: the default, which needs no notice)."""
    target = target or this_machine_profile()
    chosen, left_out = target_precisions(target, device)
    if quiet:  # the export's own line says what the default built, once the weights are known
        return chosen
    for precision, why in left_out.items():
        print(f"--precision target: {precision} is fast on {target.name} but left out here: {why}", file=sys.stderr)
    print(f"--precision target ({target.name}): {','.join(chosen)}", file=sys.stderr)
    return chosen


def _config_overrides(args) -> dict:
    """The policy values the command pins in the archive, as model-config.yaml's keys (contract/policy.py's
    OPTIONS: their flags, their ranges, checked by PolicyChoices); TorchServe's worker count is a range, pinned at
    both ends."""
    chosen, overrides = PolicyChoices.from_flags(args), {}
    for option in (option for option in OPTIONS if option.name in EXPORT_PINS):
        if getattr(chosen, option.name) is not None:
            overrides[option.pin_key] = getattr(chosen, option.name)
    if chosen.workers is not None:
        overrides["maxWorkers"] = chosen.workers
    return overrides


def _device(name: str) -> str:
    import torch
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ExportError(f"--device {name!r} is not a device; use cpu or cuda[:N]") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ExportError(f"--device {name}: no CUDA device is visible here; use --device cpu")
    return str(device)


def _print_resize_line(paths: TraceVsScript, progress: Progress) -> None:
    """One line on the resize branch (the last probe): what each artifact does with a non-224 input."""
    probe = paths.probes[-1]
    parts = []
    for row in paths.rows:
        result = row.on(probe)
        if result.status == MATCHES:
            parts.append(f"{row.artifact} matches")
        elif result.status == REJECTED:
            parts.append(f"{row.artifact} rejects it")
        else:
            parts.append(f"{row.artifact} differs from eager by {result.max_abs:.3g} (no error)")
    progress.step(f"resize branch, input {probe}: " + "; ".join(parts))


def _print_serving(result, progress: Progress) -> None:
    serving = result.manifest.decision()
    excluded = {k: v for k, v in serving.candidates.items() if v != "served" and not v.startswith("servable")}
    chosen = f"{serving.served} (asked for with --serve)" if serving.requested else serving.served
    progress.step(f"served artifact: {chosen} (rule: {serving.rule})"
                  + "".join(f"\n    not {k}: {why}" for k, why in excluded.items()))
    if len(serving.gated) > 1:
        progress.step(f"candidates shipped in order ({serving.target} meets {serving.served} first); the engine "
                      "measures those its machine meets at load and serves the first within a margin of the "
                      "fastest:" + "".join(
                          f"\n    {c['kind']}: {_needs_words(c)}" for c in serving.gated))
    if result.archive:
        progress.step(f"TorchServe archive: {result.archive}" + _not_live_yet(result.archive))


def _not_live_yet(archive: Path) -> str:
    """A later version of a name beside its live one waits for a rollout (contract/versions.py)."""
    found = split_versioned(archive.stem)
    if found is None:
        return ""
    name, _ = found
    return (f"\n    {name}.mar is still the live version; `python -m serving rollout {name} {archive}` makes "
            "this one live once it agrees with it")


def _needs_words(candidate: dict) -> str:
    runs, fast = Needs.from_dict(candidate["runs_on"]), Needs.from_dict(candidate["fast_on"])
    return f"runs on {runs.words() if runs != Needs() else 'any machine'}" + (
        f", fast on {fast.words()}" if fast != Needs() else "")


def _print_refused(result, progress: Progress) -> None:
    """The summary's list of forms that were not made, and what that means for serving."""
    refused = result.manifest.refused
    if not refused:
        return
    progress.step(f"partial export: {len(refused)} form(s) not made; the served artifact was chosen among the "
                  f"{len(result.manifest.artifacts)} that were (tracebacks in {result.out / 'export.log'}):"
                  + "".join(f"\n    {kind}: {refusal.line()}" for kind, refusal in refused.items()))


def _print_forms(result, out: Path, progress: Progress) -> None:
    """The table of forms, then the export's last line: the page to open."""
    progress.step("forms (report.json 'forms'):\n" + result.forms_table)
    progress.step(f"report: {(out / 'report.html').resolve().as_uri()}")


def _print_files(out: Path, progress: Progress) -> None:
    listing = ", ".join(f"{p.name} ({p.stat().st_size / 1e6:.1f} MB)" for p in sorted(out.iterdir()) if p.is_file())
    progress.step(f"files in {out}: {listing}")
