"""A model's versions: what the manifest records, how the model store names them, which one a run dir serves.

Every archive the export writes is a version of its model name: a number, monotonic per name in its model store,
and the content hash of what it serves (the artifacts' sha256, so two archives of the same content share it).
The store keeps versions side by side as NAME.vN.mar, the last KEEP_VERSIONS of them (never the live one nor the
one before it). NAME.mar is the live version, what `python -m serving` starts: the first export of a name makes
it, and afterwards only a version that takes the traffic (a rollout's or rollback's switch) becomes it. A
candidate a rollout refused is kept apart in REFUSED_FOLDER, where no start, rollback or --keep-versions sees it.
A rollout also records the default version of each name in the run dir (DEFAULTS_FILE).

Standard library only: the archive ships this file, and the handler reads the version from its manifest.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.errors import VisionExportError
from contract.files import atomic_write_text

KEEP_VERSIONS = 3  # versions of a name the store keeps (the newest ones); `--keep-versions` changes it
VERSION_HEADER = "X-Model-Version"  # every engine's answers carry it, beside the JSON's "version"
UNVERSIONED = "unversioned"  # what an archive made before versions answers, logs and labels its metrics with
UNVERSIONED_ARCHIVE = "1.0"  # what torch-model-archiver calls such an archive (its default), TorchServe's version
REFUSED_FOLDER = "refused"  # in the model store: the candidates rollouts refused, apart from the kept versions
KEEP_REFUSED = 3  # refused candidates of a name kept there to look at (the newest ones)
DEFAULTS_FILE = "model-versions.json"  # in the run dir: {name: "vN"}, the version each name serves by default
_VERSIONED = re.compile(r"^(?P<name>.+)\.v(?P<number>[0-9]+)$")


class VersionError(VisionExportError):
    """A version that does not exist, or a store or run dir whose version records cannot be read."""


@dataclass(frozen=True)
class ModelVersion:
    number: int
    content: str  # sha256 over the served artifacts' own sha256 (export/package/versions.py)

    @property
    def label(self) -> str:
        return f"v{self.number}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelVersion:
        return cls(int(data["number"]), str(data["content"]))


def label_of(version: ModelVersion | None) -> str:
    return version.label if version else UNVERSIONED


def archive_name(name: str, number: int) -> str:
    return f"{name}.v{number}.mar"


def split_versioned(stem: str) -> tuple[str, int] | None:
    """("resnet18", 2) for the stem "resnet18.v2"; None for a plain name."""
    found = _VERSIONED.match(stem)
    return (found["name"], int(found["number"])) if found else None


def is_versioned(archive: Path) -> bool:
    return split_versioned(Path(archive).stem) is not None


def stored_versions(model_store: Path, name: str) -> list[int]:
    """The version numbers the store holds for name, oldest first."""
    found = (split_versioned(path.stem) for path in Path(model_store).glob(f"{glob_escape(name)}.v*.mar"))
    return sorted(number for hit in found if hit and hit[0] == name for number in [hit[1]])


def newest_number(model_store: Path, name: str) -> int:
    """The highest version number name ever had in the store, refused candidates included (numbers are not reused),
    0 for none."""
    numbers = stored_versions(model_store, name) + stored_versions(Path(model_store) / REFUSED_FOLDER, name)
    return max(numbers, default=0)


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def version_archive(model_store: Path, name: str, number: int) -> Path:
    path = Path(model_store) / archive_name(name, number)
    if not path.is_file():
        kept = ", ".join(f"v{n}" for n in stored_versions(model_store, name)) or "none"
        raise VersionError(f"{path} not found: the store keeps {name}'s versions {kept}")
    return path


def parse_label(label: str) -> int:
    if not re.fullmatch(r"v?[0-9]+", label):
        raise VersionError(f"{label!r} is not a version: write vN (e.g. v2)")
    return int(label.lstrip("v"))


# ---------------------------------------------------------------- the live version: the plain archive
def plain_archive(model_store: Path, name: str) -> Path:
    return Path(model_store) / f"{name}.mar"


def live_version(model_store: Path, name: str) -> int | None:
    """The version the plain archive NAME.mar is (a hard link to its NAME.vN.mar, or a copy); None when there is
    no plain archive or it is none of the kept versions (an archive made before versions)."""
    plain = plain_archive(model_store, name)
    if not plain.is_file():
        return None
    for number in reversed(stored_versions(model_store, name)):
        kept = Path(model_store) / archive_name(name, number)
        if os.path.samefile(kept, plain) or filecmp.cmp(kept, plain, shallow=False):
            return number
    return None


def make_live(model_store: Path, name: str, number: int) -> Path:
    """NAME.mar becomes version number: a hard link to NAME.vN.mar (a copy where the file system has none),
    renamed over the plain archive at once, so a start reads the old version or the new one, never a part."""
    versioned = version_archive(model_store, name, number)
    plain = plain_archive(model_store, name)
    staged = plain.with_name(f".{plain.name}.{os.getpid()}.link")
    staged.unlink(missing_ok=True)
    try:
        os.link(versioned, staged)
    except OSError:  # a file system without hard links (some volumes)
        shutil.copy2(versioned, staged)
    os.replace(staged, plain)
    return plain


def protected_versions(model_store: Path, name: str) -> set[int]:
    """The live version and the one before it (what a rollback returns to): never pruned."""
    live = live_version(model_store, name)
    if live is None:
        return set()
    older = [number for number in stored_versions(model_store, name) if number < live]
    return {live, *older[-1:]}


def prune_versions(model_store: Path, name: str, keep: int) -> list[int]:
    """The kept versions beyond the newest `keep` removed, except the live one and the one before it; the
    numbers removed."""
    protected = protected_versions(model_store, name)
    removed = [number for number in stored_versions(model_store, name)[:-keep] if number not in protected]
    for number in removed:
        (Path(model_store) / archive_name(name, number)).unlink(missing_ok=True)
    return removed


def set_aside(model_store: Path, name: str, number: int) -> Path:
    """A refused candidate moved from the kept versions into REFUSED_FOLDER (the newest KEEP_REFUSED stay there to
    look at): no start serves it, no rollback returns to it, --keep-versions does not count it."""
    refused = Path(model_store) / REFUSED_FOLDER
    refused.mkdir(exist_ok=True)
    target = refused / archive_name(name, number)
    os.replace(version_archive(model_store, name, number), target)
    for old in stored_versions(refused, name)[:-KEEP_REFUSED]:
        (refused / archive_name(name, old)).unlink(missing_ok=True)
    return target


# ---------------------------------------------------------------- which version a run dir serves
def read_defaults(run_dir: Path) -> dict[str, str]:
    path = Path(run_dir) / DEFAULTS_FILE
    if not path.is_file():
        return {}
    try:
        found = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise VersionError(f"{path} is not JSON ({error}): delete it to serve each name's newest archive") from None
    if not isinstance(found, dict):
        raise VersionError(f"{path} is not a JSON object: delete it to serve each name's newest archive")
    return {str(name): str(label) for name, label in found.items()}


def record_default(run_dir: Path, name: str, label: str) -> None:
    defaults = read_defaults(run_dir)
    defaults[name] = label
    atomic_write_text(Path(run_dir) / DEFAULTS_FILE, json.dumps(defaults, indent=2, sort_keys=True) + "\n")


def served_archive(model_store: Path, run_dir: Path | None, name: str) -> Path:
    """The archive a start serves for name: the run dir's default version where one was recorded and the store
    still keeps it, else NAME.mar (the live version)."""
    label = read_defaults(run_dir).get(name) if run_dir is not None else None
    if label is not None:
        path = Path(model_store) / archive_name(name, parse_label(label))
        if path.is_file():
            return path
    return plain_archive(model_store, name)
