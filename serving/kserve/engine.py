"""The KServe engine (`python -m serving --engine kserve`): KServe's protocol (serving/kserve/app.py) with every archive of the
model store, ready when each model has answered a real prediction through KServe's v1 endpoint. The same
archives, artifacts (sha256-checked) and request core as the TorchServe engine; workers, batching and threads
from the same serving policy."""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from contract.policy import ServingPolicy
from serving.auth import TOKEN_HELP, KeysNotWritten, auth_headers, curl_header, key_env, key_notes
from serving.engine import Engine, register
from serving.kserve.config import HTTP_PORT, REFUSAL, KServeSettings
from serving.ports import Port
from serving.settings import EXAMPLE_IMAGE, HOST, PROBE_TIMEOUT_S, PROJECT_ROOT, free_port, policies_text
from serving.signals import metrics_env

if TYPE_CHECKING:
    import requests

    from serving.rollout.switchboard import Switchboard

LOG_TAIL_LINES = 5


@register
class KServe(Engine):
    name = "kserve"
    title = "the KServe server"
    description = ("KServe's v1 and v2 protocol, our request core behind it.\nToken authorisation: --token-auth (or "
                   "TS_DISABLE_TOKEN_AUTHORIZATION=false), keys in RUN_DIR/key_file.json (docs/security.md).")
    settings_type = KServeSettings
    retry_on = (KeysNotWritten,)  # a probe before the key file is there is tried again
    # The server process stops its inference workers itself on SIGTERM, and starts a new one in place of a worker
    # that died while it still runs (serving/kserve/pool.py).
    leader_stops_workers = True
    settings: KServeSettings

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--host", default=HOST, help="address to bind (default: loopback; 0.0.0.0 in a container)")
        parser.add_argument("--inference-port", "--http-port", dest="http_port", type=int, default=HTTP_PORT,
                            help=f"KServe's HTTP port: v1, v2, health and metrics (default {HTTP_PORT})")
        parser.add_argument("--token-auth", action="store_true", help=TOKEN_HELP)

    @classmethod
    def own_settings(cls, args: argparse.Namespace) -> dict:
        return {"host": args.host, "http_port": args.http_port, "token_auth": args.token_auth}

    def launch(self) -> subprocess.Popen:
        """`python -m serving.kserve.worker SETTINGS_FILE`: the settings travel as a file, each model's policy
        resolved."""
        self.settings.log_file.unlink(missing_ok=True)
        keys = key_env(self.settings)  # tokens on or off is settled here, before the run config records it
        config = self.settings.write()
        return self.popen([sys.executable, "-m", "serving.kserve.worker", str(config)], self.settings.log_file,
                          {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), **metrics_env(self.settings.run_dir),
                           **self.settings.extra_env, **keys})

    def ports(self) -> list[Port]:
        """Its one HTTP port (v1, v2, health and metrics); its gRPC server is off."""
        return [Port("--inference-port", self.settings.host, self.settings.http_port)]

    def probe(self, model: str, image: Path) -> tuple[str, Callable[[], requests.Response]]:
        import requests
        url, (body, content_type) = self.settings.predict_url(model), self.client_body(Path(image).read_bytes())

        def post() -> requests.Response:  # the key file read at each try: the server writes it as it starts
            return requests.post(url, data=body, timeout=PROBE_TIMEOUT_S,
                                 headers={"Content-Type": content_type, **self.request_headers()})
        return url, post

    def client_body(self, image: bytes) -> tuple[bytes, str]:
        return json.dumps(v1_instances(image)).encode(), "application/json"

    def answer_of(self, response: requests.Response) -> dict:
        return response.json()["predictions"][0]

    def log_files(self) -> list[Path]:
        return [self.settings.log_file]

    def exit_reason(self) -> str:
        """The worker's refusal when it logged one, else the end of the log."""
        log_file = self.settings.log_file
        text = log_file.read_text(errors="replace") if log_file.exists() else ""
        refusals = [line.split(REFUSAL, 1)[1].strip() for line in text.splitlines() if REFUSAL in line]
        if refusals:
            return refusals[-1]
        return " | ".join(text.strip().splitlines()[-LOG_TAIL_LINES:]) or f"see {log_file}"

    def announcement(self) -> str:
        policies = self.settings.model_policies()
        threads = "/".join(sorted({str(policy.threads_per_worker) for policy in policies.values()}))
        return (f"KServe ModelServer starting with {', '.join(self.settings.models)} (log: {self.settings.log_file}; "
                f"policy: {policies_text(policies)}, {self.settings.server_workers()} worker(s) x {threads} "
                "thread(s)); waiting for a real prediction from each model ...")

    def urls(self, model: str) -> dict[str, str]:
        return {"v1": self.settings.predict_url(model), "v2": self.settings.infer_url(model)}

    @classmethod
    def on_free_ports(cls, model_store: Path, run_dir: Path, models: Sequence[str] = (),
                      policy: ServingPolicy | None = None) -> KServeSettings:
        return KServeSettings(model_store, tuple(models), run_dir=run_dir, policy=policy, http_port=free_port())

    def switchboard(self) -> Switchboard:
        from serving.kserve.switchboard import KServeSwitchboard
        return KServeSwitchboard(self.settings.run_dir)

    def curl_line(self, model: str, image: Path = EXAMPLE_IMAGE) -> str:
        return (f'echo "{{\\"instances\\": [{{\\"image\\": {{\\"b64\\": \\"$(base64 -w0 {image})\\"}}}}]}}" | '
                f'curl -sS -X POST {self.settings.predict_url(model)} -H "Content-Type: application/json"'
                f"{curl_header(self.settings)} --data-binary @-")

    def metrics_url(self) -> str:
        return f"{self.settings.url}/metrics"

    def request_headers(self) -> dict:
        return auth_headers(self.settings)

    def notes(self) -> list[str]:
        return key_notes(self.settings)


def v1_body(image: Path) -> dict:
    """KServe's v1 request for one image file: {"instances": [{"image": {"b64": ...}}]}."""
    return v1_instances(Path(image).read_bytes())


def v1_instances(image: bytes) -> dict:
    return {"instances": [{"image": {"b64": base64.b64encode(image).decode()}}]}
