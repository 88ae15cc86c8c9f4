"""The KServe adapter: ImageCore (handlers/core.py) as a `kserve.Model` behind KServe's data plane.

What is KServe's lives here: the v1 body, the Open Inference Protocol (v2) tensors, the model's v2 metadata,
and answering without blocking KServe's event loop (handlers/batching.py). Which artifact, its sha256, the
preprocessing and the request's life are the core's, exactly as under TorchServe.

  v1  POST /v1/models/NAME:predict  {"instances": [{"image": {"b64": "<base64 image>"}, "topk": 3}, ...]}
      -> {"predictions": [<the core's answer>, ...]}; also {"instances": [{"data": "<base64>"}]} (what KServe's
      TorchServe envelope takes, so examples/clients/kserve_v1_client.py works against both), a raw image body
      (Content-Type image/*) or {"data": "<base64>", "topk": k}, as on the TorchServe path.
  v2  POST /v2/models/NAME/infer  input `image`, BYTES, shape [N]: each element an encoded image (raw bytes
      with the binary-data extension, base64 text in JSON); request parameter `topk`.
      -> outputs `labels` (BYTES [N, k]), `indices` (INT64 [N, k]), `probabilities` (FP32 [N, k]);
      parameters `model`, `architecture` and `artifact`. A detector answers one row per box of every image: `boxes` (FP32
      [B, 4], the photo's pixels), `labels`, `indices`, `scores`, `image_index` (which image, INT64 [B]); a
      segmenter one row per class present: `labels`, `indices`, `shares`, `image_index`, and `class_map_png`
      (BYTES [N], each image's class map). Request parameters: a detector's score_threshold and max_detections.
A bad request raises RequestError: the server answers its status with {"code": ..., "error": ...}
(serving/kserve/app.py maps it), the worker stays up. Every answer names the worker that answered in its
X-Served-By header ("worker 2 pid 4242"): the policy's worker processes (serving/kserve/pool.py) with
`--workers N`, N > 1; the server process itself with one worker.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
from kserve import Model
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse

from contract.policy import ServingPolicy
from contract.records import CLASSIFICATION, DETECTION, SEGMENTATION
from contract.versions import UNVERSIONED
from handlers.answers import reply
from handlers.batching import Batcher
from handlers.core import ImageCore, ImageRequest
from handlers.metrics import ServedModel
from handlers.opening import open_archive
from handlers.request import JSON_TYPE, request_id_of
from handlers.request_body import TASK_OPTIONS, checked_topk, from_base64
from handlers.request_error import RequestError

logger = logging.getLogger(__name__)

IMAGE = "image"  # the v2 input, and the v1 instance key
B64 = "b64"  # KServe's v1 convention for binary values: {"b64": "<base64>"}
TOPK = "topk"  # v1 instance key, v2 request parameter
LABELS, INDICES, PROBABILITIES = "labels", "indices", "probabilities"
V2_PARAMETERS = ("model", "architecture", "artifact")  # what every answer names (handlers/core.py), v2's parameters
V1_SHAPE = 'v1 takes {"instances": [{"image": {"b64": "<base64 image>"}}]}'
INPUT_METADATA = [{"name": IMAGE, "datatype": "BYTES", "shape": [-1]}]
OUTPUT_METADATA = [{"name": LABELS, "datatype": "BYTES", "shape": [-1, -1]},
                   {"name": INDICES, "datatype": "INT64", "shape": [-1, -1]},
                   {"name": PROBABILITIES, "datatype": "FP32", "shape": [-1, -1]}]
OUTPUTS = {  # each task's v2 outputs: name -> (datatype, shape)
    CLASSIFICATION: {meta["name"]: (meta["datatype"], meta["shape"]) for meta in OUTPUT_METADATA},
    DETECTION: {"boxes": ("FP32", [-1, 4]), LABELS: ("BYTES", [-1]), INDICES: ("INT64", [-1]),
                "scores": ("FP32", [-1]), "image_index": ("INT64", [-1])},
    SEGMENTATION: {LABELS: ("BYTES", [-1]), INDICES: ("INT64", [-1]), "shares": ("FP32", [-1]),
                   "image_index": ("INT64", [-1]), "class_map_png": ("BYTES", [-1])},
}


class KServeModel(Model):
    """One model of the store, served from its unpacked archive (the folder TorchServe's worker would run in),
    under the serving policy the server process read from its run config (threads, batching). With `workers`
    (serving/kserve/pool.py's WorkerPool.open), the policy's worker processes run the core and the batcher hands
    each batch to a free one; without, the core runs in this process (one worker)."""

    def __init__(self, name: str, folder: Path, policy: ServingPolicy, device: str = "cpu",
                 settings: dict | None = None, workers: Callable | None = None):
        super().__init__(name, return_response_headers=True)
        self.folder = Path(folder)
        self.settings = settings  # model-config.yaml's handler section
        self.policy = policy
        self.device = device
        self.workers = workers  # (folder, device, settings, policy) -> a started pool of worker processes
        self.core: ImageCore | None = None  # or, with workers, the pool that runs one in each worker
        self.batcher: Batcher | None = None
        self.rows_here = 0  # rows the core in this process answered (one worker)
        self.served: ServedModel | None = None  # what its answers and metrics name (handlers/metrics.py), at load
        self.version = UNVERSIONED  # the archive's version (contract/versions.py), read at load

    def load(self) -> bool:
        """Open the archive's served artifact after checking its sha256 (in each worker process with `workers`);
        a refusal raises (HandlerSetupError, IntegrityError) and the server does not start."""
        if self.workers is None:
            self.core = open_archive(self.folder, self.device, self.policy, self.settings, served_name=self.name)
            self.batcher = Batcher(self.core, self.policy)
        else:
            self.core = self.workers(self.folder, self.device, self.settings, self.policy)
            self.batcher = Batcher(self.core, self.policy, lanes=self.core.lanes)
        self.served = ServedModel.of(self.core.describe())  # the labels of its metrics, and its version header
        self.version = self.served.version
        self.ready = True
        return self.ready

    def stop(self) -> None:  # KServe's unload; the pool also closes itself at exit
        if self.workers is not None and self.core is not None:
            self.core.close()

    def here(self) -> str:
        return f"worker 1 pid {os.getpid()}"

    def describe(self) -> dict:
        """Which form serves here and why (serving/kserve/app.py answers it at DESCRIPTION_ROUTE), and each
        worker: its pid and the rows it answered."""
        if self.core is None:
            return {"model": self.name, "ready": False, "policy": self.policy.describe()}
        if self.workers is not None:
            return self.core.describe()
        return {**self.core.describe(), "workers": [{"worker": 1, "pid": os.getpid(), "rows": self.rows_here,
                                                     "restarts": 0}]}

    def get_input_types(self) -> list[dict]:
        return INPUT_METADATA

    def get_output_types(self) -> list[dict]:
        task = self.core.TASK if self.core else CLASSIFICATION
        return [{"name": name, "datatype": datatype, "shape": shape} for name, (datatype, shape) in OUTPUTS[task].items()]

    async def predict(self, payload, headers: dict | None = None, response_headers: dict | None = None):
        v2 = isinstance(payload, InferRequest)
        rows = rows_of(payload, self.core.TASK, headers)
        answers, worker = await self.batcher.answered(rows)
        if worker is None:
            self.rows_here += len(rows)
        # a bad row raises its RequestError here: serving/kserve/app.py replies with it
        body = (v2_response(payload, self.name, answered(answers), self.core.TASK) if v2
                else {"predictions": answered(answers)})
        # the reply every engine makes (handlers/answers.py); KServe's front records its metrics and request id
        sent = reply(body, self.served, request_id_of(headers or {}), served_by=worker or self.here())
        if response_headers is not None:
            response_headers.update(sent.headers)
        return sent.body


def rows_of(payload, task: str, headers: dict | None = None) -> list[ImageRequest]:
    """One ImageRequest per image of a v1 or v2 request."""
    return v2_rows(payload, task, headers) if isinstance(payload, InferRequest) else v1_rows(payload, headers)


# ---------------------------------------------------------------- v1
def v1_rows(payload, headers: dict | None = None) -> list[ImageRequest]:
    """One ImageRequest per image: KServe hands a non-JSON body as bytes, a JSON one parsed."""
    headers = dict(headers or {})
    request_id = request_id_of(headers)
    if isinstance(payload, (bytes, bytearray, str)):  # a non-JSON body: the image itself, as on TorchServe's path
        body, content_type = ((payload.encode(), "text/plain") if isinstance(payload, str)
                              else (bytes(payload), headers.get("content-type", "")))
        return [ImageRequest(body, content_type, headers, request_id=request_id)]
    if isinstance(payload, dict) and "instances" in payload:
        instances = payload["instances"]
        if not instances:
            raise RequestError(400, f"no instances: {V1_SHAPE}")
        return [instance_row(index, instance, headers, request_id) for index, instance in enumerate(instances)]
    if isinstance(payload, dict):  # TorchServe's JSON body {"data": base64, "topk": k}
        return [ImageRequest(b"", JSON_TYPE, headers, payload, request_id)]
    raise RequestError(400, f"JSON body must be an object, got a JSON {type(payload).__name__}: {V1_SHAPE}")


def instance_row(index: int, instance, headers: dict | None = None, request_id: str = "") -> ImageRequest:
    if not isinstance(instance, dict):
        raise RequestError(400, f"instance {index} is a JSON {type(instance).__name__}, not an object: {V1_SHAPE}")
    image = instance.get(IMAGE, instance.get("data"))
    if isinstance(image, dict):
        image = image.get(B64)
    if not isinstance(image, str):
        raise RequestError(400, f"instance {index} has no base64 image: {V1_SHAPE}")
    topk = instance.get(TOPK)
    options = {name: instance[name] for name in TASK_OPTIONS if instance.get(name) is not None}
    return ImageRequest.of_image(from_base64(image), None if topk is None else checked_topk(topk), headers,
                                 request_id, **options)


# ---------------------------------------------------------------- v2
def v2_rows(request: InferRequest, task: str = CLASSIFICATION, headers: dict | None = None) -> list[ImageRequest]:
    tensors = {tensor.name: tensor for tensor in request.inputs}
    tensor = tensors.get(IMAGE)
    if tensor is None or tensor.datatype != "BYTES":
        got = ", ".join(f"{t.name} ({t.datatype})" for t in request.inputs) or "none"
        raise RequestError(400, f'v2 takes one BYTES input named "{IMAGE}" holding encoded images; got {got}')
    parameters = request.parameters or {}
    topk = parameters.get(TOPK)
    k = None if topk is None else checked_topk(topk)
    options = {name: parameters[name] for name in TASK_OPTIONS if parameters.get(name) is not None}
    if task == SEGMENTATION:
        options["masks"] = "png"  # a tensor protocol carries each image's class map as one PNG
    request_id = request_id_of(headers or {})
    return [ImageRequest.of_image(element if isinstance(element, bytes) else from_base64(str(element)), k, headers,
                                  request_id, **options) for element in elements(tensor)]


def elements(tensor) -> list:
    """The tensor's elements: raw bytes (binary-data extension) or base64 strings (JSON)."""
    try:
        values = tensor.as_numpy().reshape(-1)
    except ValueError as error:  # the data do not fill the declared shape
        raise RequestError(400, f'input "{IMAGE}": {error}') from None
    if values.size == 0:
        raise RequestError(400, f'input "{IMAGE}" holds no image')
    return list(values)


def v2_response(request: InferRequest, model_name: str, answers: list[dict],
                task: str = CLASSIFICATION) -> InferResponse:
    tensors = V2_TENSORS[task](answers)
    outputs = [InferOutput(name, list(tensors[name].shape), datatype, tensors[name])
               for name, (datatype, _) in OUTPUTS[task].items()]
    # a request may leave its id out; KServe's response model requires one (its own requests get a uuid)
    return InferResponse(request.id or str(uuid.uuid4()), model_name, outputs, parameters={
        name: answers[0][name] for name in V2_PARAMETERS},
        use_binary_outputs=request.use_binary_outputs, requested_outputs=request.request_outputs)


def classification_tensors(answers: list[dict]) -> dict:
    rows = [answer["predictions"] for answer in answers]
    return {LABELS: np.array([[p["label"].encode() for p in row] for row in rows], dtype=np.object_),
            INDICES: np.array([[p["index"] for p in row] for row in rows], dtype=np.int64),
            PROBABILITIES: np.array([[p["probability"] for p in row] for row in rows], dtype=np.float32)}


def detection_tensors(answers: list[dict]) -> dict:
    rows = [(image, box) for image, answer in enumerate(answers) for box in answer["detections"]]
    return {"boxes": np.array([box["box"] for _, box in rows], dtype=np.float32).reshape(-1, 4),
            LABELS: np.array([box["label"].encode() for _, box in rows], dtype=np.object_),
            INDICES: np.array([box["index"] for _, box in rows], dtype=np.int64),
            "scores": np.array([box["score"] for _, box in rows], dtype=np.float32),
            "image_index": np.array([image for image, _ in rows], dtype=np.int64)}


def segmentation_tensors(answers: list[dict]) -> dict:
    rows = [(image, item) for image, answer in enumerate(answers) for item in answer["classes"]]
    return {LABELS: np.array([item["label"].encode() for _, item in rows], dtype=np.object_),
            INDICES: np.array([item["index"] for _, item in rows], dtype=np.int64),
            "shares": np.array([item["share"] for _, item in rows], dtype=np.float32),
            "image_index": np.array([image for image, _ in rows], dtype=np.int64),
            "class_map_png": np.array([answer["class_map_png"].encode() for answer in answers], dtype=np.object_)}


V2_TENSORS = {CLASSIFICATION: classification_tensors, DETECTION: detection_tensors,
              SEGMENTATION: segmentation_tensors}


def answered(answers: list) -> list[dict]:
    """The answers, or the first row's RequestError (one HTTP status per request: naming the row when several)."""
    for index, answer in enumerate(answers):
        if isinstance(answer, RequestError):
            if len(answers) > 1:
                raise RequestError(answer.code, f"image {index}: {answer.message}")
            raise answer
    return answers
