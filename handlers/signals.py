"""A request's id and its log line, the same on every engine: `X-Request-ID` is taken from the request (or made
when absent or unusable), returned on its answer and in every error body, and logged with the served model's
version and form, the answer's code and the stage times of its batch, so that one request is found in the
logs by its id (docs/observability.md). The metrics themselves: handlers/metrics.py.

A log shipper reads one JSON object a line with SIGNALS_LOG_ENV=json; the default is one plain line.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence

from handlers import metrics
from handlers.metrics import ServedModel
from handlers.request import ACCEPTED_ID, REQUEST_ID_HEADER, request_id_of

REQUEST_ID_FIELD = "request_id"  # the field of an error body that carries it
SIGNALS_LOG_ENV = "VISION_LOG_FORMAT"  # "json": one JSON object a line

logger = logging.getLogger("handlers.requests")


def request_id(given: str | None) -> str:
    """The client's id when it is usable (handlers/request.py's rule), else a new one; with signals off, none."""
    if not metrics.ON and not (given and ACCEPTED_ID.fullmatch(given.strip())):
        return ""
    return request_id_of({REQUEST_ID_HEADER: given or ""})


def with_request_id(body: dict, rid: str) -> dict:
    """An error body ({"code", "error"}) or an answer with the request's id in it."""
    return {**body, REQUEST_ID_FIELD: rid} if rid else body


def json_lines(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(SIGNALS_LOG_ENV, "").strip().lower() == "json"


JSON_LINES = json_lines()


def request_line(rid: str, served: ServedModel, code: int, stage_ms: Mapping[str, float],
                 rows: int = 1) -> str:
    """The line a request is logged with once its batch is answered: plain `request ID model=... version=...
    form=... code=... batch=N decode_ms=... ...`, or one JSON object."""
    fields: dict[str, object] = {"request_id": rid, **served.labels(), "code": code, "batch": rows,
                                 **{f"{stage}_ms": round(ms, 2) for stage, ms in stage_ms.items()}}
    if JSON_LINES:
        return json.dumps({"event": "request", **fields})
    return f"request {rid} " + " ".join(f"{name}={value}" for name, value in fields.items() if name != "request_id")


def log_batch(served: ServedModel, rows: Sequence[tuple[object, object]], stage_ms: Mapping[str, float]) -> None:
    """A batch the core answered: its metrics, and a line per request that has an id ((request, answer) pairs:
    an answer dict, or the RequestError of that row)."""
    metrics.observe_batch(served, len(rows), stage_ms)
    if not metrics.ON:
        return
    for request, answer in rows:
        rid = getattr(request, "request_id", "")
        if rid:
            code = getattr(answer, "code", 200)
            logger.log(logging.WARNING if code >= 500 else logging.INFO,
                       request_line(rid, served, code, stage_ms, len(rows)))
