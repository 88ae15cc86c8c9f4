"""LiteRT flatbuffers (`.tflite`) run by LiteRT's own interpreter (`ai_edge_litert.interpreter`), the runtime an
Android or embedded app links: what parity proves here is the file a device loads.

A file is converted for one image at exactly its example's height x width (the input tensor's shape says which); a
batch is run one image at a time, as a device feeds it.

litert-torch pins packages older than the serving stack's (typing_extensions, pydantic), so it lives in an
environment of its own layered over the main one (`make litert-env`); without it the backend and the exporter
refuse, saying so.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from runtime import device_programs
from runtime.base import ArtifactError, ArtifactRunError, Backend, Outputs, RunOptions, host_outputs

SIGNATURE = "serving_default"  # the signature litert-torch writes and a device's runner calls
INSTALL = ("make litert-env, then run with .venv-litert/bin/python (its own environment: litert-torch's pins "
           "would downgrade the main one's typing_extensions and pydantic)")


def contract_name(program_name: str) -> str:
    """The input contract written beside it: model.tflite -> model.litert.json."""
    return device_programs.contract_name(program_name, ".tflite", "litert")


def output_names(count: int) -> list[str]:
    """The signature's names of a file's outputs, in the module's order: litert-torch writes output_0, output_1, ..."""
    return [f"output_{i}" for i in range(count)]


def import_interpreter() -> ModuleType:
    """ai_edge_litert.interpreter, or an ArtifactError saying how to install it (only `.tflite` files need it)."""
    try:
        return importlib.import_module("ai_edge_litert.interpreter")
    except ImportError as error:
        raise ArtifactError(f"LiteRT files need the ai-edge-litert package ({error}); {INSTALL}") from None


def interpreter_threads(threads: int) -> int:
    """LiteRT's interpreter defaults to one thread; RunOptions' 0 means every core, as for the other backends."""
    return threads or len(os.sched_getaffinity(0))


class LiteRTBackend(Backend):
    format = "litert"

    def __init__(self, path: Path, options: RunOptions, name: str | None = None):
        self.contract = device_programs.read_contract(path, contract_name(path.name), options, "LiteRT files")
        super().__init__(path, options, name)
        self.threads = interpreter_threads(options.threads)
        interpreter = import_interpreter().Interpreter(model_path=str(path), num_threads=self.threads)
        if SIGNATURE not in interpreter.get_signature_list():
            raise ArtifactError(f"{path.name} has no signature {SIGNATURE!r}; re-run the export")
        self.runner = interpreter.get_signature_runner(SIGNATURE)
        details = self.runner.get_input_details()
        self.input_name = next(iter(details))
        self.input_shape = tuple(int(d) for d in details[self.input_name]["shape"])

    def predict(self, batch: torch.Tensor) -> Outputs:
        if tuple(batch.shape[1:]) != self.input_shape[1:]:
            raise ArtifactRunError(f"{self.name} takes images of exactly {'x'.join(map(str, self.input_shape[2:]))} "
                                   f"(height x width), got {tuple(batch.shape)}; resize and crop as its input "
                                   f"contract {contract_name(self.path.name) if self.path else ''} says")
        rows = batch.detach().cpu().contiguous().float().numpy()
        images = [self._run(rows[i:i + 1]) for i in range(len(rows))]
        if len(images) == 1:
            return host_outputs(images[0])
        return host_outputs([torch.cat(parts) for parts in zip(*images)])

    def _run(self, image: np.ndarray) -> list[torch.Tensor]:
        outputs = self.runner(**{self.input_name: image})
        # np.array copies: the next image's run must not change this one's outputs
        return [torch.from_numpy(np.array(outputs[name])) for name in output_names(len(outputs))]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "input_shape": list(self.input_shape), "litert_threads": self.threads}
