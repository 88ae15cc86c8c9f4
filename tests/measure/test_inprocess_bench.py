"""The in-process benchmark: its arithmetic, tables and peak measurement (fast), and a smoke run of
`python -m measure inprocess` on a real resnet18 export (slow). No test asserts a timing."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from contract.records import DETECTION, ContractError, InputRecord, Manifest, ModelInfo, OutputRecord
from export.package.rebuild import entry_from_manifest, weights_from_manifest
from measure.cli import main as measure_main
from measure.inprocess import bench
from measure.inprocess import records as bench_records
from measure.inprocess.bench import Peak, Report, Row
from tests.conftest import ROOT


def row(artifact="onnx-dynamo", threads=1, batch=8, images_per_s=10.0, precision="fp32", device="cpu", gflops=80.0):
    return Row("resnet50", artifact, "onnx", precision, device, threads, batch, batch / images_per_s * 1000,
               images_per_s, gflops, None, "OnnxRuntimeBackend", [1.0])


def test_batches_and_threads_parse_and_bad_values_say_what_to_give():
    assert bench.parse_batches("1,8,32") == [1, 8, 32]
    assert bench.parse_threads("1,all", cores=2) == [1, 2]
    assert bench.parse_threads("2,all", cores=2) == [2]  # duplicates dropped
    for bad in ("", "0", "x", "1,-2"):
        with pytest.raises(bench.BenchError, match="e.g. 1,8,32"):
            bench.parse_batches(bad)
    with pytest.raises(bench.BenchError, match="'all'"):
        bench.parse_threads("1,some", cores=2)


def test_flop_arithmetic():
    assert bench_records.gemm_flops(1000) == 2e9
    assert bench.achieved_gflops(8.2e9, batch=8, seconds=0.8) == pytest.approx(82.0)
    peak = Peak("fp32", 1, 100.0, "numpy BLAS")
    assert bench.peak_fraction(82.0, peak) == pytest.approx(0.82)
    assert bench.peak_fraction(82.0, None) is None
    assert bench.peak_dtype("int8") == "int8" and bench.peak_dtype("bf16") == "bf16"
    assert bench.peak_dtype("fp16", "cuda:0") == "cuda-fp16" and bench.peak_dtype("fp32", "cuda:0") == "cuda-fp32"


def test_flop_counter_counts_two_per_multiply_add():
    conv = nn.Conv2d(3, 8, kernel_size=3, padding=1, bias=False)
    # 8 output channels x 16 x 16 positions x (3 x 3 x 3) multiply-adds, 2 FLOPs each
    assert bench.count_flops(conv, torch.rand(1, 3, 16, 16)) == 2 * 8 * 16 * 16 * 27


def test_peaks_merge_to_the_best_per_library_and_fractions_use_the_merged_peak():
    start = [Peak("fp32", 1, 90.0, "onnxruntime MatMul", {"onnxruntime MatMul": 90.0, "numpy BLAS": 85.0})]
    end = [Peak("fp32", 1, 95.0, "numpy BLAS", {"onnxruntime MatMul": 80.0, "numpy BLAS": 95.0})]
    merged = bench.merge_peaks(start, end)
    assert len(merged) == 1
    assert merged[0].gflops == 95.0 and merged[0].library == "numpy BLAS"
    assert merged[0].by_library == {"onnxruntime MatMul": 90.0, "numpy BLAS": 95.0}
    rows = [row(gflops=76.0), row(threads=2, gflops=76.0)]
    bench.apply_peaks(rows, merged)
    assert rows[0].peak_fraction == pytest.approx(0.8) and rows[1].peak_fraction is None  # no 2-thread peak


def test_vnni_is_read_from_cpu_flags():
    assert bench_records.has_vnni("flags : fpu avx2 avx512_vnni fma")
    assert bench_records.has_vnni("flags : avx_vnni avx2")
    assert not bench_records.has_vnni("flags : fpu avx2 fma avx512f")


def test_best_rows_pick_the_fastest_per_batch_on_the_device():
    rows = [row("traced", 1, 8, 5.0), row("onnx-dynamo", 2, 8, 9.0), row("onnx-traced", 1, 1, 7.0),
            row("onnx-dynamo", 0, 8, 500.0, device="cuda:0")]
    best = bench.best_rows(rows)
    assert list(best) == [1, 8] and best[8].artifact == "onnx-dynamo" and best[8].threads == 2
    assert bench.best_rows(rows, "cuda")[8].images_per_s == 500.0
    rows.append(row("onnx-int8", 2, 8, 19.0, precision="int8"))
    assert bench.best_rows(rows)[8].artifact == "onnx-int8"
    assert bench.best_rows(rows, precision="fp32")[8].artifact == "onnx-dynamo"


def test_timed_runs_honour_warmup_repeats_and_the_time_floor():
    calls = []
    times = bench.time_runs(lambda: calls.append(1), warmup=2, repeats=3, min_seconds=0)
    assert len(times) == 3 and len(calls) == 5
    times = bench.time_runs(lambda: None, warmup=0, repeats=1, min_seconds=10, max_runs=7)
    assert len(times) == 7  # the floor is not reached by no-op runs: capped


def test_markdown_has_the_peaks_the_best_per_batch_every_row_and_the_skips():
    report = Report(machine={"cpu": "Test CPU", "cores": 2, "vnni": False, "torch_cpu_capability": "AVX2",
                             "torch": "x", "onnxruntime": "y", "numpy": "z", "load_average_at_start": [0.1, 0.2, 0.3]},
                    peaks=[Peak("fp32", 1, 94.0, "onnxruntime MatMul", {"onnxruntime MatMul": 94.0, "numpy BLAS": 93.0}),
                           Peak("int8", 1, 180.0, "onnxruntime MatMulInteger", {"onnxruntime MatMulInteger": 180.0})],
                    flops_per_image={"resnet50": 8.2e9}, rows=[row(gflops=75.2)],
                    skipped=[bench.Skip("resnet50", "openvino-bf16", "ArtifactError: no backend")],
                    settings={"repeats": 5, "warmup": 2, "min_seconds": 1.0})
    bench.apply_peaks(report.rows, report.peaks)
    text = bench.render_markdown(report)
    assert "| fp32 | 1 | 94.0 | onnxruntime MatMul | not reported | 94.0 | 93.0 | — |" in text
    assert "| 8 | onnx-dynamo (onnx, fp32) | 1 | 10.0 | 80% of fp32 |" in text
    assert "| resnet50 | onnx-dynamo | onnx | fp32 | cpu | 1 | 8 | 800.0 | 10.0 | 75.2 | 80% of fp32 |" in text
    assert "openvino-bf16: ArtifactError: no backend" in text and "8.20 GFLOP" in text


def test_a_written_report_loads_back_and_a_foreign_file_is_refused(tmp_path):
    report = Report(machine={"cpu": "c"}, peaks=[Peak("fp32", 1, 1.0, "numpy BLAS")], rows=[row()])
    (tmp_path / "bench.json").write_text(json.dumps(dataclasses.asdict(report)))
    assert bench.load_report(tmp_path / "bench.json").rows[0].artifact == "onnx-dynamo"
    (tmp_path / "other.json").write_text("[1, 2]")
    with pytest.raises(bench.BenchError, match="not a bench.json"):
        bench.load_report(tmp_path / "other.json")


def test_gemm_peaks_are_measured_with_every_library_at_a_small_size():
    said = []
    peaks = bench.measure_peaks([1], n=128, repeats=1, say=said.append)
    fp32 = bench.find_peak(peaks, "fp32", 1)
    assert set(fp32.by_library) == {"onnxruntime MatMul", "numpy BLAS", "torch.mm"}
    assert fp32.gflops == max(fp32.by_library.values()) > 0
    assert [p.dtype for p in peaks] == ["fp32", "bf16", "int8"]  # each precision a row uses (tests/measure/test_peak_*)
    assert said and "1 thread(s)" in said[-1]


def test_a_folder_without_an_export_is_a_clear_error(tmp_path, capsys):
    assert measure_main(["inprocess", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    stderr = capsys.readouterr().err
    assert "has no manifest.json: export a model there first" in stderr and "Traceback" not in stderr


def manifest_of(source: dict, weights: dict) -> Manifest:
    return Manifest(ModelInfo("m", "f", "d", source), weights, InputRecord((1, 3, 8, 8)), OutputRecord(["batch", 2]),
                    opset=18)


def test_the_model_and_its_weights_are_rebuilt_from_the_manifest(tmp_path):
    """Rebuilding gives weights of the kind the manifest recorded (the benchmark's eager row is that model)."""
    registry = manifest_of({"registry": "cf-branch"}, {"kind": "random", "source": ""})
    assert entry_from_manifest(registry).name == "cf-branch"
    assert entry_from_manifest(registry).build(weights_from_manifest(registry)).weights.kind == "random"
    user = ROOT / "tests" / "export" / "user_models" / "models_for_tests.py"
    module = manifest_of({"module": f"{user}:plain", "input_shape": [1, 3, 8, 8]}, {"kind": "factory", "source": ""})
    rebuilt = entry_from_manifest(module).build(weights_from_manifest(module))
    # PlainNet's factory draws its weights: the rebuilt provenance says so (a random initialisation, seeded here)
    assert type(rebuilt.module).__name__ == "PlainNet" and rebuilt.weights.kind == "random"
    assert weights_from_manifest(manifest_of({}, {"kind": "imagenet", "source": "url"})) == "imagenet"
    state = tmp_path / "weights.pt"
    assert weights_from_manifest(manifest_of({}, {"kind": "path", "source": str(state)})) == str(state)


def test_a_detector_is_timed_one_image_at_a_time_and_says_so():
    """A detector's or segmenter's forms take one image of any size (outputs per image): batch 8 would be refused
    by the runtime with a traceback."""
    said = []
    detector = dataclasses.replace(manifest_of({"registry": "cf-branch"}, {"kind": "random", "source": ""}),
                                   task=DETECTION)
    assert bench.batches_for(detector, [1, 8, 32], said.append) == [1]
    assert said == ["m: a detection model's forms take one image at a time: batch 1 only (not 8, 32); eager-list "
                    "times torchvision's own list of same-size images per call, what batching could buy"]
    classifier = manifest_of({"registry": "cf-branch"}, {"kind": "random", "source": ""})
    assert bench.batches_for(classifier, [1, 8, 32], said.append) == [1, 8, 32] and len(said) == 1


def test_a_torchvision_detector_is_also_timed_with_several_images_in_one_call(tmp_path):
    """What batching could buy, measured on the detector itself (its exported graphs take one image)."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    from models.detection import flat_outputs
    model = flat_outputs(fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None).eval())
    detector = dataclasses.replace(manifest_of({"registry": "cf-branch"}, {"kind": "random", "source": ""}),
                                   task=DETECTION)
    targets = {t.name: t for t in bench.targets_for(tmp_path, detector, model, (1, 4, 32))}
    assert set(targets) == {"eager", "eager-list"} and targets["eager-list"].batches == (1, 4)  # 32: past the cap
    scores = targets["eager-list"].open(bench.RunOptions(threads=1)).predict(torch.rand(3, 3, 64, 80))
    assert len(scores) == 3  # one answer per image of the call
    assert [t.name for t in bench.targets_for(tmp_path, detector, model, (1,))] == ["eager"]


def test_a_manifest_the_model_cannot_be_rebuilt_from_says_so():
    with pytest.raises(ContractError, match="weights.kind 'borrowed' is not one of path"):
        weights_from_manifest(manifest_of({"registry": "cf-branch"}, {"kind": "borrowed", "source": ""}))
    with pytest.raises(ContractError, match="names neither a registry model nor a module"):
        entry_from_manifest(manifest_of({"hub": "x"}, {"kind": "random", "source": ""}))


def test_the_benchmark_does_not_import_the_cli_commands():
    """export.commands runs the benchmark; the benchmark rebuilding models through export.commands was a cycle."""
    code = "import sys, measure.inprocess.bench; print('export.commands' in sys.modules or 'export.cli' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stdout + done.stderr


@pytest.mark.slow
def test_smoke_every_artifact_and_eager_are_benchmarked_and_the_files_written(resnet18_export,
                                                                               resnet18_inprocess_bench):
    out = resnet18_inprocess_bench["out"]
    assert {p.name for p in out.iterdir()} >= {"bench.md", "bench.json", "bench.png"}
    data = json.loads((out / "bench.json").read_text())
    manifest = Manifest.read(resnet18_export["out"])
    measured = {r["artifact"] for r in data["rows"]} | {s["artifact"] for s in data["skipped"]}
    assert measured >= {"eager", *manifest.artifacts}  # every artifact record, whatever its format
    assert {(r["artifact"], r["batch"]) for r in data["rows"]} >= {("eager", 1), ("eager", 2)}
    assert all(r["peak_fraction"] is not None for r in data["rows"])
    assert all(r["peak"] == r["precision"] and r["peak_gflops"] > 0 for r in data["rows"])  # its own precision's peak
    assert all(len(r["runs_ms"]) == 2 for r in data["rows"])  # --rounds 2 of --repeats 1: every target timed twice
    assert data["flops_per_image"]["resnet18"] > 1e9
    stdout = resnet18_inprocess_bench["stdout"]
    assert "[1/" in stdout and "peak" in stdout  # progress shown on the terminal
