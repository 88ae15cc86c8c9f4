"""manifest.json (contract.records.Manifest): assembled from what an export's steps found, written last, and
an export folder checked against it."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from contract.files import atomic_write_text
from contract.records import (
    DETECTION,
    LABELS_NAME,
    MANIFEST_NAME,
    SEGMENTATION,
    ArtifactRecord,
    FileRecord,
    Manifest,
    ModelInfo,
    OutputRecord,
    ServingDecision,
)
from export.checks.parity import ParityReport
from export.checks.trace_vs_script import TraceVsScript
from export.errors import ExportError, IntegrityError
from export.forms import kinds
from export.forms.exporters import Artifact
from export.precision.variants import PrecisionReport
from export.refusals import EXPORT_LOG, Refusals
from gates.masks import MASK_THRESHOLD
from models.registry import BuiltModel, ModelEntry
from runtime.integrity import file_sha256, mismatch


def library_versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import torch
    import torchvision
    return {"python": platform.python_version(), "torch": torch.__version__,
            "torchvision": torchvision.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__}


def file_record(folder: Path, name: str) -> FileRecord:
    path = Path(folder) / name
    return FileRecord(path=name, sha256=file_sha256(path), bytes=path.stat().st_size)


def write_manifest(folder: Path, manifest: Manifest) -> Path:
    """Last step of an export: its presence means the folder is complete."""
    manifest.versions = manifest.versions or library_versions()
    manifest.created = manifest.created or datetime.now(timezone.utc).isoformat(timespec="seconds")
    path = Path(folder) / MANIFEST_NAME
    atomic_write_text(path, manifest.to_json())
    return path


def verify_hashes(folder: Path, manifest: Manifest) -> None:
    """Every artifact and recorded file must exist with the recorded sha256; name each one that does not."""
    problems = {}
    expected = {r.path: r.sha256 for r in manifest.recorded_files()}
    for record in manifest.artifacts.values():
        expected.update(record.companions)  # an OpenVINO IR's weights, checked with it
    for path, sha256 in expected.items():
        problem = mismatch(Path(folder) / path, sha256)
        if problem:
            problems[path] = problem
    if problems:
        raise IntegrityError(problems)


@dataclass
class ExportFindings:
    """What an export's steps found, as manifest.json records it."""

    entry: ModelEntry
    built: BuiltModel
    example: torch.Tensor
    opset: int
    artifacts: dict[str, Artifact]  # the fp32 forms that passed every step
    parity: ParityReport
    second_opinion: dict  # onnx.reference.ReferenceEvaluator vs ONNX Runtime (small models)
    trace_vs_script: TraceVsScript
    variants: PrecisionReport | None
    serving: ServingDecision
    refusals: Refusals
    reports: list[str]  # files written beside the artifacts (export.package.reports)


def assemble_manifest(folder: Path, found: ExportFindings) -> Manifest:
    """The manifest of an export folder, from what its steps found: every artifact and file with its sha256,
    the checks' verdicts and the serving decision (the run's warnings and timings are added when it ends)."""
    entry, variants = found.entry, found.variants
    manifest = Manifest(model=ModelInfo(entry.name, entry.family, entry.description, dict(entry.source)),
                        weights=found.built.weights.describe(), input=entry.input_spec.record(),
                        output=OutputRecord(shape=[]), opset=found.opset, task=entry.task, limits=entry.limits)
    manifest.outputs = output_records(entry, found.built.module, found.example, found.built.labels)
    manifest.output = manifest.outputs[0]
    manifest.artifacts = {k: _artifact_record(folder, a, entry) for k, a in found.artifacts.items()}
    files = list(found.reports)
    if variants:
        manifest.artifacts.update(_variant_records(folder, variants, found.artifacts, entry))
        manifest.precision = variants.manifest_record()
        files += variants.files
    if found.refusals.has_log():
        files.append(EXPORT_LOG)
    manifest.refused = found.refusals.records
    manifest.files = {name: file_record(folder, name) for name in files}
    manifest.parity = {"passed": not found.parity.failures, "summary": found.parity.summary(),
                       "reference_evaluator": found.second_opinion}
    manifest.trace_vs_script = found.trace_vs_script.manifest_record()
    manifest.serving = found.serving
    return manifest


def output_records(entry: ModelEntry, module, example, labels) -> list[OutputRecord]:
    """Every output, named and described for the model's task."""
    if entry.task == DETECTION:
        return detection_records(entry.outputs, labels)
    record = output_record(module, example, labels)
    if entry.task == SEGMENTATION:
        record.shape = ["batch", record.shape[1], "height", "width"]
        record.meaning = "per-pixel class logits at the input's size (their argmax is the class map)"
        record.classes = record.shape[1]
    return [record]


DETECTION_MEANINGS = {
    "boxes": (["detections", 4], "float32", "x1 y1 x2 y2 in the input image's pixels"),
    "labels": (["detections"], "int64", "category index of each box (the labels file names it)"),
    "scores": (["detections"], "float32", "each box's score, best first, at least the model's threshold"),
    "masks": (["detections", 1, "height", "width"], "float32",
              f"each box's mask probabilities at the input's size (above {MASK_THRESHOLD} is the object)"),
}


def detection_records(outputs: tuple[str, ...], labels: list[str] | None) -> list[OutputRecord]:
    records = []
    for name in outputs:
        shape, dtype, meaning = DETECTION_MEANINGS[name]
        record = OutputRecord(shape=shape, name=name, dtype=dtype, meaning=meaning)
        if name == "labels" and labels:
            record.labels, record.classes = LABELS_NAME, len(labels)
        records.append(record)
    return records


def output_record(module, example, labels) -> OutputRecord:
    """The output's shape and meaning; labels must name every class. Without labels the answers name each
    class by its index, and the record says so."""
    with torch.inference_mode():
        output = module(example)
    record = OutputRecord(shape=["batch"] + list(output.shape[1:]), dtype=str(output.dtype).replace("torch.", ""))
    classes = output.shape[1] if output.dim() in (2, 4) else None  # a classifier's logits, a segmenter's maps
    if labels and len(labels) != classes:
        raise ExportError(f"{len(labels)} labels were given but the model's output has shape "
                          f"{tuple(output.shape)} ({classes or 'not'} classes); give one label per class")
    if labels:
        record.meaning, record.labels = "logits (apply softmax for probabilities)", LABELS_NAME
    elif classes:
        record.meaning = "logits; no labels given, so answers name each class by its index (--labels FILE names them)"
    record.classes = classes
    return record


def _artifact_record(folder: Path, artifact: Artifact, entry: ModelEntry) -> ArtifactRecord:
    file = file_record(folder, artifact.path.name)
    return ArtifactRecord(kind=artifact.kind, path=file.path, sha256=file.sha256, bytes=file.bytes,
                          format=artifact.format, exporter=artifact.exporter,
                          spatial_dynamic=artifact.spatial_dynamic, accepts=artifact.accepts(entry.input_spec.shape),
                          control_flow=artifact.control_flow, checks=artifact.checks, details=artifact.details,
                          companions=companion_records(folder, artifact.kind))


def _variant_records(folder: Path, variants: PrecisionReport, artifacts: dict, entry: ModelEntry) -> dict:
    records = {}
    for kind, variant in variants.variants.items():
        source = artifacts[variant.source]
        file = file_record(folder, variant.path.name)
        records[kind] = ArtifactRecord(
            kind=kind, path=file.path, sha256=file.sha256, bytes=file.bytes, format=variant.format,
            exporter=variant.made_by["tool"], spatial_dynamic=source.spatial_dynamic,
            accepts=source.accepts(entry.input_spec.shape), precision=variant.precision,
            run_precision=variant.run_precision, source=variant.source, details=variant.details(),
            companions=companion_records(folder, kind))
    return records


def companion_records(folder: Path, kind: str) -> dict:
    """The files the kind opens beside its own (its row's `companions`): name -> sha256."""
    return {name: file_sha256(Path(folder) / name) for name in kinds.get(kind).companions}
