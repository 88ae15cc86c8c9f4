"""docker/entrypoint.sh run natively: export when the store is empty, serve, and stop everything on SIGTERM."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

from handlers.policy import machine_policy, this_machine_resources
from serving.auth import read_keys
from serving.kserve import server as kserve
from serving.kserve.config import KServeSettings
from serving.rollout.candidate import checked_manifest
from serving.settings import ServingError, free_port
from serving.torchserve import server as torchserve
from serving.torchserve.config import ServerSettings
from tests.answers import assert_same_answer, expected_answer

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
HEALTHCHECK = ROOT / "docker" / "healthcheck.sh"
EXPORT_AND_SERVE_TIMEOUT_S = 480  # resnet18 export (about a minute alone) plus TorchServe's start
SERVE_TIMEOUT_S = 180
STOP_TIMEOUT_S = 60
MODEL = "resnet18"  # the entrypoint's MODEL: resnet18.mar, exported as the ResNet of that name when missing

pytestmark = pytest.mark.slow

def jpeg_bytes() -> bytes:
    from PIL import Image, ImageDraw
    image = Image.new("RGB", (256, 192), (90, 140, 200))
    draw = ImageDraw.Draw(image)
    draw.ellipse((60, 40, 200, 170), fill=(230, 180, 60), outline=(40, 40, 40), width=4)
    draw.rectangle((10, 150, 250, 185), fill=(40, 120, 50))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def session_pids(session: int) -> list[int]:
    """Every process still in the entrypoint's session (it was started with start_new_session=True)."""
    result = subprocess.run(["pgrep", "-s", str(session)], capture_output=True, text=True)
    return [int(pid) for pid in result.stdout.split()]


def processes_mentioning(text: str) -> list[str]:
    result = subprocess.run(["pgrep", "-af", text], capture_output=True, text=True)
    return [line for line in result.stdout.splitlines() if str(os.getpid()) != line.split()[0]]


class Entrypoint:
    """docker/entrypoint.sh with every path and port inside tmp_path."""

    def __init__(self, tmp_path: Path, **env: str):
        self.tmp_path = tmp_path
        self.model_store = tmp_path / "model-store"
        self.artifacts = tmp_path / "artifacts"
        self.workdir = tmp_path / "work"
        self.log_dir = tmp_path / "logs"
        for folder in (self.workdir, self.log_dir):
            folder.mkdir(exist_ok=True)
        # The entrypoint makes TorchServe's folder for worker sockets in TMPDIR: a short one, as /tmp is in the
        # image, because a unix socket's path has at most 107 bytes and a test's tmp_path can be long.
        self.tmpdir = Path(tempfile.mkdtemp(prefix="entrypoint-"))
        self.ports = {name: free_port() for name in ("inference", "management", "metrics", "grpc1", "grpc2")}
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TS_") and k not in ("MODEL", "ARCH")},
            "MODEL_STORE": str(self.model_store),
            "ARTIFACTS": str(self.artifacts),
            "MODEL": MODEL,
            "WEIGHTS": "random",
            "PYTHON": sys.executable,
            "TS_INFERENCE_ADDRESS": f"http://127.0.0.1:{self.ports['inference']}",
            "TS_MANAGEMENT_ADDRESS": f"http://127.0.0.1:{self.ports['management']}",
            "TS_METRICS_ADDRESS": f"http://127.0.0.1:{self.ports['metrics']}",
            # TorchServe also opens gRPC on 7070/7071: free ones, in case another server runs here.
            "TS_GRPC_INFERENCE_PORT": str(self.ports["grpc1"]),
            "TS_GRPC_MANAGEMENT_PORT": str(self.ports["grpc2"]),
            "LOG_LOCATION": str(self.log_dir),
            "METRICS_LOCATION": str(self.log_dir),
            "TMPDIR": str(self.tmpdir),
            "TS_KEYS_DIR": str(tmp_path / "keys"),  # where TorchServe writes key_file.json (token auth)
            "RUN_DIR": str(self.tmpdir / "run"),  # what `python -m serving rollout` finds the server by
            **env,
        }
        self.console = tmp_path / "console.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.console, "wb") as console:
            self.process = subprocess.Popen(["bash", str(ENTRYPOINT)], cwd=self.workdir, env=self.env,
                                            stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def output(self) -> str:
        text = self.console.read_text(errors="replace")
        ts_log = self.log_dir / "ts_log.log"
        if ts_log.exists():
            text += "\n--- ts_log.log (end) ---\n" + ts_log.read_text(errors="replace")[-4000:]
        for engine_log in sorted(self.tmpdir.glob("*/logs/kserve.log")):  # the kserve engine's own log
            text += f"\n--- {engine_log} (end) ---\n" + engine_log.read_text(errors="replace")[-4000:]
        return text[-12000:]

    @property
    def archive(self) -> Path:
        return self.model_store / f"{MODEL}.mar"

    def predict(self, timeout: float, model: str = MODEL) -> dict:
        """server's readiness loop against the entrypoint: the first 200 answer, with the inference key from
        TS_KEYS_DIR/key_file.json when token authorisation is on."""
        keys = ServerSettings(run_dir=Path(self.env["TS_KEYS_DIR"]),
                              token_auth=self.env.get("TS_DISABLE_TOKEN_AUTHORIZATION", "").lower() == "false")
        url = f"{self.env['TS_INFERENCE_ADDRESS']}/predictions/{model}"
        try:
            return torchserve.poll_for_prediction(url, jpeg_bytes(), lambda: torchserve.auth_headers(keys),
                                                  time.monotonic() + timeout, self.process, self.log_dir)
        except ServingError as error:
            pytest.fail(f"{error}\n{self.output()}")

    def healthcheck(self) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(HEALTHCHECK)], env=self.env, capture_output=True, text=True, timeout=30)

    def stop(self) -> int:
        """SIGTERM to the entrypoint alone, as `docker compose down` sends to the container's main process."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the entrypoint did not exit within {STOP_TIMEOUT_S}s of SIGTERM:\n{self.output()}")

    def assert_nothing_left(self) -> None:
        left = processes_mentioning(str(self.model_store))
        assert not left, f"TorchServe still running for {self.model_store}:\n" + "\n".join(left)
        assert not session_pids(self.process.pid), \
            f"processes left behind: {subprocess.run(['ps', '-o', 'pid,cmd', '-s', str(self.process.pid)], capture_output=True, text=True).stdout}"

    def kill_everything(self) -> None:
        if self.process is None:
            return
        # The serving command starts its server in a session of its own: found by its run dir (in TMPDIR) or store.
        servers = processes_mentioning(str(self.tmpdir)) + processes_mentioning(str(self.model_store))
        for pid in session_pids(self.process.pid) + [int(line.split()[0]) for line in servers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def entrypoint(tmp_path):
    created: list[Entrypoint] = []

    def make(**env: str) -> Entrypoint:
        created.append(Entrypoint(tmp_path, **env))
        return created[-1]

    yield make
    for instance in created:
        instance.kill_everything()
        shutil.rmtree(instance.tmpdir)


def assert_the_archives_answer(served: dict, archive: Path) -> None:
    """The entrypoint's answer is the archive's own, run in this process on the same image."""
    assert_same_answer(served, expected_answer(archive, jpeg_bytes()))


def copy_archive(resnet18_export: dict, model_store: Path) -> None:
    """The real resnet18.mar of the session's export, as a model store a previous start left behind."""
    model_store.mkdir(parents=True, exist_ok=True)
    shutil.copy2(resnet18_export["archive"], model_store / f"{MODEL}.mar")


def test_serves_every_archive_of_the_store_without_exporting_and_stops_on_sigterm(entrypoint, resnet18_export):
    server = entrypoint()
    copy_archive(resnet18_export, server.model_store)
    shutil.copy2(resnet18_export["archive"], server.model_store / "second.mar")  # another model of the store
    assert server.healthcheck().returncode != 0, "healthy before the server started"

    server.start()
    assert_the_archives_answer(server.predict(SERVE_TIMEOUT_S), server.archive)
    assert_the_archives_answer(server.predict(SERVE_TIMEOUT_S, "second"), server.model_store / "second.mar")
    health = server.healthcheck()
    assert health.returncode == 0 and "resnet18:" in health.stdout and "second:" in health.stdout, \
        health.stdout + health.stderr
    assert not server.artifacts.exists(), f"exported although the model store had {MODEL}.mar"
    assert processes_mentioning(str(server.model_store)), "no process serves this model store"

    assert server.stop() == 0, server.output()
    server.assert_nothing_left()
    assert server.healthcheck().returncode != 0


def test_exports_into_an_empty_store_then_serves_and_stops_on_sigterm(entrypoint):
    # EXPORT_ARGS passes its options on: two forms, not every one, keep the test's export short
    server = entrypoint(EXPORT_ARGS="--formats traced,onnx-traced")
    server.start()
    answer = server.predict(EXPORT_AND_SERVE_TIMEOUT_S)
    assert server.archive.is_file()
    assert_the_archives_answer(answer, server.archive)
    manifest = json.loads((server.artifacts / "manifest.json").read_text())
    assert set(manifest["artifacts"]) == {"traced", "onnx-traced"}
    assert server.healthcheck().returncode == 0

    assert server.stop() == 0, server.output()
    server.assert_nothing_left()


def test_sigterm_during_the_export_stops_it(entrypoint):
    server = entrypoint()
    server.start()
    deadline = time.monotonic() + 60
    while not any("-m export resnet" in line for line in processes_mentioning(str(server.artifacts))):
        assert server.process.poll() is None and time.monotonic() < deadline, \
            f"the export never started:\n{server.output()}"
        time.sleep(0.2)
    assert server.stop() == 128 + signal.SIGTERM, server.output()
    server.assert_nothing_left()
    assert not server.archive.exists()


def test_unwritable_model_store_falls_back_to_the_cache_folder(entrypoint, resnet18_export, tmp_path):
    # As when Docker creates a missing ./model-store as root. A path under a file is unwritable even for root.
    (tmp_path / "a-file").write_text("")
    server = entrypoint(MODEL_STORE=str(tmp_path / "a-file" / "model-store"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    server.model_store = tmp_path / "cache" / "vision-export" / "model-store"
    copy_archive(resnet18_export, server.model_store)
    server.start()
    assert_the_archives_answer(server.predict(SERVE_TIMEOUT_S), server.archive)
    assert "not writable" in server.console.read_text()
    assert processes_mentioning(str(server.model_store)), "not serving the fallback store"
    assert server.stop() == 0, server.output()
    server.assert_nothing_left()


def test_with_token_authorisation_the_entrypoint_serves_and_the_health_check_passes(entrypoint, resnet18_export):
    server = entrypoint(TS_DISABLE_TOKEN_AUTHORIZATION="false")
    copy_archive(resnet18_export, server.model_store)
    server.start()
    assert_the_archives_answer(server.predict(SERVE_TIMEOUT_S), server.archive)  # with the inference key
    plain = requests.post(f"{server.env['TS_INFERENCE_ADDRESS']}/predictions/{MODEL}", data=jpeg_bytes(),
                          headers={"Content-Type": "image/jpeg"}, timeout=30)
    assert plain.status_code == 400 and "Token Authorization failed" in plain.text
    health = server.healthcheck()
    assert health.returncode == 0, health.stdout + health.stderr
    # `python -m serving versions` finds this TorchServe by the entrypoint's run dir, and its management API
    # answers it with the management key from there; an anonymous management request is refused.
    versions = subprocess.run([sys.executable, "-m", "serving", "versions", MODEL, "--run-dir", server.env["RUN_DIR"]],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    label = checked_manifest(server.archive).model_version.label
    assert versions.returncode == 0, versions.stdout + versions.stderr
    assert f"{MODEL} on torchserve: default {label}; loaded {label}" in versions.stdout, versions.stdout
    anonymous = requests.get(f"{server.env['TS_MANAGEMENT_ADDRESS']}/models/{MODEL}", timeout=30)
    assert anonymous.status_code == 400 and "Token Authorization failed" in anonymous.text, anonymous.text
    assert server.stop() == 0, server.output()
    server.assert_nothing_left()


def test_engine_kserve_serves_the_store_with_the_policys_workers_and_stops_on_sigterm(entrypoint, resnet18_export):
    """With token authorisation on, as the image has it: the keys made once in TS_KEYS_DIR, kept there, never in the
    console; the entrypoint's health check and a client with the inference key answered, an anonymous one not."""
    port = free_port()
    server = entrypoint(ENGINE="kserve", KSERVE_HOST="127.0.0.1", KSERVE_HTTP_PORT=str(port),
                        TS_DISABLE_TOKEN_AUTHORIZATION="false", PAGE_PORT=str(free_port()))
    copy_archive(resnet18_export, server.model_store)
    server.start()
    settings = KServeSettings(models=(MODEL,), http_port=port, run_dir=Path(server.env["TS_KEYS_DIR"]),
                              token_auth=True)  # its key_file: TS_KEYS_DIR/key_file.json
    photo = server.tmp_path / "photo.jpg"
    photo.write_bytes(jpeg_bytes())
    try:
        answers = kserve.wait_until_serving(settings, server.process, photo, timeout=SERVE_TIMEOUT_S)
    except ServingError as error:
        pytest.fail(f"{error}\n{server.output()}")
    assert_the_archives_answer(answers[MODEL], server.archive)
    anonymous = requests.post(settings.predict_url(MODEL), json=kserve.v1_body(photo), timeout=60)
    assert anonymous.status_code == 401, anonymous.text
    keys = read_keys(settings.key_file)
    assert not [key for key in keys.values() if key in server.output()]
    health = server.healthcheck()
    assert health.returncode == 0 and "KServe serves resnet18" in health.stdout, health.stdout + health.stderr
    (group,) = [int(line.split()[0]) for line in processes_mentioning("serving.kserve.worker")
                if str(server.tmpdir) in line]  # the ModelServer's process group (its run dir is in TMPDIR)
    workers = machine_policy(*this_machine_resources()).workers
    spawned = subprocess.run(["pgrep", "-g", str(group), "-f", "spawn_main"], capture_output=True, text=True)
    # the pool's workers and its spare, which has done a worker's imports for the next dead worker's place
    # (serving/kserve/pool.py); one worker is served in the server's own process
    assert len(spawned.stdout.split()) == (workers + 1 if workers > 1 else 0)
    assert server.stop() == 0, server.output()
    server.assert_nothing_left()
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)
