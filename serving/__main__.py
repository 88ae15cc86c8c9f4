"""`python -m serving COMMAND`: serving's commands, each imported only when asked for (so `gpu-check` runs
from a plain checkout, without the virtualenv's packages).

  python -m serving [start]        TorchServe with every archive of model-store/, until Ctrl-C
  python -m serving --detach       start, wait until each model answers, print the curl lines, return
  python -m serving stop           stop a server started with --detach
  python -m serving --engine kserve [--detach | stop]   the same archives in KServe's own ModelServer
  python -m serving config --out F config.properties with this machine's serving policy
  python -m serving kserve OUT     KServe material (TorchServe runtime); triton OUT: a Triton repository

Measurements (bench, soak, faults, gpu-check, pipeline, decoders) are `python -m measure COMMAND`.

`python -m serving COMMAND --help` for each command's options.
"""

from __future__ import annotations

import importlib
import sys

# command: (module, function, whether the function is given the command's own name as argv[0])
COMMANDS = {
    "kserve": ("serving.deploy", "deploy", True),
    "triton": ("serving.deploy", "deploy", True),
}
TORCHSERVE = ("serving.torchserve.cli", "main", True)  # start / stop / config, and no command at all
TORCHSERVE_ACTIONS = ("start", "stop", "config")
MEASUREMENTS = ("bench", "soak", "faults", "gpu-check", "pipeline", "decoders")  # now python -m measure
ENGINES = {"torchserve": TORCHSERVE, "kserve": ("serving.kserve.cli", "main", True)}  # --engine (default torchserve)


def engine_of(argv: list[str]) -> tuple[tuple, list[str]]:
    """The engine `--engine NAME` (or --engine=NAME) names, and argv without it."""
    for index, word in enumerate(argv):
        if word == "--engine" or word.startswith("--engine="):
            name = word.split("=", 1)[1] if "=" in word else (argv[index + 1] if index + 1 < len(argv) else "")
            if name not in ENGINES:
                raise SystemExit(f"python -m serving: --engine {name!r}: choose from {', '.join(ENGINES)}")
            rest = argv[:index] + argv[index + (1 if "=" in word else 2):]
            return ENGINES[name], rest
    return TORCHSERVE, argv


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help") and len(argv) == 1:
        print(__doc__)
        return 0
    if argv and not argv[0].startswith("-") and argv[0] not in (*COMMANDS, *TORCHSERVE_ACTIONS, *MEASUREMENTS):
        print(f"python -m serving: unknown command {argv[0]!r}; choose from "
              f"{', '.join((*TORCHSERVE_ACTIONS, *COMMANDS))} (python -m serving --help)", file=sys.stderr)
        return 2
    if argv and argv[0] in MEASUREMENTS:
        from contract.cli import moved
        return moved(f"python -m serving {argv[0]}", f"python -m measure {argv[0]}")
    engine, argv = engine_of(argv)
    module, function, with_name = COMMANDS.get(argv[0], engine) if argv else engine
    command = getattr(importlib.import_module(module), function)
    if module == "serving.deploy":  # the writers raise our errors; run_command turns them into exit codes
        from contract.cli import run_command
        return run_command(lambda: command(argv))
    return command(argv if with_name else argv[1:])


if __name__ == "__main__":
    sys.exit(main())
