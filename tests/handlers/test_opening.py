"""Opening an archive as a core (handlers/opening.py), what every engine and the batch call: the device named once,
the archive unpacked once per content and still verified, and every phase of the start reported, the first real
answer last (handlers/start_phases.py)."""

from __future__ import annotations

import json
import logging
import zipfile

import pytest

from contract.records import Manifest
from handlers.metrics import MULTIPROC_ENV
from handlers.opening import UNPACKED_MARK, device_of, open_archive, unpacked
from handlers.start_phases import PHASES, read_phases
from runtime import IntegrityError
from tests.conftest import ROOT

CAT = ROOT / "examples" / "cat.jpg"


def test_the_device_is_named_once_for_every_engine():
    assert device_of("gpu") == "cuda:0" and device_of("gpu", 2) == "cuda:2"
    assert device_of("cpu") == "cpu"


@pytest.mark.slow
def test_an_archive_is_unpacked_once_per_content(resnet18_export, tmp_path):
    archive, folder = resnet18_export["archive"], tmp_path / "model"
    unpacked(archive, folder)
    assert (folder / UNPACKED_MARK).is_file() and Manifest.read(folder).model.name == "resnet18"
    (folder / "left-by-the-first-start").write_text("")
    unpacked(archive, folder)  # the same content: kept as it is
    assert (folder / "left-by-the-first-start").exists()
    changed = tmp_path / "changed.mar"
    with zipfile.ZipFile(archive) as source, zipfile.ZipFile(changed, "w") as target:
        for item in source.infolist():
            target.writestr(item, source.read(item))
        target.writestr("one-more-member.txt", "another archive")
    unpacked(changed, folder)  # another content: unpacked afresh
    assert not (folder / "left-by-the-first-start").exists() and (folder / "one-more-member.txt").is_file()


@pytest.mark.slow
def test_a_kept_folder_whose_served_form_was_changed_is_refused(resnet18_export, tmp_path):
    archive, folder = resnet18_export["archive"], tmp_path / "model"
    unpacked(archive, folder)
    record = Manifest.read(folder).artifacts[Manifest.read(folder).decision().served_kind()]
    with open(folder / record.path, "r+b") as artifact:  # the archive is unchanged, the folder is not
        artifact.seek(-1, 2)
        last = artifact.read(1)
        artifact.seek(-1, 2)
        artifact.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(IntegrityError, match="sha256"):
        open_archive(archive, scratch=folder, threads=1)


@pytest.mark.slow
def test_every_phase_is_reported_and_the_first_real_answer_completes_the_start(resnet18_export, tmp_path,
                                                                                 monkeypatch, caplog):
    run_dir = tmp_path / "run"
    monkeypatch.setenv(MULTIPROC_ENV, str(run_dir / "metrics"))  # as every engine sets it for its processes
    core = open_archive(resnet18_export["archive"], "cpu", scratch=tmp_path / "model", threads=1)
    (opened,) = read_phases(run_dir)
    assert set(opened["seconds"]) == set(PHASES) - {"first_answer"} and opened["ready_at"] is None
    assert opened["model"] == "resnet18" and all(seconds >= 0 for seconds in opened["seconds"].values())
    assert set(opened["cpu_seconds"]) == set(opened["seconds"]) and opened["cpu_seconds"]["process_and_imports"] > 0
    with caplog.at_level(logging.INFO, logger="handlers"):
        core.answer(CAT.read_bytes())
        core.answer(CAT.read_bytes())  # a later answer changes nothing
    (answered,) = read_phases(run_dir)
    assert set(answered["seconds"]) == set(PHASES) and answered["ready_at"] >= answered["born"]
    lines = [record.getMessage() for record in caplog.records if "start phases" in record.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("start phases model=resnet18 ") and " ready=" in lines[0]
    assert json.loads(next((run_dir / "start-phases").glob("*.json")).read_text()) == answered


@pytest.mark.slow
def test_a_served_start_reports_its_phases_in_the_run_dir(resnet18_server):
    """TorchServe's worker (the archive's own handler code) wrote its phases, its readiness answer among them."""
    started = read_phases(resnet18_server.run_dir)
    assert started and {phases["model"] for phases in started} == {"resnet18"}
    assert any(set(phases["seconds"]) == set(PHASES) for phases in started)  # the worker that answered
