"""How a TorchServe of ours is configured: its ports, its folders and the config.properties it reads, its run
config (the shipped base plus each model's serving policy: TorchServe's `models=` keys, and the policy records
our handler reads as they are). What every engine shares (address, run dir, timeouts, policies) is in
serving/settings.py; what only TorchServe has is defined here, once."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from contract.versions import UNVERSIONED_ARCHIVE
from handlers.policy import POLICIES_PROPERTY, policies_line
from serving.settings import KEY_FILE, ServingSettings, free_port, torchserve_version  # noqa: F401

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = PACKAGE_DIR / "config.properties"
LOG_CONFIG = PACKAGE_DIR / "log4j2.xml"  # TorchServe's files without per-request DEBUG, duplicates and echoes
LOG_CONFIG_FLAG = "-Dlog4j.configurationFile="
# The frontend's JVM on a CPU host, where the workers use every core: C1 only (C2's compilations cost seconds of
# CPU in the first minutes of load, and C2's faster code gains nothing measurable in a frontend that spends
# ~1 ms per request), one compiler thread, the serial GC (no GC thread per core). Measured in
# docs/results/2026-11-25-serving-overhead/analysis.md. A GPU host, whose cores are mostly free, keeps the JVM's defaults.
CPU_JVM_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:CICompilerCount=1", "-XX:+UseSerialGC")

MODEL_RESPONSE_TIMEOUT_S = 120  # TorchServe's per-model responseTimeout: a worker slower than this is restarted
INFERENCE_PORT = 8080
MANAGEMENT_PORT = 8081
METRICS_PORT = 8082
SIGNALS_PORT = 8083  # our metrics and health beside TorchServe (serving/signals.py)
GRPC_INFERENCE_PORT = 7070
GRPC_MANAGEMENT_PORT = 7071
MODEL_VERSION = UNVERSIONED_ARCHIVE  # the version TorchServe is told an archive without one has
RUN_CONFIG = "config.properties"


@dataclass
class ServerSettings(ServingSettings):
    model_name: str = "resnet50"  # the model predictions_url() addresses; the only one served when models is empty
    inference_port: int = INFERENCE_PORT
    management_port: int = MANAGEMENT_PORT
    metrics_port: int = METRICS_PORT
    signals_port: int = SIGNALS_PORT
    grpc_inference_port: int = GRPC_INFERENCE_PORT
    grpc_management_port: int = GRPC_MANAGEMENT_PORT
    config: Path = DEFAULT_CONFIG
    model_version: str = MODEL_VERSION
    response_timeout_s: int = MODEL_RESPONSE_TIMEOUT_S

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
    def signals_url(self) -> str:
        return f"http://{self.host}:{self.signals_port}"

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


def on_free_ports(model_store: Path, run_dir: Path) -> ServerSettings:
    """Settings whose five ports (HTTP and gRPC) are all free: for tests and benchmarks beside other servers."""
    return ServerSettings(model_store=model_store, run_dir=run_dir, inference_port=free_port(),
                          management_port=free_port(), metrics_port=free_port(), signals_port=free_port(),
                          grpc_inference_port=free_port(), grpc_management_port=free_port())


def jvm_flags(base: dict[str, str], device: str) -> str:
    """TorchServe's vmargs: the base config's own, or CPU_JVM_FLAGS on a CPU host; plus our log configuration
    unless the flags name one."""
    flags = base["vmargs"].split() if "vmargs" in base else list(CPU_JVM_FLAGS if device == "cpu" else ())
    if LOG_CONFIG.is_file() and not any(flag.startswith(LOG_CONFIG_FLAG) for flag in flags):
        flags.append(f"{LOG_CONFIG_FLAG}{LOG_CONFIG.as_uri()}")
    return " ".join(flags)


def run_config_text(settings: ServerSettings) -> str:
    """The base config.properties plus each model's serving policy (settings.model_policies()): TorchServe's
    per-model `models=` keys (values pinned in the archive's model-config.yaml are the same: the policy applied
    them), the POLICIES_PROPERTY line our handler reads, and the JVM's flags (jvm_flags; a vmargs line of the base
    is replaced by the one written here)."""
    policies = settings.model_policies()
    archives = {name: settings.archive(name) for name in policies}  # a rollout's default version, else NAME.mar
    from runtime.integrity import verify_archive_signature  # here: runtime's imports (torch) stay out of --help
    for archive in archives.values():
        verify_archive_signature(archive)  # its handler runs in TorchServe: refused before, where a key is set
    models = {name: {torchserve_version(archives[name]) or settings.model_version: {
        "defaultVersion": True, "marName": archives[name].name,
        **policy.model_config(), "responseTimeout": settings.response_timeout_s}} for name, policy in policies.items()}
    store = Path(settings.model_store).absolute()
    allowed = (f"\n# Registration (if ever switched on) only from this model store: no URL downloads.\n"
               f"allowed_urls=file://{store}/[^/]*[.]mar\n")
    # The management API registers versions beside the served one (python -m serving rollout): on loopback as
    # every API, behind the management key when tokens are on, from this model store only (allowed_urls).
    registration = "\n# Versions registered beside the served one (serving/rollout/).\nenable_model_api=true\n"
    token = ("\n# Token authorisation on: keys in key_file.json, in TorchServe's working folder.\n"
             f"{TOKEN_SWITCH}=false\n") if settings.token_auth else ""
    load = ",".join(f"{name}={settings.archive(name).name}" for name in settings.served_models())
    base = Path(settings.config).read_text()
    flags = jvm_flags(read_properties(settings.config), next(iter(policies.values())).device)
    jvm = f"\n# The frontend's JVM (config.py: jvm_flags).\nvmargs={flags}\n" if flags else ""
    ours = ("vmargs=", POLICIES_PROPERTY, "enable_model_api=")  # lines of the base written here instead
    return ("\n".join(line for line in base.splitlines() if not line.lstrip().startswith(ours)).rstrip("\n")
            + "\n\n" + policy_comments(policies) + f"models={json.dumps(models)}\n"
            + f"# Registered at start (TorchServe reads them from model_store).\nload_models={load}\n"
            + allowed + registration + token + jvm + where_it_listens(settings))


def where_it_listens(settings: ServerSettings) -> str:
    """The addresses and store of this server, as the environment gives them to TorchServe: what `python -m
    serving rollout` reads from the run dir to reach a running server (the last value of a key wins)."""
    return ("\n# Where this server listens and what it serves from (serving/rollout/ reads them).\n"
            f"inference_address={settings.inference_url}\nmanagement_address={settings.management_url}\n"
            f"model_store={Path(settings.model_store).absolute()}\n")


def policy_comments(policies: dict) -> str:
    """Each model's policy with the reason of every value, as comments, then the line the handler reads."""
    reasons = "".join(f"#   {name}: {line}\n" for name, policy in policies.items() for line in policy.lines())
    return (f"# Serving policy resolved on this machine by `python -m serving` (contract/policy.py):\n{reasons}"
            f"# Each model's policy as the handler reads it (handlers/policy.py).\n{policies_line(policies)}\n")


def write_run_config(settings: ServerSettings) -> Path:
    path = settings.run_dir.absolute() / RUN_CONFIG
    path.write_text(run_config_text(settings))
    return path
