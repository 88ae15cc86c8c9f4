"""`python -m serving`: every archive of the model store served by one engine, on loopback, ready when each
model has answered a real prediction; and deployment material written from an export.

  python -m serving [start]             serve until Ctrl-C (--engine torchserve, the default)
  python -m serving --detach            start, wait until each model answers, print the curl lines, return
  python -m serving stop                stop every server started from the run dir (--run-dir), whatever its engine
  python -m serving --engine kserve     the same archives under KServe's v1 and v2 protocol
  python -m serving config --out F      TorchServe's config.properties with this machine's serving policy
  python -m serving deploy kserve OUT   KServe material; `deploy triton OUT`: a Triton model repository;
                                        `deploy ray OUT`: a KubeRay RayService
  python -m serving rollout NAME PATH   a new version beside the live one, gated on agreement, then switched;
                                        `rollback NAME`, `versions NAME` (docs/rollout.md)
  python -m serving batch PATH INPUT --out OUT   score a folder or table of photos offline (Ray Data, Parquet)

Measurements (bench, soak, faults, gpu-check, pipeline, decoders) are `python -m measure COMMAND`.
`python -m serving --engine NAME --help` lists that engine's own options; `python -m serving deploy --help`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from contract.cli import moved, run_command
from contract.policy import PolicyChoices, add_policy_options
from serving import engine as engines
from serving.engine import DEFAULT_ENGINE, Engine
from serving.page import DEFAULT_HOST as PAGE_HOST
from serving.page import DEFAULT_PORT as PAGE_PORT
from serving.ports import Port
from serving.processes import LogFollower, serve_until_stopped, sigterm_interrupts, start_until_ready
from serving.settings import DEFAULT_MODEL_STORE, DEFAULT_RUN_DIR, READY_TIMEOUT_S, choose_models

PROG = "python -m serving"
DEPLOY = "deploy"  # a command of its own: python -m serving deploy kserve|triton|ray OUT
VERSION_COMMANDS = ("rollout", "rollback", "versions")  # commands of their own: serving/rollout/command.py
BATCH = "batch"  # offline scoring: python -m serving batch PATH INPUT --out OUT (serving/batch/)
MEASUREMENTS = ("bench", "soak", "faults", "gpu-check", "pipeline", "decoders")
MOVED = {"kserve": f"{PROG} deploy kserve", "triton": f"{PROG} deploy triton",
         **{name: f"python -m measure {name}" for name in MEASUREMENTS}}


def main(argv: list[str] | None = None) -> int:
    """deploy and the moved commands are named by the first word; any other words are the serving command's."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv else None
    if command in MOVED:
        return moved(f"{PROG} {command}", MOVED[command])
    if command == DEPLOY:
        from serving.deploy import deploy
        return run_command(lambda: deploy(argv[1:]))
    if command in VERSION_COMMANDS:
        from serving.rollout.command import main as versions_main
        return run_command(lambda: versions_main(command, argv[1:]))
    if command == BATCH:
        from serving.batch.run import main as batch
        return batch(argv[1:])
    engine_type = engines.get(chosen_engine(argv))
    parser = parser_for(engine_type)
    args = parser.parse_args(argv)
    if args.action == DEPLOY:
        parser.error(f"deploy comes first, without the serving options: {PROG} deploy kserve|triton|ray OUT")
    return run_command(lambda: serve(engine_type, args), interrupted=f"interrupted; {engine_type.title} stopped")


def chosen_engine(argv: list[str]) -> str:
    """--engine's value, read first: the options the command offers are the chosen engine's."""
    parser = argparse.ArgumentParser(prog=PROG, add_help=False)
    parser.add_argument("--engine", choices=engines.names(), default=DEFAULT_ENGINE)
    return parser.parse_known_args(argv)[0].engine


def model_names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def parser_for(engine_type: type[Engine]) -> argparse.ArgumentParser:
    """The shared options, the engine's own, and the serving policy's."""
    description = f"{__doc__}\n--engine {engine_type.name}: {engine_type.description}"
    parser = argparse.ArgumentParser(prog=PROG, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = {"start": "serve (the default)", "stop": "stop every server started from --run-dir",
               **engine_type.extra_actions, DEPLOY: "a command of its own, `python -m serving deploy --help`"}
    parser.add_argument("action", nargs="?", choices=tuple(actions), default="start",
                        help="; ".join(f"{name}: {what}" for name, what in actions.items()))
    parser.add_argument("--engine", choices=engines.names(), default=DEFAULT_ENGINE,
                        help=f"what serves the archives (default: {DEFAULT_ENGINE})")
    parser.add_argument("--model-store", type=Path, default=DEFAULT_MODEL_STORE)
    parser.add_argument("--models", default=None, type=model_names,
                        help="comma-separated model names (NAME.mar in the store; default: every archive there)")
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR,
                        help=f"logs, pid files and what the engine writes for itself (default: {DEFAULT_RUN_DIR})")
    parser.add_argument("--timeout", type=float, default=READY_TIMEOUT_S,
                        help="seconds to wait until every model has answered a real prediction")
    parser.add_argument("--detach", action="store_true", help="leave the server running and return")
    parser.add_argument("--follow-logs", action="store_true",
                        help="in the foreground, copy the server's log lines to stdout as they are written (what a "
                             "container's entrypoint does, so that `docker logs` has them)")
    engine_type.add_arguments(parser.add_argument_group(f"the {engine_type.name} engine's options"))
    add_policy_options(parser)
    page = parser.add_argument_group("the try-it page (a browser page that calls the engine's API; serving/page/)")
    page.add_argument("--page-port", type=int, default=PAGE_PORT,
                      help="its port, while the engine serves in the foreground (default: %(default)s; 0: no page)")
    page.add_argument("--page-host", default=PAGE_HOST,
                      help="the address it listens on (default: %(default)s; 0.0.0.0 in a container)")
    return parser


def serve(engine_type: type[Engine], args: argparse.Namespace) -> int:
    if args.action == "stop":
        return stop_every_engine(args.run_dir)
    settings = engine_type.settings_from(args)
    settings.models = choose_models(args.model_store, args.models)
    settings.flags = PolicyChoices.from_flags(args)
    engine = engine_type(settings)
    if args.action != "start":
        return engine.run_extra_action(args.action, args)
    sigterm_interrupts()  # a stop while models load stops the server too
    page = page_ports(args)  # checked free with the engine's own before anything starts
    process, answers = start_until_ready(lambda: engine.start(page),
                                         lambda process: engine.wait_until_ready(process, timeout=args.timeout),
                                         engine.stop, engine.title, engine.announcement)
    print_serving(engine, answers)
    if args.detach:
        print(f"stop with: {engine.stop_command()}")
        return 0
    follow = LogFollower(engine.log_files()) if args.follow_logs else None
    with try_it_page(engine, answers, args):
        return serve_until_stopped(process, lambda: engine.stop(process), engine.title, engine.exit_reason, follow)


def page_ports(args: argparse.Namespace) -> list[Port]:
    """The try-it page's port where the page will start: in the foreground, --page-port not 0."""
    return [] if args.detach or not args.page_port else [Port("--page-port", args.page_host, args.page_port)]


@contextlib.contextmanager
def try_it_page(engine: Engine, answers: dict[str, dict], args: argparse.Namespace):
    """The try-it page beside the engine while it serves; its port was free at the start (page_ports): one taken
    since is said, and serving goes on."""
    if not args.page_port:
        yield None
        return
    from serving.page.server import PageServer, target_of
    try:
        page = PageServer(target_of(engine, answers), args.page_host, args.page_port)
    except OSError as error:
        print(f"try-it page not started: {args.page_host}:{args.page_port}: {error.strerror} (--page-port)", flush=True)
        yield None
        return
    print(f"try it in a browser: {page.url} (the same API as the curl lines)", flush=True)
    with page:
        yield page


def stop_every_engine(run_dir: Path) -> int:
    """Each engine whose pid file is in run_dir, stopped with its whole process group."""
    stopped = [engine for engine in engines.engines_running_in(run_dir) if engine.stop()]
    for engine in stopped:
        print(f"{engine.title} stopped")
    if not stopped:
        print(f"no server running from {run_dir.absolute()}")
    return 0


def print_serving(engine: Engine, answers: dict[str, dict]) -> None:
    for name, answer in answers.items():
        print(f"serving {name} ({answer['artifact']}) at {where(engine.urls(name))}\n"
              f"  example prediction: {answer_line(answer)}\n"
              f"  try: {engine.curl_line(name)}", flush=True)
    for note in engine.notes():
        print(note, flush=True)
    if engine.metrics_url():
        print(f"metrics: {engine.metrics_url()}", flush=True)


def answer_line(answer: dict) -> str:
    """The example photo's answer in a few words, whatever the task."""
    if "predictions" in answer:
        top = answer["predictions"][0]
        return f"{top['label']} ({top['probability']:.3f})"
    if "detections" in answer:
        found = answer["detections"]
        return f"{len(found)} boxes" + (f", the first {found[0]['label']} ({found[0]['score']:.3f})" if found else "")
    shares = ", ".join(f"{c['label']} {100 * c['share']:.0f} %" for c in answer["classes"][:3])
    return f"{len(answer['classes'])} classes: {shares}"


def where(urls: dict[str, str]) -> str:
    """One URL as it is; several each with its protocol: "URL1 (v1) and URL2 (v2)"."""
    if len(urls) == 1:
        return next(iter(urls.values()))
    return " and ".join(f"{url} ({protocol})" for protocol, url in urls.items())
