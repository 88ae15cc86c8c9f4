"""`python -m measure decoders`: each decoder timed per JPEG body with its difference from PIL exact; the
comparison docs/benchmarks.md quotes (torchvision's pixels equal PIL's: both are libjpeg-turbo)."""

from __future__ import annotations

import json

from PIL import Image

from measure.request_path import decoders
from tests.conftest import ROOT


def test_every_decoder_gets_a_row_per_jpeg_with_its_difference_from_pil_exact(tmp_path):
    images = tmp_path / "bodies"
    images.mkdir()
    (images / "cat.jpg").write_bytes((ROOT / "examples" / "cat.jpg").read_bytes())
    Image.effect_mandelbrot((1200, 1000), (-2, -1.5, 1, 1.5), 64).convert("RGB").save(images / "big.jpg", quality=90)
    Image.new("RGB", (64, 64)).save(images / "skipped.png")
    out = tmp_path / "out"
    assert decoders.main(["--images", str(images), "--seconds", "0.05", "--resize", "232", "--out", str(out)]) == 0
    report = json.loads((out / "decoders.json").read_text())
    rows = {(r["body"], r["decoder"]): r for r in report["rows"]}
    assert set(rows) == {(b, d) for b in ("cat.jpg", "big.jpg") for d in ("PIL exact", "PIL draft", "torchvision")}
    assert all(r["ms"] > 0 for r in rows.values())
    assert rows["big.jpg", "torchvision"]["max_diff_vs_exact"] == 0  # the same libjpeg-turbo decode
    assert rows["big.jpg", "PIL draft"]["decoded"] == [600, 500]  # 1/2: both sides still >= 2 x 232
    assert rows["cat.jpg", "PIL draft"]["max_diff_vs_exact"] == 0  # too small for draft: exact
    assert "libjpeg-turbo" in report["context"]["libjpeg"]
