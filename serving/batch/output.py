"""What a batch run writes into OUT: one Parquet part per input shard, each written whole or not at all, and
the run's record.

  OUT/part-<shard key>.parquet   the shard's rows (SCHEMA), one per photo; written to a hidden temporary file,
                                 synced, then renamed: a part is there complete or not at all
  OUT/_run.json                  what the run scores (the inputs' hash and count, the part size) and with what
                                 (the model, its version and the content hash of what it serves): a resumed run
                                 must be the same run; another is refused before any work rather than mixed
                                 into OUT (rows of two versions in one output would be read as one model's)

A resumed run skips every shard whose part exists, so each photo ends in exactly one row.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from contract.errors import VisionExportError
from contract.files import atomic_write_bytes, atomic_write_text

RUN_RECORD = "_run.json"
PART_PREFIX = "part-"
PART_SUFFIX = ".parquet"

SCHEMA = pa.schema(
    [
        pa.field("input", pa.string(), nullable=False),  # the photo's name: its path, or its table row's id
        pa.field("status", pa.int32(), nullable=False),  # 200, or the HTTP status the endpoint answers it with
        pa.field("error", pa.string()),  # the endpoint's error message; null when status is 200
        pa.field("answer", pa.string()),  # the endpoint's JSON answer, as it sends it; null on error
        pa.field("label", pa.string()),  # the answer's first label (top class, first box, largest class); null if none
        pa.field("score", pa.float64()),  # its probability, score or share
        pa.field("model", pa.string(), nullable=False),
        pa.field("version", pa.string(), nullable=False),  # the model's version: vN, or unversioned (an export folder)
        pa.field("artifact", pa.string(), nullable=False),  # the served form that computed it
    ]
)


class BatchOutputError(VisionExportError):
    """OUT cannot take this run (it holds another run's rows, or is not a folder); the message says what to do."""


@dataclass(frozen=True)
class RunRecord:
    inputs_sha256: str  # of every photo's name, in order
    photos: int
    shard_size: int
    model: str
    source: str  # INPUT as given
    version: str  # the model's version label (vN; "unversioned" for an export folder)
    content: str  # sha256 over the artifacts it serves: tells two unversioned exports apart

    def write(self, out: Path) -> None:
        atomic_write_text(out / RUN_RECORD, json.dumps(asdict(self), indent=2) + "\n")

    def model_line(self) -> str:
        return f"{self.model} {self.version} (content {self.content[:12]})"


def prepare_out(out: Path, record: RunRecord) -> set[str]:
    """OUT made ready for this run: created, or holding the same run (its parts kept, stale temporary files of a
    killed run removed); the keys of the shards already written."""
    if out.exists() and not out.is_dir():
        raise BatchOutputError(f"{out} is a file; --out names a folder of Parquet parts")
    out.mkdir(parents=True, exist_ok=True)
    previous = out / RUN_RECORD
    if previous.is_file():
        refuse_another_run(out, read_record(previous), record)
    elif any(out.glob(f"{PART_PREFIX}*{PART_SUFFIX}")):
        raise BatchOutputError(f"{out} holds parts but no {RUN_RECORD}: choose a new --out")
    for stale in out.glob(f".{PART_PREFIX}*.tmp"):
        stale.unlink()
    record.write(out)
    return written_keys(out)


def read_record(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BatchOutputError(f"{path} cannot be read ({error}): choose a new --out") from None
    if not isinstance(found, dict):
        raise BatchOutputError(f"{path} is not a run's record: choose a new --out")
    return found


def refuse_another_run(out: Path, found: dict, record: RunRecord) -> None:
    """Nothing when OUT's record is this run's; else the refusal naming what differs: the model (or its version),
    or the photos."""
    if found == asdict(record):
        return
    model = ("model", "version", "content")
    if any(found.get(key) != getattr(record, key) for key in model):
        before = (
            f"{found.get('model')} {found.get('version')} (content {str(found.get('content'))[:12]})"
            if found.get("version")
            else f"{found.get('model')}, its version not recorded (an earlier release wrote it)"
        )
        raise BatchOutputError(
            f"{out} holds rows scored by {before}; this run scores with {record.model_line()}: the rows of two "
            f"models or versions would mix in one output; choose a new --out, or remove {out} to start over"
        )
    raise BatchOutputError(
        f"{out} holds another run ({found.get('photos')} photos of {found.get('source')}, parts of "
        f"{found.get('shard_size')}); this one scores {record.photos} photos of {record.source} in parts of "
        f"{record.shard_size}: choose a new --out, or remove {out} to start over"
    )


def written_keys(out: Path) -> set[str]:
    return {path.name[len(PART_PREFIX) : -len(PART_SUFFIX)] for path in out.glob(f"{PART_PREFIX}*{PART_SUFFIX}")}


def part_path(out: Path, key: str) -> Path:
    return out / f"{PART_PREFIX}{key}{PART_SUFFIX}"


def write_part(out: Path, key: str, rows: list[dict]) -> Path:
    """The shard's rows as one Parquet file, appearing whole (contract.files.atomic_write_bytes)."""
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), sink)
    path = part_path(out, key)
    atomic_write_bytes(path, sink.getvalue().to_pybytes())
    return path


def read_rows(out: Path) -> pa.Table:
    """Every part of OUT as one table (what a reader of the output gets)."""
    parts = sorted(out.glob(f"{PART_PREFIX}*{PART_SUFFIX}"))
    if not parts:
        return SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(part, schema=SCHEMA) for part in parts])


def fsync_folder(out: Path) -> None:
    """The renames themselves made durable (a part's rename survives a power cut once its folder is synced)."""
    descriptor = os.open(out, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
