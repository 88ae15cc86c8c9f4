"""What every engine of `python -m serving` shares, defined once: the address and folders it serves from, its
timeouts, the serving policy decided from this machine and the command line, the model store's archives, the
error it raises, and the settings record each engine's own settings extend."""

from __future__ import annotations

import json
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

from contract.errors import VisionExportError
from handlers.policy import ServingPolicy, machine_policy, this_machine, with_overrides

PROJECT_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_IMAGE = PROJECT_ROOT / "examples" / "cat.jpg"

HOST = "127.0.0.1"
DEFAULT_RUN_DIR = Path(".serving")  # logs, each engine's pid file and what the engine writes for itself
DEFAULT_MODEL_STORE = Path("model-store")

READY_TIMEOUT_S = 240  # start until every model has answered a real prediction (a cold start plus model loads)
STOP_TIMEOUT_S = 60  # SIGTERM to SIGKILL
REQUEST_TIMEOUT_S = 60  # one HTTP request to a running server; a slow shared machine must not turn latency into errors
# One readiness probe. A server may hold a prediction until a worker is up, so a probe sent while workers die
# would wait out REQUEST_TIMEOUT_S before the logs were read again; a probe that times out is simply sent again,
# so a slow first answer is still waited for (READY_TIMEOUT_S).
PROBE_TIMEOUT_S = 10


class ServingError(VisionExportError):
    """A server did not come up, or cannot be started as asked; the message says why and what to do."""


@dataclass
class ServingSettings:
    """What every engine is told; an engine's own settings extend it (its ports, its files)."""

    model_store: Path = DEFAULT_MODEL_STORE
    models: tuple[str, ...] = ()  # NAME for NAME.mar of the store; python -m serving: every archive there
    host: str = HOST
    run_dir: Path = DEFAULT_RUN_DIR
    policy: ServingPolicy | None = None  # None: decided for this machine when the server starts
    extra_env: dict = field(default_factory=dict)  # added to the server's environment

    def effective_policy(self) -> ServingPolicy:
        return self.policy or machine_policy(*this_machine())

    def served_models(self) -> tuple[str, ...]:
        return tuple(self.models)

    @property
    def log_dir(self) -> Path:
        return self.run_dir.absolute() / "logs"

    def write_file(self, name: str) -> Path:
        """These settings as RUN_DIR/name, with the policy decided here, for a server process to read (an engine
        whose server cannot take them as flags)."""
        path = self.run_dir.absolute() / name
        record = {**asdict(self), "model_store": str(Path(self.model_store).absolute()),
                  "run_dir": str(self.run_dir.absolute()), "models": list(self.models),
                  "policy": asdict(self.effective_policy())}
        path.write_text(json.dumps(record, indent=2))
        return path

    @classmethod
    def read(cls, path: Path):
        """The settings write_file wrote."""
        record = json.loads(Path(path).read_text())
        return cls(**{**record, "model_store": Path(record["model_store"]), "run_dir": Path(record["run_dir"]),
                      "models": tuple(record["models"]), "policy": ServingPolicy(**record["policy"])})


def archives_in(model_store: Path) -> list[str]:
    """The models a store holds: NAME for every NAME.mar, sorted."""
    return sorted(path.stem for path in Path(model_store).glob("*.mar"))


def choose_models(model_store: Path, requested: list[str] | None) -> tuple[str, ...]:
    """The requested models (each must have its archive), or every archive in the store."""
    present = archives_in(model_store)
    if not present:
        raise ServingError(f"no archive (*.mar) in {Path(model_store).absolute()}: run `python -m export resnet` first "
                           f"(it writes {model_store}/resnet50.mar), or pass --model-store the folder that holds yours")
    missing = [name for name in requested or () if name not in present]
    if missing:
        raise ServingError(f"{', '.join(f'{name}.mar' for name in missing)} not in {model_store} (it holds "
                           f"{', '.join(present)}): export it with `python -m export ... --model-store {model_store}`")
    return tuple(requested or present)


def free_port() -> int:
    """A loopback port nobody holds right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def decide_policy(flags) -> ServingPolicy:
    """This machine's policy (handlers/policy.py) with what --workers, --batch-size, --max-batch-delay and
    --threads (flags.workers ... flags.threads, None when not given) override."""
    return policy_with(flags.workers, flags.batch_size, flags.max_batch_delay, flags.threads)


def policy_with(workers: int | None = None, batch_size: int | None = None, max_batch_delay: int | None = None,
                threads: int | None = None) -> ServingPolicy:
    """This machine's policy with the choices given (None: the policy's own), each checked as its flag is."""
    chosen = {"workers": workers, "batch_size": batch_size, "threads": threads}
    for flag, value in chosen.items():
        if value is not None and value < 1:
            raise ServingError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    if max_batch_delay is not None and max_batch_delay < 0:
        raise ServingError(f"--max-batch-delay must be 0 or more, got {max_batch_delay}")
    gpus, cores = this_machine()
    return with_overrides(machine_policy(gpus, cores), workers, batch_size, max_batch_delay, threads, cores)
