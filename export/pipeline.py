"""The export pipeline: build -> eval check -> every artifact -> ONNX checks -> parity -> trace vs script ->
reduced precision -> serving decision -> reports -> manifest (last). Everything is built in a staging folder and
swapped in whole. `_export_into` is the list of steps; each returns a record the later ones read."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from contract.errors import VisionExportError
from contract.records import Manifest, ServingDecision
from export.atomic import ensure_free_space, staged_directory
from export.checks.decode import record_decode_check
from export.checks.eval_mode import prepare_for_export
from export.checks.parity import ParityReport, parity_inputs
from export.checks.second_opinion import reference_agreement
from export.checks.trace_vs_script import ArtifactUnderTest, TraceVsScript, compare_paths
from export.forms import exporters, kinds
from export.forms.tolerances import held_to
from export.interrupt import watch as watch_interrupts
from export.package.archive import ArchiveRequest, PendingArchive, prepare_archive
from export.package.holdout import HeldOutPhotos, carry_holdout
from export.package.look import FormsRun, Looked, write_look
from export.package.manifest import ExportFindings, assemble_manifest, write_manifest
from export.package.pictures import kept_answer
from export.package.reports import write_reports
from export.package.selection import Candidate, artifact_needs, decide
from export.precision.detector_variants import DetectorSources, build_detector_variants
from export.precision.gate import GATE_ENFORCE
from export.precision.request import PrecisionRequest, automatic_skip_reason, sources_to_build
from export.precision.variants import PrecisionReport, VariantSources, build_variants
from export.progress_lines import Progress, print_divergence, print_gate, print_parity, print_second_opinion
from export.refusals import Refusals
from export.steps import build_artifacts, inspect_artifacts, open_artifacts, parity_step, require_servable
from export.warnings_log import WarningLog
from models.registry import BuiltModel, ModelEntry
from models.weights import state_dict_fingerprint
from runtime.eager import EagerBackend
from runtime.machine import MachineProfile, this_machine_profile


@dataclass
class ExportOptions:
    out: Path
    weights: str = "auto"
    opset: int = exporters.DEFAULT_OPSET
    device: str = "cpu"
    fail_on_parity: bool = True
    archive: ArchiveRequest | None = None  # also build NAME.mar, committed only with the export
    serve: str | None = None  # --serve: a kind to serve instead of the rule's first choice (same conditions)
    precision: PrecisionRequest = field(default_factory=PrecisionRequest)  # int8/bf16/fp16 variants, gated
    decode: str = "draft"  # --decode: draft where the decode check passes (export/checks/decode.py), or exact
    formats: list[str] | None = None  # --formats: the fp32 kinds to build (None: export.forms.kinds.default_formats)
    target: MachineProfile | None = None  # --target: the machine the serving order is decided for (None: this one)
    benchmark: bool = True  # --no-benchmark: no short latency per form in the table and report.html
    holdout: HeldOutPhotos | None = None  # --holdout-photos: checked, carried in the folder and its archive


@dataclass
class ExportResult:
    out: Path
    manifest: Manifest
    parity: ParityReport
    trace_vs_script: TraceVsScript
    warnings: WarningLog
    timings: dict = field(default_factory=dict)
    archive: Path | None = None
    forms_table: str = ""  # one row per form, printed last (export.package.form_table)


def export_model(entry: ModelEntry, options: ExportOptions, progress: Progress | None = None) -> ExportResult:
    """Build, prove and write every artifact; swap the folder (and the archive) in only when all passed."""
    progress = progress or Progress()
    watch_interrupts()
    pending: PendingArchive | None = None
    try:
        with staged_directory(Path(options.out)) as stage:
            result = _export_into(stage, entry, options, progress)
            if options.archive:
                pending = prepare_archive(stage, result.manifest, options.archive)
        progress.step(f"wrote {options.out}/ (manifest.json last); {result.warnings.summary_line()}")
        if pending:
            result.archive = pending.commit()
        result.out = Path(options.out)
        return result
    finally:
        if pending:
            pending.discard()


def _export_into(stage: Path, entry: ModelEntry, options: ExportOptions, progress: Progress) -> ExportResult:
    run = ExportRun(stage, entry, options, progress)
    built = build_model(run)
    forms = make_forms(run, built.module, sources_to_build(
        options.precision, options.formats is not None,
        automatic_skip_reason(options.precision, built.weights.kind, entry.input_spec.preprocessing is not None)),
        built.labels)
    checked = check_forms(run, built.module, forms)
    explain_divergence(run, built.module, checked)
    paths = compare_trace_and_script(run, checked)
    variants = make_variants(run, built, checked, paths)
    serving = decide_serving(run, checked, paths, variants)
    files = write_reports(stage, entry, built.labels, checked.parity, checked.second_opinion, paths)
    enforce(run, checked.parity, variants, serving)  # inside the stage: a failed attempt keeps every report
    manifest = assemble_manifest(stage, ExportFindings(
        entry=entry, built=built, example=run.example, opset=options.opset, artifacts=checked.artifacts,
        parity=checked.parity, second_opinion=checked.second_opinion, trace_vs_script=paths, variants=variants,
        serving=serving, refusals=run.refusals, reports=files))
    carry_holdout(stage, manifest, options.holdout, progress.step)
    check_decoding(run, manifest)
    looked = look(run, built, checked, paths, manifest)
    seal_manifest(run, manifest)  # last: its presence means the folder is complete
    return ExportResult(Path(options.out), manifest, checked.parity, paths, run.log, run.timings,
                        forms_table=looked.table)


@dataclass
class ExportRun:
    """What every step of one export shares: the staging folder, the model and what was asked, the progress
    lines, the refused forms, the warnings captured and each step's time."""

    stage: Path
    entry: ModelEntry
    options: ExportOptions
    progress: Progress
    log: WarningLog = field(default_factory=WarningLog)
    timings: dict[str, float] = field(default_factory=dict)
    refusals: Refusals = field(init=False)
    example: torch.Tensor = field(init=False)  # the entry's example input, made once

    def __post_init__(self):
        self.refusals = Refusals(self.stage, self.progress)
        self.example = self.entry.example_input()

    def timed(self, name: str, native: bool = False) -> _Timer:
        return _Timer(name, self.timings, self.log, native)


@dataclass
class Checked:
    """The forms held to eager: those left after loading and parity (a form its runtime cannot load or run is
    refused), each opened through runtime/, the parity report and the reference evaluator's opinion."""

    artifacts: dict[str, exporters.Artifact]
    eager: EagerBackend
    backends: dict
    parity: ParityReport
    second_opinion: dict = field(default_factory=dict)
    refused_backends: dict = field(default_factory=dict)  # forms refused once opened: still drawn in report.html


def build_model(run: ExportRun) -> BuiltModel:
    """The module with the weights asked for; its state_dict fingerprint recognises the same weights later."""
    with run.timed("build"):
        built = run.entry.build(run.options.weights)
        built.weights.state_dict_sha256 = state_dict_fingerprint(built.module)
    if built.weights.note:
        run.progress.warn(built.weights.note)
    run.progress.step(f"built {run.entry.name} (weights: {built.weights.line()})")
    return built


def make_forms(run: ExportRun, module: torch.nn.Module, sources: tuple[str, ...] = (),
               labels: list[str] | None = None) -> dict[str, exporters.Artifact]:
    """Every chosen fp32 form, built and structurally checked (kind -> Artifact; refused ones have left); `sources`:
    the off-by-default kinds the variants the tool chose are made from (the OpenVINO IR)."""
    requested = None if run.options.formats is None and not sources else (
        (run.options.formats or kinds.default_formats()) + list(sources))
    chosen = kinds.chosen_formats(requested, also=run.options.serve)
    ensure_free_space(run.stage, kinds.estimated_bytes(exporters.parameter_bytes(module), chosen))
    context = _verified_context(run, module)
    context.image, context.labels = run.entry.input_spec.preprocessing, labels
    run.progress.step(formats_line(chosen))
    build_artifacts(context, run.timed, run.refusals, chosen)
    with run.timed("inspect"):
        inspect_artifacts(context.built, run.refusals)
    onnx_count = sum(a.format == kinds.ONNX for a in context.built.values())
    run.progress.step(f"onnx.checker (full) and strict shape inference passed on {onnx_count} ONNX files")
    return context.built


def _verified_context(run: ExportRun, module: torch.nn.Module) -> exporters.BuildContext:
    """Eval mode verified on the module (an error: every form is made from it) and on its torch.export form
    (when that is another module and fails, only the forms made from it are refused, by their exporter)."""
    with run.timed("eval_check"):
        prepare_for_export(module, run.example)
        export_form = exporters.torch_export_form(module)
        if export_form is not module:
            try:
                prepare_for_export(export_form, run.example)
            except VisionExportError as error:
                export_form = error
    run.progress.step("eval mode verified (module and its torch.export form): no submodule training, no grads, "
                      "repeatable outputs")
    return exporters.BuildContext(module, export_form, run.example, run.stage, run.options.opset,
                                  run.entry.input_spec.resizes_in_graph, run.options.device,
                                  exporters.GraphIO(run.entry.outputs, run.entry.input_spec.dynamic_batch,
                                                    run.entry.input_spec.resize_rule is not None))


def formats_line(chosen: list[str]) -> str:
    """What will be built, and each kind left out with why (a default one only when --formats left it out)."""
    left_out = [k for k in kinds.fp32_kinds() if k.name not in chosen]
    notes = "; ".join(f"{k.name} not built: {k.off_by_default or 'not in --formats'}" for k in left_out)
    return f"building {', '.join(chosen)}" + (f" ({notes}; --formats chooses)" if notes else "")


def check_forms(run: ExportRun, module: torch.nn.Module, artifacts: dict[str, exporters.Artifact]) -> Checked:
    """Each form opened through runtime/ and held to eager (and, for small models, ONNX Runtime to the
    reference evaluator)."""
    eager = EagerBackend(module)
    with run.timed("load"):
        backends = open_artifacts(artifacts, run.options.device, run.refusals)
    with run.timed("parity"):
        opened = dict(backends)
        parity = parity_step(run.entry, eager, artifacts, backends, run.refusals)
    print_parity(parity, run.progress)
    checked = Checked(artifacts, eager, backends, parity,
                      refused_backends={k: b for k, b in opened.items() if k not in backends})
    if run.entry.reference_check:
        with run.timed("reference_evaluator"):
            checked.second_opinion = reference_agreement(artifacts, backends, run.entry.probe_inputs())
        print_second_opinion(checked.second_opinion, run.progress)
    return checked


def explain_divergence(run: ExportRun, module: torch.nn.Module, checked: Checked) -> None:
    """Where each form that failed parity first diverges (only on failure: it costs a run with every
    intermediate kept); parity.md / parity.json and the failure's message carry it."""
    if not checked.parity.failures:
        return
    from export.divergence.explain import explain_failures
    spec = run.entry.input_spec
    with run.timed("divergence"):
        checked.parity.divergence = explain_failures(
            checked.parity, module, checked.artifacts, checked.backends,
            parity_inputs(spec.shape, spec.value_range, spatial_dynamic=spec.resizes_in_graph,
                          dynamic_batch=spec.dynamic_batch), run.example)
    run.progress.step("where the failing forms diverge:\n    " + "\n    ".join(checked.parity.divergence_lines()))


def compare_trace_and_script(run: ExportRun, checked: Checked) -> TraceVsScript:
    """Every form against eager on the probe inputs that take other paths (export.checks.trace_vs_script)."""
    with run.timed("trace_vs_script"):
        units = [ArtifactUnderTest(k, a.format, checked.backends[k], a.control_flow,
                                   held_to(kinds.get(k).tolerance, run.entry.task, run.entry.limits))
                 for k, a in checked.artifacts.items()]
        paths = compare_paths(checked.eager, units, run.entry.probe_inputs(), run.log.of_category("TracerWarning"),
                              missing={k: r.line() for k, r in run.refusals.records.items()},
                              keep=kept_answer(run.entry.task))
    run.progress.step("trace vs script on probe inputs:\n" + paths.table(run.entry.name))
    print_divergence(run.entry, paths, run.progress)
    return paths


def make_variants(run: ExportRun, built: BuiltModel, checked: Checked, paths: TraceVsScript) -> PrecisionReport | None:
    """The reduced-precision variants asked for (each one that cannot be made is refused inside); when none
    can be made at all, each is refused with the reason and the fp32 forms go on."""
    request = run.options.precision
    if not request.wanted:
        return None
    if run.entry.held_out is not None:  # a trained detector: gated box by box on its held-out photos
        return _detector_variants(run, built, checked, paths)
    why_not = automatic_skip_reason(request, built.weights.kind, run.entry.input_spec.preprocessing is not None)
    if why_not:
        run.progress.step(f"reduced precision not built: {why_not}")
        return None
    if request.automatic:
        run.progress.step(f"reduced precision (--precision auto: the target's, for trained weights): "
                          f"{', '.join(request.variant_kinds)}; a variant failing its gate is set aside")
    sources = VariantSources(run.stage, built.module, run.entry.input_spec.preprocessing, checked.artifacts,
                             eligible_sources(checked.artifacts, checked.parity, paths), built.labels)
    with run.timed("precision"):
        try:
            variants = build_variants(sources, request, run.options.device, run.progress, run.refusals)
        except VisionExportError as error:
            for kind in request.variant_kinds:
                run.refusals.refuse(kind, "precision", error)
            return None
        print_gate(variants, request.gate, run.progress)
    return variants


def _detector_variants(run: ExportRun, built: BuiltModel, checked: Checked, paths: TraceVsScript) -> PrecisionReport | None:
    sources = DetectorSources(run.stage, built.module, checked.artifacts,
                              eligible_sources(checked.artifacts, checked.parity, paths), run.entry.held_out,
                              run.entry.limits, run.example, built.weights.kind)
    with run.timed("precision"):
        return build_detector_variants(sources, run.options.precision, run.options.device, run.progress, run.refusals)


def eligible_sources(artifacts: dict, parity: ParityReport, paths: TraceVsScript) -> list[str]:
    """fp32 artifacts a reduced-precision variant may be made from: passed parity, never diverge from eager."""
    diverging = paths.diverging_probes()
    return [kind for kind in artifacts if parity.passed(kind) and kind not in diverging]


def decide_serving(run: ExportRun, checked: Checked, paths: TraceVsScript,
                   variants: PrecisionReport | None) -> ServingDecision:
    """Apply export.package.selection's declared rule to this export's results, for the target machine. A
    reduced-precision variant inherits its fp32 source's parity and divergence, and carries its own accuracy-gate
    verdict."""
    diverging, spec = paths.diverging_probes(), run.entry.input_spec
    example_size = tuple(spec.shape[1:])
    candidates = [Candidate(kind, checked.parity.passed(kind), tuple(diverging.get(kind, ())), a.spatial_dynamic,
                            example_size, runs_on=artifact_needs(kind, {}, run.options.device))
                  for kind, a in checked.artifacts.items()]
    for kind, variant in (variants.variants.items() if variants else ()):
        source = variant.source
        candidates.append(Candidate(kind, checked.parity.passed(source), tuple(diverging.get(source, ())),
                                    checked.artifacts[source].spatial_dynamic, example_size,
                                    gate=variant.gate.verdict,
                                    runs_on=artifact_needs(kind, variant.made_by, run.options.device)))
    target = run.options.target or this_machine_profile()
    decision = decide(candidates, spec.record().handler_input(), run.options.serve, target=target,
                      any_size=spec.resize_rule is not None)
    return decision


def enforce(run: ExportRun, parity: ParityReport, variants: PrecisionReport | None, serving: ServingDecision) -> None:
    """The export fails here (the reports are written: the failed attempt keeps them, the last good export
    stays) on a parity failure, an enforced accuracy-gate failure, or nothing that may be served."""
    if run.options.fail_on_parity:
        parity.raise_on_failure()
    if variants and run.options.precision.gate == GATE_ENFORCE:
        variants.raise_on_failure()  # accuracy.md stays in NAME.failed with every number
    require_servable(run.entry, parity, serving, run.refusals)


def check_decoding(run: ExportRun, manifest: Manifest) -> None:
    """Draft decoding measured with the served artifact; the contract records the decode mode it earned."""
    with run.timed("decode_check"):
        record_decode_check(run.stage, manifest, manifest.decision(), run.options.device, run.options.decode,
                            run.progress.step)


def look(run: ExportRun, built: BuiltModel, checked: Checked, paths: TraceVsScript, manifest: Manifest) -> Looked:
    """The forms' table (report.json's "forms"), each form's latency (unless --no-benchmark) and report.html."""
    forms = FormsRun(checked.refused_backends, checked.parity.divergence_lines())
    with run.timed("report_html"):
        return write_look(run.stage, run.entry, built.labels, manifest, paths, forms, run.options.benchmark,
                          run.options.device)


def seal_manifest(run: ExportRun, manifest: Manifest) -> None:
    """What the whole run recorded (warnings, exporters' output, step times), then manifest.json, written last."""
    manifest.warnings = run.log.as_list()
    manifest.exporter_output = run.log.output_as_dict()
    manifest.timings_s = {k: round(v, 2) for k, v in run.timings.items()}
    write_manifest(run.stage, manifest)


class _Timer:
    """Times a step and captures its warnings and printed output (native: also what C++ code prints)."""

    def __init__(self, name, timings, log, native: bool = False):
        self.name, self.timings, self.stack = name, timings, contextlib.ExitStack()
        self.captures = [log.capture(name)] + ([log.native_output(name)] if native else [])

    def __enter__(self):
        self.start = time.perf_counter()
        for capture in self.captures:
            self.stack.enter_context(capture)

    def __exit__(self, *exc):
        self.stack.__exit__(*exc)
        self.timings[self.name] = self.timings.get(self.name, 0.0) + time.perf_counter() - self.start
        return False
