"""A model's versions: what the manifest records, how the model store names them, which one a run dir serves.

Every archive the export writes is a version of its model name: a number, monotonic per name in its model store,
and the content hash of what it serves (the artifacts' sha256, so two archives of the same content share it).
The store keeps versions side by side as NAME.vN.mar, the last KEEP_VERSIONS of them, and NAME.mar is the newest
(what `python -m serving` starts when no rollout chose another). A rollout records the default version of each
name in the run dir (DEFAULTS_FILE): a restart serves what was default when the server stopped.

Standard library only: the archive ships this file, and the handler reads the version from its manifest.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.errors import VisionExportError
from contract.files import atomic_write_text

KEEP_VERSIONS = 3  # versions of a name the store keeps (the newest ones); `--keep-versions` changes it
VERSION_HEADER = "X-Model-Version"  # every engine's answers carry it, beside the JSON's "version"
UNVERSIONED = "unversioned"  # what an archive made before versions answers
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
    still keeps it, else NAME.mar."""
    label = read_defaults(run_dir).get(name) if run_dir is not None else None
    if label is not None:
        path = Path(model_store) / archive_name(name, parse_label(label))
        if path.is_file():
            return path
    return Path(model_store) / f"{name}.mar"
