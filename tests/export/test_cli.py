"""The command line as a user meets it: help, one-line errors, user modules, interruption."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from contract.records import MANIFEST_NAME, Manifest
from export.forms import kinds
from tests.conftest import ROOT, run_export

USER_FILE = Path(__file__).parent / "user_models" / "models_for_tests.py"


def test_help_lists_commands_and_choices():
    top = run_export("--help")
    assert top.returncode == 0 and all(c in top.stdout for c in ("resnet", "module", "controlflow", "parity"))
    resnet = run_export("resnet", "--help")
    assert "resnet152" in resnet.stdout and "--weights" in resnet.stdout and "--opset" in resnet.stdout
    assert "--name" in resnet.stdout and "--serve" in resnet.stdout
    help_text = re.sub(r"-\s+", "-", " ".join(resnet.stdout.split()))  # argparse wraps lines, also at hyphens
    assert all(kind in help_text for kind in kinds.names())  # --serve's choices come from the kinds table


@pytest.mark.parametrize("command", [["resnet", "--arch", "resnet18"], ["module", "x.py:f", "--input-shape", "1,3,8,8"]])
def test_serve_takes_only_kinds_of_the_table(command, tmp_path):
    result = run_export(*command, "--serve", "tflite", "--out", str(tmp_path / "o"))
    assert result.returncode == 2  # argparse's usage error, before anything is built
    assert "--serve: invalid choice: 'tflite'" in result.stderr and "onnx-dynamo" in result.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args,expected", [
    (["resnet", "--arch", "resnet9000"], "choose one of: resnet18, resnet34, resnet50, resnet101, resnet152"),
    (["resnet", "--arch", "resnet18", "--weights", "/nonexistent.pt"], "is not a file, nor one of: auto"),
    (["module", "nofile.py:make", "--input-shape", "1,3,8,8"], "does not exist"),
    (["module", f"{USER_FILE}:plain", "--input-shape", "1,x"], "must be positive integers"),
    (["module", f"{USER_FILE}:not_a_module", "--input-shape", "1,3,8,8"], "not a torch.nn.Module"),
    (["parity", "/nonexistent-folder"], "not a complete export"),
])
def test_bad_input_gives_one_line_and_nonzero_exit(args, expected, tmp_path):
    result = run_export(*args, "--out", str(tmp_path / "o")) if args[0] != "parity" else run_export(*args)
    assert result.returncode == 1
    assert expected in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_bad_checkpoint_names_the_keys(tmp_path):
    from tests.export.user_models.models_for_tests import PlainNet
    state = PlainNet().state_dict()
    state["head.extra"] = state.pop("head.bias")
    torch.save(state, tmp_path / "bad.pt")
    result = run_export("module", f"{USER_FILE}:plain", "--input-shape", "1,3,16,16", "--weights",
                        str(tmp_path / "bad.pt"), "--out", str(tmp_path / "o"))
    assert result.returncode == 1
    assert "missing keys: head.bias" in result.stderr and "unexpected keys: head.extra" in result.stderr
    assert not (tmp_path / "o").exists()


def test_unwritable_output_folder(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = run_export("module", f"{USER_FILE}:plain", "--input-shape", "1,3,8,8", "--out", str(blocker / "out"))
    assert result.returncode == 1 and "cannot write to" in result.stderr and "--out" in result.stderr


@pytest.mark.slow
def test_user_module_with_a_branch_gets_a_warning_naming_the_input(tmp_path):
    out, store = tmp_path / "gated", tmp_path / "store"
    result = run_export("module", f"{USER_FILE}:gated", "--input-shape", "1,3,16,16", "--out", str(out),
                        "--model-store", str(store), "--model-name", "gated")
    assert result.returncode == 0, result.stderr
    assert "WARNING" in result.stdout and "large values (x10)" in result.stdout
    manifest = Manifest.read(out)
    assert manifest.model.family == "module" and manifest.model.name == USER_FILE.stem  # the archive is --name's
    diverging = {d["artifact"] for d in manifest.trace_vs_script["diverging"]}
    assert diverging >= {"traced"}
    assert manifest.trace_vs_script["verdicts"]["scripted"] == "right on every probe"
    assert set(manifest.artifacts) >= {"traced", "scripted", "onnx-traced", "onnx-scripted"}
    # a silently diverging artifact is never served, and asking for it is refused at export
    decision = manifest.decision()
    assert decision.served not in diverging and not diverging & set(decision.servable)
    assert decision.candidates["traced"].startswith("silently diverges from eager on:")
    archive = (store / "gated.mar").read_bytes()
    before = Manifest.read(out)
    refused = run_export("module", f"{USER_FILE}:gated", "--input-shape", "1,3,16,16", "--out", str(out),
                         "--model-store", str(store), "--name", "gated", "--serve", "traced")
    assert refused.returncode == 1
    assert "refusing to serve 'traced': silently diverges from eager on:" in refused.stderr
    assert (store / "gated.mar").read_bytes() == archive and Manifest.read(out) == before
    assert sorted(p.name for p in store.iterdir()) == ["gated.mar"]
    # torch.export refuses the data-dependent branch: both forms made from its program are refused with its
    # reason, the traceback kept in export.log
    for kind in ("exported", "onnx-dynamo"):
        assert kind not in manifest.artifacts and kind not in decision.candidates
        refusal = manifest.refused[kind]
        assert (refusal.step, refusal.error, refusal.log) == ("build", "GuardOnDataDependentSymNode", "export.log")
        assert refusal.location.endswith("models_for_tests.py:20")  # the user's `if x.mean() > 0.75:`
        assert f"{kind} NOT MADE, build: GuardOnDataDependentSymNode: " in result.stdout
    assert "(traceback in export.log)" in result.stdout and "Traceback" not in result.stdout + result.stderr
    assert "export.log" in manifest.files
    log = (out / "export.log").read_text()
    assert log.startswith("--- exported refused at build\nTraceback (most recent call last):") and "torch.export" in log
    assert "\x1b[" not in refusal.message  # the manifest holds the reason, not terminal colours


@pytest.mark.slow
def test_user_module_without_control_flow_has_no_warning_and_takes_weights(tmp_path):
    from tests.export.user_models.models_for_tests import PlainNet
    torch.manual_seed(5)
    torch.save(PlainNet().state_dict(), tmp_path / "w.pt")
    out = tmp_path / "plain"
    result = run_export("module", f"{USER_FILE}:plain", "--input-shape", "2,3,16,16", "--weights",
                        str(tmp_path / "w.pt"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stdout
    manifest = Manifest.read(out)
    assert manifest.weights["kind"] == "path" and manifest.trace_vs_script["diverging"] == []
    assert manifest.model.name == USER_FILE.stem and manifest.input.example_shape == (2, 3, 16, 16)


def _start_export(out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "export", "module", f"{USER_FILE}:plain", "--input-shape",
                             "1,3,16,16", "--out", str(out)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.slow
@pytest.mark.parametrize("kill_when", ["model.traced.pt", "model.scripted.onnx"])
def test_interrupted_export_leaves_no_manifest_and_rerun_succeeds(tmp_path, kill_when):
    out = tmp_path / "plain"
    process = _start_export(out)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(f".plain.partial-*/{kill_when}")):
        assert process.poll() is None and time.monotonic() < deadline, "export ended before it could be killed"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (out / MANIFEST_NAME).exists()
    assert not out.exists() or not any(out.iterdir())
    rerun = run_export("module", f"{USER_FILE}:plain", "--input-shape", "1,3,16,16", "--out", str(out))
    assert rerun.returncode == 0, rerun.stderr
    assert (out / MANIFEST_NAME).is_file() and not list(tmp_path.glob(".plain.partial-*"))


@pytest.mark.slow
def test_interrupting_a_reexport_keeps_the_previous_complete_export(tmp_path):
    out = tmp_path / "plain"
    assert run_export("module", f"{USER_FILE}:plain", "--input-shape", "1,3,16,16", "--out", str(out)).returncode == 0
    before = (out / MANIFEST_NAME).read_bytes()
    process = _start_export(out)
    while not list(tmp_path.glob(".plain.partial-*/model.traced.pt")):
        assert process.poll() is None
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)  # Ctrl-C
    assert process.wait(timeout=60) != 0
    assert (out / MANIFEST_NAME).read_bytes() == before
    assert not list(tmp_path.glob(".plain.partial-*"))


@pytest.mark.slow
def test_controlflow_command_reports_traced_wrong_and_scripted_right(tmp_path):
    result = run_export("controlflow", "--out", str(tmp_path / "cf"))
    assert result.returncode == 0, result.stderr
    report = (tmp_path / "cf" / "report.md").read_text()
    for name in ("cf-branch", "cf-loop", "cf-repeat", "resnet18"):
        assert f"## {name}" in report
    assert "**WRONG**" in report and "without any error" in report
    assert "traced" in result.stdout and "WRONG" in result.stdout
    combined = json.loads((tmp_path / "cf" / "report.json").read_text())
    assert combined["cf-repeat"]["diverging"] == []
    assert {d["artifact"] for d in combined["cf-loop"]["diverging"]} == {"traced", "onnx-traced"}


def test_bad_serving_shape_is_refused_before_exporting(tmp_path):
    result = run_export("resnet", "--arch", "resnet18", "--workers", "0", "--out", str(tmp_path / "o"))
    assert result.returncode == 1 and "--workers and --batch-size must be at least 1" in result.stderr
    assert not (tmp_path / "o").exists()
