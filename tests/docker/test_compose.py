"""compose.yaml as the real Compose parser resolves it (`docker-compose config`; no Docker engine needed)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from tests.docker.test_dockerfile import DOCKERFILE, exec_form, parse_stages

ROOT = Path(__file__).resolve().parents[2]
GPU_SERVICE, CPU_SERVICE, CPU_PROFILE = "torchserve", "torchserve-cpu", "cpu"
# Variables the file interpolates or Compose reads: the test checks the defaults, not this shell's settings.
COMPOSE_VARIABLES = ("APP_UID", "COMPOSE_FILE", "COMPOSE_PROFILES", "COMPOSE_PROJECT_NAME", "COMPOSE_PATH_SEPARATOR",
                     "ENGINE", "MODEL", "WEIGHTS", "EXPORT_ARGS", "MODEL_STORE_DIR", "INFERENCE_PORT",
                     "MANAGEMENT_PORT", "METRICS_PORT")


def compose_config(*options: str, **variables: str) -> dict:
    executable = shutil.which("docker-compose")
    if executable is None:
        if os.environ.get("CI"):
            pytest.fail("docker-compose is not installed: CI must install it (apt-get install -y docker-compose)")
        pytest.skip("docker-compose is not installed (apt-get install docker-compose) to check compose.yaml")
    env = {**{key: value for key, value in os.environ.items() if key not in COMPOSE_VARIABLES}, **variables}
    result = subprocess.run([executable, "-f", "compose.yaml", *options, "config"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    return yaml.safe_load(result.stdout)


@pytest.fixture(scope="module")
def services() -> dict:
    return compose_config()["services"]


@pytest.fixture(scope="module")
def cpu_services() -> dict:
    return compose_config("--profile", CPU_PROFILE)["services"]


def gpu_devices(service: dict) -> list[dict]:
    return service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])


def port_bindings(service: dict) -> list[tuple[str, int, int]]:
    """(host ip or "" for all interfaces, published, target) from either of Compose's port notations."""
    bindings = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            bindings.append((port.get("host_ip", ""), int(port["published"]), int(port["target"])))
            continue
        match = re.fullmatch(r"(?:(?P<ip>[\d.]+):)?(?P<published>\d+):(?P<target>\d+)(?:/\w+)?", str(port))
        assert match, f"unexpected port notation {port!r}"
        bindings.append((match["ip"] or "", int(match["published"]), int(match["target"])))
    return bindings


def size_in_bytes(size) -> int:
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"(\d+)\s*([kmg]?)b?", str(size).strip().lower())
    assert match, f"unexpected size {size!r}"
    return int(match[1]) * 1024 ** " kmg".index(match[2] or " ")


def seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", str(duration))
    assert parts, f"unexpected duration {duration!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def image_env() -> dict:
    return parse_stages(DOCKERFILE)[-1].env()


def test_plain_up_starts_only_the_gpu_service(services):
    assert GPU_SERVICE in services
    default = [name for name, service in services.items() if not service.get("profiles")]
    assert default == [GPU_SERVICE], f"`docker compose up` would start {default}"


def test_gpu_is_reserved(services):
    devices = gpu_devices(services[GPU_SERVICE])
    nvidia = [d for d in devices if d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])]
    assert nvidia, f"no nvidia GPU reservation: {devices}"
    assert "count" in nvidia[0] or "device_ids" in nvidia[0], "say which GPUs: count or device_ids"


def test_build_uses_the_dockerfile_from_the_repository_root(services):
    build = services[GPU_SERVICE]["build"]
    assert Path(build["context"]) == ROOT
    assert (ROOT / build["context"] / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE


def test_build_args_are_arguments_the_dockerfile_declares(services):
    declared = {instruction["value"].split("=", 1)[0].strip()
                for instruction in DockerfileParser(str(DOCKERFILE)).structure if instruction["instruction"] == "ARG"}
    passed = set(services[GPU_SERVICE]["build"].get("args", {}))
    assert passed <= declared, f"compose passes {passed - declared}, which docker/Dockerfile never reads"


def test_only_inference_is_published_beyond_this_host_and_management_nowhere(services):
    bindings = port_bindings(services[GPU_SERVICE])
    by_target = {target: [(ip, published) for ip, published, t in bindings if t == target]
                 for target in (8080, 8081, 8082, 8083, 8090)}
    assert by_target[8080] == [("", 8080)] or by_target[8080] == [("0.0.0.0", 8080)], by_target[8080]
    for target in (8082, 8083, 8090):  # metrics, health, the page: this host only
        assert by_target[target] == [("127.0.0.1", target)], by_target[target]
    assert by_target[8081] == [], f"management must not be published (rollouts run in the container): {by_target[8081]}"


def test_token_authorisation_is_on_and_the_keys_live_in_a_volume(services):
    service = services[GPU_SERVICE]
    assert service["environment"]["TS_DISABLE_TOKEN_AUTHORIZATION"] == "false"
    keys_dir = image_env()["TS_KEYS_DIR"]
    targets = [v.split(":")[1] if isinstance(v, str) else v["target"] for v in service["volumes"]]
    assert keys_dir in targets, f"the image's TS_KEYS_DIR ({keys_dir}) must be a volume: {service['volumes']}"


def test_model_store_is_the_repository_folder(services):
    volumes = services[GPU_SERVICE]["volumes"]
    binds = [v.split(":") if isinstance(v, str) else [v["source"], v["target"]] for v in volumes]
    target = image_env()["MODEL_STORE"]
    assert [str(ROOT / "model-store"), target] in [b[:2] for b in binds], \
        f"./model-store must be mounted at the image's MODEL_STORE ({target}): {volumes}"


def test_healthcheck_restart_and_shm(services):
    service = services[GPU_SERVICE]
    test = service["healthcheck"]["test"]
    command = " ".join(test) if isinstance(test, list) else test
    assert "healthcheck.sh" in command and "/ping" not in command, command
    assert seconds(service["healthcheck"]["start_period"]) >= 300, "the first start exports the model: allow minutes"
    assert service["restart"] in ("always", "unless-stopped", "on-failure")
    assert size_in_bytes(service["shm_size"]) >= 256 * 1024 ** 2, "Docker's default 64 MB /dev/shm is too small"


def test_compose_health_check_runs_the_image_health_check(services):
    test = services[GPU_SERVICE]["healthcheck"]["test"]
    assert isinstance(test, list) and test[0] == "CMD", f"use the exec form [CMD, ...]: {test}"
    image_check = parse_stages(DOCKERFILE)[-1].all("HEALTHCHECK")[-1]
    assert test[1:] == exec_form(image_check, after="CMD"), "compose and the image check health differently"


def test_stop_grace_period_outlasts_the_entrypoint_stop(services):
    entrypoint = (ROOT / "docker" / "entrypoint.sh").read_text()
    stop_timeout = int(re.search(r'STOP_TIMEOUT="\$\{STOP_TIMEOUT:-(\d+)\}"', entrypoint)[1])
    assert seconds(services[GPU_SERVICE]["stop_grace_period"]) > stop_timeout, \
        "Docker would SIGKILL TorchServe before the entrypoint's own stop finishes"


def test_cpu_variant_has_no_gpu_reservation_and_otherwise_matches(cpu_services, services):
    cpu = cpu_services[CPU_SERVICE]
    assert CPU_PROFILE in cpu.get("profiles", [])
    assert not gpu_devices(cpu), f"the CPU service still reserves {gpu_devices(cpu)}"
    strip = ("deploy", "profiles")
    assert {k: v for k, v in cpu.items() if k not in strip} == \
           {k: v for k, v in services[GPU_SERVICE].items() if k not in strip}


def test_readme_gives_the_cpu_command():
    readme = (ROOT / "docker" / "README.md").read_text()
    assert f"docker compose --profile {CPU_PROFILE} up {CPU_SERVICE}" in readme


def test_both_services_run_one_image_built_one_way(cpu_services, services):
    # One image for the GPU and the CPU service (docker/README.md, "One image"): same name, same build.
    gpu, cpu = services[GPU_SERVICE], cpu_services[CPU_SERVICE]
    assert gpu["image"] == cpu["image"] and gpu["build"] == cpu["build"]


def test_the_defaults_are_the_documented_ones(services):
    environment = services[GPU_SERVICE]["environment"]
    assert {k: environment[k] for k in ("ENGINE", "MODEL", "WEIGHTS")} == \
           {"ENGINE": "torchserve", "MODEL": "resnet50", "WEIGHTS": "auto"}


def test_the_shell_chooses_engine_model_store_and_ports():
    # What tests/docker/test_image.py and users set: ENGINE=kserve docker compose up, a store elsewhere, loopback ports.
    cpu = compose_config("--profile", CPU_PROFILE, ENGINE="kserve", MODEL="resnet18", MODEL_STORE_DIR="/srv/models",
                         INFERENCE_PORT="127.0.0.1:18080", METRICS_PORT="127.0.0.1:18082",
                         PAGE_PORT="127.0.0.1:18090",
                         SIGNALS_PORT="127.0.0.1:18083")["services"][CPU_SERVICE]
    assert cpu["environment"]["ENGINE"] == "kserve" and cpu["environment"]["MODEL"] == "resnet18"
    assert sorted(port_bindings(cpu)) == [("127.0.0.1", 18080, 8080), ("127.0.0.1", 18082, 8082),
                                          ("127.0.0.1", 18083, 8083), ("127.0.0.1", 18090, 8090)]
    volumes = [v.split(":")[:2] if isinstance(v, str) else [v["source"], v["target"]] for v in cpu["volumes"]]
    assert ["/srv/models", image_env()["MODEL_STORE"]] in volumes, volumes
