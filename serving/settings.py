"""What every engine of `python -m serving` shares, defined once: the address and folders it serves from, its
timeouts, each model's serving policy (resolved once from this machine, the archive's pins and the command's
flags by contract/policy.py's resolve_policy), the model store's archives, the error it raises, and the settings
record each engine's own settings extend."""

from __future__ import annotations

import json
import socket
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from contract.errors import VisionExportError
from contract.policy import NOTHING_CHOSEN, Machine, PolicyChoices, ServingPolicy, resolve_policy
from contract.versions import ModelVersion, is_versioned, served_archive
from handlers.policy import this_machine_resources

PROJECT_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_IMAGE = PROJECT_ROOT / "examples" / "cat.jpg"

HOST = "127.0.0.1"
DEFAULT_RUN_DIR = Path(".serving")  # logs, each engine's pid file and what the engine writes for itself
DEFAULT_MODEL_STORE = Path("model-store")
KEY_FILE = "key_file.json"  # with tokens on, the inference and management keys, in the run dir (serving/auth.py)

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
    policy: ServingPolicy | None = None  # given whole (a test, a measurement): every model's, as it is
    extra_env: dict = field(default_factory=dict)  # added to the server's environment
    flags: PolicyChoices = NOTHING_CHOSEN  # the command's --workers ...: resolved with each archive's pins
    # Each served model's policy as resolved for this start: what the run config carries, read as it is.
    policies: dict[str, ServingPolicy] = field(default_factory=dict)
    token_auth: bool = False  # callers send a key of KEY_FILE (serving/auth.py), on every engine

    @property
    def key_file(self) -> Path:
        return self.run_dir.absolute() / KEY_FILE

    def resolve_policies(self, machine: Machine | None = None) -> dict[str, ServingPolicy]:
        """Each served model's policy, resolved (resolve_policy: this machine, its archive's pins, the command's
        flags) unless given whole, and kept for the run config."""
        machine = machine or this_machine_resources()
        self.policies = {name: self.policy or resolve_policy(machine, self.pins_of(name), self.flags)
                         for name in self.served_models()}
        return self.policies

    def model_policies(self) -> dict[str, ServingPolicy]:
        """The policies resolved for the served models (resolved now if they were not)."""
        if set(self.policies) != set(self.served_models()):
            return self.resolve_policies()
        return self.policies

    def pins_of(self, name: str) -> PolicyChoices:
        return archive_pins(self.archive(name))

    def archive(self, name: str) -> Path:
        """The archive a start serves for name: the version a rollout left default in the run dir, else NAME.mar
        (contract/versions.py)."""
        return served_archive(Path(self.model_store), self.run_dir.absolute(), name)

    def effective_policy(self) -> ServingPolicy:
        """The first served model's policy (what measure/ reads: a measurement serves one model)."""
        return next(iter(self.model_policies().values()))

    def served_models(self) -> tuple[str, ...]:
        return tuple(self.models)

    @property
    def log_dir(self) -> Path:
        return self.run_dir.absolute() / "logs"

    def write_file(self, name: str) -> Path:
        """These settings as RUN_DIR/name with each model's policy as resolved here (the flags, or a policy given
        whole, went into it): the run config of a server process that cannot take them as flags."""
        path = self.run_dir.absolute() / name
        record = {**asdict(self), "model_store": str(Path(self.model_store).absolute()),
                  "run_dir": str(self.run_dir.absolute()), "models": list(self.models),
                  "policies": {model: policy.to_dict() for model, policy in self.model_policies().items()}}
        for resolved in ("policy", "flags"):
            del record[resolved]
        path.write_text(json.dumps(record, indent=2))
        return path

    @classmethod
    def read(cls, path: Path):
        """The settings write_file wrote, each model's policy as it was resolved."""
        record = json.loads(Path(path).read_text())
        return cls(**{**record, "model_store": Path(record["model_store"]), "run_dir": Path(record["run_dir"]),
                      "models": tuple(record["models"]),
                      "policies": {model: ServingPolicy.from_dict(data) for model, data in record["policies"].items()}})


def archives_in(model_store: Path) -> list[str]:
    """The models a store holds: NAME for every NAME.mar, sorted (NAME.vN.mar are its kept versions)."""
    return sorted(path.stem for path in Path(model_store).glob("*.mar") if not is_versioned(path))


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


_CHOSEN: set[int] = set()  # the ports free_port gave this process: the OS may offer a released one again at once


def on_loopback(address: str) -> str:
    """The URL this machine calls for an address a server binds: one bound to every interface (0.0.0.0, as in the
    container, whose ports are published on the host's loopback only) is called on loopback."""
    return address.rstrip("/").replace("://0.0.0.0:", "://127.0.0.1:")


def free_port() -> int:
    """A loopback port nobody holds right now (the OS picks it), never one this process was given before: a server's
    ports are chosen one after another before any is bound, and must all differ."""
    while True:
        with socket.socket() as sock:
            sock.bind((HOST, 0))
            port = sock.getsockname()[1]
        if port not in _CHOSEN:
            _CHOSEN.add(port)
            return port


def archive_config(archive: Path) -> dict:
    """The archive's model-config.yaml (TorchServe's per-model settings and the core's `handler:` section); {}
    from an archive that is not a zip file (truncated, damaged): it pins nothing, and the engine that opens it
    refuses it with its own reason."""
    import yaml
    try:
        with zipfile.ZipFile(archive) as members:
            if "model-config.yaml" not in members.namelist():
                return {}
            return yaml.safe_load(members.read("model-config.yaml")) or {}
    except zipfile.BadZipFile:
        return {}


TORCHSERVE_MANIFEST = "MAR-INF/MANIFEST.json"


def archive_version(archive: Path) -> ModelVersion | None:
    """The version the archive's manifest records; None for one archived before versions, or unreadable."""
    try:
        with zipfile.ZipFile(archive) as members:
            found = json.loads(members.read("manifest.json")).get("model_version")
    except (OSError, zipfile.BadZipFile, KeyError, ValueError):
        return None
    return ModelVersion.from_dict(found) if isinstance(found, dict) else None


def torchserve_version(archive: Path) -> str | None:
    """The version torch-model-archiver wrote in the archive (ours: its version number; "1.0" before versions);
    None from an archive that cannot be read (the engine that opens it refuses it with its own reason)."""
    try:
        with zipfile.ZipFile(archive) as members:
            return str(json.loads(members.read(TORCHSERVE_MANIFEST))["model"]["modelVersion"])
    except (OSError, zipfile.BadZipFile, KeyError, TypeError, ValueError):
        return None


def archive_pins(archive: Path) -> PolicyChoices:
    """The serving policy's values the archive pins (python -m export --workers ...)."""
    return PolicyChoices.pinned_in(archive_config(archive))


def policy_with(workers: int | None = None, batch_size: int | None = None, max_batch_delay: int | None = None,
                threads: int | None = None) -> ServingPolicy:
    """This machine's policy with the choices given as flags (None: not given), no archive's pins."""
    return resolve_policy(this_machine_resources(), flags=PolicyChoices(workers, batch_size, max_batch_delay, threads))


def policies_text(policies: dict[str, ServingPolicy]) -> str:
    """The policies in one line: the one reason all models share, else each model's."""
    reasons = {policy.reason for policy in policies.values()}
    if len(reasons) == 1:
        return reasons.pop()
    return "; ".join(f"{name}: {policy.reason}" for name, policy in policies.items())
