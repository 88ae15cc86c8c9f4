"""The model's side of a batch run: a Scorer opens the export's request core (handlers/tasks.py open_core, as every
engine does: the sha256 check, the form chosen for this machine, the serving policy's threads) and turns a batch of
photos into output rows: the endpoint's JSON answer, or the endpoint's error for that photo (a file that cannot be
read, a body the decoder refuses), row by row, never an exception for one bad photo.

Ray Data runs one Scorer per actor of its pool (serving/batch/run.py); it is a plain class, usable in-process.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import zipfile
from pathlib import Path

from contract.policy import ServingPolicy
from contract.records import Manifest
from handlers.core import STAGES
from handlers.request_body import ImageRequest
from handlers.request_error import RequestError
from handlers.tasks import open_core
from serving.settings import archive_config

MAX_FILE_BYTES = 64 * 2**20  # no photo is larger; a bigger file is refused before it is read into memory
ARCHIVE_SUFFIX = ".mar"
READ_STATUS = {FileNotFoundError: 404, PermissionError: 403}  # a file that cannot be read; other OS errors: 400


def model_folder(path: Path, scratch: Path) -> Path:
    """An export folder as it is; an archive (.mar) unpacked into `scratch`, as the engines unpack it."""
    if path.is_dir():
        return path
    with zipfile.ZipFile(path) as members:
        members.extractall(scratch)
    return scratch


def handler_settings(path: Path) -> dict | None:
    """The archive's handler section (model-config.yaml), as the engines read it; an export folder has none."""
    return archive_config(path).get("handler") if path.is_file() else None


class Scorer:
    """One copy of the served model: __call__ answers a batch of photos (Ray Data's numpy batch: columns input,
    shard, path, data) with a batch of output rows (output.SCHEMA's columns, plus shard and each stage's ms)."""

    def __init__(self, model_path: str, policy: dict, device: str = "cpu"):
        logging.getLogger("handlers").setLevel(logging.WARNING)  # not a "batch of 1" line per photo
        self.scratch = tempfile.TemporaryDirectory(prefix="batch-model-")
        path = Path(model_path)
        self.policy = ServingPolicy.from_dict(policy)
        self.core = open_core(
            model_folder(path, Path(self.scratch.name)), device, handler_settings(path), policy=self.policy
        )
        self.manifest: Manifest = self.core.manifest

    def __call__(self, batch: dict) -> dict:
        inputs, shard_keys = list(batch["input"]), list(batch["shard"])
        answers, stage_ms = self.answers(list(batch["path"]), list(batch["data"]))
        rows = [self.row(name, answer) for name, answer in zip(inputs, answers)]
        columns = {key: [row[key] for row in rows] for key in rows[0]} if rows else {}
        return {
            **columns,
            "shard": shard_keys,
            **{f"{stage}_ms": [stage_ms[stage] / max(1, len(rows))] * len(rows) for stage in STAGES},
        }

    def answers(self, paths: list, datas: list) -> tuple[list, dict]:
        """Each photo's answer or RequestError, the core run on chunks of the policy's batch size; the stages' ms."""
        bodies = [read_body(str(path), data) for path, data in zip(paths, datas)]
        answers: list = list(bodies)
        stage_ms = dict.fromkeys(STAGES, 0.0)
        readable = [index for index, body in enumerate(bodies) if isinstance(body, bytes)]
        size = max(1, self.policy.batch_size)
        for start in range(0, len(readable), size):
            chunk = readable[start : start + size]
            result = self.core.run_batch([ImageRequest(bodies[index]) for index in chunk])
            for index, answer in zip(chunk, result.answers):
                answers[index] = answer
            for stage in STAGES:
                stage_ms[stage] += result.times.ms[stage]
        return answers, stage_ms

    def row(self, name: str, answer) -> dict:
        record = self.core.record
        common = {"input": str(name), "model": self.manifest.model.name, "artifact": record.kind}
        if isinstance(answer, RequestError):
            return {
                **common,
                "status": answer.code,
                "error": answer.message,
                "answer": None,
                "label": None,
                "score": None,
                "version": model_version(self.manifest, record.sha256, None),
            }
        label, score = first_label(answer)
        return {
            **common,
            "status": 200,
            "error": None,
            "answer": json.dumps(answer),
            "label": label,
            "score": score,
            "version": model_version(self.manifest, record.sha256, answer),
        }


def read_body(path: str, data) -> bytes | RequestError:
    """The photo's bytes (from the table, or its file), or the RequestError of a file that cannot be read."""
    if not path:
        return bytes(data) if data is not None else b""
    try:
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            return RequestError(
                413,
                f"file too large: {size:,} bytes, more than {MAX_FILE_BYTES:,}; no photo is "
                "that large: downscale it or leave it out",
            )
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        return RequestError(READ_STATUS.get(type(error), 400), f"cannot read {path}: {error.strerror or error}")


def model_version(manifest: Manifest, served_sha256: str, answer: dict | None) -> str:
    """The version the answer names (where the endpoint's answers carry one), else the manifest's, else the served
    artifact's content hash: what computed the row, in any case."""
    if answer and answer.get("version"):
        return str(answer["version"])
    recorded = getattr(manifest, "version", None)
    if recorded:
        return str(getattr(recorded, "number", recorded))
    return f"sha256:{served_sha256[:16]}"


def first_label(answer: dict) -> tuple[str | None, float | None]:
    """(label, score) of the answer's first entry: the top class, the first box, the largest class."""
    for key, score_key in (("predictions", "probability"), ("detections", "score"), ("classes", "share")):
        entries = answer.get(key)
        if entries:
            return str(entries[0]["label"]), float(entries[0][score_key])
        if entries is not None:
            return None, None
    return None, None
