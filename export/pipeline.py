"""The export pipeline: build -> eval check -> every artifact -> ONNX checks -> parity -> trace vs script ->
labels, reports, manifest (last). Everything is built in a staging folder and swapped in whole."""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from contract.errors import VisionExportError
from contract.records import LABELS_NAME, ArtifactRecord, Manifest, ModelInfo, OutputRecord, ServingDecision
from export.atomic import atomic_write_text, ensure_free_space, staged_directory
from export.checks.decode import record_decode_check
from export.checks.eval_mode import prepare_for_export
from export.checks.parity import ParityReport, report_json, report_markdown
from export.checks.second_opinion import reference_agreement, second_opinion_markdown
from export.checks.trace_vs_script import CONCLUSION, ArtifactUnderTest, compact_table, compare_paths, markdown_section
from export.errors import ExportError
from export.forms import exporters, kinds
from export.interrupt import stop_if_interrupted
from export.interrupt import watch as watch_interrupts
from export.package.archive import ArchiveRequest, PendingArchive, prepare_archive
from export.package.manifest import file_record, write_manifest
from export.package.selection import Candidate, decide
from export.precision.request import PrecisionRequest
from export.precision.variants import PrecisionReport, build_variants, requested_variant_kinds
from export.refusals import EXPORT_LOG, Refusals
from export.steps import build_artifacts, inspect_artifacts, open_artifacts, parity_step, require_servable
from export.warnings_log import WarningLog
from models.registry import BuiltModel, ModelEntry
from models.weights import state_dict_fingerprint
from runtime.eager import EagerBackend
from runtime.timing import time_runs

LATENCY_WARMUP = 1
LATENCY_RUNS = 5  # batch-1 latency is recorded for information; it never chooses the served artifact


class Progress:
    """One line per step with the elapsed time; warnings the user must see stand out."""

    def __init__(self, stream=None, quiet: bool = False):
        self.stream = stream or sys.stdout
        self.quiet = quiet
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def step(self, message: str) -> None:
        stop_if_interrupted()
        if not self.quiet:
            print(f"[{self.elapsed():6.1f}s] {message}", file=self.stream, flush=True)

    def warn(self, message: str) -> None:
        print(f"\n  !!! WARNING: {message}\n", file=self.stream, flush=True)


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


@dataclass
class ExportResult:
    out: Path
    manifest: Manifest
    parity: ParityReport
    trace_vs_script: dict
    warnings: WarningLog
    timings: dict = field(default_factory=dict)
    archive: Path | None = None


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
    log = WarningLog()
    timings: dict[str, float] = {}

    def timed(name: str, native: bool = False):
        return _Timer(name, timings, log, native)

    refusals = Refusals(stage, progress)
    built = _build(entry, options, timed, progress)
    module, example = built.module, entry.example_input()
    chosen = kinds.chosen_formats(options.formats, also=options.serve)
    ensure_free_space(stage, kinds.estimated_bytes(exporters.parameter_bytes(module), chosen))
    context = _verified_context(entry, module, example, stage, options, timed, progress)
    progress.step(formats_line(chosen))
    build_artifacts(context, timed, refusals, chosen)
    artifacts = context.built
    with timed("inspect"):
        inspect_artifacts(artifacts, refusals)
    onnx_count = sum(a.format == "onnx" for a in artifacts.values())
    progress.step(f"onnx.checker (full) and strict shape inference passed on {onnx_count} ONNX files")

    eager = EagerBackend(module)
    with timed("load"):
        backends = open_artifacts(artifacts, options.device, refusals)
    with timed("parity"):
        parity = parity_step(entry, eager, artifacts, backends, refusals)
    _print_parity(parity, progress)

    second_opinion = {}
    if entry.reference_check:
        with timed("reference_evaluator"):
            second_opinion = reference_agreement(artifacts, backends, entry.probe_inputs())
        progress.step("onnx.reference.ReferenceEvaluator vs ONNX Runtime: " + ", ".join(
            f"{k} {'agree' if v['agree'] else 'DISAGREE'} (max abs {v['max_abs']:.1e})"
            for k, v in second_opinion.items()))

    with timed("trace_vs_script"):
        units = [ArtifactUnderTest(k, a.format, backends[k], a.control_flow, kinds.get(k).tolerance)
                 for k, a in artifacts.items()]
        paths = compare_paths(eager, units, entry.probe_inputs(), log.of_category("TracerWarning"),
                              missing={k: r.line() for k, r in refusals.records.items()})
    progress.step("trace vs script on probe inputs:\n" + compact_table(entry.name, paths))
    _warn_divergence(entry, paths, progress)

    with timed("latency"):
        latency = measure_latency({k: backends[k] for k in artifacts if parity.passed(k)}, example)
    variants = None
    if options.precision.wanted:
        with timed("precision"):
            variants = _variants(stage, options, entry, module, built, artifacts, parity, paths, refusals, progress)
    serving = serving_decision(entry, artifacts, parity, paths, variants, options.serve)
    serving.latency_ms_batch1 = latency

    files = _write_reports(stage, entry, built.labels, parity, paths, second_opinion)
    if options.fail_on_parity:
        parity.raise_on_failure()  # inside the stage: the failed attempt is kept, the last good export stays
    if variants and options.precision.gate == "enforce":
        variants.raise_on_failure()  # the same: accuracy.md stays in NAME.failed with every number
    require_servable(entry, parity, serving, refusals)
    manifest = Manifest(
        model=ModelInfo(entry.name, entry.family, entry.description, dict(entry.source)),
        weights=built.weights.describe(), input=entry.input_spec.record(),
        output=output_record(module, example, built.labels), opset=options.opset)
    manifest.artifacts = {k: _artifact_record(stage, a, entry) for k, a in artifacts.items()}
    if variants:
        manifest.artifacts.update(_variant_records(stage, variants, artifacts, entry))
        manifest.precision = variants.manifest_record()
        files += variants.files
    if refusals.has_log():
        files.append(EXPORT_LOG)
    manifest.refused = refusals.records
    with timed("decode_check"):
        record_decode_check(stage, manifest, serving, options.device, options.decode, progress.step)
    manifest.files = {name: file_record(stage, name) for name in files}
    manifest.parity = {"passed": not parity.failures, "summary": parity.summary(),
                       "reference_evaluator": second_opinion}
    manifest.trace_vs_script = {"diverging": paths["diverging"],
                                "verdicts": {r["artifact"]: r["verdict"] for r in paths["rows"]},
                                "missing": paths["missing"], "warning": divergence_warning(paths) or ""}
    manifest.serving = serving
    manifest.warnings = log.as_list()
    manifest.exporter_output = log.output_as_dict()
    manifest.timings_s = {k: round(v, 2) for k, v in timings.items()}
    write_manifest(stage, manifest)  # last: its presence means the folder is complete
    return ExportResult(Path(options.out), manifest, parity, paths, log, timings)


def _build(entry: ModelEntry, options: ExportOptions, timed, progress: Progress) -> BuiltModel:
    """The module with the weights asked for; its state_dict fingerprint recognises the same weights later."""
    with timed("build"):
        built = entry.build(options.weights)
        built.weights.state_dict_sha256 = state_dict_fingerprint(built.module)
    if built.weights.note:
        progress.warn(built.weights.note)
    progress.step(f"built {entry.name} (weights: {built.weights.line()})")
    return built


def _verified_context(entry, module, example, stage, options, timed, progress) -> exporters.BuildContext:
    """Eval mode verified on the module (an error: every form is made from it) and on its torch.export form
    (when that is another module and fails, only the forms made from it are refused, by their exporter)."""
    with timed("eval_check"):
        prepare_for_export(module, example)
        export_form = exporters.torch_export_form(module)
        if export_form is not module:
            try:
                prepare_for_export(export_form, example)
            except VisionExportError as error:
                export_form = error
    progress.step("eval mode verified (module and its torch.export form): no submodule training, no grads, "
                  "repeatable outputs")
    return exporters.BuildContext(module, export_form, example, stage, options.opset,
                                entry.input_spec.resizes_in_graph, options.device)


def formats_line(chosen: list[str]) -> str:
    """What will be built, and each kind left out with why (a default one only when --formats left it out)."""
    left_out = [k for k in kinds.fp32_kinds() if k.name not in chosen]
    notes = "; ".join(f"{k.name} not built: {k.off_by_default or 'not in --formats'}" for k in left_out)
    return f"building {', '.join(chosen)}" + (f" ({notes}; --formats chooses)" if notes else "")


def _variants(stage, options, entry, module, built, artifacts, parity, paths, refusals, progress):
    """The reduced-precision variants asked for (each one that cannot be made is refused inside); when none
    can be made at all, each is refused with the reason and the fp32 forms go on."""
    try:
        variants = build_variants(stage, options.precision, module, entry.input_spec.preprocessing, artifacts,
                                  eligible_sources(artifacts, parity, paths), built.labels, options.device,
                                  progress, refusals)
    except VisionExportError as error:
        for kind in requested_variant_kinds(options.precision.precisions):
            refusals.refuse(kind, "precision", error)
        return None
    _print_gate(variants, options.precision.gate, progress)
    return variants


def serving_decision(entry: ModelEntry, artifacts: dict, parity: ParityReport, paths: dict,
                     variants: PrecisionReport | None = None, requested: str | None = None) -> ServingDecision:
    """Apply export.package.selection's declared rule to this export's results. A reduced-precision variant inherits
    its fp32 source's parity and divergence, and carries its own accuracy-gate verdict."""
    diverging = _diverging(paths)
    example_size = tuple(entry.input_spec.shape[1:])
    candidates = [Candidate(kind, parity.passed(kind), tuple(diverging.get(kind, ())), a.spatial_dynamic,
                            example_size) for kind, a in artifacts.items()]
    for kind, variant in (variants.variants.items() if variants else ()):
        source = variant.source
        candidates.append(Candidate(kind, parity.passed(source), tuple(diverging.get(source, ())),
                                    artifacts[source].spatial_dynamic, example_size, gate=variant.gate.verdict))
    return decide(candidates, entry.input_spec.record().handler_input(), requested)


def _diverging(paths: dict) -> dict[str, list[str]]:
    diverging: dict[str, list[str]] = {}
    for item in paths["diverging"]:
        diverging.setdefault(item["artifact"], []).append(item["probe"])
    return diverging


def eligible_sources(artifacts: dict, parity: ParityReport, paths: dict) -> list[str]:
    """fp32 artifacts a reduced-precision variant may be made from: passed parity, never diverge from eager."""
    diverging = _diverging(paths)
    return [kind for kind in artifacts if parity.passed(kind) and kind not in diverging]


def _variant_records(stage: Path, variants: PrecisionReport, artifacts: dict, entry: ModelEntry) -> dict:
    records = {}
    for kind, variant in variants.variants.items():
        source = artifacts[variant.source]
        file = file_record(stage, variant.path.name)
        records[kind] = ArtifactRecord(
            kind=kind, path=file.path, sha256=file.sha256, bytes=file.bytes, format=variant.format,
            exporter=variant.made_by["tool"], spatial_dynamic=source.spatial_dynamic,
            accepts=source.accepts(entry.input_spec.shape), precision=variant.precision,
            run_precision=variant.run_precision, source=variant.source, details=variant.details())
    return records


def _print_gate(variants: PrecisionReport, mode: str, progress: Progress) -> None:
    from export.precision.gate import render_table
    results = [v.gate for v in variants.variants.values() if v.gate]
    progress.step("accuracy gate (vs fp32 eager, held-out images):\n" + render_table(results))
    for note in variants.notes:
        progress.warn(note)
    if variants.failures and mode == "report":
        progress.warn("ACCURACY GATE FAILED for " + ", ".join(r.kind for r in variants.failures) + " (--gate "
                      "report): kept in the export but NOT servable:\n" + render_table(variants.failures))


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


def _artifact_record(folder: Path, artifact: exporters.Artifact, entry: ModelEntry) -> ArtifactRecord:
    file = file_record(folder, artifact.path.name)
    return ArtifactRecord(kind=artifact.kind, path=file.path, sha256=file.sha256, bytes=file.bytes,
                          format=artifact.format, exporter=artifact.exporter,
                          spatial_dynamic=artifact.spatial_dynamic, accepts=artifact.accepts(entry.input_spec.shape),
                          control_flow=artifact.control_flow, checks=artifact.checks, details=artifact.details)


def output_record(module, example, labels) -> OutputRecord:
    """The output's shape and meaning; labels must name every class. Without labels the answers name each
    class by its index, and the record says so."""
    with torch.inference_mode():
        output = module(example)
    record = OutputRecord(shape=["batch"] + list(output.shape[1:]), dtype=str(output.dtype).replace("torch.", ""))
    classes = output.shape[1] if output.dim() == 2 else None
    if labels and len(labels) != classes:
        raise ExportError(f"{len(labels)} labels were given but the model's output has shape "
                          f"{tuple(output.shape)} ({classes or 'not'} classes); give one label per class")
    if labels:
        record.meaning, record.labels = "logits (apply softmax for probabilities)", LABELS_NAME
    elif classes:
        record.meaning = "logits; no labels given, so answers name each class by its index (--labels FILE names them)"
    record.classes = classes
    return record


def _write_reports(stage: Path, entry, labels, parity, paths, second_opinion) -> list[str]:
    written = []
    if labels:
        atomic_write_text(stage / LABELS_NAME, json.dumps({str(i): name for i, name in enumerate(labels)}, indent=1))
        written.append(LABELS_NAME)
    atomic_write_text(stage / "parity.md", report_markdown(parity, entry.name) + second_opinion_markdown(second_opinion))
    atomic_write_text(stage / "parity.json", report_json(parity))
    report = markdown_section(entry.name, entry.description, paths)
    atomic_write_text(stage / "report.md", f"# Trace vs script: {entry.name}\n\n{report}\n{CONCLUSION}\n")
    atomic_write_text(stage / "report.json", json.dumps({entry.name: paths}, indent=2, default=str))
    return written + ["parity.md", "parity.json", "report.md", "report.json"]


def measure_latency(backends: dict, example: torch.Tensor) -> dict[str, float]:
    """Median milliseconds per batch-1 call, for information (the served artifact is chosen by rule)."""
    return {kind: round(statistics.median(time_runs(lambda: backend(example), LATENCY_WARMUP, LATENCY_RUNS,
                                                    min_seconds=0)), 3)
            for kind, backend in backends.items()}


def divergence_warning(paths: dict) -> str | None:
    items = paths["diverging"]
    if not items:
        return None
    first = items[0]
    names = sorted({d["artifact"] for d in items})
    return (f"{', '.join(names)} silently diverge from eager on input '{first['probe']}' "
            f"(max abs diff {first['max_abs']:.3g}): the trace recorded one path of this model's control flow; "
            "serve the scripted artifact (or ONNX from it) for such inputs")


def _warn_divergence(entry, paths, progress) -> None:
    message = divergence_warning(paths)
    if message and entry.warn_on_divergence:
        progress.warn(message)
    elif message:
        progress.step("note: " + message)


def _print_parity(parity: ParityReport, progress: Progress) -> None:
    summary = parity.summary()
    cells = ", ".join(f"{k} {'ok' if s['passed'] else 'FAIL'} ({s['max_abs']:.1e})" for k, s in summary.items())
    progress.step(f"parity vs eager (max abs): {cells}")
