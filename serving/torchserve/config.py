"""How a TorchServe of ours is configured: its ports, its timeouts, its folders and the config.properties it
reads (the shipped base plus this machine's serving policy for each model). Every policy value of serving
TorchServe is defined here, once."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from pathlib import Path

from contract.errors import VisionExportError
from handlers.policy import ServingPolicy, machine_policy, this_machine

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE_DIR.parent.parent
DEFAULT_CONFIG = PACKAGE_DIR / "config.properties"
EXAMPLE_IMAGE = PROJECT_ROOT / "examples" / "cat.jpg"

READY_TIMEOUT_S = 240  # start until every model has answered a real prediction (a cold JVM plus model loads)
STOP_TIMEOUT_S = 60  # SIGTERM to SIGKILL
REQUEST_TIMEOUT_S = 60  # one HTTP request to a running server; a slow shared machine must not turn latency into errors
# one readiness probe: TorchServe holds a prediction until a worker is up, so a probe sent while workers die
# would wait out REQUEST_TIMEOUT_S before the logs were read again (a failed load took 70 s to report, now ~15 s);
# a probe that times out is simply sent again, so a slow first answer is still waited for (READY_TIMEOUT_S)
PROBE_TIMEOUT_S = 10
MODEL_RESPONSE_TIMEOUT_S = 120  # TorchServe's per-model responseTimeout: a worker slower than this is restarted

HOST = "127.0.0.1"
INFERENCE_PORT = 8080
MANAGEMENT_PORT = 8081
METRICS_PORT = 8082
GRPC_INFERENCE_PORT = 7070
GRPC_MANAGEMENT_PORT = 7071
DEFAULT_RUN_DIR = Path(".serving")  # logs, TorchServe's pid file and ours, key_file.json
DEFAULT_MODEL_STORE = Path("model-store")
MODEL_VERSION = "1.0"  # what `python -m export` archives
RUN_CONFIG = "config.properties"
KEY_FILE = "key_file.json"  # TorchServe writes it in its working folder (our run dir) when tokens are on


class ServingError(VisionExportError):
    """TorchServe did not come up, or cannot be started as asked; the message says why and what to do."""


@dataclass
class ServerSettings:
    model_store: Path = DEFAULT_MODEL_STORE
    model_name: str = "resnet50"  # the model predictions_url() addresses; the only one served when models is empty
    models: tuple[str, ...] = ()  # every model this server serves (python -m serving: every archive in the store)
    host: str = HOST
    inference_port: int = INFERENCE_PORT
    management_port: int = MANAGEMENT_PORT
    metrics_port: int = METRICS_PORT
    grpc_inference_port: int = GRPC_INFERENCE_PORT
    grpc_management_port: int = GRPC_MANAGEMENT_PORT
    run_dir: Path = DEFAULT_RUN_DIR
    config: Path = DEFAULT_CONFIG
    extra_env: dict = field(default_factory=dict)
    policy: ServingPolicy | None = None  # None: decided for this machine when the server starts
    token_auth: bool = False  # TorchServe's token authorisation: keys in run_dir/key_file.json
    model_version: str = MODEL_VERSION
    response_timeout_s: int = MODEL_RESPONSE_TIMEOUT_S

    def effective_policy(self) -> ServingPolicy:
        return self.policy or machine_policy(*this_machine())

    @property
    def inference_url(self) -> str:
        return f"http://{self.host}:{self.inference_port}"

    @property
    def management_url(self) -> str:
        return f"http://{self.host}:{self.management_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}"

    @property
    def log_dir(self) -> Path:
        return self.run_dir.absolute() / "logs"

    @property
    def key_file(self) -> Path:
        return self.run_dir.absolute() / KEY_FILE

    def served_models(self) -> tuple[str, ...]:
        return tuple(self.models) or (self.model_name,)

    def predictions_url(self, model: str | None = None) -> str:
        return f"{self.inference_url}/predictions/{model or self.model_name}"


TOKEN_SWITCH = "disable_token_authorization"  # TorchServe's key; TS_DISABLE_TOKEN_AUTHORIZATION in the environment
TOKEN_SWITCH_ENV = "TS_DISABLE_TOKEN_AUTHORIZATION"


def read_properties(path: Path) -> dict[str, str]:
    """key=value lines of a Java properties file as TorchServe reads ours (no continuation lines); the last wins."""
    pairs = (line.split("=", 1) for line in Path(path).read_text().splitlines()
             if "=" in line and not line.lstrip().startswith(("#", "!")))
    return {key.strip(): value.strip() for key, value in pairs}


def token_auth_switched_on(settings: ServerSettings, environ: dict) -> bool:
    """Whether the TorchServe these settings start checks tokens: --token-auth, or TorchServe's own documented
    switch, disable_token_authorization=false in the config file or TS_DISABLE_TOKEN_AUTHORIZATION=false in the
    environment (which wins when the config enables environment overrides, as ours does)."""
    if settings.token_auth:
        return True
    properties = read_properties(settings.config)
    value = properties.get(TOKEN_SWITCH, "false")  # TorchServe's own default: tokens on
    env_value = {**environ, **settings.extra_env}.get(TOKEN_SWITCH_ENV)
    if env_value is not None and properties.get("enable_envvars_config", "false").lower() == "true":
        value = env_value
    return value.strip().lower() != "true"


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


def on_free_ports(model_store: Path, run_dir: Path) -> ServerSettings:
    """Settings whose five ports (HTTP and gRPC) are all free: for tests and benchmarks beside other servers."""
    return ServerSettings(model_store=model_store, run_dir=run_dir, inference_port=free_port(),
                          management_port=free_port(), metrics_port=free_port(),
                          grpc_inference_port=free_port(), grpc_management_port=free_port())


def run_config_text(settings: ServerSettings, policy: ServingPolicy) -> str:
    """The base config.properties plus this machine's serving policy for each model (TorchServe's per-model
    `models=` settings; values pinned in the archive's model-config.yaml take precedence over them)."""
    models = {name: {settings.model_version: {
        "defaultVersion": True, "marName": f"{name}.mar",
        **policy.model_config(), "responseTimeout": settings.response_timeout_s}} for name in settings.served_models()}
    store = Path(settings.model_store).absolute()
    allowed = (f"\n# Registration (if ever switched on) only from this model store: no URL downloads.\n"
               f"allowed_urls=file://{store}/[^/]*[.]mar\n")
    token = ("\n# Token authorisation on: keys in key_file.json, in TorchServe's working folder.\n"
             f"{TOKEN_SWITCH}=false\n") if settings.token_auth else ""
    load = ",".join(f"{name}={name}.mar" for name in settings.served_models())
    return (Path(settings.config).read_text().rstrip("\n")
            + f"\n\n# Serving policy decided on this machine by `python -m serving`: {policy.reason};"
            + f" {policy.threads_per_worker} thread(s) per worker.\nmodels={json.dumps(models)}\n"
            + f"# Registered at start (TorchServe reads them from model_store).\nload_models={load}\n"
            + allowed + token)


def write_run_config(settings: ServerSettings, policy: ServingPolicy) -> Path:
    path = settings.run_dir.absolute() / RUN_CONFIG
    path.write_text(run_config_text(settings, policy))
    return path
