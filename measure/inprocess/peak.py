"""This machine's matrix-multiply peak per precision, measured in the same run as the models, at each thread count:
fp32 (the best large GEMM among ONNX Runtime's MatMul, NumPy's BLAS and torch.mm), bf16 (torch.mm in bfloat16,
which oneDNN runs on AMX or AVX512_BF16 where the CPU has them, and OpenVINO's MatMul with the bf16 precision
hint) and int8 (ONNX Runtime's MatMulInteger and torch._int_mm, both 8-bit integer GEMMs accumulating in int32);
cuBLAS fp32, fp16 and bf16 on a GPU. Each peak records the kernel its libraries said they ran (oneDNN's verbose
line, OpenVINO's runtime model) or, where a library does not say (ONNX Runtime), the CPU flags its kernel is
chosen by."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from measure.inprocess.records import Peak, best_of, gemm_flops
from runtime import machine
from runtime.timing import time_runs

GEMM_SIZE = 2048  # 2 * 2048^3 = 17 GFLOP: seconds-long on 2 cores, big enough to reach the kernel's steady state
GEMM_REPEATS = 5  # the peak is the best of these (a peak is the best the machine did, not its median)
INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")  # what an x86 int8 GEMM kernel is chosen by, richest first


@dataclass
class Measured:
    gflops: float  # GFLOP/s (int8: GOP/s)
    kernel: str = ""  # what the library said it ran ("" where it does not say)


# ------------------------------------------------------------------ what a library says it ran
_onednn_isa = ""  # oneDNN prints its ISA line once per process: kept from the first verbose capture


def onednn_kernel(run: Callable[[], object]) -> str:
    """Run once with oneDNN's verbose mode on (what ONEDNN_VERBOSE=1 prints) and return the implementation it
    executed with oneDNN's ISA line, e.g. 'oneDNN brg_matmul:avx512_core_bf16 (isa: Intel AVX-512 with Intel DL
    Boost and bfloat16 support)'; '' where the call did not go through oneDNN (torch's fp32 mm: its BLAS). The
    verbose lines go to the process's stdout in C, so fd 1 is pointed at a temporary file for this one call."""
    global _onednn_isa
    sys.stdout.flush()
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(1)
        os.dup2(captured.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                run()
        except AssertionError:  # torch without oneDNN: no verbose mode to turn on
            run()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        captured.seek(0)
        isa, implementation = parse_onednn_verbose(captured.read().decode(errors="replace"))
    _onednn_isa = isa or _onednn_isa
    if not implementation:
        return ""
    return f"oneDNN {implementation}" + (f" (isa: {_onednn_isa})" if _onednn_isa else "")


def parse_onednn_verbose(text: str) -> tuple[str, str]:
    """(oneDNN's ISA line, the implementation of the last primitive executed on the CPU, or its primitive's name
    where the implementation is blank, as for the integer gemm_api); '' for what the text does not have."""
    isa = re.search(r"^onednn_verbose,(?:v\d+,)?info,cpu,isa:(.*)$", text, re.MULTILINE)
    executed = re.findall(r"^onednn_verbose,(?:v\d+,)?primitive,exec,cpu,([^,]*),([^,]*),", text, re.MULTILINE)
    primitive, implementation = executed[-1] if executed else ("", "")
    return (isa.group(1).strip() if isa else ""), implementation or primitive


def int8_flags_note(flags: set[str]) -> str:
    """What ONNX Runtime's MLAS chooses its u8 x s8 kernel by (it does not report the kernel it picked)."""
    present = [flag for flag in INT8_FLAGS if flag in flags]
    if present:
        return f"MLAS u8s8 (not reported; the CPU has {', '.join(present)})"
    return "MLAS u8s8 (not reported; no VNNI on this CPU: the AVX2 u8 x s8 path, vpmaddubsw)"


def bf16_note(flags: set[str]) -> str:
    """Whether this CPU multiplies bf16 natively; without it the bf16 figure is of emulated bf16."""
    native = [flag for flag in ("amx_bf16", "avx512_bf16") if flag in flags]
    if native:
        return f"native bf16: {', '.join(native)}" + (" (AMX)" if "amx_bf16" in native else "")
    return ("no native bf16 on this CPU (neither amx_bf16 nor avx512_bf16): the figure is of emulated bf16 "
            "(converted to fp32 inside the kernel)")


# ------------------------------------------------------------------ one GEMM per library
def _ort_gemm_session(n: int, threads: int, int8: bool):
    """A one-node ONNX model: MatMul (fp32) or MatMulInteger (uint8 x int8), B a constant like a weight."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    if int8:
        b = rng.integers(-127, 128, (n, n), dtype=np.int8)
        node = helper.make_node("MatMulInteger", ["A", "B"], ["C"])
        a_type, c_type = TensorProto.UINT8, TensorProto.INT32
    else:
        b = rng.standard_normal((n, n), dtype=np.float32)
        node = helper.make_node("MatMul", ["A", "B"], ["C"])
        a_type = c_type = TensorProto.FLOAT
    graph = helper.make_graph([node], "gemm", [helper.make_tensor_value_info("A", a_type, [n, n])],
                              [helper.make_tensor_value_info("C", c_type, [n, n])],
                              [numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), sess_options=options,
                                providers=["CPUExecutionProvider"])


def _best_gflops(run: Callable[[], object], n: int, repeats: int) -> float:
    times = time_runs(run, warmup=1, repeats=repeats, min_seconds=0)
    return gemm_flops(n) / (min(times) / 1000) / 1e9


def gemm_ort(n: int, threads: int, repeats: int, int8: bool = False) -> float:
    session = _ort_gemm_session(n, threads, int8)
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (n, n), dtype=np.uint8) if int8 else rng.standard_normal((n, n), dtype=np.float32)
    return _best_gflops(lambda: session.run(None, {"A": a}), n, repeats)


def gemm_numpy(n: int, threads: int, repeats: int) -> Measured:
    from threadpoolctl import threadpool_info, threadpool_limits
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    with threadpool_limits(limits=threads, user_api="blas"):
        gflops = _best_gflops(lambda: a @ b, n, repeats)
    blas = next((info for info in threadpool_info() if info.get("user_api") == "blas"), {})
    kernel = " ".join(str(blas[key]) for key in ("internal_api", "architecture") if blas.get(key))
    return Measured(gflops, kernel)


def gemm_torch(n: int, threads: int, repeats: int, dtype: torch.dtype = torch.float32) -> Measured:
    """torch.mm in `dtype` (float32, or bfloat16: oneDNN's matmul where the CPU has native bf16)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(3)
        a = torch.randn(n, n, generator=generator).to(dtype)
        b = torch.randn(n, n, generator=generator).to(dtype)
        with torch.inference_mode():
            kernel = onednn_kernel(lambda: torch.mm(a, b))  # also the first warm-up run
            return Measured(_best_gflops(lambda: torch.mm(a, b), n, repeats), kernel)
    finally:
        torch.set_num_threads(previous)


def gemm_torch_int8(n: int, threads: int, repeats: int) -> Measured:
    """torch._int_mm: int8 x int8 -> int32 (oneDNN's integer GEMM on x86); RuntimeError where this torch or CPU
    has none."""
    if not hasattr(torch, "_int_mm"):
        raise RuntimeError("this torch has no torch._int_mm")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(4)
        a = torch.randint(-128, 128, (n, n), dtype=torch.int8, generator=generator)
        b = torch.randint(-128, 128, (n, n), dtype=torch.int8, generator=generator)
        with torch.inference_mode():
            kernel = onednn_kernel(lambda: torch._int_mm(a, b))
            return Measured(_best_gflops(lambda: torch._int_mm(a, b), n, repeats), kernel)
    finally:
        torch.set_num_threads(previous)


def gemm_openvino_bf16(n: int, threads: int, repeats: int) -> Measured:
    """OpenVINO's MatMul with B a constant (a FullyConnected, as in a model) compiled as the openvino-bf16 forms
    are (runtime/openvino.py's settings, bf16 precision hint); the kernel is its runtime model's primitiveType."""
    import openvino
    from openvino import opset13 as ops

    from runtime.base import RunOptions
    from runtime.openvino import compile_config
    rng = np.random.default_rng(5)
    a = ops.parameter([n, n], np.float32, name="A")
    model = openvino.Model([ops.matmul(a, ops.constant(rng.standard_normal((n, n), dtype=np.float32)), False, False)],
                           [a], "gemm")
    compiled = openvino.Core().compile_model(model, "CPU", compile_config(RunOptions(device="cpu", threads=threads, precision="bf16")))
    request, x = compiled.create_infer_request(), rng.standard_normal((n, n), dtype=np.float32)
    gflops = _best_gflops(lambda: request.infer({0: x}), n, repeats)
    kernels = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "layerType" in info and info["layerType"].astype(str) in ("FullyConnected", "MatMul"):
            kernels.append(f"{info['primitiveType'].astype(str)}, {info['runtimePrecision'].astype(str)}")
    return Measured(gflops, f"OpenVINO {'; '.join(kernels)}" if kernels else "")


def peak_libraries(n: int, repeats: int, flags: set[str]) -> dict[str, dict[str, Callable[[int], Measured]]]:
    """precision -> library -> measure(threads)."""
    int8_kernel = int8_flags_note(flags)
    return {
        "fp32": {"onnxruntime MatMul": lambda t: Measured(gemm_ort(n, t, repeats)),
                 "numpy BLAS": lambda t: gemm_numpy(n, t, repeats),
                 "torch.mm": lambda t: gemm_torch(n, t, repeats)},
        "bf16": {"torch.mm": lambda t: gemm_torch(n, t, repeats, torch.bfloat16),
                 "openvino MatMul": lambda t: gemm_openvino_bf16(n, t, repeats)},
        "int8": {"onnxruntime MatMulInteger": lambda t: Measured(gemm_ort(n, t, repeats, int8=True), int8_kernel),
                 "torch._int_mm": lambda t: gemm_torch_int8(n, t, repeats)},
    }


def peak_note(precision: str, n: int, repeats: int, flags: set[str]) -> str:
    size = f"{n}x{n}"
    if precision == "bf16":
        return f"{size} bf16 GEMM (fp32 accumulation), best of {repeats}; {bf16_note(flags)}"
    if precision == "int8":
        present = [flag for flag in INT8_FLAGS if flag in flags]
        return (f"{size} 8-bit integer GEMM -> int32 (GOP/s; ONNX Runtime u8 x s8, torch s8 x s8), best of {repeats}; "
                + (f"VNNI: {', '.join(present)}" if present else "no VNNI on this CPU: the AVX2 u8 x s8 path"))
    return f"{size} GEMM, best of {repeats}"


def measure_peaks(thread_counts: list[int], n: int = GEMM_SIZE, repeats: int = GEMM_REPEATS,
                  say: Callable[[str], None] = print, flags: set[str] | None = None) -> list[Peak]:
    """The fp32, bf16 and int8 peaks at each thread count. A library that is not installed or cannot run here
    does not compete (said once per thread count); a precision no library could measure has no peak, and its rows
    then say so."""
    flags = machine.cpu_flags() if flags is None else flags
    peaks = []
    for threads in thread_counts:
        said = []
        for precision, libraries in peak_libraries(n, repeats, flags).items():
            by_library, kernels = {}, {}
            for library, measure in libraries.items():
                try:
                    measured = measure(threads)
                except (ImportError, RuntimeError) as error:
                    say(f"  peak: {precision} {library} not measured ({type(error).__name__}: {error})")
                    continue
                by_library[library], kernels[library] = measured.gflops, measured.kernel
            if not by_library:
                said.append(f"{precision} not measured")
                continue
            library, best = best_of(by_library)
            peaks.append(Peak(precision, threads, best, library, by_library, peak_note(precision, n, repeats, flags),
                              kernels))
            unit = "GOP/s" if precision == "int8" else "GFLOP/s"
            said.append(f"{precision} {best:.1f} {unit} ({library}"
                        + (f": {kernels[library]}" if kernels[library] else "") + ")")
        say(f"  peak, {threads} thread(s): " + "; ".join(said))
    return peaks


def gpu_peaks(n: int = 8192, repeats: int = GEMM_REPEATS) -> list[Peak]:
    """fp32, fp16 and (where the GPU has it) bf16 torch.mm on the GPU (only called when CUDA is present)."""
    peaks = []
    dtypes = [(torch.float32, "fp32"), (torch.float16, "fp16")]
    if torch.cuda.is_bf16_supported():
        dtypes.append((torch.bfloat16, "bf16"))
    for dtype, name in dtypes:
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        value = _best_gflops_cuda(lambda a=a, b=b: torch.mm(a, b), n, repeats)
        peaks.append(Peak(f"cuda-{name}", 0, value, "torch.mm (cuBLAS)", {"torch.mm (cuBLAS)": value},
                          f"{n}x{n} {name} GEMM on {torch.cuda.get_device_name()}, best of {repeats}"))
    return peaks


def _best_gflops_cuda(run, n, repeats) -> float:
    times = time_runs(run, warmup=2, repeats=repeats, min_seconds=0, synchronize=torch.cuda.synchronize)
    return gemm_flops(n) / (min(times) / 1000) / 1e9


def peak_command(args) -> int:
    """`python -m measure peak`: this machine's peak table, nothing else."""
    from measure.inprocess.records import parse_threads
    from measure.inprocess.report import machine_info, peak_notes, peaks_table
    info = machine_info()
    print(f"machine: {info['cpu']}, {info['cores']} cores; {info['isa'] or 'no AVX2'}")
    peaks = measure_peaks(parse_threads(args.threads, info["cores"]), args.gemm_size)
    if torch.cuda.is_available():
        peaks += gpu_peaks()
    print("\n" + peaks_table(peaks) + "\n\n" + peak_notes(peaks))
    return 0
