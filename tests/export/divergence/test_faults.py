"""Held-out proof: three real faults (examples/faulty_models.py), each exported as a user would; the failed export's
parity.json must name the right module and the right line of the model's code for every form that fails."""

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, export_in_process

pytestmark = pytest.mark.slow

FAULTS = ROOT / "examples" / "faulty_models.py"
SHAPE = "1,3,32,32"


def line_of(text: str, before: int = 0) -> str:
    """"examples/faulty_models.py:N" of the one line of the faults file that contains `text` (or `before` above)."""
    numbers = [i for i, line in enumerate(FAULTS.read_text().splitlines(), 1) if text in line]
    assert len(numbers) == 1, f"{text!r} is on lines {numbers}"
    return f"{FAULTS}:{numbers[0] - before}"


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """factory -> the divergence section of its failed export's parity.json (and the command's exit and output)."""
    found = {}
    for factory in ("wrong_symbolic", "folded_batchnorm", "batch_branch"):
        out = tmp_path_factory.mktemp(factory) / "export"
        ran = export_in_process("module", f"{FAULTS}:{factory}", "--input-shape", SHAPE, "--out", str(out))
        failed = Path(f"{out}.failed")
        parity = json.loads((failed / "parity.json").read_text())
        found[factory] = {"code": ran.returncode, "stderr": ran.stderr, "divergence": parity["divergence"],
                          "markdown": (failed / "parity.md").read_text()}
    return found


def first(report: dict, kind: str) -> dict:
    entry = report["divergence"][kind]
    assert isinstance(entry, dict), entry  # a report, not the reason none could be made
    return entry["first"]


def test_a_wrong_onnx_symbolic_is_named_at_its_module_and_the_line_that_calls_it(reports):
    report = reports["wrong_symbolic"]
    assert report["code"] == 3 and set(report["divergence"]) == {"onnx-traced", "onnx-scripted"}
    for kind in ("onnx-traced", "onnx-scripted"):
        row = first(report, kind)
        assert (row["module"], row["module_type"], row["op"]) == ("act", "Swish", "Sigmoid")
        # the legacy exporter keeps no lines: eager's, the custom op's call in the module
        assert row["source"] == row["eager_source"] == line_of("return torch.ops.faulty.swish(x)")
    assert report["divergence"]["onnx-traced"]["definition"] == line_of("return torch.ops.faulty.swish(x)",
                                                                        before=1)
    assert "onnx-traced: first diverges at act (Swish, Sigmoid" in report["stderr"]


def test_a_wrongly_folded_batchnorm_is_named_at_the_folding_module_and_the_path_the_form_took(reports):
    report = reports["folded_batchnorm"]
    assert set(report["divergence"]) == {"traced", "exported", "onnx-traced", "onnx-dynamo"}
    for kind in report["divergence"]:
        row = first(report, kind)
        assert row["module"] == "block" and row["module_type"] == "ConvBN", kind
        assert row["eager_source"] == line_of("return self.bn(self.conv(x))")
    # the forms that keep lines name the deployment path they took, not eager's
    assert first(report, "exported")["form_source"] == line_of("return self.folded(x)")
    assert first(report, "onnx-dynamo")["form_source"] == line_of("return self.folded(x)")
    assert first(report, "traced")["form_source"] == line_of("return F.conv2d(x, weight, bias, padding=1)")
    assert "another line than eager's" in report["markdown"]


def test_a_traced_batch_branch_is_named_at_the_head_and_the_one_image_line_the_trace_kept(reports):
    report = reports["batch_branch"]
    for kind in ("traced", "onnx-traced", "exported", "onnx-dynamo"):
        assert first(report, kind)["module"] == "head.0.fc", kind
    assert "scripted" not in report["divergence"]  # the script keeps the branch
    traced = report["divergence"]["traced"]
    assert traced["first"]["form_source"] == line_of("return self.fc(pooled)")
    assert traced["first"]["eager_source"] == line_of("return self.fc(pooled - pooled.mean(dim=0, keepdim=True))")
    assert traced["inputs"].startswith("'structured b2'")  # batch 1 agrees: the trace was made there
    # torch.export made its program from a batch of 2 (exporters.EXPORT_BATCH): it kept the centring path
    assert first(report, "exported")["form_source"] == traced["first"]["eager_source"]


def test_each_report_shows_how_the_error_grows_downstream(reports):
    downstream = reports["folded_batchnorm"]["divergence"]["exported"]["downstream"]
    assert [r["module"] for r in downstream][:2] == ["block", "act"]
    assert all(not r["within_tolerance"] for r in downstream)
