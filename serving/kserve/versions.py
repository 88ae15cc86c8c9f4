"""Versions of a model in our KServe ModelServer (what `python -m serving rollout` drives, serving/kserve/switchboard.py):
another version of NAME loaded from the model store beside the live one and registered as NAME.vN (so KServe's
own routes ask it directly: /v1/models/NAME.vN:predict), NAME's route switched to it, the old one unloaded once the
requests it holds are answered. Loopback clients only, whatever address the server binds (a container's 0.0.0.0):
the routes change what is served, as TorchServe's management API does.

  GET    /rollout/NAME              {"default": "v1", "loaded": ["v1", "v2"]}
  POST   /rollout/NAME/vN           load NAME.vN.mar beside (answers once its first worker runs: the live pool's spare)
  PUT    /rollout/NAME/vN/default   NAME's requests go to vN from now on
  PUT    /rollout/NAME/vN/canary?percent=P   P % of NAME's requests go to vN (0 ends it); GET NAME reports it
  PUT    /rollout/NAME/capture?count=N       keep the photos of NAME's next N requests (0 stops and forgets them)
  GET    /rollout/NAME/captured              {"captured": [{"id": request id, "b64": photo}, ...]}
  DELETE /rollout/NAME/vN           unload vN (not the default) once it drained
"""

from __future__ import annotations

import asyncio
import base64
import logging
import uuid
from collections import Counter
from dataclasses import dataclass

from fastapi import HTTPException

from contract.errors import VisionExportError
from contract.versions import archive_name, parse_label
from handlers.kserve_model import KServeModel, rows_of
from handlers.request import REQUEST_ID_HEADER
from handlers.request_body import image_of
from handlers.request_error import RequestError
from handlers.routing import FORWARD_TIMEOUT_S, CanaryShare, Capture, Outcome, ended, outcome_of_status
from serving.kserve.pool import WorkerPool

logger = logging.getLogger("serving.kserve")

ROUTE = "/rollout/{name}"
SETTLE_POLL_S = 0.05  # how often an ending canary looks whether the requests it holds were answered
DRAIN_TIMEOUT_S = 120  # the old version's requests in hand are answered within this, or it unloads anyway


@dataclass
class Canary:
    """A version loaded beside the default that answers a share of the name's requests, as the one routing policy
    says (handlers/routing.py): what it serves is the client's answer; a request it fails, hangs on or declines is
    counted and answered by the live version."""

    model: VersionedModel
    share: CanaryShare

    def report(self) -> dict:
        return {"label": self.share.label, "percent": self.share.percent, **ended(self.share.counts.as_dict())}

    async def answer(self, live, payload, headers, response_headers):
        """The canary's answer, or live's (an awaitable function) where it did not serve."""
        async def forward() -> tuple[Outcome, object]:
            try:
                return Outcome.SERVED, await self.model.predict(payload, headers, response_headers)
            except RequestError as error:  # the client's bad request (4xx), or the candidate's workers broken (5xx)
                return outcome_of_status(error.code), None
        return await self.share.answer(request_id_in(headers), forward, live)


def request_id_in(headers) -> str:
    return next((value for key, value in (headers or {}).items() if key.lower() == REQUEST_ID_HEADER.lower()), "")


def keep_photos(capture: Capture, model: KServeModel, payload, headers) -> None:
    """The request's photos kept, parsed apart from its answer: one the request core would refuse is not kept."""
    try:
        rows = rows_of(payload, model.core.TASK, headers)
        photos = [(row.request_id + (f"#{index}" if len(rows) > 1 else ""), image_of(row))
                  for index, row in enumerate(rows)]
    except RequestError:
        return
    capture.keep(photos)


class VersionedModel(KServeModel):
    """A version of a model as our server serves it: KServe calls its predict, which asks the server's versions
    (Versions.predict) who answers; its own answer is KServeModel's predict (answer)."""

    versions: Versions  # the server's, handed over when they adopt or load it

    async def predict(self, payload, headers: dict | None = None, response_headers: dict | None = None):
        return await self.versions.predict(self, payload, headers, response_headers)

    async def answer(self, payload, headers: dict | None = None, response_headers: dict | None = None):
        return await super().predict(payload, headers, response_headers)


class Versions:
    def __init__(self, settings, make_model):
        self.settings = settings
        # (archive, unpacked folder, model's name, the live version's pool or None) -> the VersionedModel, loaded
        self.make_model = make_model
        self.loaded: dict[str, dict[str, VersionedModel]] = {}
        self.in_flight: Counter = Counter()
        self.canaries: dict[str, Canary] = {}  # name -> the version that takes a share of its requests
        self.captures: dict[str, Capture] = {}  # name -> the photos of its next requests, kept

    def adopt(self, model: VersionedModel, label: str | None = None) -> None:
        """A model the server serves (one it started with: under its archive's version): its requests come here."""
        model.versions = self
        self.loaded.setdefault(model.name, {})[label or model.version] = model

    async def predict(self, model: VersionedModel, payload, headers, response_headers):
        """A request KServe gave the model: its photos kept while a capture has room, a canary's share sent to the
        canary, the rest answered by the model itself, counted while it holds them (what a drain waits on)."""
        capture = self.captures.get(model.name)
        if capture is not None and capture.room:
            keep_photos(capture, model, payload, headers)

        async def live():
            self.in_flight[id(model)] += 1
            try:
                return await model.answer(payload, headers, response_headers)
            finally:
                self.in_flight[id(model)] -= 1
        canary = self.canaries.get(model.name)
        if canary is not None and canary.model is not model and canary.share.takes():
            return await canary.answer(live, payload, headers, response_headers)
        return await live()

    def default(self, registry, name: str) -> str:
        model = registry.get_model(name)
        if model is None:
            raise HTTPException(404, f"no model {name}")
        return model.version

    async def load(self, registry, name: str, label: str) -> None:
        if label in self.loaded.get(name, {}):
            raise HTTPException(409, f"{name} {label} is loaded already")
        archive = self.settings.model_store / archive_name(name, parse_label(label))
        if not archive.is_file():
            raise HTTPException(404, f"{archive} not in the model store")
        folder = self.settings.unpacked(f"{name}.{label}")
        lender = self.live_pool(registry, name)  # its spare, imports done, becomes the new version's first worker
        try:
            model = await asyncio.get_running_loop().run_in_executor(None, self.make_model, archive, folder, name,
                                                                     lender)
        except VisionExportError as error:
            raise HTTPException(422, f"{name} {label} cannot be served: {error}") from None
        self.adopt(model, label)
        registry.update(model, f"{name}.{label}")  # asked directly at /v1/models/NAME.vN:predict
        logger.info("%s %s loaded beside %s", name, label, self.default(registry, name))

    def live_pool(self, registry, name: str) -> WorkerPool | None:
        """The worker pool of the version name's requests go to (None: its core runs in this process)."""
        live = self.loaded.get(name, {}).get(self.default(registry, name))
        return live.core if live is not None and isinstance(live.core, WorkerPool) else None

    def set_default(self, registry, name: str, label: str) -> None:
        model = self.loaded.get(name, {}).get(label)
        if model is None:
            raise HTTPException(404, f"{name} {label} is not loaded")
        if isinstance(model.core, WorkerPool):
            model.core.essential = True  # the server serves by it now
        registry.update(model, name)
        self.canaries.pop(name, None)
        self.captures.pop(name, None)
        logger.info("%s: %s is the default", name, label)

    async def canary(self, registry, name: str, label: str, percent: float) -> dict:
        """percent % of name's requests to that version from now on (0: none); the canary's report."""
        model = self.loaded.get(name, {}).get(label)
        if model is None:
            raise HTTPException(404, f"{name} {label} is not loaded")
        if label == self.default(registry, name):
            raise HTTPException(409, f"{label} is {name}'s default already")
        if not 0 <= percent < 100:
            raise HTTPException(422, f"percent={percent}: a canary takes more than 0 and less than 100 %")
        if percent == 0:
            return await self.end_canary(name)
        self.canaries[name] = Canary(model, CanaryShare(uuid.uuid4().hex, label, percent))
        logger.info("%s: %s takes %s %% of its requests", name, label, percent)
        return self.canaries[name].report()

    async def end_canary(self, name: str) -> dict:
        """The canary's report once no new request goes to it and those it holds were answered, or their bound
        passed: a request still held then is one it did not answer in its time (handlers/routing.py)."""
        ended = self.canaries.pop(name, None)
        if ended is None:
            return {}
        deadline = asyncio.get_running_loop().time() + FORWARD_TIMEOUT_S
        while ended.share.counts.in_flight > 0 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(SETTLE_POLL_S)
        return ended.report()

    def capture(self, name: str, count: int) -> None:
        if name not in self.loaded:
            raise HTTPException(404, f"no model {name}")
        if count < 0:
            raise HTTPException(422, f"count={count}: the number of requests to keep, 0 to stop")
        if count == 0:
            self.captures.pop(name, None)
        else:
            self.captures[name] = Capture(count)

    def captured(self, name: str) -> list[dict]:
        capture = self.captures.get(name)
        kept = capture.kept if capture else []
        return [{"id": request_id, "b64": base64.b64encode(photo).decode()} for request_id, photo in kept]

    async def unload(self, registry, name: str, label: str) -> None:
        if label == self.default(registry, name):
            raise HTTPException(409, f"{label} is {name}'s default: switch first")
        model = self.loaded.get(name, {}).pop(label, None)
        if model is None:
            raise HTTPException(404, f"{name} {label} is not loaded")
        if name in self.canaries and self.canaries[name].model is model:
            del self.canaries[name]  # its share goes back to the default before it drains
        registry.models.pop(f"{name}.{label}", None)
        deadline = asyncio.get_running_loop().time() + DRAIN_TIMEOUT_S
        while self.in_flight[id(model)] and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        model.stop()
        logger.info("%s %s unloaded", name, label)


def add_routes(app, versions: Versions, registry) -> None:
    """The routes above, on KServe's app (serving/kserve/app.py), over the server's versions and its models'
    registry. Who may call them is decided once, for every route, by serving/kserve/auth.py's middleware."""

    async def describe(name: str) -> dict:
        canary = versions.canaries.get(name)
        return {"default": versions.default(registry, name), "loaded": sorted(versions.loaded.get(name, {})),
                "canary": canary.report() if canary else None}

    async def load(name: str, label: str) -> dict:
        await versions.load(registry, name, label)
        return {"loaded": label}

    async def set_default(name: str, label: str) -> dict:
        versions.set_default(registry, name, label)
        return {"default": label}

    async def canary(name: str, label: str, percent: float) -> dict:
        return await versions.canary(registry, name, label, percent)

    async def unload(name: str, label: str) -> dict:
        await versions.unload(registry, name, label)
        return {"unloaded": label}

    async def capture(name: str, count: int) -> dict:
        versions.capture(name, count)
        return {"capturing": count}

    async def captured(name: str) -> dict:
        return {"captured": versions.captured(name)}

    app.add_api_route(ROUTE, describe, methods=["GET"])
    app.add_api_route(ROUTE + "/capture", capture, methods=["PUT"])  # before /{label}: "capture" is no label
    app.add_api_route(ROUTE + "/captured", captured, methods=["GET"])
    app.add_api_route(ROUTE + "/{label}", load, methods=["POST"])
    app.add_api_route(ROUTE + "/{label}/default", set_default, methods=["PUT"])
    app.add_api_route(ROUTE + "/{label}/canary", canary, methods=["PUT"])
    app.add_api_route(ROUTE + "/{label}", unload, methods=["DELETE"])
