"""ExecuTorch programs (`.pte`) run by ExecuTorch's own runtime (`executorch.runtime`), the runtime a phone or a
board links: what parity and the accuracy gate prove here is the program a device loads.

A program's memory is planned for the largest input it was lowered for, so it takes at most that batch at exactly
its height x width (its method's metadata says which); a larger batch is run in slices of that size.

The XNNPACK thread pool belongs to the process, not the program, and a program's delegate holds the pool it was
loaded under: RunOptions.threads re-creates the pool before the program is loaded (0 leaves it as it is: every
core), and a program loaded under an earlier pool loads its method again before it next runs, so no program runs
on a freed pool. A process therefore runs all its programs at the count last asked for, as a serving worker does.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from runtime import device_programs
from runtime.base import ArtifactError, ArtifactRunError, Backend, Outputs, RunOptions, host_outputs

METHOD = "forward"  # the method the exporter writes and a device's Module calls
INSTALL = "pip install '.[executorch]'"


def contract_name(program_name: str) -> str:
    """The input contract written beside it: model.pte -> model.executorch.json."""
    return device_programs.contract_name(program_name, ".pte", "executorch")


def import_runtime() -> ModuleType:
    """executorch.runtime, or an ArtifactError saying how to install it (only ExecuTorch programs need it)."""
    try:
        return importlib.import_module("executorch.runtime")
    except ImportError as error:
        raise ArtifactError(f"ExecuTorch programs need the executorch package ({error}); {INSTALL}") from None


_pool = {"generation": 0}  # bumped each time the process-wide pool is re-created


def set_threads(threads: int) -> int:
    """XNNPACK's process-wide thread pool re-created with `threads` when it has another count (0: left as it is);
    the pool's generation, which programs loaded under an earlier one compare with theirs."""
    if threads and threads != thread_count():
        from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
        _unsafe_reset_threadpool(threads)
        _pool["generation"] += 1
    return _pool["generation"]


def thread_count() -> int:
    from executorch.extension.pybindings.portable_lib import _threadpool_get_thread_count
    return int(_threadpool_get_thread_count())


class ExecuTorchBackend(Backend):
    format = "executorch"

    def __init__(self, path: Path, options: RunOptions, name: str | None = None):
        self.contract = device_programs.read_contract(path, contract_name(path.name), options, "ExecuTorch programs")
        super().__init__(path, options, name)
        self.program = import_runtime().Runtime.get().load_program(path)
        if METHOD not in self.program.method_names:
            raise ArtifactError(f"{path.name} has no method {METHOD!r} (it has "
                                f"{', '.join(self.program.method_names)}); re-run the export")
        self.generation = set_threads(options.threads)
        self.method = self.program.load_method(METHOD)
        planned = tuple(self.method.metadata.input_tensor_meta(0).sizes())
        self.max_batch, self.image_size = planned[0], planned[2:]

    def predict(self, batch: torch.Tensor) -> Outputs:
        if tuple(batch.shape[2:]) != tuple(self.image_size):
            raise ArtifactRunError(f"{self.name} takes images of exactly {'x'.join(map(str, self.image_size))} "
                                f"(height x width), got {tuple(batch.shape)}; resize and crop as its input contract "
                                f"{contract_name(self.path.name) if self.path else ''} says")
        rows = batch.detach().cpu().contiguous().float()
        slices = [self._run(rows[i:i + self.max_batch]) for i in range(0, len(rows), self.max_batch)]
        if len(slices) == 1:
            return host_outputs(slices[0])
        return host_outputs([torch.cat(parts) for parts in zip(*slices)])

    def _run(self, rows: torch.Tensor) -> list[torch.Tensor]:
        if self.generation != _pool["generation"]:  # the pool this method's delegate held was re-created
            self.method, self.generation = self.program.load_method(METHOD), _pool["generation"]
        return [torch.as_tensor(o).clone() for o in self.method.execute([rows])]  # the runtime reuses its buffers

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "max_batch": self.max_batch, "xnnpack_threads": thread_count()}
