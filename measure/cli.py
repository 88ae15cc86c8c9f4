"""`python -m measure COMMAND`: every measurement of the project, each imported only when asked for (so
`gpu-check` runs from a plain checkout, without the virtualenv's packages). `python -m measure COMMAND --help`
for each command's options. Performance is measured here, by commands that print tables and draw charts,
never by timed tests."""

from __future__ import annotations

import argparse
import importlib
import sys

# command: (module, function taking the command's own argv, what it measures)
COMMANDS = {
    "bench": ("measure.served.bench", "main",
              "the served model under load, per configuration and body, beside the naive baseline, the LitServe peer "
              "and the ceilings measured in the same run (make bench)"),
    "inprocess": ("measure.inprocess.cli", "inprocess_main",
                  "every artifact of an export in one process, against this machine's GEMM peak (make bench-inprocess)"),
    "peak": ("measure.inprocess.cli", "peak_main", "this machine's GEMM peak alone (fp32, bf16 and int8)"),
    "aoti-tuning": ("measure.inprocess.cli", "tuning_main", "AOTInductor's CPU options on one model"),
    "pipeline": ("measure.request_path.stages", "main",
                 "the request path's ceiling in one process (decode, preprocess, inference, encode), per body"),
    "decoders": ("measure.request_path.decoders", "main", "JPEG decoders compared per body size"),
    "soak": ("measure.reliability.soak", "main", "a served model held under steady load: errors and worker memory"),
    "faults": ("measure.reliability.faults", "main",
               "a worker killed under load on each engine (--engine): requests lost, wrong answers, seconds until "
               "its replacement answers and where they went"),
    "rollout": ("measure.reliability.rollout", "main",
                "a rollout and a rollback under load: failed requests, versions answering, switch time, latency"),
    "attack": ("measure.reliability.attack", "main",
               "hostile reads against a running server (length -1, oversized, chunked, slow, many connections): "
               "its memory and a normal request's answer"),
    "start": ("measure.start", "main", "a start phase by phase, until the first real answer, per engine"),
    "gpu-check": ("measure.gpu.check", "main", "the GPU path proven on a CUDA machine (make gpu-check)"),
    "ray-two-node": ("measure.distributed.two_node", "main",
                     "a Ray node killed under load on a two-node Ray Serve cluster (pip install '.[ray]' first)"),
    "ray-autoscale": ("measure.distributed.autoscale", "main",
                      "Ray Serve's autoscaler under a load step: a replica added, then given back (pip install '.[ray]')"),
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m measure", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, _, what) in COMMANDS.items():
        commands.add_parser(name, help=what, add_help=False)  # its options are its own parser's
    return top


def main(argv: list[str] | None = None) -> int:
    """The command's own main gets everything after its name; anything else is argparse's help or error."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        parser().parse_args(argv)  # prints the help, or the error naming the choices (exit 0 or 2)
        return 2
    module, function, _ = COMMANDS[argv[0]]
    return getattr(importlib.import_module(module), function)(argv[1:])
