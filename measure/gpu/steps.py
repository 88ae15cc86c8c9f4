"""The GPU check's four steps. Each takes the output folder and a log function and returns a Step; what it
needs beyond the standard library and torch it imports when it runs, so a machine without them still gets the
other steps and a reason.

  export     `python -m export resnet --device cuda --formats all` (the AOTInductor package compiled for the GPU
             too) and every artifact's parity from the manifest
  backends   the handler's backends (runtime/) on cuda:0 against CPU eager: agreement and max difference
  inprocess  eager / TorchScript / the CUDA AOTInductor package, fp32 / fp16, timed with CUDA events after a
             warm-up (medians)
  serving    the scripted TorchScript with fp16 autocast through TorchServe on the GPU, under load, with this
             machine's serving policy and a variant beside it
"""

from __future__ import annotations

import contextlib
import copy
import os
import statistics
import subprocess
import sys
from pathlib import Path

from measure.gpu.environment import (
    EXPORT_NEEDS,
    SERVING_NEEDS,
    choose_java,
    export_plan,
    import_problems,
    java_candidates,
    ort_cuda_problem,
    serving_skip_reason,
)
from measure.gpu.report import SERVED_ARTIFACT, AgreementRow, BenchRow, ParityRow, ServingRow, Status, Step

ARCH = "resnet50"  # the model the check exports (random weights)
DEVICE = "cuda:0"  # what TorchServe's gpu_id 0 becomes in the handler
BATCHES = (1, 8, 32, 64)
SERVING_CONCURRENCY = (1, 8, 32)
ARM_WORKERS, ARM_BATCH, ARM_DELAY_MS = 4, 8, 5  # the serving policy's variant beside the machine's own
WARMUP_RUNS = 10
TIMED_RUNS = 30
AGREEMENT_IMAGES = 256  # 1 disagreement = 0.4 %: fine enough to judge the 99 % target
AGREEMENT_BATCH = 32
REQUESTS_PER_LEVEL = 400
WARMUP_REQUESTS = 64  # per level, unrecorded: cuDNN autotunes each new batch size the server forms
TF32_OFF = " (TF32 off)"  # the backends row of an fp32 run with cuDNN's and cuBLAS's TF32 switched off
LOAD_DEADLINE_S = 120  # per level, whatever happens
EXPORT_TIMEOUT_S = 1800
PROJECT_ROOT = Path(__file__).resolve().parents[2]
EXPORT, STORE = "export", "model-store"  # folders inside the check's output folder
SERVED_STORE = "served-store"  # the served archive's own store: in the export's, a new version would not be live


def read_export(out: Path):
    """The check's own export, or None when the export step did not write one."""
    from contract.records import MANIFEST_NAME, Manifest
    folder = out / EXPORT
    return Manifest.read(folder) if (folder / MANIFEST_NAME).is_file() else None


# ------------------------------------------------------------------ step 1: export on the GPU

def export_step(out: Path, log) -> Step:
    broken = import_problems(EXPORT_NEEDS + ("model_archiver",))
    plan = export_plan(broken, ort_cuda_problem() if "onnxruntime" not in broken else None)
    if plan.skip:
        return Step("export", Status.SKIPPED, notes=[plan.skip])
    command = [sys.executable, "-m", "export", "resnet", "--arch", ARCH, "--weights", "random",
               "--device", plan.device, "--formats", plan.formats, "--out", str(out / EXPORT), "--model-store", str(out / STORE)]
    command += [] if plan.archive else ["--no-archive"]
    log(f"$ {' '.join(command)}")
    # faulthandler: an export that dies of a signal (a native library's crash) leaves its Python stack in the log
    path = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONPATH": path}
    done = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
    log(done.stdout + done.stderr)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return Step("export", Status.FAILED, notes=plan.notes + [f"exit {done.returncode}: {last[0][:300]}"])
    summary = read_export(out).parity.get("summary", {})
    rows = [ParityRow(kind, plan.device, s["passed"], s["max_abs"], s.get("top1_agreement"), s.get("top5_agreement"))
            for kind, s in summary.items()]
    notes = plan.notes + ([] if rows else ["the manifest records no parity summary"])
    return Step("export", Status.RAN, rows, notes)


# ------------------------------------------------------------------ step 2: the handler's backends on cuda:0

def backends_step(out: Path, log) -> Step:
    manifest = read_export(out)
    if manifest is None:
        return Step("backends", Status.SKIPPED, notes=["no export to load (see the export step)"])
    import models
    from export.checks.parity import structured_images
    from runtime import RunOptions
    from runtime.eager import EagerBackend
    images = structured_images(AGREEMENT_IMAGES, 3, 224, 224, seed=3)
    eager = EagerBackend(models.get(ARCH).build("random").module, RunOptions(device="cpu"))
    reference = predict_in_batches(eager, images)
    runs, notes = backend_runs(manifest.artifacts, ort_cuda_problem())
    rows = []
    for record, precision in runs:
        rows.append(agreement_row(record, out / EXPORT, precision, images, reference))
        log(f"backends: {rows[-1]}")
        if precision == "fp32" and record.format == "torchscript":  # cuDNN's TF32 (on by default) vs true fp32
            with tf32_off():
                rows.append(agreement_row(record, out / EXPORT, precision, images, reference, label=TF32_OFF))
            log(f"backends: {rows[-1]}")
    notes += [f"{r.artifact}: ONNX Runtime did not use CUDA ({r.ran_on})" for r in rows
              if r.ran_on.startswith("providers") and "CUDAExecutionProvider" not in r.ran_on]
    return Step("backends", Status.RAN, rows, notes)


def backend_runs(artifacts: dict, ort_problem: str | None) -> tuple[list[tuple], list[str]]:
    """(record, precision) to run on the GPU: each artifact as it is meant to run, fp32 TorchScript also in fp16
    autocast (the handler's fp16 path); ONNX only through ONNX Runtime's CUDA provider, or a note saying why not."""
    runnable = [r for r in artifacts.values() if r.format != "onnx" or ort_problem is None]
    runs = [(r, precision) for r in runnable
            for precision in ((r.run_precision, "fp16") if r.format == "torchscript" and r.run_precision == "fp32"
                              else (r.run_precision,))]
    skipped = [r.kind for r in artifacts.values() if r not in runnable]
    notes = [f"ONNX Runtime's CUDA provider: not measured ({', '.join(skipped)}): {ort_problem}"] if skipped else []
    return runs, notes


@contextlib.contextmanager
def tf32_off():
    """Convolutions and matrix products in true fp32: PyTorch lets cuDNN's convolutions use TF32 (a 10-bit
    mantissa, like fp16's) by default on Ampere and later."""
    import torch
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def agreement_row(record, folder: Path, precision: str, images, reference, label: str = "") -> AgreementRow:
    """Top-1/top-5 agreement with CPU eager; an fp32 run is also held to its kind's parity tolerance."""
    from export.checks.parity import compare_outputs, topk_agreement
    from export.forms import kinds
    from runtime import RunOptions, open_artifact
    backend = open_artifact(record.format, folder / record.path, RunOptions(device=DEVICE, precision=precision),
                            name=record.kind)
    got = predict_in_batches(backend, images)
    tolerance = kinds.get(record.kind).tolerance if precision == "fp32" else None  # variants: gated on accuracy
    if tolerance is not None:
        metrics, within = compare_outputs(reference, got, tolerance)
        max_abs = metrics["max_abs"]
    else:
        max_abs, within = (got.double().cpu() - reference.double().cpu()).abs().max().item(), None
    providers = backend.describe().get("providers")
    ran_on = f"providers {', '.join(providers)}" if providers else DEVICE
    return AgreementRow(record.kind, precision + label, ran_on, len(images), topk_agreement(reference, got, 1),
                        topk_agreement(reference, got, 5), max_abs, within)


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


def bench_variants(scripted: Path | None, aoti: Path | None = None) -> list[tuple[str, object, bool, bool]]:
    """(label, call, cudnn.benchmark, input stays on the host) for each variant."""
    import torch

    import models
    from runtime import RunOptions, open_artifact
    module = models.get(ARCH).build("random").module.eval().to(DEVICE)
    last = copy.deepcopy(module).to(memory_format=torch.channels_last)  # .to() converts in place: a copy
    variants = [("eager fp32", on_gpu(module), True, False),
                ("eager fp32, cudnn.benchmark off", on_gpu(module), False, False),
                ("eager fp16 autocast", on_gpu(module, torch.float16), True, False),
                ("eager fp16 autocast, channels_last", on_gpu(last, torch.float16, True), True, False)]
    if scripted is not None:
        script = torch.jit.load(str(scripted), map_location=DEVICE).eval()
        served = open_artifact("torchscript", scripted, RunOptions(device=DEVICE, precision="fp16"))
        variants += [("torchscript fp32", on_gpu(script), True, False),
                     ("torchscript fp16", on_gpu(script, torch.float16), True, False),
                     ("runtime torchscript fp16 predict, host in/out", served.predict, True, True)]
    if aoti is not None:  # compiled for this GPU by the export step (refused there when it could not be)
        package = open_artifact("aoti", aoti, RunOptions(device=DEVICE))
        variants += [("aotinductor fp32 (CUDA package)", on_gpu(package.runner), True, False),
                     ("runtime aotinductor predict, host in/out", package.predict, True, True)]
    return variants


def inprocess_step(out: Path, log) -> Step:
    problems = import_problems(("torchvision",))
    if problems:
        return Step("inprocess", Status.SKIPPED, notes=[f"torchvision does not import: {problems['torchvision']}"])
    import torch
    manifest = read_export(out)
    record = manifest.artifacts.get(SERVED_ARTIFACT) if manifest else None
    aoti = manifest.artifacts.get("aotinductor") if manifest else None
    rows = []
    for label, run, benchmark, host in bench_variants(out / EXPORT / record.path if record else None,
                                                      out / EXPORT / aoti.path if aoti else None):
        torch.backends.cudnn.benchmark = benchmark
        for size in BATCHES:
            batch = torch.rand(size, 3, 224, 224, device="cpu" if host else DEVICE)
            ms = time_cuda(run, batch)
            rows.append(BenchRow(label, size, ms, size * 1000 / ms))
            log(f"inprocess {label} b={size}: {ms:.3f} ms")
    torch.backends.cudnn.benchmark = True
    return Step("inprocess", Status.RAN, rows, [] if record else [f"no {SERVED_ARTIFACT} artifact: eager rows only"])


# ------------------------------------------------------------------ step 4: TorchServe on the GPU

def serving_arms():
    """(label, the whole policy or None for this machine's own) of each serving run: the policy every GPU server
    gets, and beside it more workers with a short batch delay (does one worker's decode, or the batch's wait,
    bound what a GPU serves?)."""
    from serving.settings import policy_with
    return [("this machine's policy", None),
            (f"{ARM_WORKERS} workers, batch {ARM_BATCH}, {ARM_DELAY_MS} ms",
             policy_with(workers=ARM_WORKERS, batch_size=ARM_BATCH, max_batch_delay=ARM_DELAY_MS))]


def serving_step(out: Path, log) -> Step:
    java, found = choose_java(java_candidates())
    log(f"java: {found}")
    manifest = read_export(out)
    archive = manifest is not None and (out / STORE / f"{manifest.model.name}.mar").is_file()
    skip = serving_skip_reason(java, found, import_problems(SERVING_NEEDS), archive)
    if skip:
        return Step("serving", Status.SKIPPED, notes=[skip])
    from export.package.archive import build_archive
    build_archive(out / EXPORT, manifest, out / SERVED_STORE, None, SERVED_ARTIFACT, {"fp16": True})
    notes = [f"{found}; served: {SERVED_ARTIFACT} TorchScript with the handler's fp16: true (autocast on a GPU)"]
    rows = []
    for number, (label, policy) in enumerate(serving_arms(), 1):
        arm_rows, reason = serve_arm(out / f"serving-run-{number}", manifest.model.name, java, label, policy, log)
        rows += arm_rows
        notes.append(f"{label}: {reason}")
    return Step("serving", Status.RAN, rows, notes)


def serve_arm(run_dir: Path, model_name: str, java: str, label: str, policy, log) -> tuple[list[ServingRow], str]:
    """One TorchServe run from the check's store under `policy` (None: this machine's), loaded at each concurrency."""
    from serving.settings import EXAMPLE_IMAGE
    from serving.torchserve import server
    from serving.torchserve.config import on_free_ports
    settings = on_free_ports(run_dir.parent / SERVED_STORE, run_dir)
    settings.model_name, settings.policy = model_name, policy
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    java_home = Path(java).resolve().parent.parent
    settings.extra_env = {"JAVA_HOME": str(java_home), "PATH": f"{java_home / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    reason = settings.effective_policy().reason
    log(f"serving arm {label}: {reason}")
    with server.running(settings):
        return [load_level(settings.predictions_url(), EXAMPLE_IMAGE, c, label, log) for c in SERVING_CONCURRENCY], reason


def load_level(url: str, image: Path, concurrency: int, label: str, log) -> ServingRow:
    """A warm-up, then REQUESTS_PER_LEVEL requests at `concurrency`, each run bounded by LOAD_DEADLINE_S."""
    from measure.loadgen import hey_available, run_hey, run_pool
    from serving.settings import REQUEST_TIMEOUT_S

    def load(requests: int):
        if hey_available():
            return run_hey(url, image, concurrency, REQUEST_TIMEOUT_S, requests=requests, limit_s=LOAD_DEADLINE_S)
        return run_pool(url, image, concurrency, requests, REQUEST_TIMEOUT_S, LOAD_DEADLINE_S)

    load(WARMUP_REQUESTS)
    result = load(REQUESTS_PER_LEVEL)
    row = ServingRow(label, concurrency, result.requests, result.failed, result.req_per_s, result.p50_ms,
                     result.p99_or_slowest_ms(), result.tool)
    log(f"serving c={concurrency}: {row}")
    return row
