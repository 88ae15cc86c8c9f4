"""The one interface every serving engine implements, and the registry `--engine` chooses from.

An engine serves the model store's archives in a server process of its own: start() launches it in its own
process group (its pid file, NAME.pgid, in the run dir), wait_until_ready() returns once every model has answered
a real prediction, stop() ends the whole group, and urls()/curl_line() say what a user calls; every port it will
bind (ports()) is checked free before it starts. The command line (serving/cli.py), the tests and the
measurements drive every engine through this class alone.

A new engine is one module, serving/<package>/engine.py, that subclasses Engine and registers it
(`@register`): it is found there, offered by `--engine`, stopped by `python -m serving stop`, rolled out to
(its switchboard()) and measured (on_free_ports()), with no other edit (a wheel, unlike a checkout or an
editable install, also needs the package in pyproject.toml's packages). tests/serving/test_engine.py lists what
every engine provides.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar

from contract.errors import VisionExportError
from contract.policy import ServingPolicy
from serving.ports import Port, check_ports
from serving.processes import NoAnswer, group_alive, poll_for_answer, read_pgid, running_until_exit, stop_group
from serving.settings import (
    DEFAULT_RUN_DIR,
    EXAMPLE_IMAGE,
    READY_TIMEOUT_S,
    STOP_TIMEOUT_S,
    ServingError,
    ServingSettings,
)

if TYPE_CHECKING:
    import requests

    from serving.rollout.switchboard import Switchboard

DEFAULT_ENGINE = "torchserve"
SERVING_DIR = Path(__file__).resolve().parent


class Engine(ABC):
    """One engine serving one settings record. Subclasses set the class attributes and the abstract methods."""

    name: ClassVar[str]  # what --engine calls it; its pid file is NAME.pgid in the run dir
    title: ClassVar[str]  # how a sentence names its server: "TorchServe exited ...", "the KServe server stopped"
    description: ClassVar[str] = ""  # its part of `python -m serving --engine NAME --help`
    settings_type: ClassVar[type[ServingSettings]] = ServingSettings
    extra_actions: ClassVar[dict[str, str]] = {}  # actions beside start and stop: {action: what it does}
    # Whether SIGTERM goes to the server's leader alone, which stops its own workers (and would start a new one in
    # place of a worker signalled beside it), rather than to the whole group.
    leader_stops_workers: ClassVar[bool] = False
    retry_on: ClassVar[tuple[type[BaseException], ...]] = ()  # errors of a readiness probe that mean "not yet"

    def __init__(self, settings: ServingSettings):
        self.settings = settings

    # ---------------------------------------------------------------- its command line
    @classmethod  # noqa: B027
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Its own options, beside the shared ones of serving/cli.py (a hook: most engines add none)."""

    @classmethod
    def own_settings(cls, args: argparse.Namespace) -> dict:
        """Its settings' values from its own options; ServingError for an option it cannot honour."""
        return {}

    @classmethod
    def settings_from(cls, args: argparse.Namespace) -> ServingSettings:
        return cls.settings_type(model_store=args.model_store, run_dir=args.run_dir, **cls.own_settings(args))

    def run_extra_action(self, action: str, args: argparse.Namespace) -> int:
        raise ServingError(f"the {self.name} engine has no action {action!r}")

    @classmethod
    def on_free_ports(cls, model_store: Path, run_dir: Path, models: Sequence[str] = (),
                      policy: ServingPolicy | None = None) -> ServingSettings:
        """Settings serving models (every one of the store when none) whose every port is free, the policy given
        whole when one is: for tests and measurements beside other servers."""
        raise ServingError(f"the {cls.name} engine cannot choose free ports for itself")

    # ---------------------------------------------------------------- its versions
    def switchboard(self) -> Switchboard:
        """What `python -m serving rollout` drives on the server running from this run dir: load a version beside
        the live one, route a share or keep photos (its transport of handlers/routing.py), switch, unload."""
        raise ServingError(f"the {self.name} engine cannot roll out versions: restart it on the new archive")

    # ---------------------------------------------------------------- its server process
    @abstractmethod
    def launch(self) -> subprocess.Popen:
        """The server process, in its own session (see popen); the archives are there, the log folder exists, each
        model's policy is resolved (settings.policies): write them in the run config the server reads."""

    @abstractmethod
    def ports(self) -> list[Port]:
        """Every port its start binds on this machine, each with the flag that sets it: checked by start() before
        anything starts (serving/ports.py)."""

    @abstractmethod
    def probe(self, model: str, image: Path) -> tuple[str, Callable[[], requests.Response]]:
        """(URL, a function that sends image to model once as a client does): the readiness probe."""

    def client_body(self, image: bytes) -> tuple[bytes, str]:
        """(body, content type) a client posts for one image to the first of urls(): the photo's own bytes."""
        return image, "image/jpeg"

    def answer_of(self, response: requests.Response) -> dict:
        """The answer to one image ({"model", "architecture", "artifact", "predictions": [{"label", ...}]})."""
        return response.json()

    @abstractmethod
    def exit_reason(self) -> str:
        """Why the server stopped or never answered, from what it logged."""

    def load_failure(self) -> str | None:
        """What its logs say when a model will not load (waiting on is pointless); None while nothing does."""
        return None

    @abstractmethod
    def log_files(self) -> list[Path]:
        """The files its server logs to (what --follow-logs copies to stdout)."""

    # ---------------------------------------------------------------- what a user is told
    @abstractmethod
    def announcement(self) -> str:
        """The line printed once the server started, before its models answered (the policies resolved)."""

    @abstractmethod
    def urls(self, model: str) -> dict[str, str]:
        """{protocol: URL} a client calls for predictions of model, the one probed first."""

    @abstractmethod
    def curl_line(self, model: str, image: Path = EXAMPLE_IMAGE) -> str:
        """A command line that asks model for a prediction of image."""

    def metrics_url(self) -> str | None:
        return None

    def request_headers(self) -> dict:
        """What a client adds to each prediction (the try-it page's server too): the token when auth is on."""
        return {}

    def notes(self) -> list[str]:
        """Lines printed after the models', before the metrics URL (e.g. where the keys are)."""
        return []

    # ---------------------------------------------------------------- built once, on the methods above
    @property
    def pid_file(self) -> Path:
        return self.settings.run_dir.absolute() / f"{self.name}.pgid"

    def is_running(self) -> bool:
        try:
            pgid = read_pgid(self.pid_file)
        except VisionExportError as error:
            raise ServingError(str(error)) from None
        return pgid is not None and group_alive(pgid)

    def stop_command(self) -> str:
        run_dir = self.settings.run_dir
        return ("python -m serving stop" + (f" --engine {self.name}" if self.name != DEFAULT_ENGINE else "")
                + (f" --run-dir {run_dir}" if run_dir != DEFAULT_RUN_DIR else ""))

    def start(self, beside: Sequence[Port] = ()) -> subprocess.Popen:
        """Start the server with every model of the settings; stop() ends it. Its ports, and those its caller binds
        beside it (the try-it page's), must all be free: a port held is a PortInUse before anything starts."""
        for name in self.settings.served_models():
            archive = self.settings.archive(name)
            if not archive.is_file():
                raise ServingError(f"{archive} not found: run `python -m export resnet` first (it writes the archive)")
        if self.is_running():
            raise ServingError(f"{self.title} started from {self.settings.run_dir.absolute()} is still running: "
                               f"`{self.stop_command()}` first")
        check_ports([*self.ports(), *beside])
        self.settings.log_dir.mkdir(parents=True, exist_ok=True)
        self.settings.resolve_policies()  # once per start: launch writes them in the run config
        process = self.launch()
        self.pid_file.write_text(str(process.pid))
        return process

    def popen(self, command: list[str], log: Path, env: dict) -> subprocess.Popen:
        """command in the run dir, its output in log. Its own session: Ctrl-C in the terminal reaches us, not it,
        and stop() signals its whole group (the server and every worker it started) at once."""
        with open(log, "ab") as output:
            return subprocess.Popen(command, cwd=self.settings.run_dir.absolute(), env=env, stdout=output,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_until_ready(self, process: subprocess.Popen | None, image: Path = EXAMPLE_IMAGE,
                         timeout: float = READY_TIMEOUT_S) -> dict[str, dict]:
        """{model: its answer} once every served model has answered a real prediction of image. A server that
        exits, a model that cannot load or the timeout raise ServingError with what the logs say."""
        deadline = time.monotonic() + timeout
        return {model: self.answer_of(self.first_answer(model, image, process, deadline))
                for model in self.settings.served_models()}

    def first_answer(self, model: str, image: Path, process: subprocess.Popen | None, deadline: float):
        url, post = self.probe(model, image)
        return await_prediction(url, post, deadline, process, self.title, self.exit_reason, self.load_failure,
                                self.retry_on)

    def stop(self, process: subprocess.Popen | None = None, timeout: float = STOP_TIMEOUT_S) -> bool:
        """End the whole process group (SIGTERM, SIGKILL past timeout) and return once it is gone; False when
        nothing was running."""
        return stop_group(self.pid_file, process, timeout, self.title, self.leader_stops_workers)

    @contextlib.contextmanager
    def running(self, image: Path = EXAMPLE_IMAGE, timeout: float = READY_TIMEOUT_S):
        """A server whose every model has answered a real prediction, stopped (whole group) on the way out."""
        with running_until_exit(self.start, lambda process: self.wait_until_ready(process, image, timeout),
                                self.stop) as process:
            yield process


def await_prediction(url: str, post: Callable[[], requests.Response], deadline: float,
                     process: subprocess.Popen | None, title: str, exit_reason: Callable[[], str],
                     load_failure: Callable[[], str | None], retry_on: tuple = ()) -> requests.Response:
    """post()'s first 200 before the deadline. Before each try: ServingError when the server process exited or
    load_failure() says a model will not load; at the deadline, ServingError with its last answer and why."""
    def check() -> None:
        if process is not None and process.poll() is not None:
            raise ServingError(f"{title} exited with code {process.returncode}: {exit_reason()}")
        failure = load_failure()
        if failure:
            raise ServingError(f"the model failed to load: {failure}")
    try:
        return poll_for_answer(post, check, deadline, retry_on=retry_on)
    except NoAnswer as timeout:
        raise ServingError(f"no successful prediction from {url} in time (last: {timeout.last}); "
                           f"{exit_reason()}") from None


# ---------------------------------------------------------------- the registry
_ENGINES: dict[str, type[Engine]] = {}
_discovered = False


def register(engine: type[Engine]) -> type[Engine]:
    """Offer an engine to --engine (a class decorator)."""
    if engine.name in _ENGINES and _ENGINES[engine.name] is not engine:
        raise ValueError(f"an engine named {engine.name!r} is registered already ({_ENGINES[engine.name].__module__})")
    _ENGINES[engine.name] = engine
    return engine


def unregister(name: str) -> None:
    del _ENGINES[name]


def discover() -> None:
    """Import every serving/<package>/engine.py once: each registers its engine."""
    global _discovered
    if not _discovered:
        _discovered = True
        for module in sorted(SERVING_DIR.glob("*/engine.py")):
            importlib.import_module(f"serving.{module.parent.name}.engine")


def names() -> tuple[str, ...]:
    """The registered engines, the default first."""
    discover()
    return tuple(sorted(_ENGINES, key=lambda name: name != DEFAULT_ENGINE))


def get(name: str) -> type[Engine]:
    discover()
    if name not in _ENGINES:
        raise ServingError(f"no engine named {name!r}: choose from {', '.join(names())}")
    return _ENGINES[name]


def engines_running_in(run_dir: Path) -> list[Engine]:
    """An engine for each pid file of a registered engine in run_dir (its server may have ended since)."""
    found = []
    for name in names():
        engine = _ENGINES[name](_ENGINES[name].settings_type(run_dir=Path(run_dir)))
        if engine.pid_file.exists():
            found.append(engine)
    return found
