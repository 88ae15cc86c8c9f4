"""The Ray engine (`python -m serving --engine ray`): Ray Serve with every archive of the model store, one
application each at /predictions/NAME, ready when each model has answered a real prediction. It starts a Ray
head node of its own (its processes ended by stop) or joins a running cluster with --address. The same
archives, artifacts (sha256-checked when a replica loads one), request core, answers and 4xx as the TorchServe
engine; replicas, their CPUs and threads, max_ongoing_requests and autoscaling from the same serving policy
(serving/ray/config.py deployment_options). Ray is an optional extra: `pip install '.[ray]'`."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from contract.policy import ServingPolicy
from serving.auth import TOKEN_HELP, KeysNotWritten, auth_headers, curl_header, key_env, key_notes
from serving.engine import Engine, register
from serving.ports import Port
from serving.ray.cluster import RAY_TOKEN_FILE, cluster_auth_env
from serving.ray.config import HTTP_PORT, REFUSAL, SIGNALS_PORT, RaySettings, deployment_options
from serving.settings import EXAMPLE_IMAGE, HOST, PROBE_TIMEOUT_S, PROJECT_ROOT, ServingError, free_port, policies_text

if TYPE_CHECKING:
    import requests

    from serving.rollout.switchboard import Switchboard

LOG_TAIL_LINES = 5
INSTALL = "pip install '.[ray]' (Ray Serve, an optional extra)"


@register
class RayServe(Engine):
    name = "ray"
    title = "the Ray Serve server"
    description = ("Ray Serve, our request core as one application per archive; a Ray head node of its own, or a "
                   "running cluster (--address).\nIts HTTP proxy binds --host (loopback by default). --token-auth: "
                   "keys in RUN_DIR/key_file.json, and Ray's own token authentication (docs/security.md).")
    settings_type = RaySettings
    retry_on = (KeysNotWritten,)  # a probe before the key file is there is tried again
    extra_actions = {"serve-config": "write the Serve config (serve deploy, a RayService's serveConfigV2) of the "
                                     "store's archives with this machine's serving policy to --out"}
    # The server process removes its applications and ends its Ray node on SIGTERM; signalled beside it, the
    # node's processes would die while Serve still talks to them.
    leader_stops_workers = True
    settings: RaySettings

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--host", default=HOST, help="address Serve's HTTP proxy binds (default: loopback)")
        parser.add_argument("--inference-port", "--http-port", dest="http_port", type=int, default=HTTP_PORT,
                            help=f"Serve's HTTP port (default {HTTP_PORT})")
        parser.add_argument("--signals-port", type=int, default=SIGNALS_PORT,
                            help="our metrics (GET /metrics) and health (/health/live, /health/ready)")
        parser.add_argument("--address", default=None, help="a running Ray cluster's GCS address HOST:PORT to "
                            "deploy on (default: start a head node of our own, ended by stop); where Serve runs "
                            "there already, --http-port must be its proxy's port (Serve keeps its first options)")
        parser.add_argument("--token-auth", action="store_true", help=TOKEN_HELP + "; the cluster runs in Ray's "
                            "token mode (its token in RUN_DIR/ray-auth-token, or the running cluster's)")
        parser.add_argument("--out", type=Path, default=None, help="where `serve-config` writes the Serve config")
        parser.add_argument("--cluster-model-store", type=Path, default=None, help="the archives' folder on the "
                            "cluster's nodes, for `serve-config` (default: --model-store's absolute path)")

    @classmethod
    def own_settings(cls, args: argparse.Namespace) -> dict:
        return {"host": args.host, "http_port": args.http_port, "address": args.address,
                "signals_port": args.signals_port, "token_auth": args.token_auth}

    def run_extra_action(self, action: str, args: argparse.Namespace) -> int:
        """serve-config: for clusters that deploy with Ray's own tools (serve deploy, KubeRay)."""
        if action != "serve-config":
            return super().run_extra_action(action, args)
        if args.out is None:
            raise ServingError("serve-config needs --out PATH for the Serve config it writes")
        if importlib.util.find_spec("ray") is None:
            raise ServingError(f"Ray is not installed in {sys.prefix} (its schema validates the config): {INSTALL}")
        from serving.ray import serve_config
        policies = self.settings.model_policies()
        serve_config.write(args.out, serve_config.serve_config(self.settings.model_store, policies,
                                                               args.cluster_model_store))
        print(f"{args.out}: {', '.join(self.settings.models)}; {policies_text(policies)}")
        return 0

    def launch(self) -> subprocess.Popen:
        """`python -m serving.ray.server SETTINGS_FILE`: the settings travel as a file, each model's policy
        resolved."""
        if importlib.util.find_spec("ray") is None:
            raise ServingError(f"Ray is not installed in {sys.prefix}: {INSTALL}")
        self.settings.log_file.unlink(missing_ok=True)
        keys = key_env(self.settings)  # tokens on or off is settled here, before the run config records it
        if keys:
            keys.update(cluster_auth_env(self.settings.run_dir, joining=self.settings.address is not None))
        config = self.settings.write()
        return self.popen([sys.executable, "-m", "serving.ray.server", str(config)], self.settings.log_file,
                          {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "RAY_USAGE_STATS_ENABLED": "0",
                           **self.settings.extra_env, **keys})

    def ports(self) -> list[Port]:
        """Our signals server's (the server process binds it here); with a head node of our own, Serve's HTTP
        proxy's too. On a running cluster (--address) the proxy may hold its port already: Serve keeps it."""
        settings = self.settings
        signals = Port("--signals-port", settings.host, settings.signals_port)
        return [signals] if settings.address else [Port("--inference-port", settings.host, settings.http_port), signals]

    def probe(self, model: str, image: Path) -> tuple[str, Callable[[], requests.Response]]:
        import requests
        url, body = self.settings.predictions_url(model), Path(image).read_bytes()
        return url, lambda: requests.post(url, data=body, timeout=PROBE_TIMEOUT_S, headers=self.request_headers())

    def log_text(self) -> str:
        log_file = self.settings.log_file
        return log_file.read_text(errors="replace") if log_file.exists() else ""

    def load_failure(self) -> str | None:
        """The server's refusal (an application Serve could not deploy, a node that did not start), if logged."""
        refusals = [line.split(REFUSAL, 1)[1].strip() for line in self.log_text().splitlines() if REFUSAL in line]
        return refusals[-1] if refusals else None

    def log_files(self) -> list[Path]:
        return [self.settings.log_file]

    def exit_reason(self) -> str:
        """The server's refusal when it logged one, else the end of its log."""
        return self.load_failure() or (" | ".join(self.log_text().strip().splitlines()[-LOG_TAIL_LINES:])
                                       or f"see {self.settings.log_file}")

    def announcement(self) -> str:
        policies = self.settings.model_policies()
        where = f"the cluster at {self.settings.address}" if self.settings.address else "a Ray head node of its own"
        replicas = ", ".join(sorted({replicas_said(policy) for policy in policies.values()}))
        return (f"Ray Serve starting on {where} with {', '.join(self.settings.models)} (log: {self.settings.log_file};"
                f" policy: {policies_text(policies)}, {replicas}); waiting for a real prediction from each model ...")

    def notes(self) -> list[str]:
        address = self.settings.address_file
        if self.settings.address or not address.is_file():
            return key_notes(self.settings)
        port = address.read_text().rsplit(":", 1)[1]
        token = (f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={self.settings.run_dir.absolute() / RAY_TOKEN_FILE} "
                 if self.settings.token_auth else "")
        return [*key_notes(self.settings), f"Ray head node: {address.read_text()}; another node joins with `{token}"
                f"ray start --address ADDRESS:{port}`, ADDRESS this machine's address as that node reaches it "
                "(docs/scaling.md)"]

    def request_headers(self) -> dict:
        return auth_headers(self.settings)

    def metrics_url(self) -> str:
        """Ours (serving/ray/signals.py), of the replicas on this machine."""
        return f"{self.settings.signals_url}/metrics"

    def urls(self, model: str) -> dict[str, str]:
        return {"predictions": self.settings.predictions_url(model)}

    @classmethod
    def on_free_ports(cls, model_store: Path, run_dir: Path, models: Sequence[str] = (),
                      policy: ServingPolicy | None = None) -> RaySettings:
        return RaySettings(model_store, tuple(models), run_dir=run_dir, policy=policy, http_port=free_port(),
                           signals_port=free_port())

    def switchboard(self) -> Switchboard:
        from serving.ray.switchboard import RaySwitchboard
        return RaySwitchboard(self.settings.run_dir)

    def curl_line(self, model: str, image: Path = EXAMPLE_IMAGE) -> str:
        return (f"curl -sS -X POST {self.settings.predictions_url(model)} -H 'Content-Type: image/jpeg'"
                f"{curl_header(self.settings)} --data-binary @{image}")


def replicas_said(policy) -> str:
    scaling = deployment_options(policy)["autoscaling_config"]
    return f"{scaling['min_replicas']}-{scaling['max_replicas']} replica(s) x {policy.threads_per_worker} CPU(s)"
