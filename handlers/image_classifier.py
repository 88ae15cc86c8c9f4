"""The TorchServe handler: serves the artifact the archive's model-config.yaml names, exactly as proven.

Set-up verifies the artifact's sha256 against the archive's manifest.json, reads the serving contract
from the manifest (preprocessing, labels, model name), and opens the artifact through runtime/ (the same
backends parity ran). A request's life: decode (bytes -> image, per request: errors stay with their
request) -> preprocess (the weights' own transform) -> batch -> predict (backend + softmax) -> encode
(top-k labels as JSON). Each stage's time is logged and reported as a TorchServe metric.
"""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from handlers.decode import image_bytes, requested_topk
from handlers.policy import THREADS_ENV, machine_policy, this_machine
from models.errors import VisionExportError
from runtime import IntegrityError, RunOptions, open_artifact, verify_file
from runtime.images import ImageContract, RequestError, decode_image, preprocess

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
DEFAULT_TOPK = 5
TOPK_HEADER = "X-TopK"
STAGES = ("decode", "preprocess", "inference", "encode")
METRIC_NAMES = {stage: f"{stage.capitalize()}Time" for stage in STAGES}  # ms per batch, Prometheus gauges


class HandlerSetupError(VisionExportError):
    """The archive cannot be served as configured; the worker refuses to start with this message."""


def select_device(system_properties: dict, cuda_available: Callable[[], bool] | None = None) -> torch.device:
    """cuda:{gpu_id} when TorchServe assigned a GPU and CUDA works here; CPU otherwise."""
    gpu_id = system_properties.get("gpu_id")
    if gpu_id is not None and (cuda_available or torch.cuda.is_available)():
        return torch.device(f"cuda:{int(gpu_id)}")
    return torch.device("cpu")


def worker_threads(settings: dict, environ: dict | None = None) -> int:
    """handler.threads pinned in the archive > THREADS_ENV from `python -m serving` > this machine's policy."""
    environ = os.environ if environ is None else environ
    pinned = settings.get("threads") or environ.get(THREADS_ENV)
    if pinned:
        return int(pinned)
    return machine_policy(*this_machine()).threads_per_worker


@dataclass
class StageTimes:
    ms: dict = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    @contextmanager
    def measure(self, stage: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.ms[stage] += (time.perf_counter() - start) * 1000


class ImageClassifier:
    def __init__(self):
        self.initialized = False

    # ------------------------------------------------------------ set-up
    def initialize(self, context) -> None:
        try:
            self._initialize(context)
        except IntegrityError as error:
            logger.error("REFUSING TO SERVE: %s", error)  # one line, found by `python -m serving`
            raise
        except (VisionExportError, KeyError, ValueError) as error:
            logger.error("cannot serve this archive: %s", error)
            raise

    def _initialize(self, context) -> None:
        properties = context.system_properties
        model_dir = Path(properties.get("model_dir", "."))
        config = dict(getattr(context, "model_yaml_config", None) or {})
        settings = config.get("handler", {}) or {}
        self.manifest = json.loads((model_dir / MANIFEST).read_text())
        self.artifact = settings.get("artifact") or self.manifest["serving"]["default_artifact"]
        record = self.manifest["artifacts"].get(self.artifact)
        if record is None:
            raise HandlerSetupError(f"model-config.yaml handler.artifact={self.artifact!r} is not in the manifest "
                                    f"(has: {', '.join(self.manifest['artifacts'])})")
        verify_file(model_dir / record["path"], record["sha256"],
                    "the archive was modified or truncated after export; rebuild it with `python -m export`")
        self.contract = ImageContract.from_manifest(self.manifest["input"].get("preprocessing"))
        self.labels = self._labels(model_dir)
        self.model_name = self.manifest["model"]["name"]
        self.topk_default = int(settings.get("topk", DEFAULT_TOPK))
        self.simulate_hang_s = float(settings.get("simulate_hang_s", 0))  # tests of TorchServe's timeout only
        self.device = select_device(properties)
        self.threads = worker_threads(settings)
        # torch's own pool runs the resize and crop even when ONNX Runtime runs the model; left at every core
        # it competes with the other workers' inference. Pinned to the worker's share, served resnet50 (fp32
        # ONNX, 2 workers) went from 13.5 to 15.8 req/s at concurrency 8 (python -m serving.bench, one run).
        torch.set_num_threads(self.threads)
        # a bf16/fp16 variant records how it must run; an int8 ONNX runs as-is (its run_precision is fp32)
        precision = record.get("run_precision") or ("fp16" if settings.get("fp16") and self.device.type == "cuda"
                                                    else "fp32")
        self.backend = open_artifact(record["format"], model_dir / record["path"],
                                     RunOptions(device=str(self.device), threads=self.threads, precision=precision),
                                     name=self.artifact)
        logger.info("serving %s (%s, sha256 verified) on %s with %d thread(s), %s; preprocessing: resize %d, crop %s",
                    self.model_name, self.artifact, self.device, self.threads, precision, self.contract.resize,
                    "x".join(map(str, self.contract.crop)))
        self.initialized = True

    def _labels(self, model_dir: Path) -> dict[int, str]:
        name = self.manifest["output"].get("labels")
        if not name:
            logger.warning("the manifest names no labels file: answers carry class indices as labels")
            return {}
        path = model_dir / name
        if not path.is_file():
            raise HandlerSetupError(f"the manifest names labels file {name} but the archive has none; "
                                    "rebuild the archive with `python -m export`")
        return {int(k): v for k, v in json.loads(path.read_text()).items()}

    # ------------------------------------------------------------ the request's life
    def decode(self, row: dict, header_topk: str | None) -> tuple[torch.Tensor, int]:
        return decode_image(image_bytes(row)), requested_topk(row, header_topk, self.topk_default)

    def preprocess(self, image: torch.Tensor) -> torch.Tensor:
        return preprocess(image, self.contract)

    @staticmethod
    def batch(images: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(images)

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        if self.simulate_hang_s:
            time.sleep(self.simulate_hang_s)
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
        times = StageTimes()
        responses: list = [None] * len(data)
        ready: list[tuple[int, torch.Tensor, int]] = []
        for index, row in enumerate(data):
            try:
                with times.measure("decode"):
                    image, k = self.decode(row, _header(context, index, TOPK_HEADER))
                with times.measure("preprocess"):
                    ready.append((index, self.preprocess(image), k))
            except RequestError as error:
                responses[index] = self._error(context, index, error)
            except Exception as error:  # our bug, not the client's: 500, logged with its traceback
                logger.exception("unexpected failure decoding request %d", index)
                responses[index] = self._error(context, index, RequestError(500, f"internal error while "
                                                                                 f"decoding: {type(error).__name__}"))
        if ready:
            self._predict_into(responses, ready, context, times)
        self._report(context, times, len(data))
        return responses

    def _predict_into(self, responses: list, ready: list, context, times: StageTimes) -> None:
        try:
            with times.measure("inference"):
                probabilities = self.predict(self.batch([image for _, image, _ in ready]))
            with times.measure("encode"):
                for (index, _, k), row_probabilities in zip(ready, probabilities):
                    responses[index] = self.encode(row_probabilities, k)
        except Exception as error:  # keep the worker alive; every request of the batch gets the reason
            logger.exception("inference failed")
            for index, _, _ in ready:
                responses[index] = self._error(context, index, RequestError(500, f"inference failed: {error}"))

    @staticmethod
    def _report(context, times: StageTimes, size: int) -> None:
        logger.info("batch of %d: %s", size, " ".join(f"{s}={times.ms[s]:.2f}ms" for s in STAGES))
        metrics = getattr(context, "metrics", None)
        if metrics is None:
            return
        for stage in STAGES:
            metrics.add_time(METRIC_NAMES[stage], times.ms[stage], None, "ms")

    @staticmethod
    def _error(context, index: int, error: RequestError) -> dict:
        if context is not None:
            context.set_response_status(code=error.code, phrase=error.message[:200], idx=index)
        return error.as_response()


def _header(context, index: int, name: str) -> str | None:
    try:
        return context.get_request_header(index, name) or context.get_request_header(index, name.lower())
    except (AttributeError, IndexError, KeyError, TypeError):  # a Context without request metadata (unit tests)
        return None
