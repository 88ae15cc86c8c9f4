"""What we set in KServe's ModelServer, and why each cannot be a plain argument of it (kserve 0.21):

- the bind address: KServe's REST server always binds 0.0.0.0 (right in a pod, wrong on a laptop); ours binds
  the configured host, loopback by default;
- a bad image's status: KServe maps only its own errors (InvalidInput: 400, else 500); our RequestError keeps
  its 400/413/415 and its reason, as on the TorchServe path;
- raw bytes in v2: KServe turns a binary-data BYTES input into UTF-8 text, so a JPEG sent as tritonclient sends
  it fails with a 500 ("Failed to encode ... using UTF-8"); our data plane keeps such inputs as bytes (and
  reads tritonclient's JSON-only requests, which come without a Content-Type, as JSON);
- time to start a worker: KServe's parent kills a worker that has not answered its liveness ping within 5 s of
  being started, and a spawned worker answers only once it has imported torch, ONNX Runtime and KServe and
  unpickled its models: 11 s on a busy 2-core machine, so every worker was killed and started again, forever
  (the server never answered). A worker gets WORKER_START_GRACE_S to answer its first ping;
- a listening socket per worker: KServe's workers share one, and the first worker that wakes accepts every
  connection waiting (asyncio accepts up to its backlog at once), so a client that opens its keep-alive
  connections together (hey, a load balancer's pool) is served by one worker while the others idle: measured,
  one of two workers did all the work at concurrency 8 (docs/serving-overhead.md). With SO_REUSEPORT each
  worker listens on a socket of its own and the kernel spreads new connections over them.

KServe builds its REST server from a module-level name, in this process and (pickled) in each spawned worker:
install() points that name at our subclass, which carries the first two into every worker.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import time

from fastapi.responses import JSONResponse
from kserve.errors import InvalidInput
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput, deserialize_bytes_tensor
from kserve.protocol.rest.multiprocess.server import RESTServerProcess
from kserve.protocol.rest.server import RESTServer

from handlers.kserve_model import configure_logging
from handlers.request_error import RequestError

logger = logging.getLogger("serving.kserve")
WORKER_START_GRACE_S = 120  # a spawned worker's time to import, unpickle and open its models before pings count

DESCRIPTION_ROUTE = "/v2/models/{model_name}/description"  # ours: which form serves on this machine, and why
CONTENT_LENGTH_HEADER = "inference-header-content-length"  # the binary-data extension: the JSON part's length
_bind_host = "127.0.0.1"  # set by install(); read when KServe makes its REST server


async def request_error_response(_, error: RequestError) -> JSONResponse:
    return JSONResponse(status_code=error.code, content=error.as_response())


def port_taken(host: str, port: int) -> OSError | None:
    """The error binding host:port alone gives (another server holds it), or None: checked before the workers'
    SO_REUSEPORT sockets, which would otherwise share a port with any other such socket of this user."""
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
    except OSError as error:
        return error
    finally:
        probe.close()
    return None


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT, as uvicorn binds one otherwise (SO_REUSEADDR, inheritable)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


class OurRESTServer(RESTServer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.config.host = _bind_host
        self.config.bind_socket = self.bind_first_socket  # the multiprocess parent's, before its workers start

    def bind_first_socket(self) -> socket.socket:
        """The parent's socket: the port checked free, then bound with SO_REUSEPORT so each worker can bind its
        own beside it (the parent never listens on it, so the kernel hands it no connection)."""
        host, port = self.config.host, self.config.port
        taken = port_taken(host, port)
        if taken is not None:
            logger.error("cannot serve on %s:%d: %s", host, port, taken)
            sys.exit(3)  # uvicorn's STARTUP_FAILURE, as its own bind_socket exits
        return reuseport_socket(host, port)

    def run(self, sockets=None):  # a spawned worker's entry (sockets: the parent's); one worker: no sockets
        configure_logging()
        for model in self.dataplane.model_registry.get_models().values():
            if hasattr(model, "load_copy"):
                model.load_copy()  # answering KServe's liveness pings already (handlers/kserve_model.py)
        super().run([reuseport_socket(self.config.host, self.config.port)] if sockets else sockets)

    def _register_endpoints(self, app) -> None:
        super()._register_endpoints(app)
        app.add_api_route(DESCRIPTION_ROUTE, self.description, methods=["GET"])

    async def description(self, model_name: str) -> dict:
        """The model description: which form serves on this machine and why, the core's describe() (TorchServe
        shows the same as customizedMetadata). KServe's v2 metadata has no field for it."""
        return self.dataplane.get_model_from_registry(model_name).describe()  # unknown name: KServe's 404

    def _add_exception_handlers(self, app) -> None:
        super()._add_exception_handlers(app)
        app.add_exception_handler(RequestError, request_error_response)


class OurRESTServerProcess(RESTServerProcess):
    """KServe's worker process, whose liveness ping waits until the worker has started (or the grace is over)."""

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.answered = False
        super().start()

    def is_alive(self, timeout: float = 5) -> bool:
        if not self.answered and self._process.is_alive():
            if time.monotonic() - self.started_at < WORKER_START_GRACE_S and not self._parent_conn.poll(0):
                if not getattr(self, "pinged", False):  # one ping in flight: its pong says the worker runs
                    self._parent_conn.send(b"ping")
                    self.pinged = True
                return True
            if self._parent_conn.poll(0):
                self._parent_conn.recv()
                self.answered = True
                return True
        return super().is_alive(timeout)


class RawBytesDataPlane(DataPlane):
    def decode_inference_request(self, body, headers, model_name):
        if not isinstance(body, bytes):
            return super().decode_inference_request(body, headers, model_name)
        # tritonclient sends JSON-only requests without a Content-Type, so they arrive as bytes without the
        # header that says where the JSON ends (KServe would refuse them): then the JSON is the whole body.
        length = headers.get(CONTENT_LENGTH_HEADER)
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


def install(host: str) -> None:
    """Our REST server wherever KServe's ModelServer makes one (one worker, or N spawned ones)."""
    global _bind_host
    import kserve.model_server
    import kserve.protocol.rest.multiprocess.server as multiprocess
    _bind_host = host
    kserve.model_server.RESTServer = OurRESTServer
    multiprocess.RESTServer = OurRESTServer
    multiprocess.RESTServerProcess = OurRESTServerProcess
