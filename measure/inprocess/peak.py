"""This machine's GEMM peak, measured in the same run as the models: the best large GEMM among ONNX Runtime's
MatMul, NumPy's BLAS and torch.mm at each thread count (int8: ONNX Runtime's MatMulInteger), and cuBLAS on a GPU."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from measure.inprocess.records import Peak, best_of, gemm_flops
from runtime.timing import time_runs

GEMM_SIZE = 2048  # 2 * 2048^3 = 17 GFLOP: seconds-long on 2 cores, big enough to reach the kernel's steady state
GEMM_REPEATS = 5  # the peak is the best of these (a peak is the best the machine did, not its median)
# ------------------------------------------------------------------ the machine's peak
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


def gemm_numpy(n: int, threads: int, repeats: int) -> float:
    from threadpoolctl import threadpool_limits
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    with threadpool_limits(limits=threads, user_api="blas"):
        return _best_gflops(lambda: a @ b, n, repeats)


def gemm_torch(n: int, threads: int, repeats: int) -> float:
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(3)
    a, b = torch.randn(n, n, generator=generator), torch.randn(n, n, generator=generator)
    with torch.inference_mode():
        return _best_gflops(lambda: torch.mm(a, b), n, repeats)


def measure_peaks(thread_counts: list[int], n: int = GEMM_SIZE, repeats: int = GEMM_REPEATS,
                  say: Callable[[str], None] = print, vnni: bool = False) -> list[Peak]:
    peaks = []
    fp32 = {"onnxruntime MatMul": lambda t: gemm_ort(n, t, repeats), "numpy BLAS": lambda t: gemm_numpy(n, t, repeats),
            "torch.mm": lambda t: gemm_torch(n, t, repeats)}
    int8_note = ("VNNI" if vnni else "no VNNI on this CPU: the AVX2 u8 x s8 path (vpmaddubsw)")
    for threads in thread_counts:
        by_library = {}
        for library, measure in fp32.items():
            try:
                by_library[library] = measure(threads)
            except ImportError as error:  # a library that is not installed simply does not compete
                say(f"  peak: {library} not measured ({error})")
        library, best = best_of(by_library)
        peaks.append(Peak("fp32", threads, best, library, by_library, f"{n}x{n} GEMM, best of {repeats}"))
        int8 = gemm_ort(n, threads, repeats, int8=True)
        peaks.append(Peak("int8", threads, int8, "onnxruntime MatMulInteger", {"onnxruntime MatMulInteger": int8},
                          f"{n}x{n} uint8 x int8 -> int32 GEMM (GOP/s); {int8_note}"))
        say(f"  peak, {threads} thread(s): fp32 {best:.1f} GFLOP/s ({library}; "
            + ", ".join(f"{k} {v:.1f}" for k, v in by_library.items()) + f"), int8 {int8:.1f} GOP/s")
    return peaks


def gpu_peaks(n: int = 8192, repeats: int = GEMM_REPEATS) -> list[Peak]:
    """fp32 and fp16 torch.mm on the GPU (only called when CUDA is present)."""
    peaks = []
    for dtype, name in ((torch.float32, "fp32"), (torch.float16, "fp16")):
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        value = _best_gflops_cuda(lambda a=a, b=b: torch.mm(a, b), n, repeats)
        peaks.append(Peak(f"cuda-{name}", 0, value, "torch.mm (cuBLAS)", {"torch.mm (cuBLAS)": value}))
    return peaks


def _best_gflops_cuda(run, n, repeats) -> float:
    times = time_runs(run, warmup=2, repeats=repeats, min_seconds=0, synchronize=torch.cuda.synchronize)
    return gemm_flops(n) / (min(times) / 1000) / 1e9




def peak_command(args) -> int:
    """`python -m measure peak`: this machine's peak table, nothing else."""
    from measure.inprocess.records import parse_threads
    from measure.inprocess.report import machine_info, peaks_table
    machine = machine_info()
    print(f"machine: {machine['cpu']}, {machine['cores']} cores, VNNI {'yes' if machine['vnni'] else 'no'}")
    peaks = measure_peaks(parse_threads(args.threads, machine["cores"]), args.gemm_size, vnni=machine["vnni"])
    if torch.cuda.is_available():
        peaks += gpu_peaks()
    print("\n" + peaks_table(peaks))
    return 0
