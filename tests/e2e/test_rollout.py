"""A rollout (5 live requests mirrored, then a canary), a refused rollout and a rollback on a real running server of each engine
(TorchServe, KServe, Ray Serve), under load from 8 real HTTP clients:
no request fails, every answer names exactly one version (header and JSON alike) and equals that version's
archive run in-process on the same photo, and a refusal leaves the live version serving."""

from __future__ import annotations

import re
import shutil
import time
import zipfile
from pathlib import Path

import pytest

from contract.policy import ServingPolicy
from contract.records import Manifest
from contract.versions import read_defaults, record_default
from export.package.archive import build_archive
from measure.reliability.rollout import VersionedLoad, engine_settings, failures, serving_command
from serving import engine as engines
from tests.answers import assert_same_answer, expected_answer
from tests.conftest import ROOT

pytestmark = pytest.mark.slow
CAT = ROOT / "examples" / "cat.jpg"
NAME = "resnet18"


@pytest.fixture(scope="module")
def versioned_store(resnet18_export, tmp_path_factory) -> Path:
    """v1, the session's export as it was archived, and v2, the same export archived again into the store: two
    versions side by side (their content hash is the same; their version is not)."""
    store = tmp_path_factory.mktemp("versioned-store")
    shutil.copy2(resnet18_export["model_store"] / f"{NAME}.v1.mar", store / f"{NAME}.v1.mar")
    build_archive(resnet18_export["out"], Manifest.read(resnet18_export["out"]), store, NAME)
    assert sorted(path.name for path in store.glob("*.mar")) == [f"{NAME}.mar", f"{NAME}.v1.mar", f"{NAME}.v2.mar"]
    return store


def tampered_copy(archive: Path, folder: Path) -> Path:
    """The archive with one byte of its served artifact changed, its manifest untouched."""
    served = Manifest.from_json(zipfile.ZipFile(archive).read("manifest.json").decode()).served_record().path
    target = folder / f"tampered-{archive.name}"
    with zipfile.ZipFile(archive) as source, zipfile.ZipFile(target, "w") as copy:
        for member in source.infolist():
            data = source.read(member)
            copy.writestr(member, data[:-1] + bytes([data[-1] ^ 1]) if member.filename == served else data)
    return target


# The rollout mirrors live requests to the candidate, then gives it half of them for a while, before the switch.
MIRROR_AND_CANARY = ("--shadow", "5", "--canary", "50", "--canary-seconds", "5")

# One worker of one thread: the candidate loads beside it on the machine's other core.
ONE_WORKER = ServingPolicy(workers=1, batch_size=1, max_batch_delay_ms=5, threads_per_worker=1, device="cpu",
                           reason="tests: one worker")


@pytest.mark.parametrize("engine", ["torchserve", "kserve", "ray"])
def test_rollout_refusal_and_rollback_under_load(engine, versioned_store, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record_default(run_dir, NAME, "v1")  # the start serves v1 although NAME.mar is v2
    if engine == "ray":
        pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install '.[ray]' (an optional extra)")
    settings, url = engine_settings(engine, versioned_store, run_dir, NAME, ONE_WORKER)
    with engines.get(engine)(settings).running(CAT):
        load = VersionedLoad(url, CAT.read_bytes(), kserve_v1=engine == "kserve").start()
        try:
            rolled = serving_command("rollout", NAME, str(versioned_store / f"{NAME}.v2.mar"), "--run-dir", str(run_dir),
                                     *MIRROR_AND_CANARY)
            refused_at = time.monotonic()
            refused = serving_command("rollout", NAME, str(tampered_copy(versioned_store / f"{NAME}.v2.mar", tmp_path)),
                                      "--run-dir", str(run_dir))
            back_at = time.monotonic()
            back = serving_command("rollback", NAME, "--run-dir", str(run_dir))
            time.sleep(1.0)
        finally:
            samples = load.stop()
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert "passed" in rolled.stdout and "v2 is the default" in rolled.stdout, rolled.stdout
    mirrored = re.findall(r"^request \S+ +yes ", rolled.stdout, re.MULTILINE)  # the shadow's table: live requests
    assert len(mirrored) == 5, rolled.stdout
    served = re.search(r"canary: v2 answered (\d+) of resnet18's requests, none failed", rolled.stdout)
    assert served and int(served[1]) > 0, rolled.stdout  # a share of the live requests, before the switch
    assert refused.returncode != 0 and "modified after export" in refused.stderr, refused.stdout + refused.stderr
    assert back.returncode == 0, back.stdout + back.stderr
    assert read_defaults(run_dir) == {NAME: "v1"}  # a restart serves v1 again

    assert samples and not failures(samples), [(s.status, s.error) for s in failures(samples)][:5]
    assert {s.version for s in samples} == {"v1", "v2"}
    during_refusal = [s for s in samples if refused_at <= s.start and s.end <= back_at]
    assert during_refusal and {s.version for s in during_refusal} == {"v2"}  # the live version serves on
    expected = {version: expected_answer(versioned_store / f"{NAME}.{version}.mar", CAT.read_bytes())
                for version in ("v1", "v2")}
    for sample in samples:
        assert_same_answer(sample.answer, expected[sample.version])
        in_process = expected[sample.version].for_served(sample.answer)
        assert sample.answer["version"] == in_process["version"] == sample.version
