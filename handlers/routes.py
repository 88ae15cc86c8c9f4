"""A model's routes beside TorchServe's own, which sends every request of a name to its default version and has
neither a share nor a mirror: a canary (a share of the default version's requests answered by a candidate version)
and a capture (the photos of the next live requests kept, for a shadow comparison). The default version's workers
do both, as `python -m serving rollout` asks (serving/torchserve/switchboard.py) through one control file per model,
RUN_DIR/routes/NAME.json (mode 0600: it may hold the inference key):

    {"live": "v1", "capture": 5,
     "canary": {"id": "…", "label": "v2", "url": "http://127.0.0.1:8080/predictions/NAME/2", "headers": {…},
                "percent": 50}}

A worker finds RUN_DIR beside the run config RUN_CONFIG_ENV names, stats the control file once a batch and reads it
again only when it changed; one of another shape is logged once (per change) and routes nothing, the live version
answering every request. Only workers of the "live" version act on it: the candidate's never forward nor keep.
A kept photo is a file of NAME.capture/ named by its arrival and request id; a canary's counts are one file per
worker in NAME.canary/, which the rollout sums. What is forwarded, counted and answered here is the one routing
policy's (handlers/routing.py): this module is its transport on TorchServe.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import shutil
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

from contract.versions import VERSION_HEADER
from handlers.policy import RUN_CONFIG_ENV
from handlers.request import REQUEST_ID_HEADER, ImageRequest
from handlers.request_body import OPTION_KEYS, TOPK_HEADER, image_of, option, option_header
from handlers.request_error import RequestError
from handlers.routing import FORWARD_TIMEOUT_S, OUTCOMES, CanaryShare, Outcome, answered, outcome_of_status, summed

logger = logging.getLogger(__name__)

ROUTES_FOLDER = "routes"  # in the run dir
FORWARD_THREADS = 4  # a batch's forwards at once


@dataclass(frozen=True)
class Canary:
    id: str  # one canary's counts are told from an earlier one's by it
    label: str
    url: str  # TorchServe's /predictions/NAME/VERSION of the candidate, on loopback
    headers: dict = field(default_factory=dict)  # the inference key when token authorisation is on
    percent: float = 0.0


@dataclass(frozen=True)
class Control:
    live: str  # the version whose workers route; any other version's ignore the file
    capture: int = 0  # photos of live requests to keep (0: none)
    canary: Canary | None = None

    @property
    def idle(self) -> bool:
        return not self.capture and self.canary is None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Control:
        """The control a rollout wrote; ValueError saying what is wrong with any other text."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("live"), str):
            raise ValueError('not a JSON object naming the "live" version')
        capture = data.get("capture") or 0
        if not isinstance(capture, int) or isinstance(capture, bool) or capture < 0:
            raise ValueError(f'"capture" is {capture!r}, not a number of photos')
        canary = data.get("canary")
        return cls(data["live"], capture, canary_of(canary) if canary else None)


def canary_of(data) -> Canary:
    """The canary of a control, each field of its type (ValueError naming the first that is not)."""
    if not isinstance(data, dict):
        raise ValueError(f'"canary" is a JSON {type(data).__name__}, not an object')
    for key in ("id", "label", "url"):
        if not isinstance(data.get(key), str):
            raise ValueError(f'"canary"."{key}" is {data.get(key)!r}, not a string')
    headers, percent = data.get("headers") or {}, data.get("percent")
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ValueError('"canary"."headers" is not an object of strings')
    if not isinstance(percent, (int, float)) or isinstance(percent, bool) or not 0 <= percent <= 100:
        raise ValueError(f'"canary"."percent" is {percent!r}, not a number from 0 to 100')
    return Canary(data["id"], data["label"], data["url"], headers, float(percent))


class ModelRoutes:
    """One model's route files in a routes folder: the control, the kept photos, the canary's counts."""

    def __init__(self, folder: Path, name: str):
        self.control_file = Path(folder) / f"{name}.json"
        self.capture_dir = Path(folder) / f"{name}.capture"
        self.counts_dir = Path(folder) / f"{name}.canary"

    # ------------------------------------------------------------ the rollout's side
    def read(self) -> Control | None:
        """The control, None when there is none; ValueError (or OSError) when it cannot be read."""
        try:
            return Control.from_json(self.control_file.read_text())
        except FileNotFoundError:
            return None

    def current(self) -> Control | None:
        """The control to change: one that cannot be read is replaced (logged), as the workers ignore it."""
        try:
            return self.read()
        except (OSError, ValueError) as error:
            logger.warning("the routes in %s cannot be read (%s): written anew", self.control_file, error)
            return None

    def write(self, control: Control | None) -> None:
        """The control file replaced at once (a worker reads the old one or the new one); an idle one removed."""
        if control is None or control.idle:
            self.control_file.unlink(missing_ok=True)
            return
        self.control_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(self.control_file, control.to_json().encode())

    def start_capture(self, live: str, count: int) -> None:
        self.forget(self.capture_dir)
        self.capture_dir.mkdir(mode=0o700, parents=True)
        self.write(replace(self.current() or Control(live), live=live, capture=count))

    def stop_capture(self) -> None:
        control = self.current()
        self.write(control and replace(control, capture=0))
        self.forget(self.capture_dir)

    def captured(self) -> list[tuple[str, bytes]]:
        """(request id, photo) of each kept request, in arrival order."""
        if not self.capture_dir.is_dir():
            return []
        names = sorted(name for name in os.listdir(self.capture_dir) if not name.startswith("."))
        return [(id_of(name.split("-", 2)[2]), (self.capture_dir / name).read_bytes()) for name in names]

    def start_canary(self, live: str, canary: Canary) -> None:
        self.forget(self.counts_dir)
        self.counts_dir.mkdir(mode=0o700, parents=True)
        self.write(replace(self.current() or Control(live), live=live, canary=canary))

    def end_canary(self, settle_s: float = FORWARD_TIMEOUT_S) -> dict:
        """The canary ended; its counts once every forward asked was answered (or settle_s passed)."""
        control = self.current()
        if control is None or control.canary is None:
            return dict.fromkeys(OUTCOMES, 0)
        self.write(replace(control, canary=None))
        deadline = time.monotonic() + settle_s
        while not answered(counts := self.counts(control.canary.id)) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.forget(self.counts_dir)
        return counts

    def counts(self, canary_id: str) -> dict:
        """The canary's counts summed over the workers that routed it."""
        reports = []
        for path in self.counts_dir.glob("[!.]*.json") if self.counts_dir.is_dir() else ():
            counted = json.loads(path.read_text())
            if counted.pop("id", None) == canary_id:
                reports.append(counted)
        return summed(reports)

    def clear(self) -> None:
        """No route left: no canary, no capture, nothing kept."""
        self.write(None)
        self.forget(self.capture_dir)
        self.forget(self.counts_dir)

    @staticmethod
    def forget(folder: Path) -> None:
        """The folder renamed aside at once (a worker's late write then fails instead of landing in a new one),
        then deleted; a file a worker was writing meanwhile can stop the delete: the hidden rest goes next time."""
        for stale in folder.parent.glob(f".{folder.name}.*"):
            shutil.rmtree(stale, ignore_errors=True)
        if folder.is_dir():
            aside = folder.with_name(f".{folder.name}.{os.getpid()}.{time.time_ns()}")
            folder.rename(aside)
            shutil.rmtree(aside, ignore_errors=True)

    # ------------------------------------------------------------ a worker's side
    def keep(self, count: int, photos: Sequence[tuple[str, bytes]]) -> None:
        """Photos kept, in order, until the folder holds count (a folder gone: the capture ended). One that cannot
        be written is logged, its request answered all the same (the rollout then waits in vain and says so)."""
        try:
            room = count - sum(1 for name in os.listdir(self.capture_dir) if not name.startswith("."))
            for request_id, photo in photos[:max(room, 0)]:
                write_private(self.capture_dir / f"{time.time_ns():020d}-{os.getpid()}-{file_name(request_id)}", photo)
        except FileNotFoundError:
            return
        except OSError as error:
            logger.error("cannot keep live photos in %s for the rollout's shadow: %s", self.capture_dir, error)

    def record(self, canary_id: str, counts: dict) -> None:
        try:
            write_private(self.counts_dir / f"{os.getpid()}.json", json.dumps({"id": canary_id, **counts}).encode())
        except FileNotFoundError:  # the canary ended and its counts were read
            return
        except OSError as error:  # the requests are answered all the same
            logger.error("cannot record the canary's counts in %s: %s", self.counts_dir, error)


def file_name(request_id: str) -> str:
    """A request id (ACCEPTED_ID: up to 128 characters, "/" among them) as a short enough file name, and back."""
    return base64.urlsafe_b64encode(request_id.encode()).decode()


def id_of(name: str) -> str:
    return base64.urlsafe_b64decode(name.encode()).decode()


def forget_all(run_dir: Path) -> None:
    """No route of an earlier run left (a server starting from this run dir)."""
    folder = Path(run_dir) / ROUTES_FOLDER
    if folder.is_dir():
        shutil.rmtree(folder)


def write_private(path: Path, data: bytes) -> None:
    """All or nothing (a temporary file renamed over it), readable by this user only; not synced: a route file
    matters only while the server runs."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Forwarded:
    """A canary's answer to one request, and the version it names (header and JSON alike)."""

    answer: dict
    version: str


class WorkerRoutes:
    """What one worker of one version does with its model's control file."""

    def __init__(self, files: ModelRoutes, version: str):
        self.files = files
        self.version = version
        self._seen: tuple | None = None  # the control file's (inode, mtime, size) when last read
        self._control: Control | None = None
        self._share: CanaryShare | None = None
        self._forwarded: dict[int, str] = {}  # the request id of each row of the batch in hand sent to the canary
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def of_worker(cls, model: str, version: str, environ: Mapping[str, str] | None = None) -> WorkerRoutes | None:
        """The routes of a worker `python -m serving` started (its run config beside the routes); None otherwise."""
        run_config = (os.environ if environ is None else environ).get(RUN_CONFIG_ENV)
        return cls(ModelRoutes(Path(run_config).parent / ROUTES_FOLDER, model), version) if run_config else None

    def control(self) -> Control | None:
        """The control when it asks this version to route: one stat, a read only when the file changed."""
        try:
            stat = os.stat(self.files.control_file)
        except FileNotFoundError:
            self._seen = self._control = None
            return None
        seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if seen != self._seen:
            self._control, self._seen = self._read(), seen
        return self._control if self._control and self._control.live == self.version else None

    def _read(self) -> Control | None:
        """The control; one that cannot be read is logged (once: it is read again only when it changes) and routes
        nothing: the live version answers every request."""
        try:
            return self.files.read()
        except (OSError, ValueError) as error:
            logger.warning("the routes in %s cannot be read, none followed until the file changes: %s",
                           self.files.control_file, error)
            return None

    def route(self, requests: Sequence[ImageRequest]) -> dict[int, Future]:
        """The photos the capture asks for kept; the canary's share forwarded: its futures by row."""
        control = self.control()
        if control is None:
            return {}
        photos = {index: sent for index, request in enumerate(requests) if (sent := forwardable(request))}
        if control.capture:
            self.files.keep(control.capture, [(requests[index].request_id, photo)
                                              for index, (photo, _) in photos.items()])
        canary = control.canary
        if canary is None or canary.label == self.version:  # never to itself: its one worker would wait on itself
            return {}
        if self._share is None or self._share.canary_id != canary.id:
            self._share = CanaryShare(canary.id, canary.label, canary.percent)
        chosen = self._share.chosen(list(photos))
        if not chosen:
            return {}
        self._share.asked(len(chosen))
        self._record()
        self._pool = self._pool or ThreadPoolExecutor(FORWARD_THREADS, thread_name_prefix="canary")
        self._forwarded = {index: requests[index].request_id for index in chosen}
        return {index: self._pool.submit(forward, canary, requests[index].request_id, *photos[index])
                for index in chosen}

    def collect(self, forwards: dict[int, Future]) -> dict[int, Forwarded]:
        """The rows the canary served, by row (the others are the live version's to answer), counted: a forward
        not answered by its deadline is the candidate's failure, the worker waits no longer for it."""
        share, deadline = self._share, time.monotonic() + FORWARD_TIMEOUT_S
        assert share is not None  # route() made it when it forwarded
        served = {}
        for index, future in forwards.items():
            try:
                outcome, answer, why = *future.result(max(deadline - time.monotonic(), 0)), ""
            except FutureTimeout:
                outcome, answer, why = Outcome.FAILED, None, f"no answer within {FORWARD_TIMEOUT_S:g} s"
            if share.settle(outcome, self._forwarded.get(index, ""), why) and answer is not None:
                served[index] = answer
        self._record()
        return served

    def _record(self) -> None:
        if self._share is not None:
            self.files.record(self._share.canary_id, self._share.counts.as_dict())


def forwardable(request: ImageRequest) -> tuple[bytes, dict[str, str]] | None:
    """The request's photo and its options as headers; None when they cannot be read (the live version answers it
    with the reason)."""
    try:
        return image_of(request), option_headers(request)
    except RequestError:
        return None


def forward(canary: Canary, request_id: str, photo: bytes, options: dict[str, str]) -> tuple[Outcome, Forwarded | None]:
    """(outcome, answer) of one request sent to the canary: the photo as the body, its options and id as headers.
    served: a 200 naming the canary's version; declined: the canary refused the request itself (a 4xx the live
    version would give too); failed: anything else."""
    headers = {**canary.headers, "Content-Type": "application/octet-stream", REQUEST_ID_HEADER: request_id, **options}
    try:
        with urllib.request.urlopen(urllib.request.Request(canary.url, photo, headers, method="POST"),
                                    timeout=FORWARD_TIMEOUT_S) as response:
            answer, version = json.loads(response.read()), response.headers.get(VERSION_HEADER)
    except urllib.error.HTTPError as error:
        body = error.read()
        logger.warning("the canary %s answered HTTP %d: %s", canary.label, error.code, body[:200])
        return outcome_of_status(error.code, refused_by_handler(body)), None
    except (OSError, http.client.HTTPException, ValueError) as error:  # refused, reset, cut short, timed out, not JSON
        logger.warning("the canary %s did not answer: %s", canary.label, error)
        return Outcome.FAILED, None
    if version != canary.label or not isinstance(answer, dict) or answer.get("version") != canary.label:
        logger.warning("the canary %s answered as %s (header) / %s (JSON)", canary.label, version,
                       answer.get("version") if isinstance(answer, dict) else None)
        return Outcome.FAILED, None
    return Outcome.SERVED, Forwarded(answer, version)


def refused_by_handler(body: bytes) -> bool:
    """Whether an error is our handler's refusal of the request itself (its body names the request), rather than
    TorchServe's (a token refused, a version not loaded, a full queue)."""
    try:
        refusal = json.loads(body)
    except ValueError:
        return False
    return isinstance(refusal, dict) and {"code", "error", "request_id"} <= refusal.keys()


def option_headers(request: ImageRequest) -> dict[str, str]:
    """The request's options (a form's, a JSON object's or headers) as the headers TorchServe lets through."""
    headers = {}
    for name in OPTION_KEYS:
        value = option(request, name)
        if isinstance(value, (bytes, bytearray)):
            value = value.decode("utf-8", "replace")
        if value is not None:
            headers[TOPK_HEADER if name == "topk" else option_header(name)] = str(value)
    return headers
