"""The TorchServe handler: serves the artifact the archive's model-config.yaml names.

A request's life: decode (bytes -> image tensor, per request, errors stay with their request) -> batch
(stack what decoded) -> predict (backend forward + softmax) -> encode (top-k labels as JSON).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from handlers.backends import open_backend, select_device, threads_per_worker
from handlers.decode import RequestError, decode_image, image_bytes, preprocess, requested_topk

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
LABELS = "index_to_name.json"
DEFAULT_TOPK = 5
TOPK_HEADER = "X-TopK"


class ImageClassifier:
    def __init__(self):
        self.initialized = False

    # ------------------------------------------------------------ set-up
    def initialize(self, context) -> None:
        properties = context.system_properties
        model_dir = Path(properties.get("model_dir", "."))
        config = dict(getattr(context, "model_yaml_config", None) or {})
        settings = config.get("handler", {}) or {}
        self.manifest = json.loads((model_dir / MANIFEST).read_text())
        self.artifact = settings.get("artifact") or self.manifest["serving"]["default_artifact"]
        if self.artifact not in self.manifest["artifacts"]:
            raise ValueError(f"model-config.yaml handler.artifact={self.artifact!r} is not in the manifest "
                             f"(has: {', '.join(self.manifest['artifacts'])})")
        self.topk_default = int(settings.get("topk", DEFAULT_TOPK))
        self.labels = self._labels(model_dir)
        self.device = select_device(properties)
        workers = int(config.get("maxWorkers") or config.get("minWorkers") or 1)
        # handler.threads overrides the safe default (the benchmark uses it to show oversubscription)
        self.threads = int(settings.get("threads") or threads_per_worker(workers))
        if self.device.type == "cpu":
            torch.set_num_threads(self.threads)
        self.backend = open_backend(self.manifest["artifacts"][self.artifact], model_dir, self.device,
                                    fp16=bool(settings.get("fp16", False)), threads=self.threads)
        self.model_name = self.manifest["model"]["name"]
        logger.info("serving %s (%s) on %s with %d thread(s)", self.model_name, self.artifact, self.device,
                    self.threads)
        self.initialized = True

    @staticmethod
    def _labels(model_dir: Path) -> dict[int, str]:
        path = model_dir / LABELS
        if not path.is_file():
            return {}
        return {int(k): v for k, v in json.loads(path.read_text()).items()}

    # ------------------------------------------------------------ the request's life
    def decode(self, row: dict, header_topk: str | None) -> tuple[torch.Tensor, int]:
        topk = requested_topk(row, header_topk, self.topk_default)
        return preprocess(decode_image(image_bytes(row))), topk

    @staticmethod
    def batch(images: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(images)

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.backend.predict(batch).float(), dim=1)

    def encode(self, probabilities: torch.Tensor, k: int) -> dict:
        values, indices = probabilities.topk(min(k, probabilities.numel()))
        return {
            "predictions": [{"label": self.labels.get(int(i), str(int(i))), "index": int(i),
                             "probability": round(float(p), 6)} for p, i in zip(values, indices)],
            "model": self.model_name,
            "artifact": self.artifact,
        }

    # ------------------------------------------------------------ TorchServe's entry
    def handle(self, data: list, context) -> list:
        started = time.perf_counter()
        responses: list = [None] * len(data)
        decoded: list[tuple[int, torch.Tensor, int]] = []
        for index, row in enumerate(data):
            try:
                image, k = self.decode(row, _header(context, index, TOPK_HEADER))
                decoded.append((index, image, k))
            except RequestError as error:
                responses[index] = self._error(context, index, error)
            except Exception as error:  # never let one request take the batch or the worker down
                logger.exception("unexpected decode failure")
                responses[index] = self._error(context, index, RequestError(400, f"cannot decode image: {error}"))
        if decoded:
            try:
                probabilities = self.predict(self.batch([image for _, image, _ in decoded]))
                for (index, _, k), row_probabilities in zip(decoded, probabilities):
                    responses[index] = self.encode(row_probabilities, k)
            except Exception as error:
                logger.exception("inference failed")
                for index, _, _ in decoded:
                    responses[index] = self._error(context, index, RequestError(500, f"inference failed: {error}"))
        logger.info("batch of %d handled in %.1f ms", len(data), (time.perf_counter() - started) * 1000)
        return responses

    @staticmethod
    def _error(context, index: int, error: RequestError) -> dict:
        if context is not None:
            context.set_response_status(code=error.code, phrase=error.message[:200], idx=index)
        return error.as_response()


def _header(context, index: int, name: str) -> str | None:
    try:
        return context.get_request_header(index, name) or context.get_request_header(index, name.lower())
    except Exception:  # a Context without request metadata (unit tests, TorchServe internals)
        return None
