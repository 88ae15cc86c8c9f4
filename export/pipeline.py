"""The export pipeline: build -> eval check -> every artifact -> ONNX checks -> parity -> trace vs script ->
labels, reports, manifest (last). Everything is built in a staging folder and swapped in whole."""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from export import formats
from export.archive import ArchiveRequest, PendingArchive, prepare_archive
from export.atomic import atomic_write_text, ensure_free_space, staged_directory
from export.eval_check import prepare_for_export
from export.manifest import Manifest
from export.onnx_check import check_onnx, onnx_control_flow, torchscript_control_flow
from export.precision import PrecisionReport, PrecisionRequest, build_variants
from export.parity import (ParityReport, compare_outputs, parity_inputs, report_json, report_markdown,
                           run_parity, ONNX_TOLERANCE)
from export.selection import Candidate, decide
from export.trace_vs_script import (CONCLUSION, ArtifactUnderTest, compact_table, compare_paths,
                                    markdown_section)
from export.warnings_log import WarningLog
from models.registry import ModelEntry
from runtime import RunOptions, open_artifact
from runtime.eager import EagerBackend

LABELS_FILE = "index_to_name.json"
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
        if not self.quiet:
            print(f"[{self.elapsed():6.1f}s] {message}", file=self.stream, flush=True)

    def warn(self, message: str) -> None:
        print(f"\n  !!! WARNING: {message}\n", file=self.stream, flush=True)


@dataclass
class ExportOptions:
    out: Path
    weights: str = "auto"
    opset: int = formats.DEFAULT_OPSET
    device: str = "cpu"
    fail_on_parity: bool = True
    archive: ArchiveRequest | None = None  # also build NAME.mar, committed only with the export
    precision: PrecisionRequest = field(default_factory=PrecisionRequest)  # int8/bf16/fp16 variants, gated


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

    def timed(name: str):
        return _Timer(name, timings, log)

    with timed("build"):
        built = entry.build(options.weights)
    if built.weights.note:
        progress.warn(built.weights.note)
    progress.step(f"built {entry.name} (weights: {built.weights.kind})")
    module, example = built.module, entry.example_input()
    ensure_free_space(stage, formats.estimated_bytes(module))
    with timed("eval_check"):
        prepare_for_export(module, example)
        export_form = formats.torch_export_form(module)
        if export_form is not module:
            prepare_for_export(export_form, example)
    progress.step("eval mode verified (module and its torch.export form): no submodule training, no grads, "
                  "repeatable outputs")

    artifacts, refused, scripted_modules = _export_artifacts(entry, module, export_form, example, stage,
                                                             options, timed, progress)
    with timed("onnx_check"):
        for artifact in artifacts.values():
            if artifact.format == "onnx":
                artifact.checks = check_onnx(artifact.path)
                artifact.control_flow = onnx_control_flow(artifact.path)
            else:
                artifact.control_flow = torchscript_control_flow(scripted_modules[artifact.kind])
    progress.step(f"onnx.checker (full) and strict shape inference passed on "
                  f"{sum(a.format == 'onnx' for a in artifacts.values())} ONNX files")

    eager = EagerBackend(module)
    with timed("load"):
        backends = {kind: open_artifact(a.format, a.path, RunOptions(device=options.device), name=kind)
                    for kind, a in artifacts.items()}
    with timed("parity"):
        inputs = parity_inputs(entry.input_spec.shape, entry.input_spec.value_range,
                               spatial_dynamic=entry.input_spec.resizes_in_graph)
        candidates = {k: (backends[k], a.format, a.spatial_dynamic) for k, a in artifacts.items()}
        parity = run_parity(eager, candidates, inputs)
    _print_parity(parity, progress)

    second_opinion = {}
    if entry.family == "controlflow":
        with timed("reference_evaluator"):
            second_opinion = reference_agreement(artifacts, backends, entry.probe_inputs())
        progress.step("onnx.reference.ReferenceEvaluator vs ONNX Runtime: " + ", ".join(
            f"{k} {'agree' if v['agree'] else 'DISAGREE'} (max abs {v['max_abs']:.1e})"
            for k, v in second_opinion.items()))

    with timed("trace_vs_script"):
        units = [ArtifactUnderTest(k, a.format, backends[k], a.control_flow) for k, a in artifacts.items()]
        paths = compare_paths(eager, units, entry.probe_inputs(), log.of_step("trace"))
    progress.step("trace vs script on probe inputs:\n" + compact_table(entry.name, paths))
    _warn_divergence(entry, paths, progress)

    with timed("latency"):
        latency = measure_latency({k: backends[k] for k in artifacts if parity.passed(k)}, example)
    variants = None
    if options.precision.wanted:
        with timed("precision"):
            variants = build_variants(stage, options.precision, module, entry.input_spec.preprocessing, artifacts,
                                      eligible_sources(artifacts, parity, paths), built.labels, options.device,
                                      progress)
        _print_gate(variants, options.precision.gate, progress)
    serving = serving_decision(entry, artifacts, parity, paths, variants)
    serving["latency_ms_batch1"] = latency

    manifest = Manifest(
        model={"name": entry.name, "family": entry.family, "description": entry.description, **entry.source},
        weights=built.weights.describe(),
        input={"name": formats.INPUT_NAME, **entry.input_spec.describe()},
        output=_output_spec(module, example, built.labels),
        opset=options.opset,
    )
    files = _write_reports(stage, entry, built.labels, parity, paths, second_opinion)
    if options.fail_on_parity:
        parity.raise_on_failure()  # inside the stage: the failed attempt is kept, the last good export stays
    if variants and options.precision.gate == "enforce":
        variants.raise_on_failure()  # the same: accuracy.md stays in NAME.failed with every number
    manifest.artifacts = {k: _artifact_record(manifest, stage, a, entry) for k, a in artifacts.items()}
    if variants:
        manifest.artifacts.update(_variant_records(manifest, stage, variants, artifacts, entry))
        manifest.precision = variants.manifest_record()
        files += variants.files
    manifest.refused = refused
    manifest.files = {name: manifest.record_file(stage, name) for name in files}
    manifest.parity = {"passed": not parity.failures, "summary": parity.summary(),
                       "reference_evaluator": second_opinion}
    manifest.trace_vs_script = {"diverging": paths["diverging"],
                                "verdicts": {r["artifact"]: r["verdict"] for r in paths["rows"]},
                                "warning": divergence_warning(paths) or ""}
    manifest.serving = serving
    manifest.warnings = log.as_list()
    manifest.exporter_output = log.output_as_dict()
    manifest.timings_s = {k: round(v, 2) for k, v in timings.items()}
    manifest.write(stage)  # last: its presence means the folder is complete
    return ExportResult(Path(options.out), manifest, parity, paths, log, timings)


def serving_decision(entry: ModelEntry, artifacts: dict, parity: ParityReport, paths: dict,
                     variants: PrecisionReport | None = None) -> dict:
    """Apply export.selection's declared rule to this export's results. A reduced-precision variant inherits
    its fp32 source's parity and divergence, and carries its own accuracy-gate verdict."""
    diverging = _diverging(paths)
    contract = entry.input_spec.preprocessing
    handler_input = (entry.input_spec.shape[1], *contract.crop) if contract else None
    candidates = [Candidate(kind, parity.passed(kind), tuple(diverging.get(kind, ())), a.spatial_dynamic,
                            tuple(entry.input_spec.shape[1:])) for kind, a in artifacts.items()]
    for kind, variant in (variants.variants.items() if variants else ()):
        source = variant.source
        candidates.append(Candidate(kind, parity.passed(source), tuple(diverging.get(source, ())),
                                    artifacts[source].spatial_dynamic, tuple(entry.input_spec.shape[1:]),
                                    gate=variant.gate.verdict))
    return decide(candidates, handler_input)


def _diverging(paths: dict) -> dict[str, list[str]]:
    diverging: dict[str, list[str]] = {}
    for item in paths["diverging"]:
        diverging.setdefault(item["artifact"], []).append(item["probe"])
    return diverging


def eligible_sources(artifacts: dict, parity: ParityReport, paths: dict) -> list[str]:
    """fp32 artifacts a reduced-precision variant may be made from: passed parity, never diverge from eager."""
    diverging = _diverging(paths)
    return [kind for kind in artifacts if parity.passed(kind) and kind not in diverging]


def _variant_records(manifest: Manifest, stage: Path, variants: PrecisionReport, artifacts: dict,
                     entry: ModelEntry) -> dict:
    records = {}
    for kind, variant in variants.variants.items():
        source = artifacts[variant.source]
        records[kind] = {**manifest.record_file(stage, variant.path.name), "format": variant.format,
                         "exporter": variant.made_by["tool"], "accepts": source.accepts(entry.input_spec.shape),
                         "spatial_dynamic": source.spatial_dynamic, **variant.record_extra()}
    return records


def _print_gate(variants: PrecisionReport, mode: str, progress: Progress) -> None:
    from export.accuracy import render_table
    results = [v.gate for v in variants.variants.values() if v.gate]
    progress.step("accuracy gate (vs fp32 eager, held-out images):\n" + render_table(results))
    for note in variants.notes:
        progress.warn(note)
    if variants.failures and mode == "report":
        progress.warn("ACCURACY GATE FAILED for " + ", ".join(r.kind for r in variants.failures) + " (--gate "
                      "report): kept in the export but NOT servable:\n" + render_table(variants.failures))


class _Timer:
    def __init__(self, name, timings, log):
        self.name, self.timings, self.capture = name, timings, log.capture(name)

    def __enter__(self):
        self.start = time.perf_counter()
        self.capture.__enter__()

    def __exit__(self, *exc):
        self.capture.__exit__(*exc)
        self.timings[self.name] = self.timings.get(self.name, 0.0) + time.perf_counter() - self.start
        return False


def _export_artifacts(entry, module, export_form, example, stage, options, timed, progress):
    artifacts, refused, script_modules = {}, {}, {}
    dynamic = entry.input_spec.resizes_in_graph
    with timed("trace"):
        traced, artifacts["traced"] = formats.trace(module, example, stage)
    with timed("script"):
        scripted, artifacts["scripted"] = formats.script(module, stage, dynamic)
    script_modules.update(traced=traced, scripted=scripted)
    progress.step("TorchScript: traced and scripted")
    with timed("onnx_legacy"):
        artifacts["onnx-traced"] = formats.onnx_legacy(traced, "onnx-traced", example, stage, options.opset, False)
        artifacts["onnx-scripted"] = formats.onnx_legacy(scripted, "onnx-scripted", example, stage, options.opset,
                                                         dynamic)
    progress.step(f"ONNX (legacy exporter, opset {options.opset}) from the traced and the scripted module")
    try:
        with timed("onnx_dynamo"):
            artifacts["onnx-dynamo"] = formats.onnx_dynamo(export_form, example, stage, options.opset, dynamic)
        progress.step("ONNX (torch.export-based exporter)")
    except Exception as error:  # the exporter refuses some models: recorded in the manifest, the rest go on
        reason = f"{type(error).__name__}: {_first_lines(str(error))}"
        refused["onnx-dynamo"] = reason
        progress.step(f"ONNX (torch.export-based exporter) REFUSED: {reason[:200]}")
    return artifacts, refused, script_modules


def _first_lines(text: str, count: int = 3) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines()[:count])[:600]


def _artifact_record(manifest: Manifest, folder: Path, artifact: formats.Artifact, entry: ModelEntry) -> dict:
    return {**manifest.record_file(folder, artifact.path.name), "format": artifact.format,
            "exporter": artifact.exporter, "accepts": artifact.accepts(entry.input_spec.shape),
            "spatial_dynamic": artifact.spatial_dynamic, "control_flow": artifact.control_flow, "precision": "fp32",
            **({"checks": artifact.checks} if artifact.checks else {})}


def _output_spec(module, example, labels) -> dict:
    with torch.inference_mode():
        output = module(example)
    spec = {"name": formats.OUTPUT_NAME, "shape": ["batch"] + list(output.shape[1:]), "dtype": str(output.dtype)}
    if labels:
        spec.update(meaning="logits (apply softmax for probabilities)", labels=LABELS_FILE, classes=len(labels))
    return spec


def _write_reports(stage: Path, entry, labels, parity, paths, second_opinion) -> list[str]:
    written = []
    if labels:
        atomic_write_text(stage / LABELS_FILE, json.dumps({str(i): name for i, name in enumerate(labels)}, indent=1))
        written.append(LABELS_FILE)
    atomic_write_text(stage / "parity.md", report_markdown(parity, entry.name) + _second_opinion_md(second_opinion))
    atomic_write_text(stage / "parity.json", report_json(parity))
    report = markdown_section(entry.name, entry.description, paths)
    atomic_write_text(stage / "report.md", f"# Trace vs script: {entry.name}\n\n{report}\n{CONCLUSION}\n")
    atomic_write_text(stage / "report.json", json.dumps({entry.name: paths}, indent=2, default=str))
    return written + ["parity.md", "parity.json", "report.md", "report.json"]


def _second_opinion_md(second_opinion: dict) -> str:
    if not second_opinion:
        return ""
    lines = ["", "## Second opinion: onnx.reference.ReferenceEvaluator vs ONNX Runtime", ""]
    for k, v in second_opinion.items():
        lines.append(f"- {k}: {'agree' if v['agree'] else 'DISAGREE'} (max abs {v['max_abs']:.2e} over {v['inputs']} inputs)")
        lines += [f"  - probe `{probe}` not run by the reference evaluator: {why}" for probe, why in v["skipped"].items()]
    return "\n".join(lines) + "\n"


def reference_agreement(artifacts, backends, probes: dict) -> dict:
    """ONNX Runtime against the spec-level reference evaluator on every probe (small models only)."""
    out = {}
    for kind, artifact in artifacts.items():
        if artifact.format != "onnx":
            continue
        reference = open_artifact("onnx-reference", artifact.path)
        worst, agree, count, skipped = 0.0, True, 0, {}
        for probe, tensor in probes.items():
            try:
                expected = reference(tensor)
            except Exception as error:  # e.g. a fixed-shape graph refuses other shapes: recorded, not hidden
                skipped[probe] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
                continue
            metrics, passed = compare_outputs(expected, backends[kind](tensor), ONNX_TOLERANCE)
            worst, agree, count = max(worst, metrics["max_abs"]), agree and passed, count + 1
        out[kind] = {"agree": agree and count > 0, "max_abs": worst, "inputs": count, "skipped": skipped}
    return out


def measure_latency(backends: dict, example: torch.Tensor) -> dict[str, float]:
    """Median milliseconds per batch-1 call, for information (the served artifact is chosen by rule)."""
    latency = {}
    for kind, backend in backends.items():
        for _ in range(LATENCY_WARMUP):
            backend(example)
        samples = []
        for _ in range(LATENCY_RUNS):
            start = time.perf_counter()
            backend(example)
            samples.append((time.perf_counter() - start) * 1000)
        latency[kind] = round(statistics.median(samples), 3)
    return latency


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
    if message and entry.family == "module":
        progress.warn(message)
    elif message:
        progress.step("note: " + message)


def _print_parity(parity: ParityReport, progress: Progress) -> None:
    summary = parity.summary()
    cells = ", ".join(f"{k} {'ok' if s['passed'] else 'FAIL'} ({s['max_abs']:.1e})" for k, s in summary.items())
    progress.step(f"parity vs eager (max abs): {cells}")
