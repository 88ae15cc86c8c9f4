"""The model's side of a batch run: a Scorer opens the export's request core (handlers/opening.py, as every
engine does: the sha256 check, the form chosen for this machine, the serving policy's threads) and turns a batch of
photos into output rows: the endpoint's JSON answer, or the endpoint's error for that photo (a file that cannot be
read, a body the decoder refuses), row by row, never an exception for one bad photo.

On CPUs its photos come decoded and preprocessed by the run's decode tasks (serving/batch/decoding.py): the actor
runs the core's second half (answer_prepared) on ready tensors. On a GPU it reads and decodes its photos itself, as
the endpoint's worker does (nvJPEG on the device where the export allows it), with the core's whole run_batch.

Ray Data runs one Scorer per actor of its pool (serving/batch/run.py); it is a plain class, usable in-process.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from contract.policy import ServingPolicy
from contract.records import Manifest
from handlers.core import STAGES, StageTimes
from handlers.opening import open_archive
from handlers.request_body import ImageRequest
from handlers.request_error import RequestError
from serving.batch.decoding import PREPARED_STAGES, read_bodies, unpacked
from serving.settings import archive_config

ARCHIVE_SUFFIX = ".mar"


def handler_settings(path: Path) -> dict | None:
    """The archive's handler section (model-config.yaml), as the engines read it; an export folder has none."""
    return archive_config(path).get("handler") if path.is_file() else None


class Scorer:
    """One copy of the served model: __call__ answers a batch of photos (Ray Data's numpy batch: columns input,
    shard, path, data, inside) with a batch of output rows (output.SCHEMA's columns, plus shard and each stage's ms)."""

    def __init__(self, model_path: str, policy: dict, device: str = "cpu", scratch: str | None = None):
        """`scratch`: a folder its caller removes, where Scorers of one run unpack the archive once (None: a
        folder of this Scorer's own, removed with it: a Ray Data actor's)."""
        logging.getLogger("handlers").setLevel(logging.WARNING)  # not a "batch of 1" line per photo
        self.own_scratch = tempfile.TemporaryDirectory(prefix="batch-model-") if scratch is None else None
        folder = Path(scratch) / Path(model_path).stem if scratch else Path(self.own_scratch.name)
        self.policy = ServingPolicy.from_dict(policy)
        # an export folder as it is, an archive unpacked as the engines unpack it (handlers/opening.py)
        self.core = open_archive(model_path, device, self.policy, scratch=folder)
        self.manifest: Manifest = self.core.manifest

    def __call__(self, batch: dict) -> dict:
        inputs, shard_keys = list(batch["input"]), list(batch["shard"])
        if "prepared" in batch:
            answers, stage_ms = self.answer_prepared(batch)
        else:
            answers, stage_ms = self.answers(batch)
        rows = [self.row(name, answer) for name, answer in zip(inputs, answers)]
        columns = {key: [row[key] for row in rows] for key in rows[0]} if rows else {}
        return {
            **columns,
            "shard": shard_keys,
            "decoder": list(batch["decoder"]) if "decoder" in batch else [""] * len(rows),
            **{f"{stage}_ms": stage_ms[stage] for stage in STAGES},
        }

    def answer_prepared(self, batch: dict) -> tuple[list, dict]:
        """The decode tasks' rows answered, on chunks of the policy's batch size; each stage's ms per row."""
        prepared = [unpacked(data) for data in batch["prepared"]]
        answers: list = []
        times = StageTimes()
        size = max(1, self.policy.batch_size)
        for start in range(0, len(prepared), size):
            answers += self.core.answer_prepared(prepared[start : start + size], times)
        per_row = {stage: [times.ms[stage] / max(1, len(prepared))] * len(prepared) for stage in STAGES}
        for stage in PREPARED_STAGES:  # timed by the decode tasks
            per_row[stage] = [float(ms) for ms in batch[f"{stage}_ms"]]
        return answers, per_row

    def answers(self, batch: dict) -> tuple[list, dict]:
        """Each photo read, decoded and answered here, the core run on chunks of the policy's batch size; each
        stage's ms per row."""
        bodies = read_bodies(batch)
        answers: list = list(bodies)
        times = StageTimes()
        readable = [index for index, body in enumerate(bodies) if isinstance(body, bytes)]
        size = max(1, self.policy.batch_size)
        for start in range(0, len(readable), size):
            chunk = readable[start : start + size]
            result = self.core.run_batch([ImageRequest(bodies[index]) for index in chunk])
            for index, answer in zip(chunk, result.answers):
                answers[index] = answer
            for stage in STAGES:
                times.ms[stage] += result.times.ms[stage]
        return answers, {stage: [times.ms[stage] / max(1, len(bodies))] * len(bodies) for stage in STAGES}

    def row(self, name: str, answer) -> dict:
        record = self.core.record
        common = {
            "input": str(name),
            "model": self.core.name,  # its architecture: a batch serves under no name (handlers/core.py's name_served)
            "version": self.core.version,  # what the endpoint's answers and errors name (contract/versions.py)
            "artifact": record.kind,
        }
        if isinstance(answer, RequestError):
            return {
                **common,
                "status": answer.code,
                "error": answer.message,
                "answer": None,
                "label": None,
                "score": None,
            }
        label, score = first_label(answer)
        return {
            **common,
            "status": 200,
            "error": None,
            "answer": json.dumps(answer),
            "label": label,
            "score": score,
        }


def first_label(answer: dict) -> tuple[str | None, float | None]:
    """(label, score) of the answer's first entry: the top class, the first box, the largest class."""
    for key, score_key in (("predictions", "probability"), ("detections", "score"), ("classes", "share")):
        entries = answer.get(key)
        if entries:
            return str(entries[0]["label"]), float(entries[0][score_key])
        if entries is not None:
            return None, None
    return None, None
