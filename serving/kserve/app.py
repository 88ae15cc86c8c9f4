"""What we set in KServe's ModelServer, and why each cannot be a plain argument of it (kserve 0.21):

- the bind address: KServe's REST server always binds 0.0.0.0 (right in a pod, wrong on a laptop); ours binds
  the configured host, loopback by default;
- a bad image's status: KServe maps only its own errors (InvalidInput: 400, else 500); our RequestError keeps
  its 400/413/415 and its reason, as on the TorchServe path;
- raw bytes in v2: KServe turns a binary-data BYTES input into UTF-8 text, so a JPEG sent as tritonclient sends
  it fails with a 500 ("Failed to encode ... using UTF-8"); our data plane keeps such inputs as bytes (and
  reads tritonclient's JSON-only requests, which come without a Content-Type, as JSON);
- signals: every engine's metrics on /metrics (KServe's route shows one process's default registry), a request
  id on every answer, liveness and readiness that ask the worker pool (serving/kserve/signals.py);
- bounded requests: KServe reads any body whole and runs every instance of it; ours refuses a body over
  contract/policy.py's MAX_BODY_BYTES with 413 before reading it (serving/bounds.py) and a request of more than
  MAX_PHOTOS_PER_REQUEST photos with 413 before decoding one, and a 500 says no exception's text (KServe's
  handlers answer str(exc)): the reason is logged under the request's id;
- one HTTP process: KServe's own `--workers N` starts N uvicorn processes, each answering the connections it
  accepted. Keep-alive connections stay with the process that accepted them, and the kernel spreads only new
  connections (a shared socket: the first worker that wakes accepts every waiting one; SO_REUSEPORT sockets:
  a hash of each connection), so a client holding a few connections could find them all on one worker while
  the others idled (measured: one of two workers did all the work at concurrency 8, half TorchServe's rate;
  docs/results/2026-11-25-serving-overhead/analysis.md, docs/results/2026-11-26-kserve-balance/). We start KServe's server with one
  process, and each model with the policy's worker processes behind it (serving/kserve/pool.py): its batcher
  hands each batch to a free worker, as TorchServe's frontend does, whatever the connections.

How each is added (kserve 0.21): OurModelServer, KServe's ModelServer subclassed, holds what they need (the host,
the models' versions, the registry) and adds them:
- routes (ours, the rollout's, the OpenAPI page): on KServe's FastAPI app, `kserve.model_server.app`, before the
  server starts, as KServe's own custom predictor example adds to it. They come before KServe's routes, so our
  /metrics answers in place of KServe's;
- the data plane: ModelServer's `dataplane` attribute, set when the server is made;
- the bind address, our middleware and our exception handlers: kserve 0.21 has no public way. Its REST server's
  uvicorn config binds 0.0.0.0, and create_application() adds KServe's middleware and exception handlers to the
  app once the server starts, after anything added before: KServe's InferenceError and Exception handlers would
  replace ours, and its timing middleware would wrap ours. So OurRESTServer, the one override, sets the host in
  its uvicorn config and adds ours after KServe's in create_application(). ModelServer.start() makes its REST
  server by calling the name `RESTServer` of the module kserve.model_server (no API: an import of KServe's), with
  arguments of its own; OurModelServer.start() points that name at OurRESTServer, bound to this server. The
  names this relies on are asserted in tests/serving/kserve/test_app.py, which fails if a kserve release renames
  or moves one.
"""

from __future__ import annotations

import functools
import json
import logging

import kserve.model_server
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse
from kserve import ModelServer
from kserve.errors import InferenceError, InvalidInput
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput, deserialize_bytes_tensor
from kserve.protocol.rest.server import RESTServer

from contract.policy import MAX_PHOTOS_PER_REQUEST
from handlers import answers
from handlers.metrics import ServedModel
from handlers.request_error import RequestError
from handlers.signals import request_id
from serving.bounds import BodyLimit
from serving.kserve import auth, signals
from serving.kserve.versions import Versions, add_routes

logger = logging.getLogger("serving.kserve")

DESCRIPTION_ROUTE = "/v2/models/{model_name}/description"  # ours: which form serves on this machine, and why
CONTENT_LENGTH_HEADER = "inference-header-content-length"  # the binary-data extension: the JSON part's length
DOCS_PATH = "/docs"  # KServe's own place for its OpenAPI page


async def request_error_response(request, error: RequestError, served: ServedModel | None = None) -> JSONResponse:
    """A bad request's reply as every engine makes it (handlers/answers.py), naming the version of the model served
    (`served`); RequestSignals records it."""
    return as_json(answers.reply(error, served, signals.request_id_of(request)))


async def failure_response(request, error: Exception, served: ServedModel | None = None) -> JSONResponse:
    """A 500 without the exception's text (KServe's handlers answer str(exc)): that goes to the log, under the id the
    answer carries."""
    rid = signals.request_id_of(request) or request_id(None)
    return as_json(answers.failure(error, served, rid))


def as_json(sent: answers.Reply) -> JSONResponse:
    return JSONResponse(status_code=sent.code, content=sent.body, headers=sent.headers)


def photos_in(request) -> int:
    """How many photos one request carries: v1's instances, v2's first dimension (a raw body: one)."""
    if isinstance(request, dict):
        instances = request.get("instances")
        return len(instances) if isinstance(instances, list) else 1
    shapes = [getattr(given, "shape", None) or [1] for given in getattr(request, "inputs", None) or []]
    return max((int(shape[0]) for shape in shapes), default=1)


class OurModelServer(ModelServer):
    """KServe's ModelServer with one HTTP process (the module docstring), our routes, middleware, exception handlers
    and data plane, bound to `host`."""

    def __init__(self, host: str, versions: Versions, http_port: int):
        super().__init__(http_port=http_port, workers=1, enable_grpc=False)
        self.host = host
        self.versions = versions
        self.dataplane = RawBytesDataPlane(model_registry=self.registered_models)

    def start(self, models: list) -> None:
        self.add_routes(kserve.model_server.app)
        kserve.model_server.RESTServer = functools.partial(OurRESTServer, server=self)  # the module docstring
        super().start(models)

    def add_routes(self, app) -> None:
        """Ours, before KServe's own (added when the server starts): our /metrics is matched first."""
        app.add_api_route(signals.METRICS_ROUTE, signals.metrics_route, methods=["GET"])
        app.add_api_route(DESCRIPTION_ROUTE, self.description, methods=["GET"])
        add_routes(app, self.versions, self.registered_models)  # rollout's routes, loopback clients only
        app.add_api_route(signals.LIVE_ROUTE, signals.live_route, methods=["GET"])
        app.add_api_route(signals.READY_ROUTE, self.ready, methods=["GET"])
        openapi_page_on(app)

    def add_middlewares(self, app) -> None:
        """After KServe's own (its timing middleware): the last added is the outermost."""
        app.add_middleware(BodyLimit)  # inside RequestSignals: a refused body is answered with its id and counted
        app.add_middleware(auth.TokenAuth)  # outside BodyLimit: a caller without its key is refused unread
        app.add_middleware(signals.RequestSignals, served_of=self.served_of)  # the outermost: sees every answer

    def add_exception_handlers(self, app) -> None:
        """After KServe's own: ours replace its InferenceError and Exception handlers."""
        app.add_exception_handler(RequestError, self.request_error_response)
        app.add_exception_handler(InferenceError, self.failure_response)
        app.add_exception_handler(Exception, self.failure_response)

    def served_of(self, name: str) -> ServedModel | None:
        """The labels of model name's metrics (a version switch puts another model under the name); None for a
        name the registry does not hold, or a model not loaded."""
        model = self.registered_models.get_model(name)
        return getattr(model, "served", None)

    def route_served(self, request) -> ServedModel | None:
        """The labels of the model a prediction route names (None: another route, or a name nobody serves)."""
        model = signals.model_of(request.url.path)
        return self.served_of(model) if model else None

    async def request_error_response(self, request, error: RequestError) -> JSONResponse:
        return await request_error_response(request, error, self.route_served(request))

    async def failure_response(self, request, error: Exception) -> JSONResponse:
        return await failure_response(request, error, self.route_served(request))

    async def ready(self):
        return signals.ready_answer(list(self.registered_models.get_models().values()))

    async def description(self, model_name: str) -> dict:
        """The model description: which form serves on this machine and why, the core's describe() (TorchServe
        shows the same as customizedMetadata). KServe's v2 metadata has no field for it."""
        return self.dataplane.get_model_from_registry(model_name).describe()  # unknown name: KServe's 404


class OurRESTServer(RESTServer):
    """KServe's REST server bound to our server's host, our middleware and exception handlers added after KServe's
    own: the one override of KServe's internals (the module docstring says why)."""

    def __init__(self, *args, server: OurModelServer, **kwargs):
        super().__init__(*args, **kwargs)
        self.server = server
        self.config.host = server.host

    def create_application(self) -> None:
        super().create_application()
        self.server.add_middlewares(kserve.model_server.app)
        self.server.add_exception_handlers(kserve.model_server.app)


def openapi_page_on(app) -> None:
    """KServe's OpenAPI page (Swagger UI) at /docs, beside its /openapi.json: KServe adds the page only when its own
    command line says --enable_docs_url; the same page is added here."""
    async def docs(_request):
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{app.title} - OpenAPI")
    if not any(getattr(route, "path", None) == DOCS_PATH for route in app.routes):
        app.add_route(DOCS_PATH, docs, include_in_schema=False)


class RawBytesDataPlane(DataPlane):
    async def infer(self, model_name, request, headers=None):
        photos = photos_in(request)
        if photos > MAX_PHOTOS_PER_REQUEST:
            raise RequestError(413, f"{photos} photos in one request: at most {MAX_PHOTOS_PER_REQUEST} are "
                                    "answered at once; send the rest in further requests")
        return await super().infer(model_name, request, headers)

    def decode_inference_request(self, body, headers, model_name):
        if not isinstance(body, bytes):
            return super().decode_inference_request(body, headers, model_name)
        # tritonclient sends JSON-only requests without a Content-Type, so they arrive as bytes without the
        # header that says where the JSON ends (KServe would refuse them): then the JSON is the whole body.
        length = headers.get(CONTENT_LENGTH_HEADER)
        if length is not None and not (length.isdigit() and int(length) <= len(body)):
            raise InvalidInput(f"{CONTENT_LENGTH_HEADER} must be the JSON part's length in bytes, at most the "
                               f"body's {len(body)}, got {length!r}")
        return binary_request(body, len(body) if length is None else int(length), model_name)


def binary_request(body: bytes, json_length: int, model_name: str) -> InferRequest:
    """A v2 request with the binary-data extension, BYTES inputs kept as bytes (KServe's own reading otherwise)."""
    try:
        head = json.loads(body[:json_length])
        specs = head["inputs"]
    except (ValueError, KeyError, TypeError) as error:
        raise InvalidInput(f"Unrecognized request format: {error}") from None
    binary = [s for s in specs if isinstance(s, dict) and "binary_data_size" in (s.get("parameters") or {})]
    if any(spec.get("datatype") != "BYTES" for spec in binary) or not binary:
        return InferRequest.from_bytes(body, json_length, model_name)
    inputs, start = [], json_length
    for spec in specs:
        size = (spec.get("parameters") or {}).get("binary_data_size")
        data = spec.get("data")
        if size is not None:
            data, start = list(deserialize_bytes_tensor(body[start:start + int(size)])), start + int(size)
        inputs.append(InferInput(spec["name"], spec["shape"], spec["datatype"], data=data))
    outputs = [RequestedOutput(o["name"], o.get("parameters")) for o in head.get("outputs") or []] or None
    return InferRequest(model_name, inputs, request_id=head.get("id"), parameters=head.get("parameters"),
                        request_outputs=outputs)
