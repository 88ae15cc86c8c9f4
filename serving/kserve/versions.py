"""Versions of a model in our KServe ModelServer (what `python -m serving rollout` drives, serving/rollout/kserve.py):
another version of NAME loaded from the model store beside the live one and registered as NAME.vN (so KServe's
own routes ask it directly: /v1/models/NAME.vN:predict), NAME's route switched to it, the old one unloaded once the
requests it holds are answered. Loopback clients only, whatever address the server binds (a container's 0.0.0.0):
the routes change what is served, as TorchServe's management API does.

  GET    /rollout/NAME              {"default": "v1", "loaded": ["v1", "v2"]}
  POST   /rollout/NAME/vN           load NAME.vN.mar beside (answers once its workers run)
  PUT    /rollout/NAME/vN/default   NAME's requests go to vN from now on
  DELETE /rollout/NAME/vN           unload vN (not the default) once it drained
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
from collections import Counter

from fastapi import HTTPException, Request

from contract.errors import VisionExportError
from contract.versions import archive_name, parse_label
from handlers.kserve_model import KServeModel

logger = logging.getLogger("serving.kserve")

ROUTE = "/rollout/{name}"
DRAIN_TIMEOUT_S = 120  # the old version's requests in hand are answered within this, or it unloads anyway
_state: Versions | None = None


class Versions:
    def __init__(self, settings, make_model):
        self.settings = settings
        self.make_model = make_model  # (archive, unpacked folder, model's name) -> the model, loaded
        self.loaded: dict[str, dict[str, KServeModel]] = {}
        self.in_flight: Counter = Counter()

    def adopt(self, model: KServeModel) -> None:
        """A model the server started with: its version known, its requests counted."""
        self.loaded.setdefault(model.name, {})[model.version] = self.counted(model)

    def counted(self, model: KServeModel) -> KServeModel:
        """The model's predict counts the requests it holds (what a drain waits on)."""
        predict = model.predict

        @functools.wraps(predict)
        async def counting(*args, **kwargs):
            self.in_flight[id(model)] += 1
            try:
                return await predict(*args, **kwargs)
            finally:
                self.in_flight[id(model)] -= 1
        model.predict = counting  # type: ignore[method-assign]
        return model

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
        try:
            model = await asyncio.get_running_loop().run_in_executor(None, self.make_model, archive, folder, name)
        except VisionExportError as error:
            raise HTTPException(422, f"{name} {label} cannot be served: {error}") from None
        self.loaded.setdefault(name, {})[label] = self.counted(model)
        registry.update(model, f"{name}.{label}")  # asked directly at /v1/models/NAME.vN:predict
        logger.info("%s %s loaded beside %s", name, label, self.default(registry, name))

    def set_default(self, registry, name: str, label: str) -> None:
        model = self.loaded.get(name, {}).get(label)
        if model is None:
            raise HTTPException(404, f"{name} {label} is not loaded")
        registry.update(model, name)
        logger.info("%s: %s is the default", name, label)

    async def unload(self, registry, name: str, label: str) -> None:
        if label == self.default(registry, name):
            raise HTTPException(409, f"{label} is {name}'s default: switch first")
        model = self.loaded.get(name, {}).pop(label, None)
        if model is None:
            raise HTTPException(404, f"{name} {label} is not loaded")
        registry.models.pop(f"{name}.{label}", None)
        deadline = asyncio.get_running_loop().time() + DRAIN_TIMEOUT_S
        while self.in_flight[id(model)] and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        model.stop()
        logger.info("%s %s unloaded", name, label)


def install(settings, models: list, make_model) -> None:
    global _state
    _state = Versions(settings, make_model)
    for model in models:
        _state.adopt(model)


def add_routes(app, dataplane) -> None:
    """The routes above, on the REST server's app (serving/kserve/app.py)."""
    registry = dataplane.model_registry

    def state(request: Request) -> Versions:
        host = request.client.host if request.client else ""
        if not host or not ipaddress.ip_address(host).is_loopback:
            raise HTTPException(403, "versions are managed from the server's own machine only")
        if _state is None:
            raise HTTPException(503, "this server does not manage versions")
        return _state

    async def describe(name: str, request: Request) -> dict:
        versions = state(request)
        return {"default": versions.default(registry, name), "loaded": sorted(versions.loaded.get(name, {}))}

    async def load(name: str, label: str, request: Request) -> dict:
        await state(request).load(registry, name, label)
        return {"loaded": label}

    async def set_default(name: str, label: str, request: Request) -> dict:
        state(request).set_default(registry, name, label)
        return {"default": label}

    async def unload(name: str, label: str, request: Request) -> dict:
        await state(request).unload(registry, name, label)
        return {"unloaded": label}

    app.add_api_route(ROUTE, describe, methods=["GET"])
    app.add_api_route(ROUTE + "/{label}", load, methods=["POST"])
    app.add_api_route(ROUTE + "/{label}/default", set_default, methods=["PUT"])
    app.add_api_route(ROUTE + "/{label}", unload, methods=["DELETE"])
