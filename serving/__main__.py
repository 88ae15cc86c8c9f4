"""`python -m serving`: start TorchServe on loopback with model-store/resnet.mar and wait for a real prediction.

  python -m serving              serve in the foreground; Ctrl-C stops TorchServe cleanly
  python -m serving --detach     start, wait until a prediction succeeds, print the curl line, return
  python -m serving stop         stop a server started with --detach
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from serving import server


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m serving", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", nargs="?", choices=("start", "stop"), default="start")
    parser.add_argument("--model-store", type=Path, default=Path("model-store"))
    parser.add_argument("--model-name", default="resnet")
    parser.add_argument("--inference-port", type=int, default=8080)
    parser.add_argument("--management-port", type=int, default=8081)
    parser.add_argument("--metrics-port", type=int, default=8082)
    parser.add_argument("--grpc-inference-port", type=int, default=7070)
    parser.add_argument("--grpc-management-port", type=int, default=7071)
    parser.add_argument("--run-dir", type=Path, default=Path(".serving"), help="logs and pid files (default: .serving)")
    parser.add_argument("--config", type=Path, default=server.DEFAULT_CONFIG)
    parser.add_argument("--timeout", type=float, default=server.READY_TIMEOUT_S)
    parser.add_argument("--detach", action="store_true", help="leave the server running and return")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    settings = server.ServerSettings(
        model_store=args.model_store, model_name=args.model_name, inference_port=args.inference_port,
        management_port=args.management_port, metrics_port=args.metrics_port,
        grpc_inference_port=args.grpc_inference_port, grpc_management_port=args.grpc_management_port,
        run_dir=args.run_dir, config=args.config)
    if args.action == "stop":
        stopped = server.stop(settings)
        print("TorchServe stopped" if stopped else f"no server running from {args.run_dir.absolute()}")
        return 0
    try:
        process = server.start(settings)
    except server.ServingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"TorchServe starting (logs: {settings.log_dir}); waiting for a real prediction ...", flush=True)
    try:
        first = server.wait_until_serving(settings, process, timeout=args.timeout)
    except (server.ServingError, KeyboardInterrupt) as error:
        server.stop(settings, process)
        print(f"error: {error or 'interrupted'}; TorchServe stopped", file=sys.stderr)
        return 1
    top = first["predictions"][0]
    print(f"serving {first['model']} ({first['artifact']}) at {settings.predictions_url()}\n"
          f"  example prediction: {top['label']} ({top['probability']:.3f})\n"
          f"  try: {server.curl_line(settings)}\n"
          f"  metrics: {settings.metrics_url}/metrics", flush=True)
    if args.detach:
        print("  stop with: python -m serving stop")
        return 0
    print("Ctrl-C to stop", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        while process.poll() is None:
            time.sleep(0.5)
        print(f"TorchServe exited with code {process.returncode}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        server.stop(settings, process)
        print("\nTorchServe stopped")
        return 0


if __name__ == "__main__":
    sys.exit(main())
