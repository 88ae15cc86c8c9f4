"""Partial exports: a form that cannot be made (or run) is refused with its reason and the others go on; the
export fails, with every reason, only when nothing may be served (export.steps, export.pipeline)."""

from __future__ import annotations

import pytest
import torch

from contract.records import Manifest
from export.errors import ExportError
from export.package.manifest import output_record
from export.pipeline import ExportOptions, Progress, export_model
from models.user_module import user_entry
from tests.export.user_models import USER_FILE

SHAPE = (1, 3, 16, 16)


def _export(tmp_path, factory: str):
    return export_model(user_entry(f"{USER_FILE}:{factory}", SHAPE), ExportOptions(tmp_path / factory, "auto"),
                        Progress(quiet=True))


@pytest.mark.slow
def test_an_unscriptable_model_is_exported_in_every_other_form(tmp_path):
    """scripted cannot be made (a namedtuple attribute), onnx-scripted is made from it: both refused; traced,
    exported, onnx-traced and onnx-dynamo are made, pass parity, and the rule serves the first of them."""
    result = _export(tmp_path, "unscriptable")
    manifest = Manifest.read(result.out)
    assert set(manifest.artifacts) == {"traced", "exported", "onnx-traced", "onnx-dynamo"}
    scripted, onnx_scripted = manifest.refused["scripted"], manifest.refused["onnx-scripted"]
    assert (scripted.step, scripted.error) == ("build", "RuntimeError") and "'widen'" in scripted.message
    assert scripted.location.startswith(f"{USER_FILE}:") and scripted.log == "export.log"
    assert (onnx_scripted.step, onnx_scripted.error) == ("needs", "")
    assert manifest.decision().served == "onnx-dynamo" and manifest.parity["passed"]
    assert not (result.out / "model.scripted.pt").exists() and "export.log" in manifest.files
    report = (result.out / "report.md").read_text()
    assert "**scripted is missing**: build: RuntimeError" in report
    assert set(manifest.trace_vs_script["missing"]) == {"scripted", "onnx-scripted"}


@pytest.mark.slow
def test_without_a_scripted_form_a_diverging_trace_is_still_caught_and_nothing_is_served(tmp_path):
    """Unscriptable and data-dependent: the traces diverge from eager on the probe that takes the other branch
    (held to eager, not to the missing script), torch.export refuses the branch: the export fails and says why."""
    with pytest.raises(ExportError) as raised:
        _export(tmp_path, "unscriptable_gated")
    message = str(raised.value)
    assert "models_for_tests: no form may be served" in message
    assert "scripted: build: RuntimeError" in message and "onnx-dynamo: build: " in message
    assert "traced: silently diverges from eager on: large values (x10)" in message
    failed = tmp_path / "unscriptable_gated.failed"
    report = (failed / "report.md").read_text()
    assert "**scripted is missing**" in report and "| traced |" in report and "**WRONG**" in report
    assert (failed / "export.log").is_file() and not (tmp_path / "unscriptable_gated").exists()


@pytest.mark.slow
def test_a_form_that_cannot_run_a_parity_batch_is_refused_and_removed(tmp_path):
    """The trace bakes batch 1 in (int(x.shape[0])): the traced forms cannot run batch 2, so they are refused at
    parity (not a parity failure of the export) and their files leave the folder; the scripted forms serve."""
    manifest = Manifest.read(_export(tmp_path, "batch_baked").out)
    for kind in ("traced", "onnx-traced"):
        refusal = manifest.refused[kind]
        assert (refusal.step, refusal.error) == ("parity", "CannotRunError"), refusal
        assert "cannot run parity input 'structured b2' of shape [2, 3, 16, 16]" in refusal.message
        assert kind not in manifest.artifacts and kind not in manifest.parity["summary"]
    assert {"scripted", "onnx-scripted"} <= set(manifest.artifacts) and manifest.parity["passed"]
    assert manifest.decision().served in ("onnx-dynamo", "onnx-scripted")
    assert not (tmp_path / "batch_baked" / "model.traced.pt").exists()


def test_labels_must_name_every_class_and_their_absence_is_said():
    linear, example = torch.nn.Linear(3, 4), torch.rand(1, 3)
    with pytest.raises(ExportError, match="3 labels were given but the model's output has shape"):
        output_record(linear, example, ["a", "b", "c"])
    record = output_record(linear, example, None)
    assert record.labels is None and record.classes == 4 and "name each class by its index" in record.meaning
    assert output_record(linear, example, list("abcd")).labels == "index_to_name.json"


LOADING_FACTORY = '''
import torch
from torch import nn

def factory():
    module = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
    module.load_state_dict(torch.load(__file__.replace(".py", ".pt")))
    return module
'''


@pytest.mark.slow
def test_the_state_dict_fingerprint_tells_a_recheck_that_the_weights_changed(tmp_path):
    """Loaded weights are 'as the factory built them'; the fingerprint recorded at export makes a parity re-check
    refuse to compare against other weights (the checkpoint was replaced since)."""
    import argparse

    from export.commands import parity_command
    from models.weights import state_dict_fingerprint
    source = tmp_path / "loads.py"
    source.write_text(LOADING_FACTORY)
    torch.manual_seed(1)
    trained = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                  torch.nn.Linear(4, 2))
    torch.save(trained.state_dict(), tmp_path / "loads.pt")
    result = export_model(user_entry(f"{source}:factory", SHAPE), ExportOptions(tmp_path / "out", "auto"),
                          Progress(quiet=True))
    weights = result.manifest.weights
    assert weights["kind"] == "factory" and weights["state_dict_sha256"] == state_dict_fingerprint(trained)
    assert parity_command(argparse.Namespace(folder=tmp_path / "out", device="cpu")) == 0
    torch.save({k: v + 1 for k, v in trained.state_dict().items()}, tmp_path / "loads.pt")  # replaced since
    with pytest.raises(ExportError, match="the rebuilt weights are not the exported ones"):
        parity_command(argparse.Namespace(folder=tmp_path / "out", device="cpu"))
