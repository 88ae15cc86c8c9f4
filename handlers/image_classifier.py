"""The TorchServe adapter: maps TorchServe's context onto ImageCore (handlers/core.py).

What is TorchServe's lives here: the model folder and GPU from system_properties, model-config.yaml's
`handler:` section, the serving policy `python -m serving` wrote in TorchServe's run config (handlers/policy.py),
the request rows and their headers, per-row status codes and headers. Replies, metrics and request lines are every
engine's (handlers/answers.py, handlers/metrics.py, handlers/signals.py): TorchServe's frontend hides when a request
arrived, so here a request's latency starts when its batch reaches the worker, and its queue stage is not known.
While a rollout asks (handlers/routes.py), the live version's worker sends a share of its rows to the candidate
and keeps the photos of the next ones; each row's answer and version header are the version's that computed it.
Everything else (which artifact, its sha256, preprocessing, the request's life) is the core's.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from contract.errors import VisionExportError
from handlers import metrics
from handlers.answers import Reply, reply
from handlers.core import ImageCore
from handlers.opening import GPU, device_of, open_archive
from handlers.policy import worker_policy
from handlers.request import JSON_TYPE, ImageRequest, request_id_of
from handlers.routes import Forwarded, WorkerRoutes
from runtime import IntegrityError

logger = logging.getLogger(__name__)

DESCRIBE_HEADER = "describe"  # set by TorchServe's management API on GET /models/NAME?customized=true
# TorchServe's frontend sets X-Request-ID on every answer to the id it made for the request, over any header the
# handler set (NettyUtils.sendHttpResponse): the id of our error body and log line travels in a header of ours.
ID_HEADER = "X-Vision-Request-ID"


def select_device(system_properties: dict, cuda_available: Callable[[], bool] | None = None) -> torch.device:
    """cuda:{gpu_id} when TorchServe assigned a GPU and CUDA works here; CPU otherwise."""
    gpu_id = system_properties.get("gpu_id")
    if gpu_id is not None and (cuda_available or torch.cuda.is_available)():
        return torch.device(device_of(GPU, int(gpu_id)))
    return torch.device(device_of("cpu"))


class TorchServeHandler:
    def __init__(self):
        self.core: ImageCore | None = None
        self.routes: WorkerRoutes | None = None  # a rollout's canary and capture (handlers/routes.py)
        self.initialized = False

    def initialize(self, context) -> None:
        try:
            self.core = self._core(context)
        except IntegrityError as error:
            logger.error("REFUSING TO SERVE: %s", error)  # one line, found by `python -m serving`
            raise
        except VisionExportError as error:
            logger.error("cannot serve this archive: %s", error)
            raise
        self.routes = WorkerRoutes.of_worker(context.model_name, self.core.version)
        self.initialized = True

    @staticmethod
    def _core(context) -> ImageCore:
        properties = context.system_properties
        config = getattr(context, "model_yaml_config", None) or {}
        policy, source = worker_policy(context.model_name, config)
        logger.info("serving policy of %s from %s", context.model_name, source)
        return open_archive(Path(properties.get("model_dir", ".")), str(select_device(properties)), policy,
                            settings=config.get("handler"),  # TorchServe unpacked it and read its config
                            served_name=context.model_name)

    def handle(self, data: list, context) -> list:
        if _header(context, 0, DESCRIBE_HEADER) == "True":
            return [self.core.describe()]  # shown as the model's customizedMetadata

        timer = metrics.Timer()
        requests = [torchserve_request(context, index, row) for index, row in enumerate(data)]
        forwards = self.routes.route(requests) if self.routes else {}  # a canary's share, while a rollout asks
        answers = self._answer_here(sorted(set(range(len(requests))) - forwards.keys()), requests)
        by_canary = self.routes.collect(forwards) if self.routes and forwards else {}
        answers.update(self._answer_here(sorted(forwards.keys() - by_canary.keys()), requests))  # no row lost
        return [_sent(context, index, self._reply(answers.get(index), requests[index].request_id,
                                                 by_canary.get(index), timer))
                for index in range(len(requests))]

    def _answer_here(self, rows: list[int], requests: list[ImageRequest]) -> dict:
        """Those rows answered by this worker's version, by row."""
        if not rows:
            return {}
        with metrics.in_flight(self.core.served.model):
            result = self.core.run_batch([requests[index] for index in rows])
        return dict(zip(rows, result.answers))

    def _reply(self, answer, rid: str, canary: Forwarded | None, timer: metrics.Timer) -> Reply:
        """A row's reply (handlers/answers.py): this worker's answer, its metrics recorded here; or the canary's,
        naming the canary's version, whose own worker recorded it. Every row, an error too, names its version."""
        if canary is not None:
            return reply(canary.answer, replace(self.core.served, version=canary.version), rid, id_header=ID_HEADER)
        return reply(answer, self.core.served, rid, timer.seconds(), id_header=ID_HEADER)


def _sent(context, index: int, replied: Reply):
    """TorchServe's transport of a row's reply: its headers and status set on the context, its body returned."""
    if context is not None:
        for name, value in replied.headers.items():
            context.set_response_header(index, name, value)
        if replied.code != 200:
            context.set_response_status(code=replied.code, phrase=replied.body["error"][:200], idx=index)
    return replied.body


def torchserve_request(context, index: int, row) -> ImageRequest:
    """TorchServe's request row as the core's ImageRequest. TorchServe parses a JSON body (`{"body": object}`),
    decodes a text one (`{"body": str}`), and hands a form's fields by name; the id is X-Request-ID's, else
    TorchServe's own."""
    headers = _headers(context, index)
    body = row.get("body") if isinstance(row, dict) else None
    content_type = _body_type(context, index) or headers.get("content-type", "")
    request_id = request_id_of(headers, _request_id(context, index))
    if isinstance(body, dict):
        return ImageRequest(b"", JSON_TYPE, headers, body, request_id)
    if isinstance(body, str):
        return ImageRequest(body.encode(), content_type or "text/plain", headers, {}, request_id)
    if isinstance(body, (bytes, bytearray)):
        return ImageRequest(bytes(body), content_type, headers, {}, request_id)
    if body is not None:  # a JSON array, number, ...: the core says a JSON body must be an object
        return ImageRequest(json.dumps(body).encode(), JSON_TYPE, headers, {}, request_id)
    return ImageRequest(b"", content_type, headers, row if isinstance(row, dict) else {}, request_id)


def _headers(context, index: int) -> dict[str, str]:
    """The request's headers (TorchServe also files each body part's content type here, as a dict)."""
    try:
        found = context.get_all_request_header(index) or {}
    except (AttributeError, IndexError, KeyError, TypeError):  # a Context without request metadata (unit tests)
        return {}
    return {name.lower(): value for name, value in found.items() if isinstance(value, str)}


def _body_type(context, index: int) -> str:
    try:
        part = context.get_request_header(index, "body")
    except (AttributeError, IndexError, KeyError, TypeError):
        return ""
    return part.get("content-type", "") if isinstance(part, dict) else ""


def _request_id(context, index: int) -> str | None:
    try:
        return context.get_request_id(index)
    except (AttributeError, IndexError, KeyError, TypeError):
        return None


def _header(context, index: int, name: str) -> str | None:
    try:
        return context.get_request_header(index, name) or context.get_request_header(index, name.lower())
    except (AttributeError, IndexError, KeyError, TypeError):  # a Context without request metadata (unit tests)
        return None
