"""onnx.reference.ReferenceEvaluator: slow, written from the ONNX spec; a second opinion for small models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from runtime.base import ArtifactError, Backend, Outputs, RunOptions, host_outputs


class ReferenceBackend(Backend):
    format = "onnx-reference"

    def __init__(self, path: Path, options: RunOptions, name: str | None = None):
        super().__init__(path, options, name or f"reference:{path.name}")
        if options.torch_device.type != "cpu":
            raise ArtifactError("the ONNX reference evaluator runs on the CPU only")
        from onnx.reference import ReferenceEvaluator
        self.evaluator = ReferenceEvaluator(str(path))
        self.input_name = self.evaluator.input_names[0]

    def predict(self, batch: torch.Tensor) -> Outputs:
        outputs = self.evaluator.run(None, {self.input_name: batch.detach().cpu().numpy()})
        return host_outputs([torch.from_numpy(np.asarray(o)) for o in outputs])
