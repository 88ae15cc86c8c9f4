"""The version a rollout offers: PATH (an archive, or an export folder archived into the store as the name's next
version) checked before anything is loaded: a readable archive of `python -m export`, its files the ones its
manifest recorded (sha256), of the live version's task. It ends in the model store as NAME.vN.mar, beside the
others, where every engine can open it; the plain NAME.mar (the live version) is the switch's to change. One that
never takes the traffic leaves the store as it was (leave_store): refused, it is set apart in refused/; stopped
by an error or a signal, the copy the rollout added is removed."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from contract.errors import VisionExportError
from contract.records import MANIFEST_NAME, Manifest
from contract.versions import REFUSED_FOLDER, archive_name, label_of, set_aside
from runtime.integrity import verify_archive_signature
from serving.settings import ServingError


class RolloutRefused(ServingError):
    """The candidate may not take traffic; the live version serves on untouched. The message says why."""


@dataclass
class Candidate:
    archive: Path  # NAME.vN.mar in the model store
    manifest: Manifest
    added: bool = False  # the rollout put it into the store (it was not a kept version before)

    @property
    def label(self) -> str:
        return label_of(self.manifest.model_version)

    @property
    def number(self) -> int:
        return self.manifest.model_version.number if self.manifest.model_version else 0


def prepare(path: Path, name: str, model_store: Path) -> Candidate:
    """PATH as a checked version of name in the store (archived there first when PATH is an export folder)."""
    path = Path(path)
    if path.is_dir():
        from export.package.archive import build_archive
        from export.package.manifest import verify_hashes
        manifest = Manifest.read(path)
        try:
            verify_hashes(path, manifest)
        except VisionExportError as error:  # the folder changed after its export
            raise RolloutRefused(f"{path}: {error}") from None
        archived = build_archive(path, manifest, model_store, name, candidate=True)
        return Candidate(archived, checked_manifest(archived), added=True)
    if not path.is_file():
        raise ServingError(f"{path} not found: give an archive (.mar) or an export folder")
    manifest = checked_manifest(path)
    if manifest.model_version is None:
        raise RolloutRefused(f"{path} has no version (archived before versions): re-export it")
    target = Path(model_store) / archive_name(name, manifest.model_version.number)
    added = not target.exists()
    return Candidate(into_store(path, name, manifest, Path(model_store)), manifest, added)


def manifest_in(members: zipfile.ZipFile, archive: Path) -> Manifest:
    """The manifest an archive carries, as it is (nothing checked against it)."""
    return Manifest.from_json(members.read(MANIFEST_NAME).decode(), f"{archive}:{MANIFEST_NAME}")


def served_manifest(archive: Path) -> Manifest:
    """The manifest of an archive a server opened already (its workers checked what they serve): read, not checked
    again."""
    try:
        with zipfile.ZipFile(archive) as members:
            return manifest_in(members, archive)
    except (zipfile.BadZipFile, KeyError, OSError) as error:
        raise RolloutRefused(f"{archive} is not a readable archive of `python -m export` ({error}): truncated or "
                             "damaged; re-export it") from None


def checked_manifest(archive: Path) -> Manifest:
    """The archive's manifest, once every file it ships is the one its manifest recorded (sha256)."""
    verify_archive_signature(archive)  # and, where a key is set, once its signature says who made it
    try:
        with zipfile.ZipFile(archive) as members:
            manifest = manifest_in(members, archive)
            problems = {}
            for record in manifest.artifacts.values():
                for path, sha256 in {record.path: record.sha256, **record.companions}.items():
                    if path in members.namelist() and sha256_of(members, path) != sha256:
                        problems[path] = "its sha256 is not the one the manifest records"
            for path, record in manifest.holdout_photos.items():  # the held-out photos the gate judges it on
                if path not in members.namelist():
                    problems[path] = "missing"
                elif sha256_of(members, path) != record.sha256:
                    problems[path] = "its sha256 is not the one the manifest records"
            served = manifest.served_record().path
            if served not in members.namelist():
                problems[served] = "missing"
    except (zipfile.BadZipFile, KeyError, OSError) as error:
        raise RolloutRefused(f"{archive} is not a readable archive of `python -m export` ({error}): truncated or "
                             "damaged; re-export it") from None
    if problems:
        raise RolloutRefused(f"{archive} was modified after export: "
                             + "; ".join(f"{path}: {why}" for path, why in problems.items()) + "; re-export it")
    return manifest


def carried_photos(candidate: Candidate, count: int) -> list[tuple[str, bytes]]:
    """(name, bytes) of the first `count` held-out photos the candidate's archive carries (checked_manifest checked
    their sha256), each named by its path in the export's held-out folder."""
    paths = list(candidate.manifest.holdout_photos)[:count]
    with zipfile.ZipFile(candidate.archive) as members:
        return [(path.split("/", 1)[-1], members.read(path)) for path in paths]


def sha256_of(members: zipfile.ZipFile, path: str) -> str:
    digest = hashlib.sha256()
    with members.open(path) as member:
        for block in iter(lambda: member.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def into_store(archive: Path, name: str, manifest: Manifest, model_store: Path) -> Path:
    """The archive as NAME.vN.mar in the store (N its own version); one of another content under that number is
    refused rather than overwritten."""
    number = manifest.model_version.number if manifest.model_version else 0
    target = model_store / archive_name(name, number)
    if target.exists() and target.resolve() == archive.resolve():
        return target
    if target.exists():
        stored = checked_manifest(target).model_version
        if stored is None or stored.content != manifest.model_version.content:  # type: ignore[union-attr]
            raise RolloutRefused(f"{target} holds another {name} v{number}: export the candidate into "
                                 f"{model_store} (--model-store) so that it gets the next version number")
        return target
    staged = model_store / f".{target.name}.incoming"
    shutil.copy2(archive, staged)
    staged.replace(target)  # the export prunes old versions; a rollout never removes one it may roll back to
    return target


def leave_store(candidate: Candidate, name: str, live_number: int, refused: bool) -> str:
    """What the store keeps of a candidate that did not take the traffic, said in words: refused and newer than the
    live version, it is set apart (no rollback returns to it, --keep-versions does not count it); otherwise a copy
    this rollout added goes, and a version the store kept before stays."""
    store = candidate.archive.parent
    if refused and candidate.number > live_number and candidate.archive.is_file():
        kept = set_aside(store, name, candidate.number)
        return f"{candidate.label} set apart in {store / REFUSED_FOLDER} ({kept.name})"
    if candidate.added:
        candidate.archive.unlink(missing_ok=True)
        return f"{candidate.archive.name} removed from the store"
    return f"{candidate.archive.name} stays in the store"


def check_task(candidate: Candidate, live_task: str, name: str) -> None:
    if candidate.manifest.task != live_task:
        raise RolloutRefused(f"{candidate.archive} is a {candidate.manifest.task} model; {name} serves a "
                             f"{live_task} model: another task's archive cannot replace it under this name")
