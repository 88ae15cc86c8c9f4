"""What our own servers read from a client is bounded (serving/bounds.py): the try-it page's and the signals
server's real handlers on real loopback sockets, and Ray's ingress reading a real Starlette request. A declared
size over the limit is answered before its body is sent; a chunked body is cut at the limit; a silent client is
dropped; a crowd past the connection cap gets 503 at once while a slot frees for the next caller. The page under
token authorisation refuses an anonymous caller itself and holds no key (tests/e2e/test_security.py: with a real
TorchServe)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import requests

from contract.policy import MAX_BODY_BYTES
from handlers.request_error import RequestError
from serving.bounds import MAX_CONNECTIONS, BoundedHTTPServer, bounded_body
from serving.page.server import NO_KEY, RAW, PageServer, PageTarget, handler_for
from serving.signals import REASON_CHARS, serve_signals

MODEL_PATH = "/predictions/resnet18"
ENGINE_URL = "http://127.0.0.1:9/predictions/resnet18"  # never reached: every request here is refused first


def target(token_auth: bool = False) -> PageTarget:
    return PageTarget("torchserve", RAW, {"resnet18": ENGINE_URL}, {"resnet18": "classification"}, token_auth)


@pytest.fixture
def page():
    with PageServer(target(), port=0) as server:
        yield server.httpd.server_address[1]


def exchange(port: int, head: bytes, body_parts=(), timeout: float = 10) -> tuple[int, dict, int]:
    """Send head (and body parts while the server reads them) on a raw socket: (status, JSON body, bytes sent)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(head)
        sent = 0
        for part in body_parts:
            try:
                connection.sendall(part)
            except OSError:  # the server answered and closed: what it said is read below
                break
            sent += len(part)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, json.loads(answer.split(b"\r\n\r\n", 1)[1] or b"{}"), sent


def post_head(headers: str) -> bytes:
    return f"POST {MODEL_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n{headers}\r\n".encode()


@pytest.mark.parametrize("length", ["-1", "a lot", None])
def test_a_missing_or_negative_length_is_answered_411_before_any_body(page, length):
    header = "" if length is None else f"Content-Length: {length}\r\n"
    status, body, _ = exchange(page, post_head(header))
    assert status == 411 and "Content-Length" in body["message"], body


def test_an_oversized_length_is_answered_413_without_reading_the_body(page):
    # the head alone: an answer arriving means the server never waited for the 9 MiB it was promised
    status, body, _ = exchange(page, post_head(f"Content-Length: {MAX_BODY_BYTES + 1}\r\n"), timeout=5)
    assert status == 413 and f"{MAX_BODY_BYTES >> 20} MiB" in body["message"], body


def test_a_chunked_body_is_cut_at_the_limit(page):
    chunk = b"x" * 2**20
    parts = (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(64))  # 64 MiB offered
    status, body, sent = exchange(page, post_head("Transfer-Encoding: chunked\r\n"), parts)
    assert status == 413 and "MiB" in body["message"], body
    assert sent < 4 * MAX_BODY_BYTES  # the client was stopped near the limit, not after its 64 MiB


def test_a_silent_sender_is_dropped_after_the_read_timeout():
    server = BoundedHTTPServer(("127.0.0.1", 0), handler_for(target()), read_timeout=1)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        status, body, _ = exchange(server.server_address[1], post_head("Content-Length: 1000\r\n") + b"only this")
        assert status == 408 and "stopped sending" in body["message"], body
        assert time.monotonic() - started < 10
        with socket.create_connection(server.server_address, timeout=10) as idle:  # not even a request line
            assert idle.recv(100) == b""  # closed by the server after its timeout
    finally:
        server.shutdown()
        server.server_close()


def first_answer(url: str, status: int, within_s: float = 10) -> requests.Response:
    """The first GET answered with status within the time (the server accepts connections in its own time)."""
    deadline = time.monotonic() + within_s
    while True:
        answer = requests.get(url, timeout=10)
        if answer.status_code == status or time.monotonic() > deadline:
            assert answer.status_code == status, answer.text
            return answer
        time.sleep(0.1)


def test_connections_past_the_cap_get_503_and_a_freed_slot_serves_again():
    server = BoundedHTTPServer(("127.0.0.1", 0), handler_for(target()), max_connections=2)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/config.json"
    try:
        held = [socket.create_connection(server.server_address, timeout=10) for _ in range(2)]
        crowded = first_answer(url, 503)  # once both are accepted and holding their threads
        assert "try again" in crowded.json()["message"]
        held.pop().close()
        assert first_answer(url, 200).json()["engine"] == "torchserve"
        for connection in held:
            connection.close()
    finally:
        server.shutdown()
        server.server_close()


def test_the_page_under_token_auth_refuses_an_anonymous_caller_and_says_how():
    with PageServer(target(token_auth=True), port=0) as page:
        anonymous = requests.post(page.url.rstrip("/") + MODEL_PATH, data=b"\xff\xd8 a photo", timeout=10)
        assert anonymous.status_code == 401 and anonymous.json()["message"] == NO_KEY
        assert "Authorization: Bearer" in NO_KEY and anonymous.headers["WWW-Authenticate"] == "Bearer"
        assert requests.get(page.url + "config.json", timeout=10).json()["token_auth"] is True
        assert 'id="key"' in requests.get(page.url, timeout=10).text  # the page asks its user for the key


def test_the_page_without_token_auth_forwards_and_says_the_engine_did_not_answer(page):
    answer = requests.post(f"http://127.0.0.1:{page}{MODEL_PATH}", data=b"\xff\xd8", timeout=30)
    assert answer.status_code == 502
    assert answer.json()["message"] == "torchserve did not answer; this page's log says why"


def test_the_signals_server_is_bounded_too():
    server = serve_signals("127.0.0.1", 0, lambda: [])
    url = f"http://127.0.0.1:{server.server_address[1]}/health/ready"
    try:
        held = [socket.create_connection(server.server_address, timeout=10) for _ in range(MAX_CONNECTIONS)]
        first_answer(url, 503)
        for connection in held:
            connection.close()
        assert first_answer(url, 200).json() == {"ready": True}
    finally:
        server.shutdown()
        server.server_close()


def test_readiness_answers_each_reasons_first_line_only():
    traceback = "resnet18: deployment RayDeployment DEPLOY_FAILED\nTraceback (most recent call last):\n  File /srv/x.py"
    server = serve_signals("127.0.0.1", 0, lambda: [traceback, "resnet50: " + "x" * 500])
    try:
        answer = requests.get(f"http://127.0.0.1:{server.server_address[1]}/health/ready", timeout=10)
    finally:
        server.shutdown()
        server.server_close()
    why = answer.json()["why"]
    assert answer.status_code == 503 and why[0] == "resnet18: deployment RayDeployment DEPLOY_FAILED"
    assert why[1].startswith("resnet50: xxx") and len(why[1]) <= REASON_CHARS and "Traceback" not in answer.text


# ---------------------------------------------------------------- Ray's ingress: a real Starlette request
def starlette_request(headers: dict[str, str], parts: list[bytes]):
    from starlette.requests import Request
    messages = [{"type": "http.request", "body": part, "more_body": i < len(parts) - 1} for i, part in
                enumerate(parts)]
    received = []

    async def receive():
        received.append(messages[len(received)])
        return received[-1]
    scope = {"type": "http", "method": "POST", "path": MODEL_PATH, "query_string": b"",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    return Request(scope, receive), received


def test_rays_ingress_refuses_an_oversized_body_before_reading_it():
    from serving.ray.deployment import image_request
    request, received = starlette_request({"content-length": str(MAX_BODY_BYTES + 1)}, [b"x"])
    with pytest.raises(RequestError) as refused:
        asyncio.run(image_request(request))
    assert refused.value.code == 413 and not received


def test_rays_ingress_cuts_a_chunked_body_at_the_limit_and_reads_a_form_within_it():
    from serving.ray.deployment import image_request
    chunk = b"x" * 2**20
    request, received = starlette_request({}, [chunk] * 64)
    with pytest.raises(RequestError) as refused:
        asyncio.run(image_request(request))
    assert refused.value.code == 413 and len(received) == MAX_BODY_BYTES // len(chunk) + 1
    form = (b"--b\r\nContent-Disposition: form-data; name=\"data\"; filename=\"cat.jpg\"\r\n"
            b"Content-Type: image/jpeg\r\n\r\n\xff\xd8photo\r\n--b--\r\n")
    request, _ = starlette_request({"content-type": "multipart/form-data; boundary=b"}, [form[:20], form[20:]])
    assert asyncio.run(image_request(request)).fields["data"] == b"\xff\xd8photo"


def test_bounded_body_counts_what_arrives():
    async def chunks(sizes):
        for size in sizes:
            yield b"x" * size
    assert asyncio.run(bounded_body(chunks([3, 4]), "7")) == b"x" * 7
    with pytest.raises(RequestError):
        asyncio.run(bounded_body(chunks([MAX_BODY_BYTES, 1]), None))


def test_bounded_body_drops_a_client_that_stops_sending():
    async def stalls():
        yield b"a few bytes"
        await asyncio.sleep(3600)
        yield b"never"
    started = time.monotonic()
    with pytest.raises(RequestError) as stalled:
        asyncio.run(bounded_body(stalls(), "1000", read_timeout=0.2))
    assert stalled.value.code == 408 and time.monotonic() - started < 5


# ---------------------------------------------------------------- KServe's 500: the reason in the log, not the body
def test_a_kserve_500_names_the_request_id_and_no_exception_text(caplog):
    from starlette.requests import Request

    from serving.kserve.app import failure_response
    scope = {"type": "http", "method": "POST", "path": "/v1/models/m:predict", "query_string": b"",
             "headers": [(b"x-request-id", b"req-500")]}
    secret = "worker 4242 could not open /srv/models/m/model.pt"
    answer = asyncio.run(failure_response(Request(scope), OSError(secret)))
    body = json.loads(answer.body)
    assert answer.status_code == 500 and body["request_id"] == "req-500" and "req-500" in body["error"]
    assert secret not in answer.body.decode() and "OSError" not in answer.body.decode()
    assert secret in caplog.text and "req-500" in caplog.text
