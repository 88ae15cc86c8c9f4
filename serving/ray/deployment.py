"""Our request core (handlers/core.py) as a Ray Serve deployment: one replica opens one archive's served
artifact (sha256-checked by the core, as under TorchServe and KServe) and answers POST /predictions/NAME as
TorchServe does: the same bodies (a raw image, JSON {"data": base64, "topk": k}, a form file; the X-TopK
header), the same JSON answer, the same 4xx {"code", "error"} for a bad request. Concurrent requests share a
batch as the policy says (handlers/batching.py). Each answer names the Ray node and replica that served it in
its SERVED_BY header, so a client sees where its request ran.

Every node reads the archive from the model store's path: on one machine the store itself, across machines a
shared folder or the image that carries it (docs/scaling.md).
"""

from __future__ import annotations

import json
import logging
import tempfile
import zipfile
from pathlib import Path

import yaml
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from handlers.batching import Batcher, BatchPolicy
from handlers.core import ImageClassifierCore, ImageRequest
from handlers.policy import ServingPolicy
from handlers.request_body import image_bytes, requested_topk
from handlers.request_error import RequestError

logger = logging.getLogger("serving.ray")

TOPK_HEADER = "X-TopK"  # as on the TorchServe path (handlers/image_classifier.py)
SERVED_BY = "X-Served-By"  # "NODE_ID REPLICA_ID" of the replica that answered
DESCRIPTION_PATH = "/description"  # GET ROUTE/description: which form serves on this machine, and why
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
LOG_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"


def archive_config(archive: Path) -> dict:
    """The archive's model-config.yaml (TorchServe's per-model settings and the core's `handler:` section)."""
    with zipfile.ZipFile(archive) as members:
        if "model-config.yaml" not in members.namelist():
            return {}
        return yaml.safe_load(members.read("model-config.yaml")) or {}


def batching(config: dict, policy: ServingPolicy) -> BatchPolicy:
    """The policy's batching, unless the archive pins TorchServe's batchSize / maxBatchDelay (they win there too)."""
    return BatchPolicy(int(config.get("batchSize", policy.batch_size)),
                       int(config.get("maxBatchDelay", policy.max_batch_delay_ms)))


def application(args: dict):
    """One archive's Serve application: what server.py deploys, and the import_path of the Serve config a
    cluster deploys (serve_config.py). args: archive (its path on every node), name, threads, batch_size,
    max_batch_delay_ms, device ("cpu" or "cuda"), and options, the deployment's options (config.py
    deployment_options); a Serve config gives those in its `deployments:` entry instead, where operators
    tune them."""
    batch = BatchPolicy(int(args["batch_size"]), int(args["max_batch_delay_ms"]))
    return ImageClassifierDeployment.options(name=args["name"], **args.get("options", {})).bind(
        str(args["archive"]), int(args["threads"]), batch, args.get("device", "cpu"))


def application_args(archive: Path, policy: ServingPolicy) -> dict:
    """application()'s args for archive under the policy (the archive's pinned batching wins)."""
    batch = batching(archive_config(archive), policy)
    return {"archive": str(archive), "name": archive.stem, "threads": policy.threads_per_worker,
            "batch_size": batch.size, "max_batch_delay_ms": batch.delay_ms,
            "device": "cuda" if policy.device == "gpu" else "cpu"}


@serve.deployment
class ImageClassifierDeployment:
    def __init__(self, archive: str, threads: int, batch: BatchPolicy, device: str = "cpu"):
        """Unpack the archive into a folder of this replica's own and open its artifact through the core: an
        archive that fails its sha256 check raises here, and Serve marks the application failed with it."""
        import ray
        configure_logging()
        self.folder = tempfile.TemporaryDirectory(prefix=f"{Path(archive).stem}-")
        with zipfile.ZipFile(archive) as members:
            members.extractall(self.folder.name)
        config = archive_config(Path(archive))
        self.core = ImageClassifierCore.from_folder(self.folder.name, device, config.get("handler"), threads)
        self.batcher = Batcher(self.core, batch)
        context = serve.get_replica_context()
        self.served_by = f"{ray.get_runtime_context().get_node_id()} {context.replica_id.unique_id}"

    async def __call__(self, request: Request) -> JSONResponse:
        if request.method == "GET" and request.url.path.rstrip("/").endswith(DESCRIPTION_PATH):
            return JSONResponse(self.core.describe(), headers={SERVED_BY: self.served_by})
        try:
            row = await request_row(request)
            rows = [ImageRequest(image_bytes(row), requested_topk(row, request.headers.get(TOPK_HEADER), None))]
        except RequestError as error:
            return self.respond(error)
        (answer,) = await self.batcher.answer(rows)
        return self.respond(answer)

    def respond(self, answer) -> JSONResponse:
        headers = {SERVED_BY: self.served_by}
        if isinstance(answer, RequestError):
            return JSONResponse(answer.as_response(), status_code=answer.code, headers=headers)
        return JSONResponse(answer, headers=headers)


async def request_row(request: Request) -> dict:
    """The request as TorchServe hands it to a handler: {"body": ...}, a JSON body parsed, a text body decoded,
    a form's fields by name (handlers/request_body.py finds the image and topk in it)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in FORM_TYPES:
        form = await request.form()
        return {name: (await value.read() if hasattr(value, "read") else str(value).encode())
                for name, value in form.multi_items()}
    body = await request.body()
    if content_type == "application/json":
        try:
            return {"body": json.loads(body)}
        except (UnicodeDecodeError, json.JSONDecodeError):
            return {"body": body}  # request_body answers with why it does not parse
    if content_type.startswith("text/"):
        return {"body": body.decode("utf-8", "replace")}
    return {"body": body}


def configure_logging() -> None:
    """The core's lines (sha256 verified, "batch of N: ...") in the replica's log, which Ray also sends to the
    server process's log."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    logging.getLogger("handlers").setLevel(logging.INFO)
