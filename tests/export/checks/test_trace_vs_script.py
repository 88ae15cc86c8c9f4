"""Facts about control flow, established by running the artifacts (TorchScript and ONNX Runtime); how the
trace-vs-script report records a probe an artifact or the model refuses (reason and traceback kept)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx.reference import ReferenceEvaluator

import models
from export.checks.trace_vs_script import MATCHES, REJECTED, SILENTLY_WRONG, ArtifactUnderTest, compare_paths
from export.forms import kinds
from export.forms.tolerances import ONNX_TOLERANCE
from runtime.base import Backend, RunOptions
from runtime.eager import EagerBackend

FILE_NAMES = {kind.name: kind.file_name for kind in kinds.fp32_kinds()}

DATA_DEPENDENT = ("cf-branch", "cf-loop")


@pytest.fixture(scope="module")
def demo_exports(controlflow_export):
    """Each control-flow demo's export folder, from `python -m export controlflow` (shared with test_cli)."""
    return {name: controlflow_export["out"] / name for name in models.names("controlflow")}


def _probes(name):
    return list(models.get(name).probe_inputs().values())  # [as traced, other path]


def _eager(name, x):
    with torch.inference_mode():
        return models.get(name).build("random").module.eval()(x)


def _torchscript(path, x):
    with torch.inference_mode():
        return torch.jit.load(str(path))(x)


def _onnxruntime(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])


def _ops(path):
    return {node.op_type for node in onnx.load(str(path)).graph.node}


@pytest.mark.slow
@pytest.mark.parametrize("name", DATA_DEPENDENT)
def test_traced_artifacts_are_silently_wrong_on_the_other_path(demo_exports, name):
    as_traced, other = _probes(name)
    out = demo_exports[name]
    for run, file in [(_torchscript, FILE_NAMES["traced"]), (_onnxruntime, FILE_NAMES["onnx-traced"])]:
        assert torch.allclose(run(out / file, as_traced), _eager(name, as_traced), atol=1e-5)
        wrong = run(out / file, other)  # no exception: that is the danger
        assert (wrong - _eager(name, other)).abs().max() > 0.1, f"{file} should be wrong on the other path"


@pytest.mark.slow
@pytest.mark.parametrize("name", DATA_DEPENDENT)
def test_scripted_and_onnx_from_scripted_stay_right(demo_exports, name):
    out = demo_exports[name]
    for x in _probes(name):
        expected = _eager(name, x)
        torch.testing.assert_close(_torchscript(out / FILE_NAMES["scripted"], x), expected)
        torch.testing.assert_close(_onnxruntime(out / FILE_NAMES["onnx-scripted"], x), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(_onnxruntime(out / FILE_NAMES["onnx-dynamo"], x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name,op", [("cf-branch", "If"), ("cf-loop", "Loop")])
def test_onnx_from_script_keeps_control_flow_and_from_trace_does_not(demo_exports, name, op):
    out = demo_exports[name]
    assert op in _ops(out / FILE_NAMES["onnx-scripted"])
    assert op in _ops(out / FILE_NAMES["onnx-dynamo"])  # torch.cond / torch.while_loop forms
    assert not _ops(out / FILE_NAMES["onnx-traced"]) & {"If", "Loop"}


@pytest.mark.slow
def test_fixed_count_loop_is_safe_to_trace(demo_exports):
    out = demo_exports["cf-repeat"]
    for x in _probes("cf-repeat"):
        torch.testing.assert_close(_torchscript(out / FILE_NAMES["traced"], x), _eager("cf-repeat", x))


@pytest.mark.slow
@pytest.mark.parametrize("name", models.names("controlflow"))
def test_reference_evaluator_agrees_with_onnxruntime(demo_exports, name):
    out = demo_exports[name]
    for kind in ("onnx-scripted", "onnx-dynamo"):
        evaluator = ReferenceEvaluator(str(out / FILE_NAMES[kind]))
        for x in _probes(name):
            reference = np.asarray(evaluator.run(None, {evaluator.input_names[0]: x.numpy()})[0])
            np.testing.assert_allclose(_onnxruntime(out / FILE_NAMES[kind], x).numpy(), reference, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_report_says_traced_is_wrong_and_scripted_is_right(demo_exports):
    import json
    report = json.loads((demo_exports["cf-branch"] / "report.json").read_text())["cf-branch"]
    verdicts = {row["artifact"]: row["verdict"] for row in report["rows"]}
    assert verdicts["traced"].startswith("WRONG") and verdicts["onnx-traced"].startswith("WRONG")
    assert verdicts["scripted"] == "right on every probe" and verdicts["onnx-scripted"] == "right on every probe"
    assert any(w["category"] == "TracerWarning" for w in report["tracer_warnings"])


class _FixedSize(Backend):
    """A runtime that takes only 8x8 inputs, as a fixed-shape ONNX graph does."""

    format = "fixed-size-test"

    def __init__(self):
        super().__init__(None, RunOptions(), "fixed")

    def predict(self, batch):
        if tuple(batch.shape[-2:]) != (8, 8):
            raise ValueError(f"Got invalid dimensions for input: {tuple(batch.shape)}")
        return batch.clone()  # right where it runs


def _fixed_size(tolerance=ONNX_TOLERANCE):
    return [ArtifactUnderTest("fixed", "fixed-size-test", _FixedSize(), {}, tolerance)]


PROBES = {"as traced": torch.ones(1, 3, 8, 8), "bigger": torch.ones(1, 3, 9, 9)}


def test_a_refused_input_is_reported_with_its_reason_and_keeps_the_traceback():
    result = compare_paths(EagerBackend(torch.nn.Identity()), _fixed_size(), PROBES)
    bigger = result.rows[0].on("bigger")
    assert bigger.status == REJECTED and "(1, 3, 9, 9)" in bigger.error
    assert "ValueError: Got invalid dimensions" in bigger.traceback and "predict" in bigger.traceback
    assert result.rows[0].verdict == "right where it runs; refuses (loudly) bigger"
    assert "rejected: fixed failed on input (1, 3, 9, 9)" in result.markdown("m", "")


def test_a_probe_eager_refuses_is_skipped_with_its_reason_and_traceback():
    eager = _FixedSize()  # the model itself takes only 8x8: the 9x9 probe says nothing about its artifacts
    result = compare_paths(eager, _fixed_size(), PROBES)
    assert result.probes == ["as traced"]
    skip = result.skipped_probes["bigger"]
    assert "(1, 3, 9, 9)" in skip.error and "ValueError: Got invalid dimensions" in skip.traceback
    assert "probe `bigger` skipped: eager itself rejects it (fixed failed on input (1, 3, 9, 9)" in \
        result.markdown("m", "")


def test_a_bug_of_ours_is_not_mistaken_for_a_refused_input():
    with pytest.raises(AttributeError):  # a tolerance that is not a Tolerance: our error, not the artifact's
        compare_paths(EagerBackend(torch.nn.Identity()), _fixed_size("not a tolerance"), PROBES)


class _OffWhenBig(Backend):
    """Right on the 8x8 probe, silently off by one on anything bigger: a trace that took the small path."""

    format = "off-when-big-test"

    def __init__(self):
        super().__init__(None, RunOptions(), "off")

    def predict(self, batch):
        return batch + 1.0 if batch.shape[-1] > 8 else batch.clone()


def test_report_json_and_the_manifest_record_keep_their_keys_and_say_who_diverges():
    """report.json and manifest.json's trace_vs_script are read by people and tools: the record writes them
    with the same keys, in the same order, for each kind of result."""
    units = _fixed_size() + [ArtifactUnderTest("traced", "off-when-big-test", _OffWhenBig(), {"prim::If": 0},
                                               ONNX_TOLERANCE)]
    result = compare_paths(EagerBackend(torch.nn.Identity()), units, PROBES,
                           [{"category": "TracerWarning", "message": "m", "count": 1}], {"scripted": "build: X"})
    record = result.as_dict()
    assert list(record) == ["probes", "skipped_probes", "rows", "missing", "tracer_warnings", "diverging"]
    fixed, traced = record["rows"]
    assert list(traced) == ["artifact", "format", "control_flow", "probes", "verdict"]
    assert [p["status"] for p in traced["probes"]] == [MATCHES, SILENTLY_WRONG]
    assert list(traced["probes"][1]) == ["probe", "shape", "eager_mean", "status", "measure", "max_abs", "output_mean",
                                         "detail"]
    assert list(fixed["probes"][1]) == ["probe", "shape", "eager_mean", "status", "measure", "error",
                                        "traceback"]
    assert record["diverging"] == [{"artifact": "traced", "probe": "bigger", "max_abs": 1.0}]
    assert result.diverging_probes() == {"traced": ["bigger"]}
    assert record["missing"] == {"scripted": "build: X"} and record["tracer_warnings"][0]["count"] == 1
    manifest = result.manifest_record()
    assert list(manifest) == ["diverging", "verdicts", "missing", "warning"]
    assert manifest["verdicts"] == {"fixed": "right where it runs; refuses (loudly) bigger",
                                    "traced": "WRONG without error on: bigger"}
    assert manifest["warning"].startswith("traced silently diverge from eager on input 'bigger' (max abs diff 1)")
    assert "WRONG 1" in result.table("m") and "scripted       MISSING: build: X" in result.table("m")
    clean = compare_paths(EagerBackend(torch.nn.Identity()), _fixed_size(), PROBES)
    assert clean.warning() is None and clean.manifest_record()["warning"] == ""
