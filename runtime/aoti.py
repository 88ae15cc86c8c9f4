"""AOTInductor packages (`.pt2` holding a compiled shared library) through `torch._inductor.aoti_load_package`.

A package is machine code for one torch build, one device type and, on the CPU, the compiling CPU itself
(Inductor compiles with -march=native): loaded by another torch it may crash or compute wrongly, and an AVX-512
package on an AVX2-only CPU dies of an illegal instruction. So the exporter writes BUILD_FILE into the package (the PT2 archive's own extra-files
section) and this backend refuses, before loading any code, a package whose build does not match this process.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import torch

from runtime.base import ArtifactError, ArtifactRunError, Backend, Outputs, RunOptions, host_outputs
from runtime.machine import cpu_flags
from runtime.torch_ops import with_torchvision_ops
from runtime.torchscript import configure_torch

BUILD_FILE = "vision_export_build.json"  # in the package's extra/ folder
EXTRA_FOLDER = "/extra/"


class BuildMismatchError(ArtifactError):
    """The package was compiled for another torch build, device type or CPU instruction set."""


def build_facts(device: torch.device, input_shape: list[int | None]) -> dict[str, Any]:
    """What a package compiled in this process for `device` is tied to, and the input shape it was compiled
    for (None: a dynamic dimension), written into it by the exporter."""
    facts: dict[str, Any] = {"torch": torch.__version__, "torch_git": torch.version.git_version,
                             "device": device.type, "input_shape": input_shape}
    if device.type == "cpu":
        facts["cpu_isa"] = _vector_isa()
        facts["cpu_flags"] = sorted(cpu_flags())  # the compiler is run with -march=native: every flag may be used
    else:
        facts["cuda"] = torch.version.cuda
        facts["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    return facts


def read_build_facts(path: str | Path) -> dict[str, Any]:
    """The facts recorded in a package, or an error saying the file is not a package we wrote."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith(EXTRA_FOLDER + BUILD_FILE)), None)
            if name is None:
                raise BuildMismatchError(f"{path} has no {BUILD_FILE}: it was not written by `python -m export`, "
                                         "so the torch build it needs is unknown; re-export it")
            facts = json.loads(archive.read(name))
    except (zipfile.BadZipFile, json.JSONDecodeError) as error:
        raise BuildMismatchError(f"{path} is not a readable AOTInductor package ({error}); re-export it") from None
    if not isinstance(facts, dict):
        raise BuildMismatchError(f"{path}'s {BUILD_FILE} is not a JSON object: it was not written by "
                                 "`python -m export`, so the torch build it needs is unknown; re-export it")
    return facts


def check_build(facts: dict[str, Any], device: torch.device) -> None:
    """Refuse a package this process cannot run safely; the message says what to do."""
    fix = "re-export with --formats aotinductor under the torch that will serve it (or serve another kind)"
    problems = []
    if facts.get("device") != device.type:
        problems.append(f"compiled for {facts.get('device')}, asked to run on {device.type}")
    if facts.get("torch") != torch.__version__:
        problems.append(f"compiled by torch {facts.get('torch')}, this is torch {torch.__version__}")
    if device.type == "cpu":
        problems += _cpu_problems(facts)
    if device.type == "cuda" and facts.get("device") == "cuda":
        here = ".".join(map(str, torch.cuda.get_device_capability(device)))
        if facts.get("compute_capability") != here:
            problems.append(f"compiled for compute capability {facts.get('compute_capability')}, this GPU is {here}")
    if problems:
        raise BuildMismatchError("AOTInductor package refused before loading: " + "; ".join(problems) + f"; {fix}")


def _cpu_problems(facts: dict[str, Any]) -> list[str]:
    """What a package compiled for facts' CPU would execute that this CPU lacks."""
    problems = []
    runnable = _runnable_isas()
    if facts.get("device") == "cpu" and facts.get("cpu_isa") not in runnable:
        problems.append(f"compiled for the {facts.get('cpu_isa')} instruction set, which this CPU lacks "
                        f"(it runs {', '.join(runnable) or 'no vector ISA torch knows'})")
    here = cpu_flags()
    missing = sorted(set(facts.get("cpu_flags") or ()) - here) if here else []  # no /proc/cpuinfo: unknown
    if missing:
        problems.append(f"compiled with -march=native on a CPU with instructions this one lacks "
                        f"({', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''})")
    return problems


class AOTInductorBackend(Backend):
    format = "aoti"

    def __init__(self, path: Path, options: RunOptions, name: str | None = None):
        super().__init__(path, options, name)
        self.device = options.torch_device
        self.build = read_build_facts(path)
        check_build(self.build, self.device)  # before any of the package's code is loaded
        configure_torch(options)
        with_torchvision_ops(path)  # a detector's nms: registered before the compiled code that calls it
        from torch._inductor import aoti_load_package
        index = self.device.index if self.device.index is not None else (0 if self.device.type == "cuda" else -1)
        self.runner = aoti_load_package(str(path), device_index=index)

    def predict(self, batch: torch.Tensor) -> Outputs:
        self.check_shape(batch)
        with torch.inference_mode():
            return host_outputs(self.runner(batch.to(self.device, non_blocking=True).contiguous()))

    def check_shape(self, batch: torch.Tensor) -> None:
        """A package checks nothing about its inputs (unless AOTI_RUNTIME_CHECK_INPUTS is set) and computes
        garbage on a shape it was not compiled for: refuse one here, as the other runtimes do."""
        expected = self.build.get("input_shape")
        if expected is None:
            return
        if len(expected) != batch.dim() or any(e is not None and e != d for e, d in zip(expected, batch.shape)):
            shown = " x ".join("N" if e is None else str(e) for e in expected)
            raise ArtifactRunError(f"{self.name} was compiled for inputs of shape {shown}, got "
                                   f"{' x '.join(map(str, batch.shape))}")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "build": self.build}


def _vector_isa() -> str:
    from torch._inductor.cpu_vec_isa import pick_vec_isa
    return str(pick_vec_isa())


def _runnable_isas() -> list[str]:
    """The vector instruction sets Inductor may use on this CPU (an AVX-512 CPU also runs AVX2 packages)."""
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list
    return [str(isa) for isa in valid_vec_isa_list()]
