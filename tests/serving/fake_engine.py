"""A third engine, from outside serving/: a small Python HTTP server that answers POST /predictions/NAME with an
answer of the usual shape after a moment of "loading" (FAKE_LOAD_S in the environment), and keeps a worker
process in its group that takes a moment to exit on SIGTERM, as real workers do.
`serving.engine.register(FakeEngine)` offers it (`--engine fake`); `python -m tests.serving.fake_engine ARGS` is
`python -m serving ARGS` with it registered."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from serving.engine import Engine, register
from serving.ports import Port
from serving.settings import EXAMPLE_IMAGE, PROBE_TIMEOUT_S, ServingSettings

SERVER = r"""
import http.server, json, os, signal, subprocess, sys, time
port, models = int(sys.argv[1]), sys.argv[2].split(",")
# a worker in the server's process group, which takes a second to exit on SIGTERM
subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                  "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0)))\n"
                  "while True: time.sleep(1)"])
time.sleep(float(os.environ.get("FAKE_LOAD_S", "0.5")))  # loading: the first probes find nobody listening


class Predictions(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        model = self.path.rsplit("/", 1)[-1]
        image = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, answer = ((200, {"model": model, "artifact": "fake", "predictions": [
            {"label": "tabby", "index": 281, "probability": 0.5}]}) if model in models and image
            else (404, {"code": 404, "error": f"no model {model}, or no image"}))
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("listening", flush=True)
http.server.HTTPServer(("127.0.0.1", port), Predictions).serve_forever()
"""


@dataclass
class FakeSettings(ServingSettings):
    port: int = 0

    def predictions_url(self, model: str) -> str:
        return f"http://{self.host}:{self.port}/predictions/{model}"


class FakeEngine(Engine):
    name = "fake"
    title = "the fake server"
    description = "a test's engine: fixed answers"
    settings_type = FakeSettings
    settings: FakeSettings

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--port", type=int, required=False, default=0)

    @classmethod
    def own_settings(cls, args: argparse.Namespace) -> dict:
        return {"port": args.port}

    @property
    def log_file(self) -> Path:
        return self.settings.log_dir / "fake.log"

    def log_files(self) -> list[Path]:
        return [self.log_file]

    def ports(self) -> list[Port]:
        return [Port("--port", self.settings.host, self.settings.port)]

    def launch(self) -> subprocess.Popen:
        return self.popen([sys.executable, "-c", SERVER, str(self.settings.port), ",".join(self.settings.models)],
                          self.log_file, {**os.environ, **self.settings.extra_env})

    def probe(self, model: str, image: Path):
        import requests
        url, body = self.settings.predictions_url(model), Path(image).read_bytes()
        return url, lambda: requests.post(url, data=body, timeout=PROBE_TIMEOUT_S)

    def exit_reason(self) -> str:
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return " | ".join(text.strip().splitlines()[-3:]) or f"see {self.log_file}"

    def announcement(self) -> str:
        return f"fake server starting with {', '.join(self.settings.models)}"

    def urls(self, model: str) -> dict[str, str]:
        return {"predictions": self.settings.predictions_url(model)}

    def curl_line(self, model: str, image: Path = EXAMPLE_IMAGE) -> str:
        return f"curl -X POST {self.settings.predictions_url(model)} --data-binary @{image}"


if __name__ == "__main__":
    from serving.cli import main
    register(FakeEngine)
    sys.exit(main())
