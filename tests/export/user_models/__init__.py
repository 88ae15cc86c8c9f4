"""User-style model files for the export tests, loaded by path as `python -m export module FILE:factory` does."""

from pathlib import Path

USER_FILE = Path(__file__).resolve().parent / "models_for_tests.py"
PLAIN = f"{USER_FILE}:plain"
PLAIN_SHAPE = "1,3,32,32"  # an image contract (resize and crop to 32): calibration and the gate need one


def plain_export_with_int8(out: Path, formats: str) -> dict:
    """The small user model exported with the fp32 `formats` and their int8 forms, the gate only reported (the
    kinds' tests share one such export per module): its folder, manifest and printed lines."""
    from contract.records import MANIFEST_NAME, Manifest
    from tests.conftest import export_in_process
    done = export_in_process("module", PLAIN, "--input-shape", PLAIN_SHAPE, "--formats", formats, "--precision",
                             "fp32,int8", "--gate", "report", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    return {"out": out, "manifest": Manifest.from_json((out / MANIFEST_NAME).read_text()), "stdout": done.stdout}
