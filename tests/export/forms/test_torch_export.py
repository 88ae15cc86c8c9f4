"""torch.export's own artifacts in an export: the ExportedProgram (built by default, the resize branch kept as
torch.cond) and the AOTInductor package (built when --formats asks), with `--formats` choosing what is built."""

from __future__ import annotations

import json
import re

import pytest

from export.cli import build_parser
from export.errors import ExportError
from export.forms import kinds
from export.forms.tolerances import AOTINDUCTOR_TOLERANCE, EXPORTED_PROGRAM_TOLERANCE
from tests.conftest import run_export


def test_the_default_formats_leave_out_only_the_kinds_that_say_why():
    default = kinds.default_formats()
    assert "exported" in default and "aotinductor" not in default
    assert all(kinds.get(k).off_by_default for k in kinds.names() if not kinds.get(k).is_variant and k not in default)


def test_formats_bring_the_kinds_they_are_made_from_in_table_order():
    assert kinds.chosen_formats(["onnx-scripted", "exported"]) == ["scripted", "exported", "onnx-scripted"]
    assert kinds.chosen_formats(None, also="aotinductor") == kinds.default_formats()[:3] + ["aotinductor"] + \
        kinds.default_formats()[3:]  # --serve KIND builds it too
    assert kinds.chosen_formats(["exported"], also="onnx-int8") == ["exported"]  # variants come from --precision


@pytest.mark.parametrize("name", ["tflite", "onnx-int8"])
def test_a_kind_that_is_not_an_fp32_artifact_is_refused_with_the_choices(name):
    with pytest.raises(ExportError, match=f"--formats: '{name}' is not an fp32 artifact kind; choose from traced"):
        kinds.chosen_formats([name])


def test_the_formats_option_reads_default_and_all_and_states_the_default_and_why():
    parser = build_parser()
    args = parser.parse_args(["resnet", "--formats", "default,aotinductor"])
    assert args.formats == kinds.default_formats() + ["aotinductor"]
    assert parser.parse_args(["resnet", "--formats", "all"]).formats == [k.name for k in kinds.fp32_kinds()]
    assert parser.parse_args(["resnet"]).formats is None
    text = " ".join(parser._subparsers._group_actions[0].choices["resnet"].format_help().split())
    # argparse may wrap a long line at a hyphen (a kind's name, a dated docs path): compared without whitespace
    assert "default:traced,scripted,exported,onnx-traced,onnx-scripted,onnx-dynamo" in "".join(text.split())
    assert "".join(f"aotinductor: {kinds.get('aotinductor').off_by_default}".split()) in "".join(text.split())


@pytest.mark.slow
def test_the_exported_program_keeps_the_resize_branch_and_takes_other_sizes(resnet18_export):
    manifest = json.loads((resnet18_export["out"] / "manifest.json").read_text())
    record = manifest["artifacts"]["exported"]
    assert record["format"] == "torch-export" and record["spatial_dynamic"] is True
    assert record["control_flow"] == {"cond": 1, "while_loop": 0}
    assert manifest["trace_vs_script"]["verdicts"]["exported"] == "right on every probe"
    summary = json.loads((resnet18_export["out"] / "parity.json").read_text())["summary"]["exported"]
    assert summary["passed"] and summary["tolerance"] == {"atol": EXPORTED_PROGRAM_TOLERANCE.atol,
                                                          "rtol": EXPORTED_PROGRAM_TOLERANCE.rtol}


@pytest.mark.slow
def test_the_aotinductor_compile_is_a_progress_step_and_parity_holds_it_to_its_tolerance(aoti_export):
    out, stdout = aoti_export["out"], aoti_export["stdout"]
    assert re.search(r"\] building exported, aotinductor \(traced not built: not in --formats;", stdout)
    announce = stdout.index("] aotinductor: compiling with AOTInductor")
    assert re.search(r"\] aotinductor: AOTInductor .* -> model\.aoti\.pt2 \(\d+\.\d s\)", stdout[announce:])
    manifest = aoti_export["manifest"]
    assert set(manifest.artifacts) == {"exported", "aotinductor"} and manifest.timings_s["aotinductor"] > 0
    summary = json.loads((out / "parity.json").read_text())["summary"]["aotinductor"]
    assert summary["passed"] and summary["tolerance"] == {"atol": AOTINDUCTOR_TOLERANCE.atol,
                                                          "rtol": AOTINDUCTOR_TOLERANCE.rtol}
    recheck = run_export("parity", str(out))  # the package reopened in a new process, hashes first
    assert recheck.returncode == 0, recheck.stdout + recheck.stderr
    assert "aotinductor" in recheck.stdout


def test_the_tuning_command_refuses_an_unknown_configuration_before_compiling_anything(capsys):
    from measure.cli import main  # `python -m measure`, in this process
    assert main(["aoti-tuning", "--model", "resnet18", "--configurations", "default,turbo"]) == 1
    assert "unknown configuration(s) turbo; choose from default, default-static, freezing" in capsys.readouterr().err
