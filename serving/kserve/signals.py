"""The KServe engine's signals (docs/observability.md): every answer carries an X-Request-ID (the client's, or
one made here and handed on to the model as if the client had sent it), each prediction is timed from arrival
to answer into handlers/metrics.py's histograms, and three routes beside KServe's own:

    GET /metrics       every process's metrics (the server's and its worker pool's, handlers/metrics.py), in place
                       of KServe's route, which shows the server process's default registry only
    GET /health/live   200 while the server process answers
    GET /health/ready  200 when every model has a worker that can answer now, else 503 naming what is missing
"""

from __future__ import annotations

import re
from collections.abc import Callable

from fastapi.responses import JSONResponse, Response

from handlers import metrics, signals
from handlers.metrics import ServedModel

LIVE_ROUTE = "/health/live"
READY_ROUTE = "/health/ready"
METRICS_ROUTE = "/metrics"
HEADER = signals.REQUEST_ID_HEADER.lower().encode()
PREDICTION = re.compile(r"^/v[12]/models/([^/:]+)(?::predict|/infer)$")  # the routes a prediction takes


def model_of(path: str) -> str | None:
    """The model a prediction route names (None: not a prediction)."""
    match = PREDICTION.match(path)
    return match.group(1) if match else None


class RequestSignals:
    """ASGI middleware: the request id on the way in and out, the latency and code of each prediction."""

    def __init__(self, app, served_of: Callable[[str], ServedModel | None]):
        self.app = app
        self.served_of = served_of

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = next((value.decode("latin-1") for name, value in scope["headers"] if name == HEADER), None)
        rid = signals.request_id(given)
        if rid and rid != given:  # the model reads the id from the request's headers (handlers/request.py)
            headers = [(name, value) for name, value in scope["headers"] if name != HEADER]
            scope = {**scope, "headers": [*headers, (HEADER, rid.encode())]}
        timer, status = metrics.Timer(), [500]

        async def answer(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                if rid:
                    message = {**message, "headers": [*message.get("headers", []), (HEADER, rid.encode())]}
            await send(message)

        model = model_of(scope["path"])
        if model is None:
            return await self.app(scope, receive, answer)
        with metrics.in_flight(model):
            try:
                await self.app(scope, receive, answer)
            finally:
                seconds, served = timer.seconds(), self.served_of(model)
                # KServe's front is this middleware; a name nobody serves is no label of its own
                metrics.observe_front(model if served is not None else metrics.UNKNOWN_MODEL, status[0], seconds)
                if served is not None:
                    metrics.observe_request(served, status[0], seconds)


def request_id_of(request) -> str:
    """The id RequestSignals gave this request (for error bodies)."""
    return request.headers.get(signals.REQUEST_ID_HEADER, "")


async def metrics_route() -> Response:
    return Response(metrics.exposition(), media_type=metrics.CONTENT_TYPE)


async def live_route() -> JSONResponse:
    return JSONResponse({"live": True})


def answering(model) -> str | None:
    """Why model cannot answer now (None: it can): not loaded, or a worker pool with no live worker."""
    if not model.ready or model.core is None:
        return f"{model.name}: not loaded"
    why = getattr(model.core, "not_answering", lambda: None)()
    return f"{model.name}: {why}" if why else None


def ready_answer(models: list) -> JSONResponse:
    missing = [why for why in map(answering, models) if why]
    if missing or not models:
        return JSONResponse({"ready": False, "why": missing or ["no model registered"]}, status_code=503)
    return JSONResponse({"ready": True, "models": [model.name for model in models]})
