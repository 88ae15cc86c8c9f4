"""`python -m measure inprocess | peak | aoti-tuning`: the measurements made in one process, their options."""

from __future__ import annotations

import argparse
from pathlib import Path

from contract.cli import run_command
from measure.inprocess.bench import DEFAULT_BATCHES, DEFAULT_REPEATS, DEFAULT_THREADS, DEFAULT_WARMUP
from measure.inprocess.peak import GEMM_SIZE
from runtime.timing import MIN_TIMED_S

OUT = Path("bench-results")


def inprocess_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m measure inprocess",
        description="Time eager and every artifact of each export folder through runtime/ at each batch and thread "
                    "count; measure this machine's GEMM peak per precision (fp32, bf16, int8) in the same run and "
                    "hold each row to its own precision's; write bench.md, bench.json and bench.png.")
    parser.add_argument("folders", nargs="*", type=Path, metavar="EXPORT_DIR",
                        help="export folders (default: artifacts/resnet50)")
    parser.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)),
                        help="batch sizes (default: %(default)s)")
    _threads_option(parser, DEFAULT_THREADS)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help="timed runs at least (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed runs first (default: %(default)s)")
    parser.add_argument("--min-seconds", type=float, default=MIN_TIMED_S,
                        help="timed runs last at least this long in all (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="the targets take turns this many times, each round timing every one, and each row is "
                             "the median over all rounds: on a shared machine a neighbour's load then falls on every "
                             "target alike instead of on whichever ran while it lasted (default: %(default)s)")
    _gemm_option(parser)
    parser.add_argument("--out", type=Path, default=OUT, help="where bench.md/json/png go (default: %(default)s)")
    return parser


def peak_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m measure peak",
        description="This machine's GEMM peaks alone, per precision at each thread count: the best large fp32 GEMM "
                    "of ONNX Runtime, NumPy and torch; bf16 (torch.mm in bfloat16 through oneDNN, OpenVINO's MatMul); "
                    "int8 (ONNX Runtime's MatMulInteger, torch._int_mm); each with the kernel its library reports "
                    "(cuBLAS fp32, fp16 and bf16 too where there is a GPU).")
    _threads_option(parser, DEFAULT_THREADS)
    _gemm_option(parser)
    return parser


def tuning_parser() -> argparse.ArgumentParser:
    from measure.inprocess.aoti_tuning import CONFIGURATIONS
    parser = argparse.ArgumentParser(
        prog="python -m measure aoti-tuning",
        description="Compile the model's torch.export program with each AOTInductor configuration and time it beside "
                    "eager, the ExportedProgram and ONNX Runtime in the same run; write aoti-tuning.md, .json and "
                    ".png.")
    parser.add_argument("--model", default="resnet50", help="a registry name, e.g. resnet18 (default: %(default)s)")
    parser.add_argument("--configurations", default=",".join(c.name for c in CONFIGURATIONS),
                        help="comma-separated, of: " + "; ".join(f"{c.name}: {c.what}" for c in CONFIGURATIONS) +
                             " (default: all; each compile takes up to a minute (max-autotune two) for a ResNet on "
                             "2 cores)")
    parser.add_argument("--batches", default="1,8", help="batch sizes (default: %(default)s)")
    _threads_option(parser, "1,all")
    parser.add_argument("--busy-cores", type=int, default=0, metavar="N",
                        help="N processes spin on the CPU while timing: a machine shared with other work or other "
                             "serving workers (default: 0)")
    parser.add_argument("--out", type=Path, default=OUT, help="where aoti-tuning.* go (default: %(default)s)")
    return parser


def _threads_option(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--threads", default=default,
                        help="CPU thread counts, 'all' = every core (default: %(default)s; 1 is one worker's share "
                             "under the CPU serving policy on up to 4 cores)")


def _gemm_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gemm-size", type=int, default=GEMM_SIZE,
                        help="N of the NxN peak GEMM (default: %(default)s)")


def inprocess_main(argv: list[str]) -> int:
    args = inprocess_parser().parse_args(argv)
    from measure.inprocess.bench import bench_command
    return run_command(lambda: bench_command(args))


def peak_main(argv: list[str]) -> int:
    args = peak_parser().parse_args(argv)
    from measure.inprocess.peak import peak_command
    return run_command(lambda: peak_command(args))


def tuning_main(argv: list[str]) -> int:
    args = tuning_parser().parse_args(argv)
    from measure.inprocess.aoti_tuning import tuning_command
    return run_command(lambda: tuning_command(args))
