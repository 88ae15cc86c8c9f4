"""The form an engine serves: the fastest of the archive's gated candidates this machine meets, measured under the
serving policy, the declared order breaking near ties (runtime/form_choice.py); kept for restarts and the other
workers."""

from __future__ import annotations

import zipfile

import pytest

from handlers.core import REBUILD
from handlers.tasks import open_core
from runtime import form_choice
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
