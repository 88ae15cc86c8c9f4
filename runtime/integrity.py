"""sha256 of artifacts and the check that a file is the one a manifest recorded (integrity: the sha256s are the
archive's own); and, where a key is configured, the Ed25519 signature over every file of an archive that says who
made it (authenticity): export signs, every engine verifies before the archive's code runs."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import zipfile
from pathlib import Path
from typing import Any

from contract.errors import EXIT_INTEGRITY, VisionExportError
from contract.records import ArtifactRecord

logger = logging.getLogger("runtime.integrity")


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


# ---------------------------------------------------------------- signatures: who made the archive
READ_BYTES = 2**20  # a member is hashed a MiB at a time
SIGNATURE_NAME = "SIGNATURE.json"  # the archive's member holding the signature over every other member
SIGN_KEY_ENV = "VISION_EXPORT_SIGN_KEY"  # export: the Ed25519 private key (PEM) that signs each archive
VERIFY_KEY_ENV = "VISION_EXPORT_VERIFY_KEY"  # serving: the public key (PEM) every served archive must be signed with
INTEGRITY_ONLY = (f"no public key configured ({VERIFY_KEY_ENV}): the archive's sha256s are its own manifest's, so "
                  "they show damage, not who made it (integrity only)")
RESIGN = f"export it again signed with the key whose public half {VERIFY_KEY_ENV} names (python -m export --sign-key)"


def member_digests(members: zipfile.ZipFile) -> dict[str, str]:
    """{member: sha256} of every file of an archive but its signature; a name twice (which copy an unzip keeps
    depends on the tool) refuses the archive."""
    names = [info.filename for info in members.infolist() if not info.is_dir() and info.filename != SIGNATURE_NAME]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise IntegrityError({name: "stored twice" for name in twice}, RESIGN)
    digests = {}
    for name in sorted(names):
        digest = hashlib.sha256()
        with members.open(name) as member:
            for chunk in iter(lambda: member.read(READ_BYTES), b""):
                digest.update(chunk)
        digests[name] = digest.hexdigest()
    return digests


def signed_bytes(digests: dict[str, str]) -> bytes:
    return json.dumps(digests, sort_keys=True, separators=(",", ":")).encode()


def load_key(path: Path, private: bool) -> Any:
    """An Ed25519 key from a PEM file; IntegrityError naming the file when it is not one."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    kind = "private" if private else "public"
    try:
        data = Path(path).read_bytes()
        key = (serialization.load_pem_private_key(data, password=None) if private
               else serialization.load_pem_public_key(data))
    except (OSError, ValueError, TypeError) as error:
        raise IntegrityError({str(path): f"not an Ed25519 {kind} key in PEM ({error})"},
                             "make one with `openssl genpkey -algorithm ed25519 -out sign.pem` and "
                             "`openssl pkey -in sign.pem -pubout -out verify.pem`") from None
    wanted = ed25519.Ed25519PrivateKey if private else ed25519.Ed25519PublicKey
    if not isinstance(key, wanted):
        raise IntegrityError({str(path): f"a {type(key).__name__}, not an Ed25519 {kind} key"}, RESIGN)
    return key


def sign_archive(archive: Path, private_key: Path) -> None:
    """Add SIGNATURE_NAME to the archive: the Ed25519 signature over the sha256 of every other member (the
    manifest, the artifacts, the handler's code, TorchServe's MAR-INF)."""
    key = load_key(private_key, private=True)
    with zipfile.ZipFile(archive, "a") as members:
        if SIGNATURE_NAME in members.namelist():
            raise IntegrityError({str(archive): "signed already"}, "sign an archive once, as export writes it")
        digests = member_digests(members)
        signature = base64.b64encode(key.sign(signed_bytes(digests))).decode()
        members.writestr(SIGNATURE_NAME, json.dumps({"algorithm": "ed25519", "files": digests,
                                                     "signature": signature}, indent=1))


def verify_archive_signature(archive: Path, public_key: Path | None = None) -> str:
    """Refuse an archive that is not signed by public_key (default: VERIFY_KEY_ENV's file), or one with a member
    changed, added or taken away since it was signed: before any of its code can run. Without a key configured,
    nothing is refused and the log says the check is integrity only. What was checked, as the log says it."""
    public_key = public_key or (Path(os.environ[VERIFY_KEY_ENV]) if os.environ.get(VERIFY_KEY_ENV) else None)
    if public_key is None:
        logger.info("%s: %s", archive, INTEGRITY_ONLY)
        return INTEGRITY_ONLY
    key = load_key(public_key, private=False)
    try:
        with zipfile.ZipFile(archive) as members:
            problems, files = signature_problems(members, key, public_key)
    except (OSError, zipfile.BadZipFile) as error:
        raise IntegrityError({str(archive): f"not a readable archive ({error})"}, RESIGN) from None
    if problems:
        raise IntegrityError({f"{archive}: {name}": why for name, why in problems.items()}, RESIGN)
    line = f"signature verified with {public_key}: {files} files, handler code included"
    logger.info("%s: %s", archive, line)
    return line


def signature_problems(members: zipfile.ZipFile, key: Any, public_key: Path) -> tuple[dict[str, str], int]:
    """({member: why} for each that differs from the signed archive, or for the signature itself; files signed)."""
    from cryptography.exceptions import InvalidSignature
    if SIGNATURE_NAME not in members.namelist():
        return {SIGNATURE_NAME: "missing: the archive is not signed"}, 0
    try:
        record = json.loads(members.read(SIGNATURE_NAME))
        key.verify(base64.b64decode(record["signature"]), signed_bytes(record["files"]))
    except (InvalidSignature, ValueError, KeyError, TypeError):
        return {SIGNATURE_NAME: f"does not verify with {public_key}"}, 0
    return changed_members(record["files"], member_digests(members)), len(record["files"])


def changed_members(signed: dict[str, str], found: dict[str, str]) -> dict[str, str]:
    """Each member that differs from what was signed, with why."""
    problems = {name: "changed after signing" for name in signed if name in found and found[name] != signed[name]}
    problems.update({name: "missing" for name in signed if name not in found})
    problems.update({name: "added after signing" for name in found if name not in signed})
    return problems
