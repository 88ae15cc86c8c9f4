"""The photos' side of a batch run, apart from the model: each photo read from its file (or the table's bytes),
decoded upright and preprocessed by the request core's own first half (handlers/core.py prepare_requests: the
body read as the endpoint reads it, EXIF orientation, the export's decode mode, the task's preprocessing), in
stateless Ray Data tasks (serving/batch/run.py); the model's actors (serving/batch/scoring.py) get ready tensors.

A photo that cannot be read or decoded leaves here as its error (status and the endpoint's message); the others
as their input row and options, pickled (a classifier's tensor, a detector's whole image and its size).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import stat
from functools import lru_cache
from typing import cast

import torch

from contract.handler_config import HandlerConfig
from contract.records import Manifest
from handlers.core import STAGES, ImageCore, ImageRequest, StageTimes
from handlers.request_error import RequestError
from handlers.tasks import CORES
from runtime.base import Backend

MAX_FILE_BYTES = 64 * 2**20  # no photo is larger; a bigger file is refused before it is read into memory
READ_STATUS = {FileNotFoundError: 404, PermissionError: 403}  # a file that cannot be read; other OS errors: 400
NOT_A_FILE_STATUS = 400  # a device, a FIFO, a socket or a folder where a photo's file was named
NOT_FILES = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)
PREPARED_STAGES = STAGES[:2]  # decode and preprocess: what the tasks time; the actors time the rest


@lru_cache(maxsize=4)
def preparing_core(manifest_json: str, settings_json: str | None) -> ImageCore:
    """The export's request core without its model (nothing is predicted here): the task's preprocessing, the
    decode mode its handler settings choose. One per task process, kept across the process's tasks."""
    logging.getLogger("handlers").setLevel(logging.WARNING)
    torch.set_num_threads(1)  # a task per core: its preprocessing on its own core
    manifest = Manifest.from_json(manifest_json, "manifest.json")
    core = CORES[manifest.task]
    core.check_task(manifest)
    record = next(iter(manifest.artifacts.values()))  # named only: no artifact is opened
    settings = HandlerConfig.from_dict(json.loads(settings_json) if settings_json else None)
    return core(manifest, record, cast(Backend, None), {}, settings, "cpu", threads=1)


def decode_batch(batch: dict, manifest_json: str, settings_json: str | None) -> dict:
    """Ray Data's numpy batch (input, shard, path, data, inside) -> (input, shard, prepared, decode_ms, preprocess_ms,
    decoder): `prepared` is pickle of ("ready", row, options) or ("error", status, message)."""
    core = preparing_core(manifest_json, settings_json)
    bodies = read_bodies(batch)
    readable = [index for index, body in enumerate(bodies) if isinstance(body, bytes)]
    times = StageTimes()
    prepared: list = list(bodies)
    for index, item in zip(readable, core.prepare_requests([ImageRequest(bodies[i]) for i in readable], times)):
        prepared[index] = item
    size = max(1, len(prepared))
    return {
        "input": batch["input"],
        "shard": batch["shard"],
        "prepared": [pickle.dumps(packed(item), protocol=pickle.HIGHEST_PROTOCOL) for item in prepared],
        **{f"{stage}_ms": [times.ms[stage] / size] * len(prepared) for stage in PREPARED_STAGES},
        "decoder": [decoder_name()] * len(prepared),
    }


def decoder_name() -> str:
    """This task's process: its Ray node and pid (how decoding is spread, in the run's summary)."""
    import ray

    node = ray.get_runtime_context().get_node_id()[:12] if ray.is_initialized() else "here"
    return f"{node}:{os.getpid()}"


def packed(item) -> tuple:
    if isinstance(item, RequestError):
        return ("error", item.code, item.message)
    row, options = item
    return ("ready", row, options)


def unpacked(data: bytes):
    """decode_batch's pickle back into what ImageCore.answer_prepared takes: (row, options) or the RequestError."""
    kind, first, second = pickle.loads(data)
    return RequestError(first, second) if kind == "error" else (first, second)


def read_bodies(batch: dict) -> list[bytes | RequestError]:
    """Each row's photo (its columns path, data, inside: serving/batch/inputs.py photo_items) as read_body reads it."""
    columns = zip(batch["path"], batch["data"], batch["inside"])
    return [read_body(str(path), data, str(inside)) for path, data, inside in columns]


def read_body(path: str, data, inside: str = "") -> bytes | RequestError:
    """The photo's bytes (from the table, or its file), or the RequestError of a file that cannot be read: missing,
    unreadable, not a regular file (a device, a FIFO, a socket: refused before it is opened, since reading one may
    never end), over MAX_FILE_BYTES, or outside `inside` (a table's folder) once its links are resolved."""
    if not path:
        return bytes(data) if data is not None else b""
    try:
        real = os.path.realpath(path)
        if inside and os.path.commonpath([real, inside]) != inside:
            return RequestError(
                403,
                f"{path} is outside the table's folder {inside} (it resolves to {real}); move it into that "
                "folder, or pass --allow-outside-paths to read paths anywhere",
            )
        refusal = not_a_photo_file(path, os.stat(real))
        if refusal:
            return refusal
        # should a FIFO or a link take the file's place after the check, its open returns at once (O_NONBLOCK) or
        # fails (O_NOFOLLOW: `real` has no link left to follow)
        descriptor = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        with os.fdopen(descriptor, "rb") as handle:
            refusal = not_a_photo_file(path, os.fstat(handle.fileno()))
            return refusal or capped(handle.read(MAX_FILE_BYTES + 1))
    except OSError as error:
        return RequestError(READ_STATUS.get(type(error), 400), f"cannot read {path}: {error.strerror or error}")


def not_a_photo_file(path: str, facts: os.stat_result) -> RequestError | None:
    """The refusal of anything but a regular file of at most MAX_FILE_BYTES; None for a photo's file."""
    if not stat.S_ISREG(facts.st_mode):
        kind = next((name for test, name in NOT_FILES if test(facts.st_mode)), "a special file")
        return RequestError(
            NOT_A_FILE_STATUS,
            f"{path} is {kind}, not a regular file: only a photo's file is read (a device or a pipe may never "
            "end); name the photo's file instead",
        )
    return too_large(facts.st_size) if facts.st_size > MAX_FILE_BYTES else None


def capped(body: bytes) -> bytes | RequestError:
    """What was read, unless the file grew past the cap after its size was checked."""
    return too_large(len(body)) if len(body) > MAX_FILE_BYTES else body


def too_large(size: int) -> RequestError:
    return RequestError(
        413,
        f"file too large: {size:,} bytes, more than {MAX_FILE_BYTES:,}; no photo is that large: downscale it or "
        "leave it out",
    )
