"""What every engine shares to expose its signals (docs/observability.md): the folder its processes write their
metrics to (handlers/metrics.py's multiprocess mode), and a small HTTP server for engines whose own server cannot
carry them (TorchServe's metrics API has no histograms of ours): GET /metrics, /health/live, /health/ready.

    python -m serving.signals --port 8083 --management http://127.0.0.1:8081 --models resnet50
        TorchServe's signals beside it: ready when every model has a READY worker whose process is alive
        (TorchServe's own describe keeps a dead worker READY until it notices); with --watch PID it ends when
        TorchServe's launcher does; with --access-log FILE it records each prediction's time at the frontend
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qsl, urlsplit

from handlers import metrics
from serving.auth import UNAUTHORISED, VERSION_ROUTES, management_refusal
from serving.bounds import BoundedHandler, BoundedHTTPServer
from serving.front import FrontFollower
from serving.processes import alive

logger = logging.getLogger("serving.signals")

METRICS_DIR = "metrics"  # in the run dir: each process's metric files
LIVE, READY, METRICS = "/health/live", "/health/ready", "/metrics"
MANAGEMENT_TIMEOUT_S = 5
REASON_CHARS = 160  # of a readiness reason in the answer (an engine's may carry a replica's traceback)
WATCH_S = 1.0  # how often --watch looks whether the server it serves beside is still there
Readiness = Callable[[], list[str]]  # why the server is not ready ([]: ready)


class VersionRoutes(Protocol):
    """A server process's version routes (serving/rollout/switchboard.py's RoutedSwitchboard drives them), where
    the signals server carries them (Ray's)."""

    def answer(self, method: str, path: str, query: dict[str, str]) -> tuple[int, dict]: ...


def metrics_env(run_dir: Path, environ: dict | None = None) -> dict[str, str]:
    """The environment a server's processes need to write their metrics to one folder: a fresh RUN_DIR/metrics,
    or the folder the caller's environment names already."""
    environ = os.environ if environ is None else environ
    if environ.get(metrics.MULTIPROC_ENV):
        return {metrics.MULTIPROC_ENV: environ[metrics.MULTIPROC_ENV]}
    return {metrics.MULTIPROC_ENV: str(metrics.fresh_multiprocess_dir(Path(run_dir).absolute() / METRICS_DIR))}


def handler_class(readiness: Readiness, folder: Path | None,
                  versions: VersionRoutes | None = None) -> type[BaseHTTPRequestHandler]:
    class Signals(BoundedHandler):  # reads no body; a silent or crowding client is bounded all the same
        def do_GET(self):  # noqa: N802 (http.server's name)
            path = self.path.split("?")[0]
            if versions is not None and path.startswith(f"{VERSION_ROUTES}/"):
                self.version_route()
            elif path == METRICS:
                self.answer(200, metrics.exposition(folder), metrics.CONTENT_TYPE)
            elif path == LIVE:
                self.answer_json(200, {"live": True})
            elif path == READY:
                missing = readiness()
                if missing:  # the answer is anonymous: each reason's first line; whole (a traceback) in our log
                    logger.info("not ready: %s", "; ".join(missing))
                self.answer_json(503 if missing else 200,
                                 {"ready": not missing, **({"why": list(map(headline, missing))} if missing else {})})
            else:
                self.answer_json(404, {"code": 404, "error": f"no route {path}: {METRICS}, {LIVE}, {READY}"})

        def version_route(self) -> None:
            """A version route, for the management key's holder (or a loopback caller without tokens); the
            request's body, if any, is not read (the routes take none)."""
            if self.headers.get("Content-Length", "0") not in ("", "0"):
                self.refused_unread()
            url = urlsplit(self.path)
            if versions is None or not url.path.startswith(f"{VERSION_ROUTES}/"):
                self.answer_json(405, {"code": 405, "detail": f"{self.command} {url.path}: only GET here"})
                return
            refused = management_refusal(self.headers.get("Authorization"), self.client_address[0])
            if refused is not None:
                self.answer_json(refused[0], {"code": refused[0], "detail": refused[1]})
                return
            status, body = versions.answer(self.command, url.path, dict(parse_qsl(url.query)))
            if status != 200:
                logger.info("%s %s answered %d: %s", self.command, url.path, status, body.get("detail"))
            self.answer_json(status, body)

        do_POST = do_PUT = do_DELETE = version_route  # noqa: N815 (http.server's names)

        def answer_json(self, code: int, body: dict) -> None:
            self.answer(code, json.dumps(body).encode(), "application/json")

        def answer(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if code == UNAUTHORISED:
                self.send_header("WWW-Authenticate", "Bearer")  # the scheme a caller must use (RFC 6750)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):  # noqa: A002 (http.server's name): scrapes are not logged
            pass

    return Signals


def headline(reason: str) -> str:
    """A readiness reason as an anonymous caller reads it: its first line, at most REASON_CHARS."""
    line = reason.strip().splitlines()[0] if reason.strip() else ""
    return line if len(line) <= REASON_CHARS else line[:REASON_CHARS - 3] + "..."


def serve_signals(host: str, port: int, readiness: Readiness, folder: Path | None = None,
                  versions: VersionRoutes | None = None) -> BoundedHTTPServer:
    """The signals server on host:port, answering in a thread of its own; its metrics from `folder` (default: this
    process's multiprocess folder); with versions, their routes too."""
    server = BoundedHTTPServer((host, port), handler_class(readiness, folder, versions))
    threading.Thread(target=server.serve_forever, name="signals", daemon=True).start()
    return server


SCRAPE_INTERVAL_S = 15  # Prometheus' own default; tests scrape every second


def scrape_config(targets: dict[str, str], interval_s: float = SCRAPE_INTERVAL_S) -> str:
    """A Prometheus configuration scraping each engine's metrics address ({job: "http://HOST:PORT/metrics"}):
    what `serving deploy` gives a cluster as annotations, for a Prometheus of one's own."""
    jobs = []
    for job, url in targets.items():
        scheme, rest = url.split("://", 1)
        address, _, path = rest.partition("/")
        jobs.append({"job_name": job, "scheme": scheme, "metrics_path": "/" + path,
                     "static_configs": [{"targets": [address]}]})
    interval = f"{interval_s:g}s"
    return json.dumps({"global": {"scrape_interval": interval, "evaluation_interval": interval},
                       "scrape_configs": jobs}, indent=1)  # JSON is YAML: Prometheus reads it as it is


# ---------------------------------------------------------------- TorchServe's readiness
def torchserve_readiness(management: str, models: list[str], headers: Callable[[], dict] = dict) -> Readiness:
    """Every model has a READY worker whose process is alive (this server runs on the workers' machine)."""
    import requests

    def why_not() -> list[str]:
        missing = []
        for model in models:
            try:
                answer = requests.get(f"{management}/models/{model}", headers=headers(), timeout=MANAGEMENT_TIMEOUT_S)
                workers = answer.json()[0].get("workers", []) if answer.ok else []
            except (requests.RequestException, ValueError, IndexError, KeyError, AttributeError) as error:
                logger.info("%s not ready: TorchServe's management API did not answer: %s", model, error)
                missing.append(f"{model}: TorchServe's management API did not answer")
                continue
            if not any(w.get("status") == "READY" and alive(w.get("pid")) for w in workers):
                # the answer is anonymous: its workers' states, their pids only in our log
                logger.info("%s not ready: workers (pid, status) %s", model,
                            [(w.get("pid"), w.get("status")) for w in workers])
                missing.append(f"{model}: no READY worker alive (workers: "
                               f"{[w.get('status') for w in workers] or 'none'})")
        return missing
    return why_not


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.signals", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True,
                        help="where to serve them (TorchServe's engine passes its --signals-port)")
    parser.add_argument("--management", required=True, help="TorchServe's management address")
    parser.add_argument("--models", nargs="+", required=True)
    parser.add_argument("--key-file", type=Path, default=None, help="TorchServe's key_file.json (token auth on)")
    parser.add_argument("--watch", type=int, default=None, help="exit once the process of this id has exited")
    parser.add_argument("--access-log", type=Path, default=None,
                        help="TorchServe's access log: each prediction's time at its frontend (serving/front.py)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")

    def headers() -> dict:
        if args.key_file is None or not args.key_file.is_file():
            return {}
        return {"Authorization": "Bearer " + json.loads(args.key_file.read_text())["management"]["key"]}

    try:
        server = serve_signals(args.host, args.port, torchserve_readiness(args.management.rstrip("/"), args.models,
                                                                          headers))
    except OSError as error:  # the engine checked the port before it started; something took it since
        logger.error("cannot serve signals on %s:%d: %s", args.host, args.port, error.strerror or error)
        return 1
    logger.info("signals of %s on http://%s:%d (%s, %s, %s)", ", ".join(args.models), args.host, args.port, METRICS,
                LIVE, READY)
    if args.access_log is not None:
        FrontFollower(args.access_log, "torchserve", args.models).start()
    try:
        while args.watch is None or alive(args.watch):
            time.sleep(WATCH_S)
    except KeyboardInterrupt:
        pass
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
