"""The contract between export and serving: what an export folder and a TorchServe archive promise.

export/ writes these records (manifest.json, model-config.yaml's handler section); the handler, serving/,
the KServe/Triton writers, the GPU check and the example clients read them through this module only.
Standard library only, no torch: the archive ships this file beside contract/errors.py, and it sits in the
leftmost room so a registry entry can declare its ImageContract with the very class the handler reads.

A manifest written under another SCHEMA_VERSION is refused with both versions named: fields change meaning
between versions, and serving a half-understood manifest is worse than asking for a re-export.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from contract.errors import VisionExportError
from contract.versions import ModelVersion

SCHEMA_VERSION = 4  # 4: the task, every output, the resize rule of whole-image models; 3: refused kinds are Refusals
MANIFEST_NAME = "manifest.json"
FORM_TIMING_NAME = "form-timing.json"  # the export's timing of its candidates and its machine key (form_choice.py)
LABELS_NAME = "index_to_name.json"
INPUT_NAME = "input"  # the artifacts' input and output tensor names (ONNX graphs, Triton, v2 clients)
OUTPUT_NAME = "output"
# How request images are decoded (runtime/images.py): "exact" decodes every pixel; "draft" decodes large JPEGs at
# a reduced scale in the DCT domain, recorded by the export only when its decode check passed
# (export/checks/decode.py); the handler setting `decode: exact` turns it off.
DECODE_MODES = ("exact", "draft")
# What a model answers; each task has its own request core (handlers/), which refuses another task's archive.
CLASSIFICATION, DETECTION, SEGMENTATION = "classification", "detection", "segmentation"
TASKS = (CLASSIFICATION, DETECTION, SEGMENTATION)
_Record = TypeVar("_Record", bound="_Dataclass")


class ContractError(VisionExportError):
    """A manifest or handler setting this code cannot use; the message says which field and what to do."""


class SchemaVersionError(ContractError):
    """manifest.json was written under another schema version than this code reads."""

    def __init__(self, where: str, found: Any):
        self.found = found
        super().__init__(f"{where}: manifest schema version {found!r}, but this code reads version "
                         f"{SCHEMA_VERSION}; re-run the export (`python -m export ...`) with this version to "
                         f"rewrite it, or serve it with the version of this project that wrote it")


class _Dataclass(Protocol):  # any dataclass: what dataclasses.fields takes
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]


def _from_dict(cls: type[_Record], data: Any, where: str) -> _Record:
    """A dataclass from a JSON object: missing required fields and unknown fields are named."""
    if not isinstance(data, dict):
        raise ContractError(f"{where}: expected a JSON object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    required = [n for n, f in fields.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [n for n in required if n not in data]
    if unknown or missing:
        problems = [f"{kind} {', '.join(n)}" for kind, n in (("missing", missing), ("unknown", unknown)) if n]
        raise ContractError(f"{where}: {'; '.join(problems)}; re-run the export to rewrite it")
    return cls(**data)


def _plain(value: Any) -> Any:
    """Records to JSON-ready values (tuples become lists, nested records dicts)."""
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


# ---------------------------------------------------------------- the input and output of the model

@dataclass(frozen=True)
class ImageContract:
    """How request bytes become one input row: the evaluation transform of the weights (normalisation is
    inside the exported graph). The handler, the calibration reader and the v2 client all apply this."""

    resize: int  # the shorter side is resized to this many pixels
    crop: tuple[int, int]  # then a centre crop of (height, width)
    interpolation: str = "bilinear"
    antialias: bool = True
    decode: str = "exact"  # see DECODE_MODES
    source: str = ""  # where these numbers come from (e.g. the weights' own transforms())

    def __post_init__(self) -> None:
        object.__setattr__(self, "crop", tuple(int(v) for v in self.crop))
        if self.resize < 1 or len(self.crop) != 2 or min(self.crop) < 1:
            raise ContractError(f"preprocessing: resize {self.resize} and crop {self.crop} must be positive "
                                "(crop as height, width)")
        if self.decode not in DECODE_MODES:
            raise ContractError(f"preprocessing.decode {self.decode!r} is not one of {', '.join(DECODE_MODES)}")

    def to_dict(self) -> dict[str, Any]:
        return dict(_plain(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ImageContract":
        return _from_dict(cls, data, "manifest input.preprocessing")


@dataclass(frozen=True)
class ResizeRule:
    """How a whole-image model (a detector, a segmenter) wants its image: the shorter side to `min_side` unless
    the longer one would then pass `max_side` (torchvision's GeneralizedRCNNTransform), aspect kept; `fixed`
    (height, width): the model squeezes any image to it, so the image is only fitted within it. The handler
    sends images at this size, so the model's own resize changes nothing and a 12 MP photo is not copied whole
    into the graph; its answers are scaled back to the photo's pixels."""

    min_side: int
    max_side: int
    fixed: tuple[int, int] | None = None
    source: str = ""  # where these numbers come from (the model's transform)
    enlarge: bool = True  # False: a smaller image is sent at its own size (a model that looks at any scale)

    def __post_init__(self) -> None:
        if self.fixed is not None:
            object.__setattr__(self, "fixed", tuple(int(v) for v in self.fixed))
        if self.min_side < 1 or self.max_side < self.min_side:
            raise ContractError(f"resize rule: min_side {self.min_side} and max_side {self.max_side} must be "
                                "positive, max_side at least min_side")

    def scale(self, height: int, width: int) -> float:
        if self.fixed is not None:
            factor = min(self.fixed[0] / height, self.fixed[1] / width)
        else:
            factor = min(self.min_side / min(height, width), self.max_side / max(height, width))
        return factor if self.enlarge else min(factor, 1.0)

    def size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) an image of this size is sent at."""
        factor = self.scale(height, width)
        return max(1, round(height * factor)), max(1, round(width * factor))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ResizeRule":
        return _from_dict(cls, data, "manifest input.resize_rule")


@dataclass(frozen=True)
class DetectionLimits:
    """Where a detector stops keeping boxes: its score threshold and its cap on detections per image (parity
    excuses a box at that edge; a request may ask for a higher threshold or fewer boxes, never more)."""

    score_threshold: float
    max_detections: int

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DetectionLimits":
        return _from_dict(cls, data, "manifest limits")


@dataclass
class InputRecord:
    example_shape: tuple[int, ...]  # batch first
    name: str = INPUT_NAME
    dtype: str = "float32"
    layout: str = "NCHW"
    color: str = "RGB"
    value_range: tuple[float, float] = (0.0, 1.0)
    dynamic_batch: bool = True
    resizes_in_graph: bool = False  # any spatial size at or above min_size is resized in the graph
    min_size: int = 0
    preprocessing: ImageContract | None = None  # None: not an image model the handler can serve
    resize_rule: ResizeRule | None = None  # whole-image models (detection, segmentation): the image's size

    def __post_init__(self) -> None:
        self.example_shape = tuple(int(d) for d in self.example_shape)
        if len(self.value_range) != 2:
            raise ContractError(f"input.value_range must be (low, high), got {self.value_range!r}; re-run the export")
        self.value_range = (float(self.value_range[0]), float(self.value_range[1]))
        preprocessing: object = self.preprocessing  # a dict where read from JSON (Manifest.from_dict)
        if isinstance(preprocessing, dict):
            self.preprocessing = ImageContract.from_dict(preprocessing)
        resize_rule: object = self.resize_rule
        if isinstance(resize_rule, dict):
            self.resize_rule = ResizeRule.from_dict(resize_rule)

    def handler_input(self) -> tuple[int, ...] | None:
        """(C, H, W) of the rows the handler sends (a whole-image model: the example's; it sends any size), or
        None when the model takes no image."""
        if self.resize_rule is not None:
            return tuple(self.example_shape[1:])
        if self.preprocessing is None:
            return None
        return (self.example_shape[1], *self.preprocessing.crop)

    def image_contract(self) -> ImageContract:
        if self.preprocessing is None:
            raise ContractError("this model takes no RGB image input (N x 3 x H x W in [0, 1]), so the image "
                                "handler cannot serve it; export without --model-store")
        return self.preprocessing


@dataclass
class OutputRecord:
    shape: list[str | int]  # ["batch", classes, ...]
    name: str = OUTPUT_NAME
    dtype: str = "float32"
    meaning: str = ""
    labels: str | None = None  # the labels file in the export folder and the archive, if any
    classes: int | None = None


# ---------------------------------------------------------------- what was written and proven

@dataclass
class FileRecord:
    path: str  # relative to the export folder
    sha256: str
    bytes: int


@dataclass
class ArtifactRecord:
    kind: str  # a row of export.forms.kinds' table
    path: str
    sha256: str
    bytes: int
    format: str  # which runtime backend opens it
    exporter: str  # how it was made
    spatial_dynamic: bool  # accepts other H x W (resized in the graph)
    accepts: str  # in words, for people
    precision: str = "fp32"  # what it computes in
    run_precision: str = "fp32"  # how the backend must run it (autocast variants)
    source: str | None = None  # reduced-precision variants: the fp32 kind it was made from
    control_flow: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)  # kind-specific facts (quantizer settings, gate, ...)
    # files it opens beside its own (an OpenVINO IR's .bin): export-relative path -> sha256, shipped and checked too
    companions: dict[str, str] = field(default_factory=dict)


@dataclass
class ServingDecision:
    """Which artifacts may serve, decided at export by export.package.selection; the serving machine picks at load."""

    served: str | None
    rule: str
    preference: list[str]
    candidates: dict[str, str]  # kind -> "served" | "servable (...)" | why not
    servable: list[str]
    requested: str | None = None  # --serve, when the user chose
    speed_only: bool = False  # the benchmark served a gate-failed variant for its speed; never deployed
    latency_ms_batch1: dict[str, Any] = field(default_factory=dict)  # the export machine's, for information only
    # The hardware-aware part: the machine profile the order was decided for (python -m export --target) and
    # the gated candidates the archive ships, in order, each with what it needs to run and to be fast
    # ({"kind", "runs_on", "fast_on", "fast_why"}); at load the engine serves, of those its machine meets, the first
    # within a margin of the fastest measured there (runtime/form_choice.py). Empty: serve `served` (older exports).
    target: str = ""
    gated: list[dict[str, Any]] = field(default_factory=list)

    def candidate_kinds(self) -> list[str]:
        """The kinds the archive ships: the gated candidates, or the served one alone."""
        return [c["kind"] for c in self.gated] if self.gated else [self.served_kind()]

    def served_kind(self) -> str:
        if self.served is None:
            raise ContractError("no artifact of this export may be served: " + "; ".join(
                f"{k}: {why}" for k, why in self.candidates.items()))
        return self.served


@dataclass
class Refusal:
    """A form an export could not make or keep, the step that refused it and why, in one shape for every refusal
    (an exporter, an ONNX check, loading, parity, a reduced-precision variant); the other forms go on without it."""

    step: str  # build | inspect | load | parity | precision | needs (a form it is made from is missing)
    error: str  # the exception's type ("" for a form skipped because another is missing)
    message: str  # the first meaningful line (of the innermost cause when the error wraps another)
    location: str = ""  # the model code's file:line when the error points there
    log: str = ""  # the file of the export folder holding the full traceback

    def line(self) -> str:
        """One line for the terminal and the summary."""
        where = f" at {self.location}" if self.location else ""
        log = f" (traceback in {self.log})" if self.log else ""
        what = f"{self.error}: {self.message}" if self.error else self.message
        return f"{self.step}: {what}{where}{log}"


@dataclass
class ModelInfo:
    name: str  # the registry's or the user's model name
    family: str
    description: str
    source: dict[str, Any] = field(default_factory=dict)  # how to rebuild: {"registry": NAME} or {"module": REF, ...}


@dataclass
class Manifest:
    model: ModelInfo
    weights: dict[str, Any]
    input: InputRecord
    output: OutputRecord
    opset: int
    artifacts: dict[str, ArtifactRecord] = field(default_factory=dict)  # kind -> its record
    refused: dict[str, Refusal] = field(default_factory=dict)  # kind -> why it could not be made (or kept)
    files: dict[str, FileRecord] = field(default_factory=dict)  # other files (labels, reports) -> their record
    holdout_photos: dict[str, FileRecord] = field(default_factory=dict)  # a user's, carried (export/package/holdout.py)
    serving: ServingDecision | None = None
    task: str = CLASSIFICATION  # one of TASKS: which request core serves it
    outputs: list[OutputRecord] = field(default_factory=list)  # every output, in order; output is the first
    limits: DetectionLimits | None = None  # detection: the model's score threshold and cap on boxes
    parity: dict[str, Any] = field(default_factory=dict)
    trace_vs_script: dict[str, Any] = field(default_factory=dict)
    precision: dict[str, Any] = field(default_factory=dict)  # reduced-precision variants: calibration, gate, choice
    decode_check: dict[str, Any] = field(default_factory=dict)  # draft vs exact decoding on the served artifact
    timings_s: dict[str, float] = field(default_factory=dict)
    warnings: list[dict[str, Any]] = field(default_factory=list)  # export.warnings_log's entries
    exporter_output: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    model_version: ModelVersion | None = None  # the archive's version in its model store (contract/versions.py)
    created: str = ""
    schema: int = SCHEMA_VERSION

    # ---- reading
    @classmethod
    def from_dict(cls, data: Any, where: str = MANIFEST_NAME) -> "Manifest":
        if not isinstance(data, dict):
            raise ContractError(f"{where}: not a JSON object; re-run the export")
        if data.get("schema") != SCHEMA_VERSION:
            raise SchemaVersionError(where, data.get("schema"))
        data = dict(data)
        if data.get("task", CLASSIFICATION) not in TASKS:
            raise ContractError(f"{where}: task {data.get('task')!r} is not one of {', '.join(TASKS)}; re-run the export")
        data["model"] = _from_dict(ModelInfo, data.get("model"), f"{where} model")
        data["input"] = _from_dict(InputRecord, data.get("input"), f"{where} input")
        data["output"] = _from_dict(OutputRecord, data.get("output"), f"{where} output")
        if data.get("limits") is not None:
            data["limits"] = DetectionLimits.from_dict(data["limits"])
        data["outputs"] = [_from_dict(OutputRecord, o, f"{where} outputs[{i}]") for i, o in enumerate(data.get("outputs") or [])]
        for key, record in (("artifacts", ArtifactRecord), ("refused", Refusal), ("files", FileRecord), ("holdout_photos", FileRecord)):
            data[key] = {k: _from_dict(record, v, f"{where} {key}.{k}") for k, v in (data.get(key) or {}).items()}
        for key, optional in (("serving", ServingDecision), ("model_version", ModelVersion)):
            if data.get(key) is not None:
                data[key] = _from_dict(optional, data[key], f"{where} {key}")
        return _from_dict(cls, data, where)

    @classmethod
    def from_json(cls, text: str, where: str = MANIFEST_NAME) -> "Manifest":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ContractError(f"{where} is not JSON ({error}); re-run the export") from None
        return cls.from_dict(data, where)

    @classmethod
    def read(cls, folder: str | Path) -> "Manifest":
        """manifest.json of an export folder or an unpacked archive."""
        path = Path(folder) / MANIFEST_NAME
        if not path.is_file():
            raise ContractError(f"{path} not found: {folder} is not a complete export; run `python -m export ...`")
        return cls.from_json(path.read_text(), str(path))

    # ---- writing
    def to_dict(self) -> dict[str, Any]:
        return dict(_plain(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str) + "\n"

    # ---- questions readers ask
    def decision(self) -> ServingDecision:
        if self.serving is None:
            raise ContractError("the manifest has no serving decision; re-run the export")
        return self.serving

    def served_record(self) -> ArtifactRecord:
        """The artifact this export (or archive) serves, as decided at export."""
        kind = self.decision().served_kind()
        if kind not in self.artifacts:
            raise ContractError(f"the serving decision names {kind!r}, which the manifest does not record "
                                f"(has: {', '.join(self.artifacts)}); rebuild the archive with `python -m export`")
        return self.artifacts[kind]

    def labels_file(self) -> str | None:
        """The labels file an output names (a classifier's logits, a detector's labels), or None."""
        return next((output.labels for output in self.outputs or [self.output] if output.labels), None)

    def fp32_artifacts(self) -> dict[str, ArtifactRecord]:
        return {k: r for k, r in self.artifacts.items() if r.precision == "fp32"}

    def recorded_files(self) -> list[ArtifactRecord | FileRecord]:
        """Every file whose sha256 the manifest holds (artifacts first)."""
        return [*self.artifacts.values(), *self.files.values(), *self.holdout_photos.values()]
