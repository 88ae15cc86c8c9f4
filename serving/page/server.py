"""The try-it page: page.html (static, no framework) and what it asks for, served by a small HTTP server beside the
engine. The page's calls are the engine's own documented API (TorchServe's and Ray's /predictions/NAME with the image
as the body, KServe's v1 JSON), sent to this server and forwarded unchanged to the engine. Nothing else is forwarded.
Serving never needs it: `--page-port 0` leaves it out.

Token authorisation: this server holds no key and adds none. The page asks its user for the inference key and
sends it as the engine's clients do (`Authorization: Bearer KEY`), which is passed on unchanged; a call without it
is refused here with 401. Otherwise anyone who reaches the page would be served with the key of whoever started it.
What it reads is bounded as every server of ours is (serving/bounds.py)."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import urlsplit

import requests

from handlers.request_error import RequestError
from serving.bounds import BoundedHandler, BoundedHTTPServer, read_body
from serving.page import DEFAULT_HOST, DEFAULT_PORT

logger = logging.getLogger("serving.page")

PAGE = Path(__file__).with_name("page.html")
FORWARD_TIMEOUT_S = 300  # a 12 MP photo on a busy CPU
AUTHORIZATION = "Authorization"
FORWARDED_REQUEST_HEADERS = ("Content-Type", "Accept", AUTHORIZATION)  # and every X- header (the request id, options)
NO_KEY = ("token authorisation is on: send your inference key as 'Authorization: Bearer KEY' (the page's key "
          "field); it is in key_file.json of the engine's run folder")
FORWARDED_ANSWER_HEADERS = ("Content-Type", "X-Model-Version", "X-Request-ID")
V1 = "v1"  # KServe's v1 protocol: JSON with the image as base64
RAW = "raw"  # TorchServe's and Ray's: the image as the body, options as X- headers


@dataclass
class PageTarget:
    """What the page tries: the engine, its protocol, each model's prediction URL and task, and whether the engine
    checks tokens (then each caller brings its own key)."""

    engine: str
    protocol: str  # V1 | RAW
    urls: dict[str, str]  # model -> the URL curl calls
    tasks: dict[str, str]  # model -> classification | detection | segmentation
    token_auth: bool = False

    def paths(self) -> dict[str, str]:
        """URL path -> the URL it is forwarded to (the page calls the same paths on this server)."""
        return {_path(url): url for url in self.urls.values()}

    def config(self) -> dict:
        return {
            "engine": self.engine,
            "protocol": self.protocol,
            "token_auth": self.token_auth,
            "models": {
                name: {"path": _path(url), "task": self.tasks.get(name, "classification")}
                for name, url in self.urls.items()
            },
        }


def _path(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def handler_for(target: PageTarget) -> type[BaseHTTPRequestHandler]:
    forwarded = target.paths()

    class PageHandler(BoundedHandler):
        server_version = "try-it-page"

        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path in ("/", "/index.html"):
                self._send(200, PAGE.read_bytes(), "text/html; charset=utf-8")
            elif self.path == "/config.json":
                self._send(200, json.dumps(target.config()).encode(), "application/json")
            else:
                self._not_here()

        def do_POST(self):  # noqa: N802
            url = forwarded.get(self.path)
            if url is None:
                return self._not_here()
            if target.token_auth and not self.headers.get(AUTHORIZATION, "").startswith("Bearer "):
                self.refused_unread()
                return self._send(401, _error(NO_KEY), "application/json", {"WWW-Authenticate": "Bearer"})
            try:
                body = read_body(self)
            except RequestError as error:
                return self._send(error.code, _error(error.message), "application/json")
            headers = {
                k: v for k, v in self.headers.items() if k in FORWARDED_REQUEST_HEADERS or k.lower().startswith("x-")
            }
            try:
                answer = requests.post(url, data=body, headers=headers, timeout=FORWARD_TIMEOUT_S)
            except (requests.RequestException, OSError) as error:  # the engine is down or busy: said in our log
                logger.warning("%s did not answer %s: %s", target.engine, self.path, error)
                return self._send(502, _error(f"{target.engine} did not answer; this page's log says why"),
                                  "application/json")
            kept = {k: answer.headers[k] for k in FORWARDED_ANSWER_HEADERS if k in answer.headers}
            self._send(answer.status_code, answer.content, kept.pop("Content-Type", "application/json"), kept)

        def _not_here(self):
            known = ", ".join(["GET /", "GET /config.json", *(f"POST {p}" for p in forwarded)])
            self._send(404, _error(f"{self.path} is not here; this page serves {known}"), "application/json")

        def _send(self, status: int, body: bytes, content_type: str, headers: dict | None = None):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):  # noqa: A002 - the engine's log says what was served
            return

    return PageHandler


def _error(message: str) -> bytes:
    return json.dumps({"message": message}).encode()


class PageServer:
    """The page's server in a thread of this process: `url` to open, `stop()` when the engine stops."""

    def __init__(self, target: PageTarget, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT):
        self.httpd = BoundedHTTPServer((host, port), handler_for(target))
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self.url = f"http://{shown}:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="try-it-page", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> PageServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def task_of(answer: dict) -> str:
    """The task an engine's answer to the example photo shows (the page draws boxes, masks or bars from it)."""
    return "detection" if "detections" in answer else "segmentation" if "classes" in answer else "classification"


def target_of(engine, answers: dict[str, dict]) -> PageTarget:
    """The page's target for a started engine (serving.engine.Engine) and each model's answer to the example photo:
    KServe's v1 URL where the engine has one, else its /predictions/NAME."""
    urls = {name: engine.urls(name) for name in answers}
    protocol = V1 if all(V1 in u for u in urls.values()) else RAW
    chosen = {name: u[V1] if protocol == V1 else next(iter(u.values())) for name, u in urls.items()}
    return PageTarget(  # an engine whose clients need headers checks tokens: the page's callers bring theirs
        engine.name, protocol, chosen, {name: task_of(a) for name, a in answers.items()},
        token_auth=bool(engine.request_headers()),
    )
