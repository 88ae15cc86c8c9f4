"""Security posture of a real TorchServe started our way: loopback-only APIs, no model registration from a
URL, registration limited to the local model store, token authorisation end to end (python -m serving and
its readiness check, the try-it page in front of it, the benchmark), bounded request and response sizes; and of a
real KServe server and a real Ray Serve, both with token authorisation on: every port tried anonymously and with
each key (Ray's rollout gate too), Ray's cluster refusing a driver without its token, one body limit with
TorchServe's, read no further than it, and on KServe a cap on the photos of one request (the other servers'
bounds: tests/serving/test_bounds.py)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from contract.policy import MAX_BODY_BYTES, MAX_PHOTOS_PER_REQUEST
from serving.auth import auth_headers, read_keys
from serving.kserve.config import KServeSettings
from serving.kserve.engine import KServe
from serving.page.server import NO_KEY
from serving.ray.config import GATE_PREFIX
from serving.torchserve import server
from serving.torchserve.config import DEFAULT_CONFIG, free_port
from tests.answers import assert_same_answer, expected_answer
from tests.browser import chromium, wait_for
from tests.conftest import ROOT

pytestmark = pytest.mark.slow
CAT = ROOT / "examples" / "cat.jpg"


def listening_addresses(port: int) -> set[str]:
    """Local addresses a TCP port listens on, read from /proc/net/tcp{,6} (no traffic sent)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if int(hex_port, 16) == port and state == "0A":  # LISTEN
                found.add("127.0.0.1" if address in ("0100007F", "0000000000000000FFFF00000100007F") else address)
    return found


def test_the_shipped_config_binds_loopback_and_bounds_sizes():
    config = dict(line.split("=", 1) for line in DEFAULT_CONFIG.read_text().splitlines()
                  if "=" in line and not line.startswith("#"))
    for key in ("inference_address", "management_address", "metrics_address"):
        assert config[key].startswith("http://127.0.0.1:")
    assert config["enable_model_api"] == "false"
    assert config["allowed_urls"] == "file://.*[.]mar"  # local archives only, even if registration is switched on
    assert int(config["max_request_size"]) == MAX_BODY_BYTES  # one body limit, whichever engine serves
    assert int(config["max_response_size"]) <= MAX_BODY_BYTES


@pytest.fixture(scope="module")
def default_server(resnet18_server):
    return resnet18_server


def test_apis_listen_on_loopback_only(default_server):
    for port in (default_server.inference_port, default_server.management_port, default_server.metrics_port):
        assert listening_addresses(port) == {"127.0.0.1"}, port


def test_registering_a_model_from_a_url_is_refused(default_server):
    """Registration is on (a rollout registers versions beside the live one), from the model store only."""
    for url in ("http://127.0.0.1:1/evil.mar", "file:///etc/passwd.mar", "../../../tmp/evil.mar"):
        response = requests.post(f"{default_server.management_url}/models", params={"url": url}, timeout=30)
        assert response.status_code == 404 and "not" in response.json()["message"], response.text


def test_with_the_model_api_on_only_the_local_model_store_may_register(resnet18_export, tmp_path):
    settings = server.on_free_ports(resnet18_export["model_store"], tmp_path / "run")
    settings.run_dir.mkdir(parents=True)
    settings.model_name = resnet18_export["model_name"]
    settings.extra_env = {"TS_ENABLE_MODEL_API": "true"}
    with server.running(settings, CAT):
        response = requests.post(f"{settings.management_url}/models",
                                 params={"url": "http://127.0.0.1:1/evil.mar"}, timeout=30)
    assert response.status_code >= 400 and "allowed" in response.text.lower(), response.text


def run_serving(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_token_authorisation_end_to_end(resnet18_export, tmp_path):
    run_dir = tmp_path / "run"
    ports = [free_port() for _ in range(5)]
    args = ["--model-store", str(resnet18_export["model_store"]), "--run-dir", str(run_dir),
            "--inference-port", str(ports[0]), "--management-port", str(ports[1]), "--metrics-port", str(ports[2]),
            "--grpc-inference-port", str(ports[3]), "--grpc-management-port", str(ports[4]),
            "--signals-port", str(free_port())]
    started = run_serving(*args, "--detach", "--token-auth")
    try:
        assert started.returncode == 0, started.stdout + started.stderr  # its readiness check used the key
        assert "Authorization: Bearer <inference key" in started.stdout
        name = resnet18_export["model_name"]
        settings = server.ServerSettings(inference_port=ports[0], management_port=ports[1], run_dir=run_dir,
                                         token_auth=True, model_name=name)
        body, jpeg = CAT.read_bytes(), {"Content-Type": "image/jpeg"}
        anonymous = requests.post(settings.predictions_url(), data=body, headers=jpeg, timeout=30)
        assert anonymous.status_code == 400 and "Token Authorization failed" in anonymous.text
        anonymous_management = requests.get(f"{settings.management_url}/models/{name}", timeout=30)
        assert anonymous_management.status_code == 400 and "Token Authorization failed" in anonymous_management.text
        wrong_key = requests.post(settings.predictions_url(), data=body, timeout=30,
                                  headers={**jpeg, **server.auth_headers(settings, "management")})
        assert wrong_key.status_code == 400  # the management key is not an inference key
        allowed = requests.post(settings.predictions_url(), data=body, timeout=30,
                                headers={**jpeg, **server.auth_headers(settings)})
        assert allowed.status_code == 200, allowed.text
        assert_same_answer(allowed.json(), expected_answer(resnet18_export["archive"], body))
        managed = requests.get(f"{settings.management_url}/models/{name}", timeout=30,
                               headers=server.auth_headers(settings, "management"))
        assert managed.status_code == 200 and managed.json()[0]["workers"]
        its_grpc_ports_ask_for_the_keys_too(settings, ports[3], ports[4], body, allowed.json(), tmp_path / "grpc")
        the_page_asks_each_caller_for_the_key(settings, resnet18_export, body)
    finally:
        run_serving("stop", "--run-dir", str(run_dir), timeout=120)


def its_grpc_ports_ask_for_the_keys_too(settings, inference_port: int, management_port: int, body: bytes,
                                        answer: dict, stubs_folder: Path) -> None:
    """TorchServe's gRPC inference and management ports, called as a gRPC client does: refused without the key
    (and the inference port with the management key), answered with it, the prediction HTTP's."""
    import grpc

    from tests.torchserve_grpc import compiled, list_models, predict
    stubs, name = compiled(stubs_folder), settings.model_name
    inference_key = server.auth_headers(settings)["Authorization"].removeprefix("Bearer ")
    management_key = server.auth_headers(settings, "management")["Authorization"].removeprefix("Bearer ")
    for call in (lambda: predict(stubs, inference_port, name, body),
                 lambda: predict(stubs, inference_port, name, body, management_key),
                 lambda: list_models(stubs, management_port)):
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert "Token Authorization failed" in (refused.value.details() or ""), refused.value
    assert_same_answer(json.loads(predict(stubs, inference_port, name, body, inference_key)), answer)
    assert name in list_models(stubs, management_port, management_key)


@contextlib.contextmanager
def try_it_page(inference_url: str, model_store: Path, *flags: str):
    """`python -m serving.page` in front of an engine, as the container starts it: its base URL."""
    port = free_port()
    page = subprocess.Popen([sys.executable, "-m", "serving.page", "--url", inference_url, "--model-store",
                             str(model_store), "--page-port", str(port), *flags], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert "try it in a browser" in page.stdout.readline()
        yield f"http://127.0.0.1:{port}"
    finally:
        page.terminate()
        page.wait(timeout=30)


def the_page_asks_each_caller_for_the_key(settings, export: dict, body: bytes) -> None:
    """The page holds no key: an anonymous caller is refused (401, saying how to send the key), a caller with the
    inference key is answered as the engine answers it, the key passed on as the caller sent it."""
    jpeg = {"Content-Type": "image/jpeg"}
    with try_it_page(settings.inference_url, export["model_store"], "--token-auth") as page:
        url = f"{page}/predictions/{export['model_name']}"
        anonymous = requests.post(url, data=body, headers=jpeg, timeout=60)
        assert anonymous.status_code == 401 and anonymous.json()["message"] == NO_KEY
        wrong_key = requests.post(url, data=body, timeout=60,
                                  headers={**jpeg, **server.auth_headers(settings, "management")})
        assert wrong_key.status_code == 400 and "Token Authorization failed" in wrong_key.text  # TorchServe's
        keyed = requests.post(url, data=body, headers={**jpeg, **server.auth_headers(settings)}, timeout=60)
        assert keyed.status_code == 200, keyed.text
        assert_same_answer(keyed.json(), expected_answer(export["archive"], body))
        in_a_browser(page, server.auth_headers(settings)["Authorization"].removeprefix("Bearer "), keyed.json())


def in_a_browser(page: str, key: str, keyed: dict) -> None:
    """The page in headless Chromium: without the key its user reads how to send it; with the key typed in its
    field, the engine's answer (the one curl got with the key)."""
    with chromium() as browser:
        browser.get(page + "/")
        wait_for(lambda: browser.execute_script("return document.getElementById('model').options.length"))
        assert browser.find_element("id", "key").is_displayed()
        browser.find_element("id", "file").send_keys(str(CAT))
        wait_for(lambda: browser.execute_script("return document.body.dataset.state") == "error")
        assert browser.find_element("id", "error").text == NO_KEY
        browser.find_element("id", "key").send_keys(key)
        browser.execute_script("document.getElementById('key').dispatchEvent(new Event('change'))")
        wait_for(lambda: browser.execute_script("return document.body.dataset.state") == "answered")
        assert browser.execute_script("return window.lastAnswer")["predictions"] == keyed["predictions"]


def test_the_page_without_token_auth_serves_anyone_as_the_engine_does(default_server, resnet18_export):
    body = CAT.read_bytes()
    with try_it_page(default_server.inference_url, resnet18_export["model_store"]) as page:
        answer = requests.post(f"{page}/predictions/{resnet18_export['model_name']}", data=body, timeout=60,
                               headers={"Content-Type": "image/jpeg"})
    assert answer.status_code == 200, answer.text
    assert_same_answer(answer.json(), expected_answer(resnet18_export["archive"], body))


# ---------------------------------------------------------------- KServe: keys, the same body limit, a photo cap
@pytest.fixture(scope="module")
def kserve(resnet18_export, tmp_path_factory) -> KServeSettings:
    settings = KServeSettings(resnet18_export["model_store"], (resnet18_export["model_name"],),
                              http_port=free_port(), run_dir=tmp_path_factory.mktemp("kserve-bounds"), token_auth=True)
    with KServe(settings).running(CAT):  # its readiness probe sent the inference key
        yield settings


def test_kserve_with_token_auth_answers_each_route_only_with_its_key(kserve, resnet18_export):
    name, body = resnet18_export["model_name"], CAT.read_bytes()
    inference, management = auth_headers(kserve), auth_headers(kserve, "management")
    v1 = {"instances": [{"image": {"b64": base64.b64encode(body).decode()}}]}
    predict = lambda headers: requests.post(kserve.predict_url(name), json=v1, headers=headers, timeout=300)  # noqa: E731
    for headers in ({}, management, {"Authorization": "Bearer " + "x" * 32}):
        refused = predict(headers)
        assert refused.status_code == 401 and "send the inference key" in refused.json()["error"], refused.text
        assert refused.headers["x-request-id"]  # refused inside the request signals: the id, the count
    keyed = predict(inference)
    assert keyed.status_code == 200, keyed.text
    assert_same_answer(keyed.json()["predictions"][0], expected_answer(resnet18_export["archive"], body))
    for method, path in (("GET", f"/v2/models/{name}"), ("GET", "/docs"), ("POST", f"/v2/models/{name}/infer")):
        assert requests.request(method, kserve.url + path, timeout=60).status_code == 401, path
    for method, path in (("GET", f"/rollout/{name}"), ("GET", f"/rollout/{name}/captured"),
                         ("POST", f"/v2/repository/models/{name}/unload"), ("POST", f"/rollout/{name}/v9")):
        for headers in ({}, inference):  # the inference key changes no version and reads no photo
            refused = requests.request(method, kserve.url + path, headers=headers, timeout=60)
            assert refused.status_code == 401 and "management key" in refused.json()["error"], (path, refused.text)
    assert requests.get(f"{kserve.url}/rollout/{name}", headers=management, timeout=60).json()["default"]
    absent = requests.post(f"{kserve.url}/v2/repository/models/absent/unload", headers=management, timeout=60)
    assert absent.status_code == 404, absent.text  # past the key, KServe's own answer (the served one stays)
    for path in ("/metrics", "/health/live", "/health/ready"):  # anyone: no model's answer, no internals
        open_route = requests.get(kserve.url + path, timeout=60)
        assert open_route.status_code == 200 and "pid" not in open_route.text, path
    assert keys_not_in_the_log(kserve.key_file, kserve.log_file)


def keys_not_in_the_log(key_file: Path, *logs: Path) -> bool:
    keys = read_keys(key_file).values()
    return not [key for log in logs for key in keys if key in log.read_text(errors="replace")]


def raw_post(url_port: int, path: str, head: str, parts=(), headers: dict | None = None) -> tuple[int, str]:
    """A POST on a raw socket (a declared size the body never reaches, a chunked body): status and body."""
    head += "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    with socket.create_connection(("127.0.0.1", url_port), timeout=60) as connection:
        connection.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{head}\r\n"
                           .encode())
        for part in parts:
            try:
                connection.sendall(part)
            except OSError:
                break
        answer = b""
        while not answer.endswith(b"}") and (chunk := connection.recv(65536)):
            answer += chunk
    head_text, _, body = answer.decode("latin-1").partition("\r\n\r\n")
    return int(head_text.split(" ", 2)[1]), body


def test_kserve_refuses_an_oversized_body_before_reading_it(kserve, resnet18_export):
    path = f"/v1/models/{resnet18_export['model_name']}:predict"
    started = time.monotonic()
    status, body = raw_post(kserve.http_port, path, f"Content-Length: {64 * MAX_BODY_BYTES}\r\n",
                            headers=auth_headers(kserve))
    assert status == 413 and "MiB" in body, body  # answered with none of its 512 MiB sent
    assert time.monotonic() - started < 30
    chunk = b"x" * 2**20
    parts = (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(64))
    status, body = raw_post(kserve.http_port, path, "Transfer-Encoding: chunked\r\n", parts, auth_headers(kserve))
    assert status == 413 and "MiB" in body, body


def test_kserve_caps_the_photos_of_one_request_and_still_answers_one(kserve, resnet18_export):
    url, body = kserve.predict_url(resnet18_export["model_name"]), CAT.read_bytes()
    instance = {"image": {"b64": base64.b64encode(body).decode()}}
    crowded = requests.post(url, json={"instances": [instance] * (MAX_PHOTOS_PER_REQUEST + 1)}, timeout=60,
                            headers=auth_headers(kserve))
    assert crowded.status_code == 413 and f"at most {MAX_PHOTOS_PER_REQUEST}" in crowded.json()["error"]
    one = requests.post(url, json={"instances": [instance]}, timeout=300, headers=auth_headers(kserve))
    assert one.status_code == 200, one.text
    assert_same_answer(one.json()["predictions"][0], expected_answer(resnet18_export["archive"], body))


# ---------------------------------------------------------------- Ray Serve's ingress: the same body limit
@pytest.fixture(scope="module")
def ray_serve(resnet18_export, tmp_path_factory):
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install '.[ray]' (an optional extra)")
    from contract.policy import ServingPolicy
    from serving.ray.config import RaySettings
    from serving.ray.engine import RayServe
    one_replica = ServingPolicy(workers=1, batch_size=1, max_batch_delay_ms=5, threads_per_worker=1, device="cpu",
                                reason="tests: one replica")
    settings = RaySettings(resnet18_export["model_store"], (resnet18_export["model_name"],), http_port=free_port(),
                           run_dir=tmp_path_factory.mktemp("ray-bounds"), policy=one_replica,
                           signals_port=free_port(), token_auth=True)
    with RayServe(settings).running(CAT):  # its readiness probe sent the inference key
        yield settings


def test_ray_with_token_auth_answers_only_the_key_and_its_cluster_only_the_token(ray_serve, resnet18_export):
    from serving.ray.cluster import RAY_TOKEN_FILE
    url, photo = ray_serve.predictions_url(resnet18_export["model_name"]), CAT.read_bytes()
    jpeg = {"Content-Type": "image/jpeg"}
    for headers in ({}, auth_headers(ray_serve, "management")):
        refused = requests.post(url, data=photo, headers={**jpeg, **headers}, timeout=60)
        assert refused.status_code == 401 and "send the inference key" in refused.json()["error"], refused.text
    assert requests.get(f"{url}/description", timeout=60).status_code == 401
    keyed = requests.post(url, data=photo, headers={**jpeg, **auth_headers(ray_serve)}, timeout=300)
    assert keyed.status_code == 200, keyed.text
    for path in ("/metrics", "/health/live", "/health/ready"):
        assert requests.get(ray_serve.signals_url + path, timeout=60).status_code == 200, path
    versions = f"{ray_serve.signals_url}/rollout/{resnet18_export['model_name']}"  # a rollout's steps: management
    for method, headers in (("GET", {}), ("GET", auth_headers(ray_serve)), ("POST", auth_headers(ray_serve))):
        refused = requests.request(method, f"{versions}/v9" if method == "POST" else versions, headers=headers,
                                   timeout=60)
        assert refused.status_code == 401 and "send the management key" in refused.json()["detail"], refused.text
        assert refused.headers["WWW-Authenticate"] == "Bearer"
    described = requests.get(versions, headers=auth_headers(ray_serve, "management"), timeout=60)
    assert described.status_code == 200 and described.json()["loaded"] == [described.json()["default"]], described.text
    gate_url = f"http://127.0.0.1:{ray_serve.http_port}{GATE_PREFIX}/{resnet18_export['model_name']}/v1"

    # The gate's own route, anonymously: Serve's proxy answers 404 or 503 for it until the spare, deployed once the
    # models answered, runs (the answer comes in a list: a 401 response is falsy, and wait_for waits for truth).
    def gate_route_answer():
        answer = requests.post(gate_url, data=photo, headers=jpeg, timeout=60)
        return None if answer.status_code in (404, 503) else [answer]
    (gate,) = wait_for(gate_route_answer, timeout=120, every=0.5)
    assert gate.status_code == 401 and "send the inference key" in gate.json()["error"], gate.text
    held = requests.post(gate_url, data=photo, headers={**jpeg, **auth_headers(ray_serve)}, timeout=60)
    assert held.status_code == 404 and "not loaded beside the live version" in held.json()["error"], held.text
    address = ray_serve.address_file.read_text()
    assert drives_the_cluster(address, {"RAY_AUTH_MODE": "token",
                                        "RAY_AUTH_TOKEN_PATH": str(ray_serve.run_dir / RAY_TOKEN_FILE)})
    assert not drives_the_cluster(address, {"RAY_AUTH_MODE": "disabled"})  # anonymous: the router is out of reach
    assert not drives_the_cluster(address, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64})
    assert keys_not_in_the_log(ray_serve.key_file, ray_serve.log_file)


def drives_the_cluster(address: str, auth_env: dict) -> bool:
    """Whether a Ray driver with this authentication reaches the cluster at address and finds Serve's actors
    (the rollout's router lives among them); a refusal is seen in Ray's first InvalidAuthToken line."""
    script = ("import ray; ray.init(address=%r, namespace='serve', logging_level='ERROR'); "
              "print('DRIVES', len(ray.util.list_named_actors(all_namespaces=True)) > 0, flush=True)" % address)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}, **auth_env,
           "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        for line in driver.stdout:
            if "InvalidAuthToken" in line or line.startswith("DRIVES"):
                return line.strip() == "DRIVES True"
        return False
    finally:
        driver.kill()
        driver.wait(timeout=30)


def test_rays_ingress_refuses_a_body_over_the_limit_and_still_answers_a_photo(ray_serve, resnet18_export):
    url, name = ray_serve.predictions_url(resnet18_export["model_name"]), resnet18_export["model_name"]
    keyed = auth_headers(ray_serve)
    status, body = raw_post(ray_serve.http_port, f"/predictions/{name}", f"Content-Length: {64 * MAX_BODY_BYTES}\r\n",
                            headers=keyed)
    assert status == 413 and "MiB" in body, body
    chunk = b"x" * 2**20
    parts = (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(2 * MAX_BODY_BYTES // len(chunk)))
    status, body = raw_post(ray_serve.http_port, f"/predictions/{name}", "Transfer-Encoding: chunked\r\n", parts,
                            keyed)
    assert status == 413 and "MiB" in body, body
    photo = CAT.read_bytes()
    one = requests.post(url, data=photo, headers={"Content-Type": "image/jpeg", **keyed}, timeout=300)
    assert one.status_code == 200, one.text
    assert_same_answer(one.json(), expected_answer(resnet18_export["archive"], photo))


@pytest.mark.skipif(shutil.which("hey") is None, reason="the load generator hey is not installed")
def test_the_benchmark_works_with_token_authorisation(resnet18_export, tmp_path):
    done = subprocess.run([sys.executable, "-m", "measure", "bench", "--export-dir", str(resnet18_export["out"]),
                           "--configurations", "default", "--requests", "10", "--concurrency", "1",
                           "--warmup", "1",
                           "--inprocess", "none", "--token-auth", "--out", str(tmp_path / "bench")], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    row = __import__("json").loads((tmp_path / "bench" / "results.json").read_text())[0]
    assert row["failed"] == 0 and row["requests"] == 10
