"""The image built and run for real, as a user does it: `make docker-build` (docker/build.sh), then
`docker-compose --profile cpu up -d torchserve-cpu` on 127.0.0.1, real HTTP, and `docker-compose down`.

One image build is shared by the module (the layer cache makes it seconds once built), and each engine runs in one
container start or two: TorchServe exports resnet18 (random weights) into an empty store owned by APP_UID, answers
the example photo and a 12 MP phone JPEG exactly as the same archive does in this process (tests/answers.py), takes
a second version (`docker exec ... python -m serving rollout`) and gives it back (`rollback`) under a small load
without a failed request, stops under a small load within the grace period (requests in flight that got no answer
are counted), and serves again after a restart without exporting; KServe's engine (ENGINE=kserve) then starts on a store owned by root, exports into
the documented fallback and answers the same way. The CA bundle the build was given is searched for in every layer.

Needs a Docker engine: without one (no dockerd, no privileges to start one) every test here skips and says why.
Docker 20.10's BuildKit (Debian's docker.io) and Debian's docker-compose 1.29 are what CI installs (.ci/run)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
import requests

from measure.reliability.rollout import VersionedLoad, failures
from serving.settings import free_port
from tests.answers import assert_same_answer, expected_answer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "docker" / "build.sh"
CAT = ROOT / "examples" / "cat.jpg"
IMAGE = "vision-export-torchserve"  # compose.yaml's image
SERVICE, PROFILE = "torchserve-cpu", "cpu"
MODEL = "resnet18"  # small and fast; the users' default (resnet50, weights auto) is compose.yaml's
APP_UID = 1000  # the image's default APP_UID (docker/Dockerfile, compose.yaml)
FALLBACK_STORE = "/home/app/.cache/vision-export/model-store"  # docker/entrypoint.sh's, in the torch-cache volume
BUILD_TIMEOUT_S = 1500  # a fresh machine: the base from Debian's archive, then about 3 GB of wheels from PyPI
HEALTHY_TIMEOUT_S = 480  # the first start exports resnet18 (about a minute alone on 2 cores) before serving
STOP_GRACE_S = 30  # compose.yaml's stop_grace_period
KEY_FILE = "/home/app/keys/key_file.json"  # the image's TS_KEYS_DIR: compose.yaml's keys volume
# The starts' exports make two forms, not every one (compose.yaml's EXPORT_ARGS): what these tests look at is the
# store, the archive's answers and the rollout; every form of resnet18 is tests/e2e's (tests/conftest.py).
EXPORT_ARGS = "--formats traced,onnx-traced"
# A line in the CA bundle given to the build, outside its PEM blocks (OpenSSL reads past it): no layer may keep it.
CA_MARKER = b"# vision-export tests/docker/test_image.py: a build secret, in no layer of the image"
# Names compose.yaml interpolates: this shell's values must not leak into the test's compose runs.
COMPOSE_VARIABLES = ("ENGINE", "MODEL", "WEIGHTS", "EXPORT_ARGS", "MODEL_STORE_DIR", "INFERENCE_PORT",
                     "MANAGEMENT_PORT", "METRICS_PORT", "APP_UID", "COMPOSE_FILE", "COMPOSE_PROFILES",
                     "COMPOSE_PROJECT_NAME")


def run(command: list[str], timeout: float, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-4000:]}\n"
                    f"{result.stderr[-6000:]}")
    return result


@pytest.fixture(scope="module")
def docker() -> str:
    """The docker CLI that builds with BuildKit (docker/build.sh picks it); skips where no engine answers."""
    found = subprocess.run([str(BUILD), "--print-docker"], capture_output=True, text=True, timeout=60)
    if found.returncode != 0:
        pytest.skip(f"no usable docker CLI: {found.stderr.strip()}")
    cli = found.stdout.strip()
    info = subprocess.run([cli, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        pytest.skip(f"no Docker engine answers ({cli} info: {info.stderr.strip()[-300:]}); .ci/run starts dockerd "
                    "where it has the privileges")
    if shutil.which("docker-compose") is None:
        if os.environ.get("CI"):
            pytest.fail("docker-compose is not installed: CI must install it (apt-get install -y docker-compose)")
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    return cli


@pytest.fixture(scope="module")
def ca_bundle(tmp_path_factory) -> Path:
    """This machine's CA bundle (pip needs it where TLS is re-signed) with the marker line added."""
    system = Path(os.environ.get("CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt"))
    bundle = tmp_path_factory.mktemp("ca") / "ca-bundle.pem"
    bundle.write_bytes((system.read_bytes() if system.is_file() else b"") + b"\n" + CA_MARKER + b"\n")
    return bundle


@pytest.fixture(scope="module")
def image(docker, ca_bundle) -> dict:
    """make docker-build, with the CA bundle as the build secret; how long it took and whether pip's layer ran."""
    env = {k: v for k, v in os.environ.items() if k not in ("APP_UID", "EXTRAS", "IMAGE")}
    start = time.monotonic()
    result = run([str(BUILD), "--ca-bundle", str(ca_bundle)], BUILD_TIMEOUT_S, env=env)
    seconds = time.monotonic() - start
    inspect = json.loads(run([docker, "image", "inspect", IMAGE], 60).stdout)[0]
    # The step that installs the wheels: "CACHED" when an earlier build made the layer.
    pip_step = re.search(r"^#(\d+) \[[^]]+\] RUN --mount=type=bind,source=docker/requirements.txt", result.stderr,
                         re.MULTILINE)
    pip_ran = bool(pip_step) and f"#{pip_step[1]} CACHED" not in result.stderr
    print(f"image built in {seconds:.0f} s (pip layer {'built' if pip_ran else 'cached'}): {inspect['Id']}, "
          f"{inspect['Size'] / 1e9:.2f} GB")
    return {"id": inspect["Id"], "config": inspect["Config"], "size": inspect["Size"], "seconds": seconds,
            "pip_ran": pip_ran, "log": result.stderr}


# ---------------------------------------------------------------------------------------------- compose

@dataclass
class Compose:
    """docker-compose (v1) on compose.yaml, as its own project, with every port on 127.0.0.1."""

    docker: str
    project: str
    store: Path
    engine: str = "torchserve"

    def __post_init__(self):
        self.ports = {"inference": free_port(), "metrics": free_port()}  # management is published nowhere

    @property
    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in COMPOSE_VARIABLES}
        return {**env,
                # Compose 1.x builds with the docker CLI on PATH; BuildKit, for the Dockerfile's RUN --mount.
                "PATH": f"{Path(self.docker).parent}:{env.get('PATH', '')}",
                "DOCKER_BUILDKIT": "1", "COMPOSE_DOCKER_CLI_BUILD": "1",
                "ENGINE": self.engine, "MODEL": MODEL, "WEIGHTS": "random", "EXPORT_ARGS": EXPORT_ARGS,
                "MODEL_STORE_DIR": str(self.store),
                "INFERENCE_PORT": f"127.0.0.1:{self.ports['inference']}",
                "METRICS_PORT": f"127.0.0.1:{self.ports['metrics']}"}

    def __call__(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        return run(["docker-compose", "--file", str(ROOT / "compose.yaml"), "--project-name", self.project,
                    "--profile", PROFILE, *args], timeout, env=self.env, check=check)

    def container(self) -> str:
        container = self("ps", "--quiet", SERVICE).stdout.strip()
        assert container, f"no {SERVICE} container in project {self.project}"
        return container

    def logs(self, container: str) -> str:
        """stdout and stderr as Docker keeps them, each line with Docker's timestamp."""
        return subprocess.run([self.docker, "logs", "--timestamps", container], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=60).stdout

    def wait_healthy(self, container: str) -> float:
        """Seconds until the image's own HEALTHCHECK said healthy; fails at once when the container stops."""
        start = time.monotonic()
        while time.monotonic() - start < HEALTHY_TIMEOUT_S:
            details = json.loads(run([self.docker, "inspect", container], 60).stdout)[0]
            state, restarts = details["State"], details["RestartCount"]
            health = state.get("Health", {}).get("Status")
            if health == "healthy":
                return time.monotonic() - start
            if state["Status"] != "running" or health == "unhealthy" or restarts:  # restart: unless-stopped
                pytest.fail(f"{SERVICE} is {state['Status']} (restarted {restarts} times), health {health}:\n"
                            f"{self.logs(container)[-8000:]}")
            time.sleep(2)
        pytest.fail(f"{SERVICE} not healthy after {HEALTHY_TIMEOUT_S} s:\n{self.logs(container)[-8000:]}")

    def url(self) -> str:
        if self.engine == "kserve":
            return f"http://127.0.0.1:{self.ports['inference']}/v1/models/{MODEL}:predict"
        return f"http://127.0.0.1:{self.ports['inference']}/predictions/{MODEL}"

    def headers(self) -> dict:
        """The inference key (token authorisation is the image's default), read in the container as its operator
        would: the keys are in its keys volume, never in its log."""
        keys = json.loads(run([self.docker, "exec", self.container(), "cat", KEY_FILE], 60).stdout)
        return {"Authorization": "Bearer " + keys["inference"]["key"]}

    def predict(self, body: bytes, timeout: float = 120) -> dict:
        anonymous = requests.post(self.url(), data=body, headers={"Content-Type": "image/jpeg"}, timeout=timeout)
        assert anonymous.status_code in (400, 401), f"an anonymous caller was answered {anonymous.status_code}"
        response = requests.post(self.url(), data=body, headers={"Content-Type": "image/jpeg", **self.headers()},
                                 timeout=timeout)
        assert response.status_code == 200, f"{response.status_code}: {response.text[:500]}"
        answer = response.json()
        return answer["predictions"][0] if self.engine == "kserve" else answer

    def down(self) -> None:
        self("down", "--volumes", "--remove-orphans", timeout=120, check=False)


@pytest.fixture(scope="module")
def phone_jpeg(tmp_path_factory) -> bytes:
    """A 12 MP phone photo: 4032x3024 stored sideways with EXIF Orientation 6 (examples/photo_sizes.py)."""
    from examples.photo_sizes import write_bodies
    folder = tmp_path_factory.mktemp("photo-sizes")
    write_bodies(folder)
    return (folder / "12mp-sideways.jpg").read_bytes()


def owned_store(path: Path, uid: int) -> Path:
    path.mkdir(parents=True)
    os.chown(path, uid, uid)
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def project(docker, image, tmp_path_factory):
    """The compose project of this module: TorchServe first; torn down (volumes too) whatever happens."""
    if os.getuid() != 0:
        pytest.skip("the model stores are made owned by uid 1000 and by root: run as root (CI does)")
    compose = Compose(docker, f"vetest{os.getpid()}", owned_store(tmp_path_factory.mktemp("store") / "store", APP_UID))
    yield compose
    compose.down()


# ---------------------------------------------------------------------------------------------- the image

@pytest.mark.timeout(BUILD_TIMEOUT_S + 300)  # the first test to ask for the image waits for its build
def test_the_image_runs_as_app_uid_with_the_entrypoint_and_health_check(image):
    config = image["config"]
    assert config["User"] == str(APP_UID), f"the image runs as {config['User']!r}"
    assert config["Entrypoint"] == ["/app/docker/entrypoint.sh"]
    assert config["Healthcheck"]["Test"] == ["CMD", "/app/docker/healthcheck.sh"]
    assert not [e for e in config["Env"] if e.startswith(("PIP_CERT=", "REQUESTS_CA_BUNDLE="))], config["Env"]


def test_the_image_holds_the_locked_versions(docker, image):
    # docker/constraints.txt pins every package (docker/lock.sh): a build that resolved anything else is not the
    # reproducible build the lock promises.
    frozen = run([docker, "run", "--rm", "--entrypoint", "/opt/venv/bin/pip", IMAGE, "freeze",
                  "--disable-pip-version-check"], 120).stdout.split()
    locked = [line for line in (ROOT / "docker" / "constraints.txt").read_text().split() if "==" in line]
    assert sorted(frozen, key=str.lower) == sorted(locked, key=str.lower), \
        f"image only: {sorted(set(frozen) - set(locked))}; lock only: {sorted(set(locked) - set(frozen))}"


def test_compose_builds_the_same_image(project, image):
    # Compose's own build (the CLI's BuildKit, as Compose 1.x does it) of compose.yaml's build section: the layers
    # make docker-build made, hence the same image. (It cannot pass the CA secret: Compose 1.x has no build secrets.)
    project("build", SERVICE, timeout=600)
    rebuilt = run([project.docker, "image", "inspect", "--format", "{{.Id}}", IMAGE], 60).stdout.strip()
    assert rebuilt == image["id"], "compose.yaml's build is not the one make docker-build runs"


def test_no_layer_keeps_the_ca_bundle(docker, image, ca_bundle):
    history = run([docker, "history", "--no-trunc", "--format", "{{.CreatedBy}}", IMAGE], 60).stdout
    assert history.strip(), f"docker history {IMAGE} shows nothing"
    assert CA_MARKER.decode() not in history and "BEGIN CERTIFICATE" not in history
    # The install reads the secret where BuildKit mounts it (history keeps the command, not its mounts).
    assert "PIP_CERT=/run/secrets/ca" in history, "the install does not read the secret where this test expects it"
    # Every byte of every layer and of the image's config (docker save): the marker, and the certificates of the
    # bundle that no public bundle of the image has (Debian's ca-certificates, certifi's and pip's copies), e.g.
    # the authority of a proxy that re-signs TLS.
    public = run([docker, "run", "--rm", "--entrypoint", "sh", IMAGE, "-c",
                  "cat /etc/ssl/certs/ca-certificates.crt $(find / -xdev -name cacert.pem 2>/dev/null)"], 120).stdout
    assert public.count("BEGIN CERTIFICATE") > 100, "the image's public CA bundles were not found"
    private = [block for block in pem_blocks(ca_bundle.read_text()) if block not in public]
    needles = [CA_MARKER] + [block.splitlines()[1].encode() for block in private]  # a line of each's base64
    found = search_saved_image(docker, IMAGE, needles)
    assert not found, f"the image keeps the build secret: {found}"
    print(f"searched every layer for the marker and {len(private)} certificate(s) of the bundle Debian's lacks; "
          f"pip's layer {'was built with this bundle' if image['pip_ran'] else 'came from the build cache'}")


def pem_blocks(text: str) -> list[str]:
    return re.findall(r"-----BEGIN CERTIFICATE-----\n.*?-----END CERTIFICATE-----", text, re.DOTALL)


def search_saved_image(docker: str, image: str, needles: list[bytes]) -> list[str]:
    """Which needles occur in `docker save IMAGE` (every layer's tar, uncompressed, and the config), read as a
    stream: a file's bytes are contiguous in a tar, so a needle shorter than the overlap kept between chunks is
    found wherever it lies."""
    overlap = max(len(needle) for needle in needles)
    found, tail = set(), b""
    with subprocess.Popen([docker, "save", image], stdout=subprocess.PIPE) as save:
        while chunk := save.stdout.read(1 << 24):
            window = tail + chunk
            found.update(i for i, needle in enumerate(needles) if needle in window)
            tail = window[-overlap:]
    assert save.returncode == 0, f"docker save {image} exited {save.returncode}"
    return [needles[i].decode(errors="replace") for i in sorted(found)]


# ---------------------------------------------------------------------------------------------- TorchServe

@pytest.fixture(scope="module")
def torchserve(project) -> dict:
    """compose up on an empty store owned by APP_UID: exports on the first start, healthy by its HEALTHCHECK."""
    start = time.monotonic()
    project("up", "--detach", SERVICE)
    container = project.container()
    healthy_s = project.wait_healthy(container)
    print(f"TorchServe: up and healthy in {time.monotonic() - start:.0f} s, {healthy_s:.0f} s of it after `up` "
          "returned (the export included)")
    return {"container": container, "logs": project.logs(container), "archive": project.store / f"{MODEL}.mar"}


def test_first_start_exports_into_the_store_owned_by_app_uid(project, torchserve):
    assert f"no {MODEL}.mar in /home/app/model-store: exporting" in torchserve["logs"], torchserve["logs"][-3000:]
    archive = torchserve["archive"]
    assert archive.is_file(), f"no {archive} on the host"
    assert archive.stat().st_uid == APP_UID, f"{archive} is owned by uid {archive.stat().st_uid}, not {APP_UID}"


@pytest.mark.parametrize("photo", ["cat.jpg", "12 MP phone JPEG"])
def test_answers_as_the_archive_in_process(project, torchserve, phone_jpeg, photo):
    body = CAT.read_bytes() if photo == "cat.jpg" else phone_jpeg
    assert_same_answer(project.predict(body), expected_answer(torchserve["archive"], body))


# ---------------------------------------------------------------------------------------------- rollout

ARTIFACTS = "/home/app/artifacts"  # the image's ARTIFACTS: the export the first start made
ROLLOUT_CLIENTS = 3


def serving_in(project: Compose, container: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m serving ARGS` in the running container as docs/rollout.md shows it: docker exec in the image's
    working folder, whose .serving is the entrypoint's run dir (no --run-dir)."""
    return run([project.docker, "exec", "--env", "PYTHONPATH=/app", container, "python", "-m", "serving", *args],
               600, check=False)


def test_a_rollout_into_the_running_container_under_load(project, torchserve):
    """A second version (the container's own export, archived into the store volume as v2) rolled out while
    clients post the photo, then rolled back: no request fails, answers come from v2 once the rollout returned
    and from v1 once the rollback did, each the in-process answer of its own archive on the host."""
    container = torchserve["container"]
    load = VersionedLoad(project.url(), CAT.read_bytes(), concurrency=ROLLOUT_CLIENTS, headers=project.headers()).start()
    try:
        # Few gate photos, random weights (no evidence): the gate is proven in tests/e2e/; here, the way into the container.
        rolled = serving_in(project, container, "rollout", MODEL, ARTIFACTS, "--photos", "3",
                            "--accept-weak-evidence")
        rolled_at = time.monotonic()
        time.sleep(1)
        back_from = time.monotonic()
        back = serving_in(project, container, "rollback", MODEL)
        back_at = time.monotonic()
        time.sleep(1)
    finally:
        samples = load.stop()
    assert rolled.returncode == 0 and "on weak evidence" in rolled.stdout and "v2 is the default" in rolled.stdout, \
        rolled.stdout + rolled.stderr
    assert back.returncode == 0 and "v1 is the default" in back.stdout, back.stdout + back.stderr
    versions = serving_in(project, container, "versions", MODEL)
    assert f"{MODEL} on torchserve: default v1; loaded v1; kept in /home/app/model-store: v1, v2" in versions.stdout, \
        versions.stdout + versions.stderr
    loaded = [line for line in rolled.stdout.splitlines() if "loaded beside" in line]
    print(f"rollout into the container: {loaded}; {len(samples)} requests from {ROLLOUT_CLIENTS} clients")

    assert samples and not failures(samples), [(s.status, s.error) for s in failures(samples)][:5]
    assert {s.version for s in samples if rolled_at <= s.start and s.end <= back_from} == {"v2"}
    assert {s.version for s in samples if s.start >= back_at} == {"v1"}
    # v2 is v1's export archived again: one in-process answer is both versions' (failures() checked that each
    # answer's JSON names the version its header does).
    expected = expected_answer(project.store / f"{MODEL}.v1.mar", CAT.read_bytes())
    for sample in {json.dumps(s.answer, sort_keys=True): s for s in samples}.values():
        assert_same_answer(sample.answer, expected)


@dataclass
class Request:
    start: float  # time.time()
    end: float = 0.0
    status: int | None = None  # None: no answer (refused, reset, closed without a response)
    error: str = ""
    answer: dict | None = None


def load(url: str, clients: int, stop: threading.Event, headers: dict) -> tuple[list[Request], list[threading.Thread]]:
    """`clients` loops of POST cat.jpg, each on its own keep-alive connection, until `stop` is set."""
    requests_made: list[Request] = []
    body = CAT.read_bytes()

    def client():
        with requests.Session() as session:
            while not stop.is_set():
                request = Request(time.time())
                requests_made.append(request)
                try:
                    response = session.post(url, data=body, headers={"Content-Type": "image/jpeg", **headers},
                                            timeout=60)
                    request.status = response.status_code
                    if response.status_code == 200:
                        request.answer = response.json()
                except requests.RequestException as error:
                    request.error = type(error).__name__ + ": " + str(error)[:200]
                    time.sleep(0.05)  # refused at once after the stop: do not spin
                request.end = time.time()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    return requests_made, threads


def sigterm_time(logs: str) -> float:
    """When the entrypoint got SIGTERM: the timestamp Docker gave its log line."""
    match = re.search(r"^(\S+) entrypoint: TERM: stopping", logs, re.MULTILINE)
    assert match, f"the entrypoint never logged a SIGTERM:\n{logs[-4000:]}"
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", match[1]).replace("Z", "+00:00")  # nanoseconds -> microseconds
    return datetime.fromisoformat(stamp).timestamp()


def down_under_load(project: Compose, container: str, archive: Path) -> str:
    """`docker-compose down` while 4 clients send the example photo: the container must stop by its own SIGTERM
    handling within the grace period (exit 0, nothing killed), every client must get an outcome, and every answer
    must be the archive's. Returns what happened to the requests in flight when SIGTERM arrived."""
    waiter = subprocess.Popen([project.docker, "wait", container], stdout=subprocess.PIPE, text=True)
    logs = subprocess.Popen([project.docker, "logs", "--follow", "--timestamps", container],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stop = threading.Event()
    made, threads = load(project.url(), clients=4, stop=stop, headers=project.headers())
    time.sleep(5)
    answered_before = sum(1 for r in made if r.status == 200)
    start = time.monotonic()
    project("down", timeout=STOP_GRACE_S + 60)  # stops (SIGTERM, then SIGKILL after the grace period), removes
    down_s = time.monotonic() - start
    stop.set()
    for thread in threads:
        thread.join(timeout=90)
    exit_code = int(waiter.communicate(timeout=30)[0].strip())
    log_text = logs.communicate(timeout=30)[0]

    term = sigterm_time(log_text)
    in_flight = [r for r in made if r.start < term and (r.end == 0 or r.end > term)]
    unanswered = [r for r in in_flight if r.status is None]
    statuses = sorted({r.status for r in in_flight if r.status is not None})
    summary = (f"{project.engine}: down took {down_s:.1f} s, exit {exit_code}; {len(made)} requests "
               f"({answered_before} answered before the stop), {len(in_flight)} in flight at SIGTERM: "
               f"{len(in_flight) - len(unanswered)} answered (statuses {statuses}), {len(unanswered)} without an "
               f"answer ({sorted({r.error.split(':')[0] for r in unanswered})})")
    print(summary)
    assert answered_before >= 4, f"the load never got going: {summary}"
    assert in_flight, f"no request was in flight at SIGTERM: {summary}"
    assert all(not thread.is_alive() for thread in threads), f"a client still waits for an answer: {summary}"
    assert down_s < STOP_GRACE_S, f"Docker had to kill the container: {summary}\n{log_text[-4000:]}"
    assert exit_code == 0, f"the container exited {exit_code} (137: killed): {summary}\n{log_text[-4000:]}"
    assert "sending SIGKILL" not in log_text, log_text[-4000:]
    expected = expected_answer(archive, CAT.read_bytes())
    answers = [r.answer["predictions"][0] if project.engine == "kserve" else r.answer for r in made if r.answer]
    for answer in {json.dumps(a, sort_keys=True): a for a in answers}.values():
        assert_same_answer(answer, expected)
    return summary


def test_down_under_load_stops_within_the_grace_period(project, torchserve):
    down_under_load(project, torchserve["container"], torchserve["archive"])


def test_a_restart_serves_again_without_exporting(project, torchserve):
    archive = torchserve["archive"]
    before = archive.stat()
    project("up", "--detach", SERVICE)
    container = project.container()
    assert container != torchserve["container"], "down did not remove the container"
    healthy_s = project.wait_healthy(container)
    logs = project.logs(container)
    assert "exporting" not in logs, f"exported again although the store has {MODEL}.mar:\n{logs[-3000:]}"
    assert (archive.stat().st_mtime_ns, archive.stat().st_ino) == (before.st_mtime_ns, before.st_ino)
    assert_same_answer(project.predict(CAT.read_bytes()), expected_answer(archive, CAT.read_bytes()))
    print(f"restart: healthy in {healthy_s:.0f} s, no export")
    project("down", timeout=STOP_GRACE_S + 60)


# ---------------------------------------------------------------------------------------------- KServe

@pytest.fixture(scope="module")
def kserve(project, tmp_path_factory) -> dict:
    """ENGINE=kserve on an empty store owned by root: the export goes to the fallback in the torch-cache volume."""
    project.engine = "kserve"
    project.store = owned_store(tmp_path_factory.mktemp("root-store") / "store", 0)
    project("up", "--detach", SERVICE)
    container = project.container()
    healthy_s = project.wait_healthy(container)
    archive = tmp_path_factory.mktemp("fallback") / f"{MODEL}.mar"
    run([project.docker, "cp", f"{container}:{FALLBACK_STORE}/{MODEL}.mar", str(archive)], 120)
    print(f"KServe: healthy in {healthy_s:.0f} s (export into the fallback included)")
    return {"container": container, "logs": project.logs(container), "archive": archive}


def test_a_store_owned_by_root_gets_the_fallback(project, kserve):
    warning = f"/home/app/model-store is not writable by uid {APP_UID}; using {FALLBACK_STORE} instead"
    assert warning in kserve["logs"], kserve["logs"][-3000:]
    assert f"no {MODEL}.mar in {FALLBACK_STORE}: exporting" in kserve["logs"]
    assert not list(project.store.iterdir()), f"wrote into the root-owned store: {list(project.store.iterdir())}"


@pytest.mark.parametrize("photo", ["cat.jpg", "12 MP phone JPEG"])
def test_kserve_answers_as_the_archive_in_process(project, kserve, phone_jpeg, photo):
    body = CAT.read_bytes() if photo == "cat.jpg" else phone_jpeg
    assert_same_answer(project.predict(body), expected_answer(kserve["archive"], body))


def test_kserve_logs_are_the_containers_logs(project, kserve):
    """`python -m serving --follow-logs` in the entrypoint: what the server and its core log is in `docker logs`,
    the served form's choice and each request, not only the entrypoint's lines."""
    project.predict(CAT.read_bytes())
    time.sleep(2)  # the follower copies every half second
    logs = project.logs(kserve["container"])
    assert "handlers.core INFO serving " in logs, logs[-3000:]  # the served form and why
    assert "handlers.core INFO batch of 1: decode=" in logs and f'"POST /v1/models/{MODEL}%3Apredict' in logs


def test_kserve_versions_from_inside_the_container(project, kserve):
    # The KServe server is found by the same run dir, and answers its version routes on the container's loopback.
    versions = serving_in(project, kserve["container"], "versions", MODEL)
    assert versions.returncode == 0 and f"{MODEL} on kserve: default v1; loaded v1" in versions.stdout, \
        versions.stdout + versions.stderr


def test_kserve_down_under_load_stops_within_the_grace_period(project, kserve):
    down_under_load(project, kserve["container"], kserve["archive"])
