"""KServe's protocol on our app (serving/kserve/app.py): KServe's public names it is made of, its routes and
error handlers with ours over them, and a real server of it bound to the host it is given, stopped by SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import requests
from kserve import errors as kserve_errors

from handlers.request_error import RequestError
from serving.kserve import signals
from serving.kserve.app import OurModelServer
from serving.kserve.versions import Versions
from serving.settings import free_port

HOST = "127.0.0.1"
SERVE_EMPTY = ("from serving.kserve.app import OurModelServer; from serving.kserve.versions import Versions; "
               "OurModelServer({host!r}, Versions(settings=None, make_model=None), {port}).start([])")


def server() -> OurModelServer:
    return OurModelServer(HOST, Versions(settings=None, make_model=None), http_port=0)


def test_the_app_has_kserve_v1_and_v2_routes_beside_ours():
    paths = server().app.openapi()["paths"]
    assert {"/v1/models/{model_name}:predict", "/v2/models/{model_name}/infer", "/v2/health/live",
            "/v2/models/{model_name}/ready", signals.METRICS_ROUTE, signals.READY_ROUTE}.issubset(paths)


def test_ours_answer_a_bad_request_and_a_failure_kserve_answers_its_own_errors():
    handlers = server().app.exception_handlers
    assert handlers[RequestError].__name__ == "request_error_response"
    assert handlers[Exception].__name__ == handlers[kserve_errors.InferenceError].__name__ == "failure_response"
    assert handlers[kserve_errors.InvalidInput] is kserve_errors.invalid_input_handler
    assert handlers[kserve_errors.ModelNotFound] is kserve_errors.model_not_found_handler


def test_signals_auth_and_the_body_limit_wrap_every_route_outermost_first():
    names = [middleware.cls.__name__ for middleware in server().app.user_middleware]
    assert names == ["RequestSignals", "TokenAuth", "BodyLimit"]


def test_a_server_binds_only_its_host_answers_and_stops_on_sigterm():
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", SERVE_EMPTY.format(host=HOST, port=port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        live = wait_for(f"http://{HOST}:{port}{signals.LIVE_ROUTE}", process)
        assert live.status_code == 200
        with socket.socket() as other:  # another loopback address: free, as 0.0.0.0 would have taken it too
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(("127.0.0.2", port))
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, process.stdout.read()
    finally:
        process.kill()


def wait_for(url: str, process: subprocess.Popen, timeout: float = 60) -> requests.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read()
        try:
            return requests.get(url, timeout=2)
        except requests.ConnectionError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout} s")
