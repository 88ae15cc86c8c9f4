"""`python -m serving --engine kserve` [start|stop]: KServe's own ModelServer with every archive of the model
store (or --models a,b), on loopback, ready when each model has answered a real prediction through KServe's v1
endpoint. The same archives, artifacts (sha256-checked) and request core as the TorchServe engine; workers,
batching and threads from the same serving policy (handlers/policy.py).

KServe's ModelServer has no token authorisation: in a cluster the mesh or ingress guards it (docs/scaling.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from contract.cli import run_command
from serving.kserve import server
from serving.kserve.config import HTTP_PORT, KServeSettings
from serving.processes import serve_until_stopped, start_until_ready
from serving.torchserve import config as ts
from serving.torchserve.cli import decide_policy
from serving.torchserve.config import ServingError


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m serving --engine kserve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", nargs="?", choices=("start", "stop"), default="start")
    parser.add_argument("--model-store", type=Path, default=ts.DEFAULT_MODEL_STORE)
    parser.add_argument("--models", default=None, type=lambda text: [n.strip() for n in text.split(",") if n.strip()],
                        help="comma-separated model names (NAME.mar in the store; default: every archive there)")
    parser.add_argument("--host", default=ts.HOST, help="address to bind (default: loopback; 0.0.0.0 in a container)")
    parser.add_argument("--inference-port", "--http-port", dest="http_port", type=int, default=HTTP_PORT,
                        help=f"KServe's HTTP port: v1, v2, health and metrics (default {HTTP_PORT})")
    parser.add_argument("--run-dir", type=Path, default=ts.DEFAULT_RUN_DIR,
                        help=f"logs, the pid file and the unpacked archives (default: {ts.DEFAULT_RUN_DIR})")
    parser.add_argument("--timeout", type=float, default=ts.READY_TIMEOUT_S)
    parser.add_argument("--detach", action="store_true", help="leave the server running and return")
    parser.add_argument("--token-auth", action="store_true", help=argparse.SUPPRESS)  # refused with the reason
    policy = parser.add_argument_group("serving policy (default: decided for this machine)")
    policy.add_argument("--workers", type=int, default=None, help="KServe worker processes (default: 1 per GPU, "
                        "else 1 per core up to 4)")
    policy.add_argument("--batch-size", type=int, default=None, help="rows per batch (default: 8 on GPU, 1 on CPU)")
    policy.add_argument("--max-batch-delay", type=int, default=None, help="ms a batch waits (default: 50 on GPU)")
    policy.add_argument("--threads", type=int, default=None, help="CPU threads per worker (default: cores / workers)")
    return parser.parse_args(argv)


def main(argv) -> int:
    return run_command(lambda: serve(parse(argv)), interrupted="interrupted; the KServe server stopped")


def serve(args) -> int:
    settings = KServeSettings(model_store=args.model_store, host=args.host, http_port=args.http_port,
                              run_dir=args.run_dir)
    stop_hint = "python -m serving stop --engine kserve" + (
        f" --run-dir {args.run_dir}" if args.run_dir != ts.DEFAULT_RUN_DIR else "")
    if args.action == "stop":
        stopped = server.stop(settings)
        print("KServe server stopped" if stopped else f"no KServe server running from {args.run_dir.absolute()}")
        return 0
    if args.token_auth:
        raise ServingError("--token-auth is TorchServe's: KServe's ModelServer has no token authorisation (in a "
                           "cluster the mesh or ingress guards it, docs/scaling.md); leave it out or use the "
                           "torchserve engine")
    settings.models = ts.choose_models(args.model_store, args.models)
    settings.policy = decide_policy(args)
    announcement = (f"KServe ModelServer starting with {', '.join(settings.models)} (log: {settings.log_file}; policy: "
          f"{settings.policy.reason}, {settings.policy.workers} worker(s) x {settings.policy.threads_per_worker} "
          "thread(s)); waiting for a real prediction from each model ...")
    process, answers = start_until_ready(lambda: server.start(settings),
                                         lambda process: server.wait_until_serving(settings, process,
                                                                                   timeout=args.timeout),
                                         lambda process: server.stop(settings, process), "the KServe server",
                                         announcement)
    print_serving(settings, answers)
    if args.detach:
        print(f"stop with: {stop_hint}")
        return 0
    return serve_until_stopped(process, lambda: server.stop(settings, process), "the KServe server",
                               lambda: server.exit_reason(settings))


def print_serving(settings: KServeSettings, answers: dict[str, dict]) -> None:
    for name, answer in answers.items():
        top = answer["predictions"][0]
        print(f"serving {name} ({answer['artifact']}) at {settings.predict_url(name)} (v1) and "
              f"{settings.infer_url(name)} (v2)\n  example prediction: {top['label']} ({top['probability']:.3f})\n"
              f"  try: {server.curl_line(settings, name)}", flush=True)
    print(f"metrics: {settings.url}/metrics", flush=True)
