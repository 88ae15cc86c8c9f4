"""The form an engine serves: the fastest of the archive's gated candidates this machine meets, measured under the
serving policy, the declared order breaking near ties (runtime/form_choice.py); kept for restarts and the other
workers."""

from __future__ import annotations

import json
import shutil
import zipfile

import pytest

from handlers.core import REBUILD
from handlers.tasks import open_core
from runtime import IntegrityError, form_choice
from runtime.machine import this_machine_profile


def test_the_first_of_the_declared_order_within_the_margin_of_the_fastest_serves():
    order = ["openvino-int8", "onnx-int8", "openvino-bf16", "onnx-dynamo"]
    assert form_choice.within_margin(order, {"openvino-int8": 38.4, "onnx-int8": 30.1, "openvino-bf16": 78.8,
                                             "onnx-dynamo": 15.1}) == "openvino-bf16"  # an AMX Xeon's ResNet-50
    assert form_choice.within_margin(order, {"openvino-int8": 169.5, "onnx-int8": 147.7, "openvino-bf16": 140.6,
                                             "onnx-dynamo": 102.9}) == "openvino-int8"  # its EfficientNet-Lite0
    assert form_choice.within_margin(order, {"openvino-int8": 95.0, "onnx-int8": 100.0, "openvino-bf16": 50.0,
                                             "onnx-dynamo": 30.0}) == "openvino-int8"  # within 10 %: the declared


@pytest.mark.slow
def test_an_engine_measures_once_and_serves_the_same_choice_after(lite0_int8_export, tmp_path, monkeypatch):
    folder = tmp_path / "unpacked"
    with zipfile.ZipFile(lite0_int8_export["archive"]) as archive:
        archive.extractall(folder)
    manifest = lite0_int8_export["manifest"]
    met = form_choice.may_serve_here(manifest, this_machine_profile())
    assert len(met) >= 2, met  # the gated int8 and an fp32 form
    monkeypatch.setattr(form_choice, "CACHE_DIR", tmp_path / "choices")
    monkeypatch.setenv(form_choice.CHOICE_ENV, "remeasure")
    first = form_choice.measured_choice(folder, manifest, this_machine_profile(), 1, 1, "cpu", REBUILD)
    assert set(first.measured) == set(met) and all(rate > 0 for rate in first.measured.values())
    assert first.kind == form_choice.within_margin(met, first.measured) and "measured at this worker's start" in first.line()
    monkeypatch.delenv(form_choice.CHOICE_ENV)
    again = form_choice.measured_choice(folder, manifest, this_machine_profile(), 1, 1, "cpu", REBUILD)
    assert again.kind == first.kind and again.measured == first.measured and "earlier start" in again.how
    core = open_core(folder, threads=1)  # what the engines open: the kept choice, shown in the description
    assert core.record.kind == first.kind and core.describe()["choice"]["measured_images_per_s"] == first.measured
    monkeypatch.setenv(form_choice.CHOICE_ENV, "declared")
    assert form_choice.measured_choice(folder, manifest, this_machine_profile(), 1, 1, "cpu", REBUILD) is None


@pytest.fixture
def two_candidates(resnet18_unpacked, resnet18_export, tmp_path):
    """resnet18's archive with two gated candidates that need nothing (onnx-dynamo, onnx-traced): a choice measured
    at load, as an archive with an int8 variant gets, without exporting one."""
    from dataclasses import replace

    from contract.records import MANIFEST_NAME, Manifest
    from export.package.selection import candidate_entry
    folder = tmp_path / "model"
    shutil.copytree(resnet18_unpacked, folder)
    manifest = Manifest.read(folder)
    kinds = ["onnx-dynamo", "onnx-traced"]
    for kind in kinds:
        if not (folder / manifest.artifacts[kind].path).exists():
            shutil.copy2(resnet18_export["out"] / manifest.artifacts[kind].path, folder / manifest.artifacts[kind].path)
    decision = replace(manifest.decision(), gated=[candidate_entry(kind) for kind in kinds])
    (folder / MANIFEST_NAME).write_text(replace(manifest, serving=decision).to_json())
    return folder


@pytest.mark.slow
def test_a_kept_choice_serves_again_until_its_form_is_changed(two_candidates, tmp_path, monkeypatch):
    monkeypatch.setattr(form_choice, "CACHE_DIR", tmp_path / "choices")
    monkeypatch.delenv(form_choice.CHOICE_ENV, raising=False)
    first = open_core(two_candidates, threads=1)
    assert "measured at this worker's start" in first.choice.how and first.phases.seconds["choice"] > 0
    assert first.choice.opened == {}  # the core took the backend it measured (warm) instead of opening it again
    kept = list((tmp_path / "choices").glob("*.json"))
    assert len(kept) == 1
    again = open_core(two_candidates, threads=1)  # a restart, another worker: read, not measured
    assert "earlier start" in again.choice.how and again.record.kind == first.record.kind
    served = two_candidates / first.record.path
    original = served.read_bytes()
    served.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
    with pytest.raises(IntegrityError, match="sha256"):
        open_core(two_candidates, threads=1)  # never served from the kept choice, and the choice is forgotten
    assert not kept[0].exists()
    served.write_bytes(original)
    assert "measured at this worker's start" in open_core(two_candidates, threads=1).choice.how


@pytest.mark.slow
def test_the_exports_own_timing_is_the_first_starts_choice_and_never_replaces_a_starts(two_candidates, tmp_path,
                                                                                         monkeypatch):
    """The export times its forms under the serving policy's threads on the machine that exports: a first start
    there serves the form those timings choose without timing them again; a start's own measurement stays."""
    from contract.records import Manifest
    from runtime.machine import this_machine_profile
    monkeypatch.setattr(form_choice, "CACHE_DIR", tmp_path / "choices")
    monkeypatch.delenv(form_choice.CHOICE_ENV, raising=False)
    manifest, machine = Manifest.read(two_candidates), this_machine_profile("cpu")
    timings = {"onnx-dynamo": 10.0, "onnx-traced": 5.0}  # ms: onnx-traced twice as fast, past the margin
    assert form_choice.keep_export_measurement(manifest, machine, 1, "cpu", timings)
    first = open_core(two_candidates, threads=1)
    assert "by the export" in first.choice.how and first.record.kind == "onnx-traced"
    assert first.choice.measured == {"onnx-dynamo": 100.0, "onnx-traced": 200.0}
    (kept,) = (tmp_path / "choices").glob("*.json")  # flat, as every release reads it (an archive carries its own)
    assert json.loads(kept.read_text()) == first.choice.measured
    assert form_choice.keep_export_measurement(manifest, machine, 1, "cpu", {"onnx-dynamo": 1.0, "onnx-traced": 9.0})
    assert open_core(two_candidates, threads=1).choice.measured == first.choice.measured  # the first kept stays
    assert not form_choice.keep_export_measurement(manifest, machine, 1, "cpu", {"onnx-dynamo": 1.0})  # not all timed
    monkeypatch.setenv(form_choice.CHOICE_ENV, "remeasure")
    measured = open_core(two_candidates, threads=1).choice
    assert "measured at this worker's start" in measured.how
    monkeypatch.delenv(form_choice.CHOICE_ENV)
    form_choice.keep_export_measurement(manifest, machine, 1, "cpu", timings)
    assert open_core(two_candidates, threads=1).choice.measured == measured.measured


@pytest.mark.slow
def test_a_machine_of_the_exports_kind_reads_the_timing_its_archive_carries(two_candidates, tmp_path, monkeypatch):
    """A fleet's other node (its cache empty) serves the form the export's carried timing chooses, without timing
    the forms; on another kind of machine, or with a file that is not the one the manifest recorded, they are timed."""
    from contract.records import FORM_TIMING_NAME, MANIFEST_NAME, Manifest
    from export.package.manifest import file_record
    from runtime.machine import this_machine_profile
    monkeypatch.setattr(form_choice, "CACHE_DIR", tmp_path / "exporter")
    monkeypatch.delenv(form_choice.CHOICE_ENV, raising=False)
    manifest = Manifest.read(two_candidates)
    timing = form_choice.keep_export_measurement(manifest, this_machine_profile("cpu"), 1, "cpu",
                                                 {"onnx-dynamo": 10.0, "onnx-traced": 5.0})
    form_choice.carry_timing(two_candidates, timing)
    manifest.files[FORM_TIMING_NAME] = file_record(two_candidates, FORM_TIMING_NAME)
    (two_candidates / MANIFEST_NAME).write_text(manifest.to_json())
    monkeypatch.setattr(form_choice, "CACHE_DIR", tmp_path / "node")  # another machine of the same kind
    node = open_core(two_candidates, threads=1)
    assert node.choice.how.startswith("as measured by the archive's export") and node.record.kind == "onnx-traced"
    assert node.choice.measured == {"onnx-dynamo": 100.0, "onnx-traced": 200.0}
    assert not list((tmp_path / "node").glob("*.json"))  # nothing timed, nothing kept
    with monkeypatch.context() as other_kind:
        other_kind.setattr(form_choice, "_cpu_model", lambda: "another CPU")
        assert "measured at this worker's start" in open_core(two_candidates, threads=1).choice.how
    monkeypatch.setattr(form_choice, "CACHE_DIR", tmp_path / "third")
    carried = two_candidates / FORM_TIMING_NAME
    carried.write_text(carried.read_text().replace("200.0", "900.0"))  # not the file the manifest recorded
    assert "measured at this worker's start" in open_core(two_candidates, threads=1).choice.how


def test_a_kept_choice_is_keyed_by_the_forms_content_and_the_machine():
    from dataclasses import replace

    from runtime.machine import MachineProfile
    manifest = _manifest_with(["a", "b"], {"a": "1" * 64, "b": "2" * 64})
    amx = MachineProfile("amx", frozenset({"avx2", "avx512f", "amx_tile"}), "cpu")
    key = form_choice._key(manifest, ["a", "b"], amx, 1, (1, 3, 224, 224), "cpu")
    assert key == form_choice._key(manifest, ["a", "b"], amx, 1, (1, 3, 224, 224), "cpu")
    other_machine = MachineProfile("avx2", frozenset({"avx2"}), "cpu")
    assert key != form_choice._key(manifest, ["a", "b"], other_machine, 1, (1, 3, 224, 224), "cpu")
    rebuilt = _manifest_with(["a", "b"], {"a": "1" * 64, "b": "3" * 64})
    assert key != form_choice._key(rebuilt, ["a", "b"], amx, 1, (1, 3, 224, 224), "cpu")
    assert key != form_choice._key(manifest, ["a", "b"], replace(amx, device="cuda"), 1, (1, 3, 224, 224), "cuda")


def _manifest_with(kinds, sha256):
    """What _key reads of a manifest: each kind's recorded sha256."""
    from types import SimpleNamespace
    return SimpleNamespace(artifacts={kind: SimpleNamespace(sha256=sha256[kind]) for kind in kinds})


def gated_as(folder, kinds):
    """The unpacked archive at `folder` with `kinds` as its gated candidates, in that order."""
    from dataclasses import replace

    from contract.records import MANIFEST_NAME, Manifest
    from export.package.selection import candidate_entry
    manifest = Manifest.read(folder)
    decision = replace(manifest.decision(), gated=[candidate_entry(kind) for kind in kinds])
    (folder / MANIFEST_NAME).write_text(replace(manifest, serving=decision).to_json())
    return Manifest.read(folder)


@pytest.mark.slow
def test_a_gpu_server_skips_the_forms_its_runtimes_cannot_run_on_the_gpu_and_says_why(two_candidates, monkeypatch):
    """ONNX Runtime without its CUDA provider (the `onnxruntime` wheel) cannot run an ONNX form on a GPU: a GPU
    server chooses among the forms that can, naming the reason, instead of failing to load."""
    import onnxruntime

    from runtime.machine import PROFILES
    from runtime.onnxruntime import OnnxRuntimeBackend, missing_cuda_provider
    monkeypatch.setenv(form_choice.CHOICE_ENV, "declared")  # nothing is measured on a simulated GPU
    gpu = PROFILES["cuda"]
    missing = missing_cuda_provider(onnxruntime.get_available_providers())
    assert OnnxRuntimeBackend.unavailable("cuda") == missing and OnnxRuntimeBackend.unavailable("cpu") is None
    if missing is None:
        pytest.skip("this ONNX Runtime has its CUDA provider: an ONNX form can run on a GPU here")
    manifest = gated_as(two_candidates, ["onnx-traced", "scripted"])
    choice = form_choice.choose(two_candidates, manifest, gpu, 1, 1, "cuda", REBUILD, measure=False)
    assert choice.kind == "scripted" and "no CUDAExecutionProvider" in choice.skipped["onnx-traced"]
    assert form_choice.may_serve_here(manifest, gpu, "cuda") == ["scripted"]
    assert form_choice.may_serve_here(manifest, gpu) == ["onnx-traced", "scripted"]  # a profile simulated on a CPU
    assert form_choice.declared_choice(manifest.decision().gated, gpu).kind == "onnx-traced"  # an export's target
    only_onnx = gated_as(two_candidates, ["onnx-dynamo", "onnx-traced"])
    with pytest.raises(form_choice.FormChoiceError, match="onnx-dynamo: cannot run here: ONNX Runtime here has no"):
        form_choice.choose(two_candidates, only_onnx, gpu, 1, 1, "cuda", REBUILD, measure=False)
