"""A failed export never replaces a good one: the previous folder and .mar stay byte-identical, the
failed attempt is kept beside it for inspection, and the error says where."""

import hashlib
from pathlib import Path

import pytest

from tests.conftest import run_export
from tests.export.user_models import USER_FILE

pytestmark = pytest.mark.slow

SHAPE = "1,3,16,16"


def fingerprint(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def good_export(tmp_path_factory):
    """One complete export and archive that every failing export below is made over."""
    base = tmp_path_factory.mktemp("good")
    out, store = base / "net", base / "store"
    result = run_export("module", f"{USER_FILE}:plain", "--input-shape", SHAPE, "--out", str(out),
                        "--model-store", str(store), "--model-name", "net")
    assert result.returncode == 0, result.stderr
    return {"out": out, "store": store, "before": fingerprint(out), "mar": (store / "net.mar").read_bytes()}


def export_over(export_main, good, factory: str):
    """Another model exported over the good one (in this process: export.cli.main)."""
    return export_main("module", f"{USER_FILE}:{factory}", "--input-shape", SHAPE, "--out", good["out"],
                       "--model-store", good["store"], "--model-name", "net")


def assert_untouched(good):
    assert fingerprint(good["out"]) == good["before"]
    assert (good["store"] / "net.mar").read_bytes() == good["mar"]
    assert sorted(p.name for p in good["store"].iterdir()) == ["net.mar", "net.v1.mar"]  # no half-built archive left


def test_parity_failure_keeps_the_previous_export_and_archive(good_export, export_main):
    result = export_over(export_main, good_export, "scripted_differs")
    assert result.returncode == 3, result.stdout + result.stderr
    failed = good_export["out"].with_name("net.failed")
    assert f"the failed attempt is kept in {failed}" in result.stderr
    assert "parity failed for onnx-scripted, scripted" in result.stderr
    assert_untouched(good_export)
    assert "FAIL" in (failed / "parity.md").read_text()
    assert "ParityError" in (failed / "FAILED.txt").read_text()
    assert not (failed / "manifest.json").exists()  # never a manifest beside artifacts that failed


def test_eval_check_failure_keeps_the_previous_export_and_archive(good_export, export_main):
    result = export_over(export_main, good_export, "noisy_in_eval")
    assert result.returncode == 1
    assert "two forward passes on the same input differ" in result.stderr
    assert_untouched(good_export)
