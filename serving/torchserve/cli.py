"""`python -m serving` [start|stop|config]: TorchServe on loopback with every archive of the model store (or
--models a,b), ready when each model has answered a real prediction.

Workers, batching and threads are decided here, for the machine that serves (handlers/policy.py):
one batching worker per GPU; on a CPU, a worker per core (at most 4), no batching, cores / workers threads.
Token authorisation: --token-auth, or TorchServe's own switch (disable_token_authorization=false in the
config file, TS_DISABLE_TOKEN_AUTHORIZATION=false in the environment); the keys are in RUN_DIR/key_file.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from contract.cli import run_command
from handlers.policy import ServingPolicy, machine_policy, this_machine, with_overrides
from serving.processes import serve_until_stopped, start_until_ready
from serving.torchserve import config as ts
from serving.torchserve import server
from serving.torchserve.config import ServingError
from serving.torchserve.logs import exit_reason


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m serving", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", nargs="?", choices=("start", "stop", "config"), default="start",
                        help="start (default), stop a detached server, or config: write the config.properties "
                             "with this machine's serving policy to --out and print the policy")
    parser.add_argument("--out", type=Path, default=None, help="where `config` writes config.properties")
    parser.add_argument("--model-store", type=Path, default=ts.DEFAULT_MODEL_STORE)
    parser.add_argument("--models", default=None, type=lambda text: [n.strip() for n in text.split(",") if n.strip()],
                        help="comma-separated model names (NAME.mar in the store; default: every archive there)")
    parser.add_argument("--inference-port", type=int, default=ts.INFERENCE_PORT)
    parser.add_argument("--management-port", type=int, default=ts.MANAGEMENT_PORT)
    parser.add_argument("--metrics-port", type=int, default=ts.METRICS_PORT)
    parser.add_argument("--grpc-inference-port", type=int, default=ts.GRPC_INFERENCE_PORT)
    parser.add_argument("--grpc-management-port", type=int, default=ts.GRPC_MANAGEMENT_PORT)
    parser.add_argument("--run-dir", type=Path, default=ts.DEFAULT_RUN_DIR,
                        help=f"logs, pid files and key_file.json (default: {ts.DEFAULT_RUN_DIR})")
    parser.add_argument("--config", type=Path, default=ts.DEFAULT_CONFIG)
    parser.add_argument("--timeout", type=float, default=ts.READY_TIMEOUT_S)
    parser.add_argument("--detach", action="store_true", help="leave the server running and return")
    parser.add_argument("--token-auth", action="store_true",
                        help="switch on TorchServe's token authorisation: clients send 'Authorization: Bearer KEY' "
                             "with the keys TorchServe writes to RUN_DIR/key_file.json")
    policy = parser.add_argument_group("serving policy (default: decided for this machine; pinned archive values win)")
    policy.add_argument("--workers", type=int, default=None, help="workers (default: 1 per GPU, else 1 per core up to 4)")
    policy.add_argument("--batch-size", type=int, default=None, help="TorchServe batchSize (default: 8 on GPU, 1 on CPU)")
    policy.add_argument("--max-batch-delay", type=int, default=None, help="maxBatchDelay in ms (default: 50 on GPU)")
    policy.add_argument("--threads", type=int, default=None, help="CPU threads per worker (default: cores / workers)")
    return parser.parse_args(argv)


def decide_policy(args) -> ServingPolicy:
    for flag in ("workers", "batch_size", "threads"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ServingError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if args.max_batch_delay is not None and args.max_batch_delay < 0:
        raise ServingError(f"--max-batch-delay must be 0 or more, got {args.max_batch_delay}")
    gpus, cores = this_machine()
    return with_overrides(machine_policy(gpus, cores), args.workers, args.batch_size, args.max_batch_delay,
                          args.threads, cores)


def main(argv) -> int:
    return run_command(lambda: serve(parse(argv)), interrupted="interrupted; TorchServe stopped")


def settings_of(args) -> ts.ServerSettings:
    return ts.ServerSettings(
        model_store=args.model_store, inference_port=args.inference_port,
        management_port=args.management_port, metrics_port=args.metrics_port,
        grpc_inference_port=args.grpc_inference_port, grpc_management_port=args.grpc_management_port,
        run_dir=args.run_dir, config=args.config, token_auth=args.token_auth)


def serve(args) -> int:
    settings = settings_of(args)
    if args.action == "stop":
        stopped = server.stop(settings)
        print("TorchServe stopped" if stopped else f"no server running from {args.run_dir.absolute()}")
        return 0
    settings.models = ts.choose_models(args.model_store, args.models)
    settings.model_name = settings.models[0]
    settings.policy = decide_policy(args)
    if args.action == "config":
        return write_config(settings, args.out)
    announcement = (f"TorchServe starting with {', '.join(settings.models)} (logs: {settings.log_dir}; policy: "
          f"{settings.policy.reason}, {settings.policy.threads_per_worker} thread(s) per worker); waiting for a "
          "real prediction from each model ...")
    process, answers = start_until_ready(lambda: server.start(settings),
                                         lambda process: server.wait_until_serving(settings, process,
                                                                                   timeout=args.timeout),
                                         lambda process: server.stop(settings, process), "TorchServe", announcement)
    print_serving(settings, answers)
    if args.detach:
        print("stop with: python -m serving stop" + (f" --run-dir {args.run_dir}" if args.run_dir != ts.DEFAULT_RUN_DIR else ""))
        return 0
    return serve_until_stopped(process, lambda: server.stop(settings, process), "TorchServe",
                               lambda: exit_reason(settings.log_dir))


def print_serving(settings: ts.ServerSettings, answers: dict[str, dict]) -> None:
    for name, answer in answers.items():
        top = answer["predictions"][0]
        print(f"serving {name} ({answer['artifact']}) at {settings.predictions_url(name)}\n"
              f"  example prediction: {top['label']} ({top['probability']:.3f})\n"
              f"  try: {server.curl_line(settings, name)}", flush=True)
    if settings.token_auth:
        print(f"token authorisation on: keys (inference, management) in {settings.key_file}; anonymous requests "
              "are refused", flush=True)
    print(f"metrics: {settings.metrics_url}/metrics", flush=True)


def write_config(settings: ts.ServerSettings, out: Path | None) -> int:
    """For launchers that start TorchServe themselves (the container's entrypoint)."""
    if out is None:
        raise ServingError("`python -m serving config` needs --out PATH for the config.properties it writes")
    from export.atomic import atomic_write_text
    atomic_write_text(out, ts.run_config_text(settings, settings.policy))
    print(f"{out}: {', '.join(settings.served_models())}; {settings.policy.reason}; "
          f"{settings.policy.threads_per_worker} thread(s) per worker")
    return 0
