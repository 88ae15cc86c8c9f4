"""`python -m serving.page --url http://127.0.0.1:8080`: the try-it page alone, in front of an engine started some other
way (the container's TorchServe, docker/entrypoint.sh): each archive of the store is offered, its task read from the
archive's manifest. With --token-auth (the engine checks tokens) a call without the caller's own
`Authorization: Bearer KEY` is refused with 401; the page holds no key (serving/page/server.py)."""

from __future__ import annotations

import argparse
import sys
import time
import zipfile
from pathlib import Path

from contract.cli import run_command
from contract.records import MANIFEST_NAME, Manifest
from serving.page import DEFAULT_HOST, DEFAULT_PORT
from serving.page.server import RAW, V1, PageServer, PageTarget
from serving.settings import DEFAULT_MODEL_STORE, choose_models


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m serving.page", description=__doc__)
    parser.add_argument("--url", required=True, help="the engine's inference address, e.g. http://127.0.0.1:8080")
    parser.add_argument(
        "--protocol",
        choices=(RAW, V1),
        default=RAW,
        help="raw: POST /predictions/NAME (TorchServe, Ray); v1: KServe's /v1/models/NAME:predict",
    )
    parser.add_argument("--model-store", type=Path, default=DEFAULT_MODEL_STORE)
    parser.add_argument(
        "--token-auth",
        action="store_true",
        help="the engine checks tokens: each caller sends its own inference key (the page has a field for it)",
    )
    parser.add_argument("--page-host", default=DEFAULT_HOST)
    parser.add_argument("--page-port", type=int, default=DEFAULT_PORT)
    return parser


def target_from(args: argparse.Namespace) -> PageTarget:
    names = choose_models(args.model_store, None)
    base = args.url.rstrip("/")
    urls = {n: f"{base}/v1/models/{n}:predict" if args.protocol == V1 else f"{base}/predictions/{n}" for n in names}
    tasks = {n: task_in(args.model_store / f"{n}.mar") for n in names}
    return PageTarget(
        "kserve" if args.protocol == V1 else "torchserve",
        args.protocol,
        urls,
        tasks,
        token_auth=args.token_auth,
    )


def task_in(archive: Path) -> str:
    with zipfile.ZipFile(archive) as opened:
        return Manifest.from_json(opened.read(MANIFEST_NAME).decode(), f"{archive}:{MANIFEST_NAME}").task


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def serve() -> int:
        with PageServer(target_from(args), args.page_host, args.page_port) as page:
            print(f"try it in a browser: {page.url} (in front of {args.url})", flush=True)
            while page.thread.is_alive():
                time.sleep(1)
        return 0

    return run_command(serve, interrupted="try-it page stopped")


if __name__ == "__main__":
    sys.exit(main())
