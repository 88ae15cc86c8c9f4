"""Our request core (handlers/core.py) as a Ray Serve deployment: one replica opens one archive's served
artifact (sha256-checked by the core, as under TorchServe and KServe) and answers POST /predictions/NAME as
TorchServe does: the same bodies (a raw image, JSON {"data": base64, "topk": k}, a form file; the X-TopK
header), the same JSON answer, the same 4xx {"code", "error"} for a bad request. A body over contract/policy.py's
MAX_BODY_BYTES is refused with 413 before it is read whole (serving/bounds.py), as on every engine; a 500 says no
exception's text (it is logged under the request's id). Concurrent requests share a
batch as the model's policy says (handlers/batching.py). Each answer names the Ray node and replica that served it in
its SERVED_BY header, so a client sees where its request ran.

Beside each live application runs its gate (RayGate, application NAME.gate at GATE_PREFIX/NAME): one spare replica
with a replica's imports done and no model open. A rollout's candidate is opened there when it is loaded beside the
live version (in a second, where a new Serve application would start a process and import torch and Serve), and
the gate asks it at GATE_PREFIX/NAME/vN; it stays a process of its own, so a candidate that hangs or crashes takes
no live request with it. During a rollout the live application's replicas hand a share of their requests to the
candidate (--canary) or keep the photos of the next few (--shadow), as serving/ray/routing.py says.

Every node reads the archive from the model store's path: on one machine the store itself, across machines a
shared folder or the image that carries it (docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from pathlib import Path

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from contract.policy import ServingPolicy
from contract.versions import split_versioned
from handlers import metrics
from handlers.answers import Reply, failure, reply
from handlers.batching import Batcher
from handlers.logs import SERVED_BY, configure_logging  # SERVED_BY: "NODE_ID REPLICA_ID" here
from handlers.opening import device_of, open_archive, shared_scratch
from handlers.request import JSON_TYPE, ImageRequest, request_id_of
from handlers.request_error import RequestError
from handlers.start_phases import engine_run_dir
from serving.auth import refused_response
from serving.bounds import bounded_body
from serving.ray.config import GATE_PREFIX, gate_app
from serving.ray.routing import LiveRouting, gate_holding

logger = logging.getLogger("serving.ray")

DESCRIPTION_PATH = "/description"  # GET ROUTE/description: which form serves on this machine, and why
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


def application(args: dict):
    """One archive's Serve application: what server.py deploys, and the import_path of the Serve config a
    cluster deploys (serve_config.py). args: archive (its path on every node), name, policy (the model's serving
    policy as resolved, a ServingPolicy's to_dict(): the replica reads it as it is), and options, the
    deployment's options (config.py deployment_options); a Serve config gives those in its `deployments:` entry
    instead, where operators tune them."""
    policy = ServingPolicy.from_dict(args["policy"])
    return RayDeployment.options(name=args["name"], **args.get("options", {})).bind(
        str(args["archive"]), policy, args["name"])


def gate_application(name: str, policy: ServingPolicy, options: dict):
    """name's gate: its spare replica, deployed as name beside the live application (gate_options)."""
    return RayGate.options(name=name, **options).bind(name, policy)


def application_args(archive: Path, policy: ServingPolicy) -> dict:
    """application()'s args for archive under its resolved policy."""
    versioned = split_versioned(archive.stem)  # NAME.vN.mar: a version of NAME, deployed under NAME
    return {"archive": str(archive), "name": versioned[0] if versioned else archive.stem, "policy": policy.to_dict()}


class Replica:
    """What a replica of ours answers with: the request core it opened (batched as its policy says), named where it
    runs; a live one follows its rollout's routing."""

    core = None
    batcher: Batcher | None = None
    routing: LiveRouting | None = None
    served_by = ""

    def named(self) -> None:
        import ray
        context = serve.get_replica_context()
        self.served_by = f"{ray.get_runtime_context().get_node_id()} {context.replica_id.unique_id}"

    def scratch(self, archive: Path) -> Path:
        """The run's folder for this archive, unpacked once for every replica on this machine (and by the check
        before them, serving/ray/server.py); a folder of this replica's own where no run dir is known."""
        run_dir = engine_run_dir()
        if run_dir is not None:
            return shared_scratch(archive, run_dir)
        self.folder = tempfile.TemporaryDirectory(prefix=f"{archive.stem}-")  # removed by __del__
        return Path(self.folder.name)

    def __del__(self):
        """Serve's shutdown hook for a replica stopped gracefully: its own unpacked folder goes with it (a
        replica killed outright leaves it, as any process's temporary files), and the rollout's router no longer
        waits for it."""
        if getattr(self, "routing", None) is not None:
            self.routing.leave()
        if getattr(self, "folder", None) is not None:
            self.folder.cleanup()

    async def respond(self, request: Request) -> JSONResponse:
        """The HTTP answer of the opened core: its description, or a prediction."""
        if request.method == "GET" and request.url.path.rstrip("/").endswith(DESCRIPTION_PATH):
            return JSONResponse(self.core.describe(), headers={SERVED_BY: self.served_by})
        timer, rid = metrics.Timer(), request_id_of(request.headers)
        try:
            return await self.predict(request, rid, timer)
        except Exception as error:  # logged with its id; the client is told where to look, not what it was
            return as_response(failure(error, self.core.served, rid, timer.seconds(), served_by=self.served_by))

    async def predict(self, request: Request, rid: str, timer: metrics.Timer) -> JSONResponse:
        try:
            image = await image_request(request, rid)
        except RequestError as error:
            return as_response(self.outcome(error, rid, timer))
        canary = self.routing.canary_handle() if self.routing else None
        if canary is not None and (forwarded := await self.routing.forward(canary, image)) is not None:
            return as_response(forwarded)  # the candidate's answer, naming its version
        outcome = await self.answer(image, timer)
        if self.routing and outcome[1] == 200:
            self.routing.capture(image)
        return as_response(outcome)

    async def answer(self, image: ImageRequest, timer: metrics.Timer | None = None) -> Reply:
        """This version's reply to one request: (payload, status code, headers)."""
        timer = timer or metrics.Timer()
        with metrics.in_flight(self.core.served.model):
            (answer,) = await self.batcher.answer([image])
        return self.outcome(answer, image.request_id, timer)

    def outcome(self, answer, rid: str, timer: metrics.Timer) -> Reply:
        """The reply every engine makes (handlers/answers.py), its latency and code recorded. Serve's proxy returns
        the X-Request-ID header itself (the client's, or the one it made and handed us): no id header here."""
        return reply(answer, self.core.served, rid, timer.seconds(), served_by=self.served_by)


@serve.deployment
class RayDeployment(Replica):
    def __init__(self, archive: str, policy: ServingPolicy, name: str):
        """Open the archive's artifact through the core under the model's policy (handlers/opening.py, unpacked
        once per run), served as `name`: an archive that fails its sha256 check raises here, and Serve marks the
        application failed with it. Its replicas follow the rollout's routing of name."""
        configure_logging()
        self.core = open_archive(archive, device_of(policy.device), policy, scratch=self.scratch(Path(archive)),
                                 served_name=name)
        self.batcher = Batcher(self.core, policy)
        self.named()
        self.routing = LiveRouting(name, serve.get_replica_context().replica_id.unique_id, self.core.served.version)
        self.routing.start()  # Serve runs the constructor on the replica's event loop

    async def __call__(self, request: Request) -> JSONResponse:
        if (refused := refused_response(request.headers.get("authorization"))) is not None:
            return refused  # token authorisation on and not the inference key (serving/auth.py)
        return await self.respond(request)


@serve.deployment
class RayGate(Replica):
    """name's spare replica beside its live application: the imports a replica's opening needs are done at its
    start; it opens the version a rollout loads beside the live one when told (hold), and answers it at
    GATE_PREFIX/NAME/vN and for the live replicas' canary. Which version it holds is the router's (a replica
    Serve replaces opens it again)."""

    def __init__(self, name: str, policy: ServingPolicy):
        import handlers.core  # noqa: F401  (torch and the core: what opening a version would import)
        import handlers.tasks  # noqa: F401
        configure_logging()
        self.name, self.policy = name, policy
        self.release()  # a spare: no version held
        self.named()
        held = gate_holding(name)
        if held is not None:  # a replacement of a gate that held a candidate: it holds it again, if it still opens
            try:
                self.open(*held)
            except Exception as error:  # the gate stays up, holding nothing: the rollout's asks say so
                logger.warning("%s: %s not held again: %s", name, held[0], error)
                self.release()

    async def hold(self, label: str | None, archive: str | None = None) -> dict:
        """Hold that version (open archive, sha256-checked by the core), or none (label None): {"held": label}, or
        {"refused": why} when it cannot open (nothing held then)."""
        if (label, archive) == (self.label, self.archive):
            return {"held": label}
        self.release()
        if label is None:
            return {"held": None}
        try:
            await asyncio.to_thread(self.open, label, archive)
        except Exception as error:  # the candidate's own reason (a sha256 mismatch, a form that fails to open)
            logger.warning("%s: %s not held: %s", self.name, label, error)
            self.release()
            return {"refused": str(error)}
        return {"held": label}

    def open(self, label: str, archive: str) -> None:
        self.core = open_archive(archive, device_of(self.policy.device), self.policy,
                                 scratch=self.scratch(Path(archive)), served_name=self.name)
        self.batcher = Batcher(self.core, self.policy)
        self.label, self.archive = label, archive

    def release(self) -> None:
        self.core, self.batcher = None, None
        self.label: str | None = None  # the version held, None while spare
        self.archive: str | None = None

    async def __call__(self, request: Request) -> JSONResponse:
        if (refused := refused_response(request.headers.get("authorization"))) is not None:
            return refused
        label = request.url.path.removeprefix(f"{GATE_PREFIX}/{self.name}").strip("/").split("/")[0]
        if label != self.label or self.core is None:
            return JSONResponse({"code": 404, "error": f"{self.name} {label} is not loaded beside the live version "
                                 f"(loaded: {self.label or 'none'}); `python -m serving rollout` loads it"},
                                status_code=404)
        return await self.respond(request)

    async def answer_as(self, label: str, image: ImageRequest) -> Reply:
        """A live replica's canary request for label: this version's reply, or a 503 when it holds another."""
        if label != self.label or self.core is None:
            return {"code": 503, "error": f"{self.name} {label} is not held by {gate_app(self.name)}"}, 503, {}
        return await self.answer(image)


def as_response(outcome: Reply) -> JSONResponse:
    """Ray's transport of a reply (this replica's, or a canary's handed back as it is)."""
    payload, code, headers = outcome
    return JSONResponse(payload, status_code=code, headers=headers)


async def image_request(request: Request, rid: str = "") -> ImageRequest:
    """The HTTP request as the core's ImageRequest: the body's bytes, a JSON object parsed, a form's fields by name
    (handlers/request_body.py finds the image and the options in it)."""
    headers = dict(request.headers.items())
    body = await bounded_body(request.stream(), headers.get("content-length"))
    request = Request(request.scope, replay(body))  # a form is parsed from the bounded body, not the socket
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in FORM_TYPES:
        form = await request.form()
        fields = {name: (await value.read() if hasattr(value, "read") else str(value).encode())
                  for name, value in form.multi_items()}
        return ImageRequest(b"", content_type, headers, fields, rid)
    if content_type == JSON_TYPE:
        try:
            parsed = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            parsed = None  # request_body answers with why it does not parse
        if isinstance(parsed, dict):
            return ImageRequest(b"", content_type, headers, parsed, rid)
    return ImageRequest(body, content_type, headers, request_id=rid)


def replay(body: bytes):
    """An ASGI receive that hands over a body already read."""
    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}
    return receive
