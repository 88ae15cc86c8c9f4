"""What we set beside KServe's protocol, and why KServe's ModelServer could not take each as an argument (kserve 0.21):

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
  docs/results/2026-11-25-serving-overhead/analysis.md, docs/results/2026-11-26-kserve-balance/). We serve with one HTTP
  process, and each model with the policy's worker processes behind it (serving/kserve/pool.py): its batcher
  hands each batch to a free worker, as TorchServe's frontend does, whatever the connections.

How they are added: not into KServe's ModelServer, which offers no way for the bind address, the exception
handlers or the middleware order (it adds its own to its app when it starts, after anything added before, and
binds 0.0.0.0), but by serving KServe's protocol on an app of ours. OurModelServer composes KServe's public parts:
its ModelRepository and DataPlane (ours subclassed, above), its v1 and v2 routes (`register_v1_endpoints`,
`register_v2_endpoints`, what its own REST server calls), its error handlers (`kserve.errors`), then ours over them,
and runs the app with uvicorn on the configured host as KServe's REST server runs its own (one process, no logging
configuration of uvicorn's, KServe's keep-alive and grace period). Nothing of KServe's is reassigned or overridden;
tests/serving/kserve/test_app.py checks the names this uses and what the app answers.
"""

from __future__ import annotations

import json
import logging
import signal
from importlib import metadata

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, ORJSONResponse
from kserve import errors as kserve_errors
from kserve.errors import InferenceError, InvalidInput
from kserve.model_repository import ModelRepository
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput, deserialize_bytes_tensor
from kserve.protocol.model_repository_extension import ModelRepositoryExtension
from kserve.protocol.rest.v1_endpoints import register_v1_endpoints
from kserve.protocol.rest.v2_endpoints import register_v2_endpoints

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
DOCS_PATH = "/docs"  # KServe's own place for its OpenAPI page (Swagger UI), beside its /openapi.json
TITLE = "KServe ModelServer"  # the OpenAPI page's title, as KServe's own app is named
KEEP_ALIVE_S = 65  # KServe's REST server keeps an idle connection this long (uvicorn's own default: 5 s)
GRACE_PERIOD_S = 30  # KServe's: on SIGTERM, requests in flight get this long to finish
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # uvicorn's: each stops the server gracefully

# KServe's error handlers, as its REST server adds them; ours (OurModelServer.add_exception_handlers) replace the
# InferenceError and Exception ones
KSERVE_ERROR_HANDLERS = (
    (kserve_errors.InvalidInput, kserve_errors.invalid_input_handler),
    (kserve_errors.InferenceError, kserve_errors.inference_error_handler),
    (kserve_errors.ModelNotFound, kserve_errors.model_not_found_handler),
    (kserve_errors.ModelNotReady, kserve_errors.model_not_ready_handler),
    (NotImplementedError, kserve_errors.not_implemented_error_handler),
    (kserve_errors.UnsupportedProtocol, kserve_errors.unsupported_protocol_error_handler),
    (kserve_errors.ServerNotLive, kserve_errors.server_not_live_handler),
    (kserve_errors.ServerNotReady, kserve_errors.server_not_ready_handler),
    (Exception, kserve_errors.generic_exception_handler),
)


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


class OurModelServer:
    """KServe's protocol on an app of ours (the module docstring): one HTTP process, our routes, middleware,
    exception handlers and data plane, bound to `host`."""

    def __init__(self, host: str, versions: Versions, http_port: int):
        self.host = host
        self.http_port = http_port
        self.versions = versions
        self.registered_models = ModelRepository()
        self.dataplane = RawBytesDataPlane(model_registry=self.registered_models)
        self.app = self.application()

    def application(self) -> FastAPI:
        app = FastAPI(title=TITLE, version=metadata.version("kserve"), docs_url=DOCS_PATH, redoc_url=None,
                      default_response_class=ORJSONResponse)
        self.add_routes(app)
        app.add_api_route("/", self.dataplane.live, methods=["GET"])  # KServe's root: its liveness
        extension = ModelRepositoryExtension(model_registry=self.registered_models)
        register_v1_endpoints(app, self.dataplane, extension)
        register_v2_endpoints(app, self.dataplane, extension)
        for error, handler in KSERVE_ERROR_HANDLERS:
            app.add_exception_handler(error, handler)
        self.add_exception_handlers(app)
        self.add_middlewares(app)
        return app

    def start(self, models: list) -> None:
        """Serves models until SIGTERM or SIGINT (uvicorn's own handling: requests in flight finish), then unloads
        them (their worker pools stop)."""
        for model in models:
            self.registered_models.update(model)
        server = uvicorn.Server(uvicorn.Config(self.app, host=self.host, port=self.http_port, log_config=None,
                                              timeout_keep_alive=KEEP_ALIVE_S,
                                              timeout_graceful_shutdown=GRACE_PERIOD_S))
        # uvicorn's own stop, before its run takes the signals (one sent meanwhile still stops it) and after (it
        # raises the signal again once stopped, which must return from run() for the models to be unloaded)
        for stop in STOP_SIGNALS:
            signal.signal(stop, server.handle_exit)
        try:
            server.run()
        finally:
            for name in list(self.registered_models.get_models()):
                self.registered_models.unload(name)

    def add_routes(self, app) -> None:
        """Ours, before KServe's: our /metrics, liveness and readiness are matched first."""
        app.add_api_route(signals.METRICS_ROUTE, signals.metrics_route, methods=["GET"])
        app.add_api_route(DESCRIPTION_ROUTE, self.description, methods=["GET"])
        add_routes(app, self.versions, self.registered_models)  # rollout's routes, loopback clients only
        app.add_api_route(signals.LIVE_ROUTE, signals.live_route, methods=["GET"])
        app.add_api_route(signals.READY_ROUTE, self.ready, methods=["GET"])

    def add_middlewares(self, app) -> None:
        """The last added is the outermost."""
        app.add_middleware(BodyLimit)  # inside RequestSignals: a refused body is answered with its id and counted
        app.add_middleware(auth.TokenAuth)  # outside BodyLimit: a caller without its key is refused unread
        app.add_middleware(signals.RequestSignals, served_of=self.served_of)  # the outermost: sees every answer

    def add_exception_handlers(self, app) -> None:
        """After KServe's: ours replace its InferenceError and Exception handlers."""
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
