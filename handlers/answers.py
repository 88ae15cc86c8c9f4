"""A request's reply, decided once for every engine: the request core's answer (or a row's RequestError, or a
failure nobody expected) becomes the JSON body, the status code and the headers the client gets, and the request's
latency and failure are recorded (handlers/metrics.py). Each engine keeps only its transport: TorchServe sets each
row's headers and status on its context (handlers/image_classifier.py), KServe returns the body and headers from
its model and answers errors from its exception handlers (handlers/kserve_model.py, serving/kserve/app.py), Ray's
deployment makes a Starlette response (serving/ray/deployment.py).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from contract.versions import VERSION_HEADER
from handlers import metrics
from handlers.logs import SERVED_BY
from handlers.metrics import ServedModel
from handlers.request_error import RequestError
from handlers.signals import with_request_id

logger = logging.getLogger(__name__)


class Reply(NamedTuple):
    """What an engine sends for one request (a tuple: Ray hands a canary's reply between replicas as it is)."""

    body: Any  # the answer (or the engine's envelope of several), or the error body {"code", "error", "request_id"}
    code: int
    headers: dict[str, str]


def reply(answer: Any, served: ServedModel | None, rid: str, seconds: float | None = None, *,
          id_header: str | None = None, served_by: str | None = None) -> Reply:
    """An answer is sent as it is with 200; a RequestError as its JSON error body, the request's id in it, with its
    status. Headers: the version that computed it (an error's too), who served it (`served_by`), and the request
    id under `id_header` where the engine's front does not return it itself (TorchServe's frontend overwrites
    X-Request-ID). `seconds` since the request arrived: its latency and, for a 4xx or 5xx, its failure recorded under
    `served`'s labels; None where they are recorded elsewhere: at KServe's front (serving/kserve/signals.py), or by
    the version that computed a canary's answer. `served` None: a model nobody serves, no version to name."""
    code = answer.code if isinstance(answer, RequestError) else 200
    if seconds is not None and served is not None:
        metrics.observe_request(served, code, seconds)
    headers = {VERSION_HEADER: served.version} if served is not None else {}
    if served_by:
        headers[SERVED_BY] = served_by
    if id_header and rid:
        headers[id_header] = rid
    body = with_request_id(answer.as_response(), rid) if isinstance(answer, RequestError) else answer
    return Reply(body, code, headers)


def failure(error: BaseException, served: ServedModel | None, rid: str, seconds: float | None = None, *,
            id_header: str | None = None, served_by: str | None = None) -> Reply:
    """A failure nobody expected while answering: logged with its traceback under the request's id, replied (as
    reply() does) with a 500 that says where the reason is, not what it was (it may name files, addresses or a
    worker's state)."""
    logger.error("request %s failed: %s: %s", rid or "(no id)", type(error).__name__, error, exc_info=error)
    return reply(RequestError.server_failure(rid), served, rid, seconds, id_header=id_header, served_by=served_by)
