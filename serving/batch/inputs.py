"""What a batch run scores: INPUT read as a list of photos, each with a stable name, cut into shards.

  a folder        every entry of its tree but its folders (sorted; hidden files and folders, whose names start
                  with ".", left out and counted in the log); a file that is not an image, and anything that is
                  not a regular file (a device, a FIFO), becomes an error row, never skipped
  a glob          every entry but folders it matches ("photos/**/*.jpg", recursive)
  a table         .parquet or .csv with a column of paths (relative ones from the table's folder) or of image
                  bytes: --column names it (default: the first of path, image, bytes); each row's name is its
                  --id-column value, else its path, else TABLE#ROW. A path that leads outside the table's folder
                  (by "..", as an absolute path, or through a link) is an error row unless allow_outside: a table
                  can come from elsewhere, and its rows must not read what its folder does not hold

Shards are consecutive runs of SHARD_SIZE photos; a shard's key is a hash of its photos' names, so the same INPUT
gives the same shards and a resumed run finds the parts already written (serving/batch/output.py).
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from contract.errors import VisionExportError

logger = logging.getLogger(__name__)

SHARD_SIZE = 256  # photos per output part: small enough that a killed run loses little, large enough for Parquet
TABLE_SUFFIXES = (".parquet", ".csv")
IMAGE_COLUMNS = ("path", "image", "bytes")  # the column used when --column names none
GLOB_CHARACTERS = "*?["


class BatchInputError(VisionExportError):
    """INPUT cannot be read as photos; the message says what was wrong and what to pass instead."""


@dataclass(frozen=True)
class Photo:
    """One photo to score: its name in the output (`input`), and where its bytes are (a path, or the bytes)."""

    input: str
    path: str | None = None
    data: bytes | None = None
    inside: str = ""  # the folder `path` must resolve into ("": anywhere); checked where it is read (decoding.py)


@dataclass(frozen=True)
class Shard:
    key: str  # a hash of its photos' names: the name of its output part
    photos: tuple[Photo, ...]


def read_inputs(
    source: str, column: str | None = None, id_column: str | None = None, allow_outside: bool = False
) -> list[Photo]:
    """INPUT as photos, in a stable order; an empty or unreadable INPUT is a BatchInputError. A table's paths must
    stay inside its folder unless allow_outside."""
    path = Path(source)
    if any(character in source for character in GLOB_CHARACTERS) and not path.exists():
        photos = from_glob(source)
    elif path.is_dir():
        photos = from_folder(path)
    elif path.is_file() and path.suffix.lower() in TABLE_SUFFIXES:
        photos = from_table(path, column, id_column, "" if allow_outside else os.path.realpath(path.parent))
    elif path.is_file():
        photos = [Photo(str(path), path=str(path))]
    else:
        raise BatchInputError(
            f"{source}: no such file or folder; pass a folder of photos, a glob such as "
            "'photos/**/*.jpg', or a .parquet/.csv table with a path or bytes column"
        )
    if not photos:
        raise BatchInputError(f"{source}: no photo there; nothing to score")
    names = [photo.input for photo in photos]
    if len(set(names)) != len(names):
        raise BatchInputError(
            f"{source}: the same name is given to several rows (e.g. {first_repeat(names)!r}); "
            "every photo needs a name of its own: pass --id-column with a unique column"
        )
    return photos


def from_folder(folder: Path) -> list[Photo]:
    files, hidden = [], 0
    for path in sorted(folder.rglob("*")):
        if any(part.startswith(".") for part in path.relative_to(folder).parts):
            hidden += path.is_file()
        elif not path.is_dir():  # a FIFO or a device too: its row says why it is not read
            files.append(Photo(str(path), path=str(path)))
    if hidden:
        logger.info("%s: %d hidden file(s) left out (names starting with '.')", folder, hidden)
    return files


def from_glob(pattern: str) -> list[Photo]:
    return [Photo(name, path=name) for name in sorted(glob.glob(pattern, recursive=True)) if not Path(name).is_dir()]


def from_table(table_path: Path, column: str | None, id_column: str | None, inside: str) -> list[Photo]:
    table = read_table(table_path)
    column = column or next((name for name in IMAGE_COLUMNS if name in table.column_names), None)
    for wanted in (column, id_column):
        if wanted is not None and wanted not in table.column_names:
            raise BatchInputError(
                f"{table_path}: no column {wanted!r} (has {', '.join(table.column_names)}); "
                "name the photos' column with --column and the names' with --id-column"
            )
    if column is None:
        raise BatchInputError(
            f"{table_path}: none of the columns {', '.join(IMAGE_COLUMNS)} (has "
            f"{', '.join(table.column_names)}); name the column of paths or bytes with --column"
        )
    values = table.column(column).to_pylist()
    ids = table.column(id_column).to_pylist() if id_column else [None] * len(values)
    rows = enumerate(zip(values, ids))
    return [table_photo(table_path, index, value, name, inside) for index, (value, name) in rows]


def read_table(path: Path):
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.parquet

    try:
        return pyarrow.parquet.read_table(path) if path.suffix.lower() == ".parquet" else pyarrow.csv.read_csv(path)
    except (pa.ArrowInvalid, OSError) as error:
        raise BatchInputError(f"{path}: not a readable {path.suffix[1:]} table ({error})") from None


def table_photo(table_path: Path, index: int, value, name, inside: str) -> Photo:
    """One table row: bytes are the photo; a string is its path, relative ones from the table's folder, to be read
    only if it resolves inside `inside` ("": anywhere)."""
    if isinstance(value, (bytes, bytearray)):
        return Photo(str(name) if name is not None else f"{table_path}#{index}", data=bytes(value))
    if value is None:
        return Photo(str(name) if name is not None else f"{table_path}#{index}", data=b"")
    path = Path(str(value))
    path = path if path.is_absolute() else table_path.parent / path
    return Photo(str(name) if name is not None else str(value), path=str(path), inside=inside)


def photo_items(pending: list[Shard]) -> list[dict]:
    """The pending photos in INPUT's order as the rows the scoring reads (decoding.py read_bodies), each with its
    shard's key."""
    return [
        {
            "input": photo.input,
            "shard": shard.key,
            "path": photo.path or "",
            "data": photo.data or b"",
            "inside": photo.inside,
        }
        for shard in pending
        for photo in shard.photos
    ]


def shards(photos: list[Photo], size: int = SHARD_SIZE) -> list[Shard]:
    """Consecutive runs of `size` photos, each keyed by a hash of its photos' names."""
    runs = [tuple(photos[start : start + size]) for start in range(0, len(photos), size)]
    return [Shard(names_hash(photo.input for photo in run)[:20], run) for run in runs]


def names_hash(names) -> str:
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()


def first_repeat(names: list[str]) -> str:
    seen: set[str] = set()
    return next(name for name in names if name in seen or seen.add(name))  # type: ignore[func-returns-value]
