"""sha256 of artifacts and the check that a file is the one a manifest recorded."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from contract.errors import EXIT_INTEGRITY, VisionExportError
from contract.records import ArtifactRecord


class IntegrityError(VisionExportError):
    """Files on disk do not match the sha256 a manifest recorded; `problems` names each one."""

    exit_code = EXIT_INTEGRITY

    def __init__(self, problems: dict[str, str], what_to_do: str = "re-run the export to rebuild them"):
        self.problems = problems
        listed = "; ".join(f"{name}: {why}" for name, why in problems.items())
        super().__init__(f"integrity check failed ({listed}); {what_to_do}")


def file_sha256(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def mismatch(path: Path, expected_sha256: str) -> str | None:
    """Why `path` is not the recorded file, or None when it is."""
    if not path.is_file():
        return "missing"
    actual = file_sha256(path)
    if actual != expected_sha256:
        return f"sha256 {actual} but the manifest records {expected_sha256}"
    return None


def verify_file(path: str | os.PathLike[str], expected_sha256: str, what_to_do: str) -> None:
    path = Path(path)
    problem = mismatch(path, expected_sha256)
    if problem:
        raise IntegrityError({str(path): problem}, what_to_do)


def artifact_problems(folder: Path, record: ArtifactRecord) -> dict[str, str]:
    """Each file of an artifact (its own and the companions it opens, e.g. an OpenVINO IR's weights) that is not
    the one the manifest recorded, by its path in `folder`, with why."""
    files = {record.path: record.sha256, **record.companions}
    found = {path: mismatch(folder / path, sha256) for path, sha256 in files.items()}
    return {path: problem for path, problem in found.items() if problem}


def verify_artifact(folder: str | os.PathLike[str], record: ArtifactRecord, what_to_do: str) -> None:
    """Refuse an artifact whose file or companions are not the ones the manifest recorded, before any of its code
    runs: the one check every opener of an export's artifact makes."""
    problems = artifact_problems(Path(folder), record)
    if problems:
        raise IntegrityError({str(Path(folder) / path): why for path, why in problems.items()}, what_to_do)
