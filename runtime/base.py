"""The backend interface and the registry of backends, keyed by artifact format.

A backend opens one artifact for a device, a CPU thread count and a run-time precision, and predicts a
batch: float32 NCHW in, the model's outputs on the CPU out (`Outputs`: one tensor, or a tuple when the model has
several, e.g. a detector's boxes, labels and scores), floating ones as float32. Adding a backend means one new
file with a `Backend` subclass plus one line in `BACKENDS`.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import torch

from contract.errors import VisionExportError

PRECISIONS = ("fp32", "fp16", "bf16")
Outputs = torch.Tensor | tuple[torch.Tensor, ...]  # a classifier's logits; a detector's (boxes, labels, scores)

# format -> "module:Class"; imported on first use, so a missing optional library only matters to its format
BACKENDS: dict[str, str] = {
    "torchscript": "runtime.torchscript:TorchScriptBackend",
    "onnx": "runtime.onnxruntime:OnnxRuntimeBackend",
    "onnx-reference": "runtime.onnx_reference:ReferenceBackend",
    "torch-export": "runtime.exported_program:ExportedProgramBackend",
    "aoti": "runtime.aoti:AOTInductorBackend",
    "openvino": "runtime.openvino:OpenVinoBackend",
    "executorch": "runtime.executorch:ExecuTorchBackend",
    "litert": "runtime.litert:LiteRTBackend",
}


class ArtifactError(VisionExportError):
    """An artifact cannot be opened or run as asked (missing file, wrong options for its backend)."""


class ArtifactRunError(ArtifactError):
    """The artifact's runtime failed on an input (a shape it does not take, a kernel error); the runtime's own
    exception is chained as __cause__, so its traceback is kept."""

    def cause_traceback(self) -> str:
        import traceback
        cause = self.__cause__
        return "".join(traceback.format_exception(cause)) if cause else ""


class UnknownFormatError(ArtifactError):
    def __init__(self, format: str):
        super().__init__(f"no backend for artifact format {format!r}; known formats: {', '.join(BACKENDS)}")


@dataclass(frozen=True)
class RunOptions:
    device: str = "cpu"
    threads: int = 0  # CPU intra-op threads; 0 leaves the library's default (every core)
    precision: str = "fp32"  # run-time compute precision: fp16 = CUDA autocast, bf16 = CPU/CUDA autocast

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ArtifactError(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.threads < 0:
            raise ArtifactError(f"threads must be 0 (library default) or more, got {self.threads}")

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)


class Backend(ABC):
    """One opened artifact. Subclasses set `format` and implement `predict`."""

    format: ClassVar[str]
    supported_precisions: ClassVar[tuple[str, ...]] = ("fp32",)

    def __init__(self, path: Path | None, options: RunOptions, name: str | None = None):
        if options.precision not in self.supported_precisions:
            raise ArtifactError(f"the {self.format} backend runs {', '.join(self.supported_precisions)}, "
                                f"not {options.precision}; the artifact itself carries its precision")
        if path is not None and not Path(path).is_file():
            raise ArtifactError(f"artifact {path} does not exist; re-run the export that should have written it")
        self.path = Path(path) if path is not None else None
        self.options = options
        self.name = name or (self.path.name if self.path else self.format)

    @classmethod
    def unavailable(cls, device: str) -> str | None:
        """Why this environment cannot run this format on `device` ("cuda", "cpu") although the form itself could
        (its runtime built without that device), or None: asked before a GPU server chooses its form."""
        return None

    @abstractmethod
    def predict(self, batch: torch.Tensor) -> Outputs:
        """float32 batch (on the CPU) -> the outputs on the CPU (host_outputs)."""

    def __call__(self, batch: torch.Tensor) -> Outputs:
        """predict(), with a runtime's failure on this input as an ArtifactRunError (cause chained)."""
        try:
            return self.predict(batch)
        except ArtifactError:
            raise
        except Exception as error:  # onnxruntime, TorchScript and others each raise their own types
            first = (str(error).strip().splitlines() or [""])[0][:200]
            raise ArtifactRunError(f"{self.name} failed on input {tuple(batch.shape)}: "
                                   f"{type(error).__name__}: {first}") from error

    def describe(self) -> dict[str, Any]:
        """What ran: for reports, logs and the benchmark's table."""
        return {"backend": type(self).__name__, "format": self.format, "name": self.name,
                "path": str(self.path) if self.path else None, **asdict(self.options)}


def host_outputs(outputs: object) -> Outputs:
    """A runtime's outputs as backends return them: on the CPU, floating ones as float32 (an fp16/bf16 run's
    too), integer ones (a detector's labels) as they are; one output alone, several as a tuple."""
    if isinstance(outputs, (list, tuple)):
        converted = tuple(host_outputs(o) for o in outputs)
        if len(converted) == 1:
            return converted[0]
        # cast: the models here return flat tuples; a nested one (a tuple in the tuple) is passed on as it is
        return cast(tuple[torch.Tensor, ...], converted)
    tensor = torch.as_tensor(outputs)
    return (tensor.float() if tensor.is_floating_point() else tensor).cpu()


def backend_class(format: str) -> type[Backend]:
    try:
        module_name, class_name = BACKENDS[format].split(":")
    except KeyError:
        raise UnknownFormatError(format) from None
    backend: type[Backend] = getattr(importlib.import_module(module_name), class_name)  # BACKENDS names subclasses
    return backend


def available_formats() -> list[str]:
    return list(BACKENDS)


def open_artifact(format: str, path: str | Path, options: RunOptions | None = None,
                  name: str | None = None) -> Backend:
    """The one way to open an artifact for running."""
    return backend_class(format)(Path(path), options or RunOptions(), name)
