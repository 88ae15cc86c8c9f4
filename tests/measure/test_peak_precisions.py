"""The in-process benchmark's peaks per precision: which peak each row is held to (its own precision's, or none,
said so), how the report and bench.json say it, and the bf16 and int8 GEMMs measured on this CPU at a small size
(fast). No test asserts a timing beyond "positive and finite"."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from measure.inprocess import bench, peak
from measure.inprocess.records import Peak, Report, Row, held_to, hold_to_peak
from runtime import machine

PEAKS = [Peak("fp32", 1, 100.0, "numpy BLAS", {"numpy BLAS": 100.0}),
         Peak("bf16", 1, 400.0, "torch.mm", {"torch.mm": 400.0}, "native bf16: avx512_bf16",
              {"torch.mm": "oneDNN brg_matmul:avx512_core_bf16 (isa: Intel AVX-512 with Intel DL Boost and bfloat16 "
                           "support)"}),
         Peak("int8", 1, 800.0, "torch._int_mm", {"torch._int_mm": 800.0, "onnxruntime MatMulInteger": 700.0}),
         Peak("cuda-fp16", 0, 9000.0, "torch.mm (cuBLAS)", {"torch.mm (cuBLAS)": 9000.0})]


def row(precision: str, gflops: float = 80.0, device: str = "cpu", threads: int = 1, artifact: str = "x") -> Row:
    return Row("resnet50", artifact, "onnx", precision, device, threads, 8, 100.0, 80.0, gflops, None, "B", [100.0])


@pytest.mark.parametrize(("precision", "device", "held", "fraction"), [
    ("fp32", "cpu", "fp32", 0.8), ("bf16", "cpu", "bf16", 0.2), ("int8", "cpu", "int8", 0.1),
    ("fp16", "cuda:0", "cuda-fp16", 80 / 9000)])
def test_each_row_is_held_to_the_peak_of_its_own_precision(precision, device, held, fraction):
    measured = hold_to_peak(row(precision, device=device, threads=0 if device != "cpu" else 1), PEAKS)
    assert measured.peak == held and measured.peak_fraction == pytest.approx(fraction)
    assert measured.peak_gflops == next(p.gflops for p in PEAKS if p.dtype == held)


def test_a_row_whose_precision_has_no_measured_peak_says_so_instead_of_borrowing_another():
    for measured in (hold_to_peak(row("fp16"), PEAKS),  # no CPU fp16 peak
                     hold_to_peak(row("fp32", device="cuda:0", threads=0), PEAKS),  # no cuda-fp32 measured here
                     hold_to_peak(row("bf16", threads=2), PEAKS)):  # no 2-thread peak
        assert measured.peak_fraction is None and measured.peak_gflops is None
        assert held_to(measured) == f"no {measured.peak} peak"
    assert held_to(hold_to_peak(row("bf16", gflops=300.0), PEAKS)) == "75% of bf16"


def test_a_bf16_row_is_no_longer_measured_against_the_fp32_peak():
    """The issue's 414 %: a bf16 row four times the fp32 GEMM is a fraction of the bf16 GEMM."""
    measured = hold_to_peak(row("bf16", gflops=414.0), PEAKS[:1] + PEAKS[1:2])
    assert measured.peak == "bf16" and measured.peak_fraction == pytest.approx(414 / 400)


def test_the_report_and_bench_json_say_which_peak_each_row_was_held_to(tmp_path):
    rows = [row("fp32", artifact="onnx-dynamo"), row("bf16", 300.0, artifact="openvino-bf16"),
            row("int8", 400.0, artifact="onnx-int8"), row("fp16", artifact="scripted-fp16")]
    bench.apply_peaks(rows, PEAKS)
    report = Report(machine={"cpu": "Test CPU", "cores": 2, "vnni": True, "torch_cpu_capability": "AVX512",
                             "isa": "avx2 avx512_bf16 avx512_vnni", "bf16_native": True, "torch": "x",
                             "onnxruntime": "y", "numpy": "z", "load_average_at_start": None},
                    peaks=PEAKS[:3], flops_per_image={"resnet50": 8.2e9}, rows=rows,
                    settings={"repeats": 5, "warmup": 2, "min_seconds": 1.0})
    text = bench.render_markdown(report)
    assert "| 80.0 | 80% of fp32 |" in text and "| 300.0 | 75% of bf16 |" in text and "| 400.0 | 50% of int8 |" in text
    assert "| 80.0 | no fp16 peak |" in text
    assert "| bf16 | 1 | 400.0 | torch.mm | oneDNN brg_matmul:avx512_core_bf16 |" in text
    assert "ISA flags: avx2 avx512_bf16 avx512_vnni" in text and "bf16: native" in text
    assert "Intel DL Boost and bfloat16" in text  # the ISA oneDNN said, in the notes under the table
    (tmp_path / "bench.json").write_text(json.dumps(dataclasses.asdict(report)))
    loaded = bench.load_report(tmp_path / "bench.json")
    assert [(r.peak, r.peak_gflops) for r in loaded.rows] == [("fp32", 100.0), ("bf16", 400.0), ("int8", 800.0),
                                                              ("fp16", None)]
    assert loaded.peaks[1].kernels["torch.mm"].startswith("oneDNN brg_matmul")


def test_a_bench_json_written_before_rows_recorded_their_peak_still_loads(tmp_path):
    old = dataclasses.asdict(Report(machine={"cpu": "c"}, peaks=[Peak("fp32", 1, 1.0, "numpy BLAS")],
                                    rows=[row("fp32")]))
    for record in old["rows"]:
        del record["peak"], record["peak_gflops"]
    for record in old["peaks"]:
        del record["kernels"]
    (tmp_path / "bench.json").write_text(json.dumps(old))
    loaded = bench.load_report(tmp_path / "bench.json").rows[0]
    assert loaded.peak == "" and held_to(loaded) == "—"


def test_peaks_of_start_and_end_merge_their_kernels():
    start = [Peak("bf16", 1, 90.0, "torch.mm", {"torch.mm": 90.0}, "n", {"torch.mm": "oneDNN a"})]
    end = [Peak("bf16", 1, 95.0, "openvino MatMul", {"torch.mm": 80.0, "openvino MatMul": 95.0}, "n",
                {"torch.mm": "", "openvino MatMul": "OpenVINO b"})]
    merged, = bench.merge_peaks(start, end)
    assert merged.library == "openvino MatMul" and merged.kernels == {"torch.mm": "oneDNN a", "openvino MatMul": "OpenVINO b"}


def test_onednn_verbose_lines_give_the_isa_and_the_kernel():
    text = ("onednn_verbose,v1,info,oneDNN v3.12.0 (commit 80afa71)\n"
            "onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with Intel DL Boost and bfloat16 support\n"
            "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_amx,undef,src:bf16::blocked:ab::f0,"
            ",,64x64:64x64,7.3\n")
    assert peak.parse_onednn_verbose(text) == ("Intel AVX-512 with Intel DL Boost and bfloat16 support",
                                               "brg_matmul:avx512_core_amx")
    integer = "onednn_verbose,v1,primitive,exec,cpu,gemm_api,,undef,src_s8::blocked:ab:f0,,,64x64:64x64,31.2\n"
    assert peak.parse_onednn_verbose(integer) == ("", "gemm_api")
    assert peak.parse_onednn_verbose("") == ("", "")


def test_the_notes_say_whether_bf16_is_native_and_what_the_int8_kernel_is_chosen_by():
    assert peak.bf16_note({"avx512_bf16", "amx_bf16"}) == "native bf16: amx_bf16, avx512_bf16 (AMX)"
    assert peak.bf16_note({"avx512_bf16"}) == "native bf16: avx512_bf16"
    assert "emulated bf16" in peak.bf16_note({"avx2"})
    assert "amx_int8, avx512_vnni" in peak.int8_flags_note({"avx512_vnni", "amx_int8"})
    assert "no VNNI" in peak.int8_flags_note({"avx2"}) and "no VNNI" in peak.peak_note("int8", 64, 1, {"avx2"})


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def test_the_bf16_and_int8_peaks_are_measured_on_this_cpu_quickly():
    """A real bf16 GEMM (torch.mm in bfloat16: oneDNN) and two real int8 GEMMs (torch._int_mm, ONNX Runtime's
    MatMulInteger), at a size that takes milliseconds; the peak records what it ran where the library says."""
    said = []
    peaks = {p.dtype: p for p in peak.measure_peaks([1], n=128, repeats=1, say=said.append)}
    assert set(peaks) == {"fp32", "bf16", "int8"}
    bf16, int8 = peaks["bf16"], peaks["int8"]
    assert "torch.mm" in bf16.by_library and _positive(bf16.gflops)
    assert {"torch._int_mm", "onnxruntime MatMulInteger"} <= set(int8.by_library) and _positive(int8.gflops)
    assert all(_positive(value) for p in peaks.values() for value in p.by_library.values())
    assert ("emulated" in bf16.note) != any(flag in machine.cpu_flags() for flag in machine.BF16_FLAGS)
    if machine.is_x86() and any(flag in machine.cpu_flags() for flag in machine.BF16_FLAGS):
        assert bf16.kernels["torch.mm"].startswith("oneDNN ")  # native bf16 on x86: oneDNN's matmul said so
    assert int8.kernels["onnxruntime MatMulInteger"].startswith("MLAS u8s8")
    assert "bf16" in said[-1] and "int8" in said[-1]


def test_openvino_bf16_gemm_runs_and_says_its_kernel():
    pytest.importorskip("openvino")
    measured = peak.gemm_openvino_bf16(128, 1, 1)
    assert _positive(measured.gflops) and measured.kernel.startswith("OpenVINO ")


def test_a_library_that_cannot_run_here_does_not_compete(monkeypatch):
    def broken(n, threads, repeats):
        raise RuntimeError("no int8 GEMM on this CPU")
    monkeypatch.setattr(peak, "gemm_torch_int8", broken)
    said = []
    int8 = next(p for p in peak.measure_peaks([1], n=64, repeats=1, say=said.append) if p.dtype == "int8")
    assert set(int8.by_library) == {"onnxruntime MatMulInteger"}
    assert any("torch._int_mm not measured (RuntimeError: no int8 GEMM on this CPU)" in line for line in said)
