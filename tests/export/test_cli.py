"""The command line as a user meets it: help, one-line errors, user modules, interruption.

What a command says and does is checked in this process (export.cli.main, the `export_main` fixture); a few
tests start `python -m export` itself: the entry point, an error in a real process, exports that are killed or
interrupted, and the exports other tests here read."""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from contract.records import MANIFEST_NAME, Manifest
from export.atomic import FAILURE_NOTE
from export.forms import kinds
from tests.conftest import ROOT, run_export
from tests.export.user_models import USER_FILE


def test_help_lists_commands_and_choices(export_main):
    top = export_main("--help")
    assert top.returncode == 0 and all(c in top.stdout for c in ("resnet", "module", "controlflow", "parity"))
    resnet = export_main("resnet", "--help")
    assert resnet.returncode == 0
    assert "resnet152" in resnet.stdout and "--weights" in resnet.stdout and "--opset" in resnet.stdout
    assert "--name" in resnet.stdout and "--serve" in resnet.stdout
    help_text = re.sub(r"-\s+", "-", " ".join(resnet.stdout.split()))  # argparse wraps lines, also at hyphens
    assert all(kind in help_text for kind in kinds.names())  # --serve's choices come from the kinds table


@pytest.mark.parametrize("command", [["resnet", "--arch", "resnet18"], ["module", "x.py:f", "--input-shape", "1,3,8,8"]])
def test_serve_takes_only_kinds_of_the_table(command, export_main, tmp_path):
    result = export_main(*command, "--serve", "tflite", "--out", tmp_path / "o")
    assert result.returncode == 2  # argparse's usage error, before anything is built
    assert "--serve: invalid choice: 'tflite'" in result.stderr and "onnx-dynamo" in result.stderr
    assert not (tmp_path / "o").exists()


def test_an_error_in_a_real_process_is_one_line_and_exit_1(tmp_path):
    """`python -m export` as a process: its entry point, and an error as one line on stderr with exit code 1."""
    result = run_export("resnet", "--arch", "resnet9000", "--out", str(tmp_path / "o"))
    assert result.returncode == 1
    assert "choose one of: resnet18, resnet34, resnet50, resnet101, resnet152" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,expected", [
    (["resnet", "--arch", "resnet9000"], "choose one of: resnet18, resnet34, resnet50, resnet101, resnet152"),
    (["resnet", "--arch", "resnet18", "--weights", "/nonexistent.pt"], "is not a file, nor one of: auto"),
    (["module", "nofile.py:make", "--input-shape", "1,3,8,8"], "does not exist"),
    (["module", f"{USER_FILE}:plain", "--input-shape", "1,x"], "must be positive integers"),
    (["module", f"{USER_FILE}:not_a_module", "--input-shape", "1,3,8,8"], "not a torch.nn.Module"),
    (["parity", "/nonexistent-folder"], "not a complete export"),
])
def test_bad_input_gives_one_line_and_nonzero_exit(args, expected, export_main, tmp_path):
    result = export_main(*args, "--out", tmp_path / "o") if args[0] != "parity" else export_main(*args)
    assert result.returncode == 1
    assert expected in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_bad_checkpoint_names_the_keys(export_main, tmp_path):
    from tests.export.user_models.models_for_tests import PlainNet
    state = PlainNet().state_dict()
    state["head.extra"] = state.pop("head.bias")
    torch.save(state, tmp_path / "bad.pt")
    result = export_main("module", f"{USER_FILE}:plain", "--input-shape", "1,3,16,16", "--weights",
                         tmp_path / "bad.pt", "--out", tmp_path / "o")
    assert result.returncode == 1
    assert "missing keys: head.bias" in result.stderr and "unexpected keys: head.extra" in result.stderr
    assert not (tmp_path / "o").exists()


def test_unwritable_output_folder(export_main, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = export_main("module", f"{USER_FILE}:plain", "--input-shape", "1,3,8,8", "--out", blocker / "out")
    assert result.returncode == 1 and "cannot write to" in result.stderr and "--out" in result.stderr


def test_bad_serving_shape_is_refused_before_exporting(export_main, tmp_path):
    result = export_main("resnet", "--arch", "resnet18", "--workers", "0", "--out", tmp_path / "o")
    assert result.returncode == 1 and "--workers must be at least 1, got 0" in result.stderr
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def gated(tmp_path_factory) -> dict:
    """`python -m export module models_for_tests.py:gated` (a data-dependent branch) with its archive."""
    base = tmp_path_factory.mktemp("gated")
    out, store = base / "gated", base / "store"
    result = run_export("module", f"{USER_FILE}:gated", "--input-shape", "1,3,16,16", "--out", str(out),
                        "--model-store", str(store), "--model-name", "gated")
    assert result.returncode == 0, result.stderr
    return {"out": out, "store": store, "stdout": result.stdout, "stderr": result.stderr}


@pytest.mark.slow
def test_user_module_with_a_branch_gets_a_warning_naming_the_input(gated):
    out, stdout = gated["out"], gated["stdout"]
    assert "WARNING" in stdout and "large values (x10)" in stdout
    manifest = Manifest.read(out)
    assert manifest.model.family == "module" and manifest.model.name == USER_FILE.stem  # the archive is --name's
    diverging = {d["artifact"] for d in manifest.trace_vs_script["diverging"]}
    assert diverging >= {"traced"}
    assert manifest.trace_vs_script["verdicts"]["scripted"] == "right on every probe"
    assert set(manifest.artifacts) >= {"traced", "scripted", "onnx-traced", "onnx-scripted"}
    # a silently diverging artifact is never served (asking for it: the next test)
    decision = manifest.decision()
    assert decision.served not in diverging and not diverging & set(decision.servable)
    assert decision.candidates["traced"].startswith("silently diverges from eager on:")
    # torch.export refuses the data-dependent branch: both forms made from its program are refused with its
    # reason, the traceback kept in export.log
    for kind in ("exported", "onnx-dynamo"):
        assert kind not in manifest.artifacts and kind not in decision.candidates
        refusal = manifest.refused[kind]
        assert (refusal.step, refusal.error, refusal.log) == ("build", "GuardOnDataDependentSymNode", "export.log")
        assert refusal.location.endswith("models_for_tests.py:20")  # the user's `if x.mean() > 0.75:`
        assert f"{kind} NOT MADE, build: GuardOnDataDependentSymNode: " in stdout
    assert "(traceback in export.log)" in stdout and "Traceback" not in stdout + gated["stderr"]
    assert "export.log" in manifest.files
    log = (out / "export.log").read_text()
    assert log.startswith("--- exported refused at build\nTraceback (most recent call last):") and "torch.export" in log
    assert "\x1b[" not in refusal.message  # the manifest holds the reason, not terminal colours


@pytest.mark.slow
def test_serving_a_diverging_artifact_is_refused_and_changes_nothing(gated, export_main):
    out, store = gated["out"], gated["store"]
    archive, before = (store / "gated.mar").read_bytes(), Manifest.read(out)
    refused = export_main("module", f"{USER_FILE}:gated", "--input-shape", "1,3,16,16", "--out", out,
                          "--model-store", store, "--name", "gated", "--serve", "traced")
    assert refused.returncode == 1
    assert "refusing to serve 'traced': silently diverges from eager on: large values (x10)" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert (store / "gated.mar").read_bytes() == archive and Manifest.read(out) == before
    assert sorted(p.name for p in store.iterdir()) == ["gated.mar", "gated.v1.mar"]  # no archive, no scratch folder
    failed = out.with_name("gated.failed")  # the attempt is kept for inspection, never with a manifest
    assert f"the failed attempt is kept in {failed}" in refused.stderr
    assert "refusing to serve 'traced'" in (failed / FAILURE_NOTE).read_text()
    assert not (failed / MANIFEST_NAME).exists()


@pytest.mark.slow
def test_name_writes_that_archive_and_leaves_another_byte_identical(gated, export_main, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(gated["store"], store)
    first = (store / "gated.mar").read_bytes()
    out = tmp_path / "plain"
    result = export_main("module", f"{USER_FILE}:plain", "--input-shape", "1,3,16,16", "--out", out,
                         "--model-store", store, "--name", "classifier")
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in store.iterdir()) == ["classifier.mar", "classifier.v1.mar", "gated.mar",
                                                       "gated.v1.mar"]
    assert (store / "gated.mar").read_bytes() == first
    with zipfile.ZipFile(store / "classifier.mar") as archive:
        archived = Manifest.from_json(archive.read(MANIFEST_NAME).decode())
        assert archived.model.name == USER_FILE.stem and archived.model_version.number == 1
        # the archive's manifest is the export's, plus the version the store gave it
        assert dataclasses.replace(archived, model_version=None) == Manifest.read(out)
        assert "classifier" in archive.read("MAR-INF/MANIFEST.json").decode()  # TorchServe's model name


@pytest.mark.slow
def test_user_module_without_control_flow_has_no_warning_and_takes_weights(export_main, tmp_path):
    from tests.export.user_models.models_for_tests import PlainNet
    torch.manual_seed(5)
    torch.save(PlainNet().state_dict(), tmp_path / "w.pt")
    out = tmp_path / "plain"
    result = export_main("module", f"{USER_FILE}:plain", "--input-shape", "2,3,16,16", "--weights",
                         tmp_path / "w.pt", "--out", out)
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stdout
    manifest = Manifest.read(out)
    assert manifest.weights["kind"] == "path" and manifest.trace_vs_script["diverging"] == []
    assert manifest.model.name == USER_FILE.stem and manifest.input.example_shape == (2, 3, 16, 16)


def _start_export(out: Path) -> subprocess.Popen:
    """`python -m export` on the tiny model into out; what it prints goes to OUT.output.txt beside it."""
    with open(out.parent / f"{out.name}.output.txt", "wb") as output:
        return subprocess.Popen([sys.executable, "-m", "export", "module", f"{USER_FILE}:plain", "--input-shape",
                                 "1,3,16,16", "--out", str(out)], cwd=ROOT, stdout=output,
                                stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.slow
@pytest.mark.parametrize("kill_when", ["model.traced.pt", "model.scripted.onnx"])
def test_interrupted_export_leaves_no_manifest_and_rerun_succeeds(tmp_path, kill_when, export_main):
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
    rerun = export_main("module", f"{USER_FILE}:plain", "--input-shape", "1,3,16,16", "--out", out)
    assert rerun.returncode == 0, rerun.stderr
    assert (out / MANIFEST_NAME).is_file() and not list(tmp_path.glob(".plain.partial-*"))


@pytest.mark.slow
def test_interrupting_a_reexport_keeps_the_previous_complete_export(tmp_path, export_main):
    out = tmp_path / "plain"
    assert export_main("module", f"{USER_FILE}:plain", "--input-shape", "1,3,16,16", "--out", out).returncode == 0
    before = (out / MANIFEST_NAME).read_bytes()
    process = _start_export(out)
    while not list(tmp_path.glob(".plain.partial-*/model.traced.pt")):
        assert process.poll() is None
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)  # Ctrl-C
    assert process.wait(timeout=60) != 0
    assert (out / MANIFEST_NAME).read_bytes() == before
    assert not list(tmp_path.glob(".plain.partial-*")), (tmp_path / "plain.output.txt").read_text()[-3000:]


@pytest.mark.slow
def test_controlflow_command_reports_traced_wrong_and_scripted_right(controlflow_export):
    out, stdout = controlflow_export["out"], controlflow_export["stdout"]
    report = (out / "report.md").read_text()
    for name in ("cf-branch", "cf-loop", "cf-repeat", "resnet18"):
        assert f"## {name}" in report
    assert "**WRONG**" in report and "without any error" in report
    assert "traced" in stdout and "WRONG" in stdout
    combined = json.loads((out / "report.json").read_text())
    assert combined["cf-repeat"]["diverging"] == []
    assert {d["artifact"] for d in combined["cf-loop"]["diverging"]} == {"traced", "onnx-traced"}


@pytest.mark.slow
def test_a_later_export_into_the_store_waits_for_a_rollout_to_go_live(gated, export_main, tmp_path):
    """The store's contract (docs/rollout.md): the name's first export made gated.mar; the next one writes gated.v2.mar
    beside it, leaves gated.mar (the live version) alone and says how to make v2 live."""
    store = tmp_path / "store"
    shutil.copytree(gated["store"], store)
    live = (store / "gated.mar").read_bytes()
    again = export_main("module", f"{USER_FILE}:gated", "--input-shape", "1,3,16,16", "--out", tmp_path / "again",
                        "--model-store", store, "--name", "gated")
    assert again.returncode == 0, again.stdout + again.stderr
    assert sorted(p.name for p in store.iterdir()) == ["gated.mar", "gated.v1.mar", "gated.v2.mar"]
    assert (store / "gated.mar").read_bytes() == live == (store / "gated.v1.mar").read_bytes()
    assert (f"gated.mar is still the live version; `python -m serving rollout gated {store / 'gated.v2.mar'}` makes "
            "this one live") in again.stdout
