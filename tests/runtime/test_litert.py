"""The LiteRT backend: a `.tflite` run by LiteRT's own interpreter through the one backend interface, on a small
model converted here by litert-torch (a convolution, a linear head and its features as a second output): the outputs
eager gives, in the module's order, a batch run one image at a time, a size it does not take refused as a run error
naming the size, the file's companion contract required, the interpreter's threads set by RunOptions, and no GPU.
Without ai-edge-litert (the main environment: `make litert-env` makes the one that has it) the backend refuses,
saying how to install it."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
import torch
from torch import nn

from runtime import ArtifactError, ArtifactRunError, RunOptions, open_artifact
from runtime.litert import contract_name

SIZE = (3, 16, 16)
needs_litert = pytest.mark.skipif(importlib.util.find_spec("litert_torch") is None,
                                  reason="litert-torch is not installed here: `make test` runs these next in .venv-litert "
                                         "(make litert-env)")


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 5)

    def forward(self, x):
        features = torch.relu(self.conv(x)).mean((2, 3))
        return self.head(features), features


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    import litert_torch

    torch.manual_seed(0)
    module = Small().eval()
    path = tmp_path_factory.mktemp("litert") / "model.tflite"
    path.write_bytes(litert_torch.convert(module, (torch.rand(1, *SIZE),)).model_content())
    path.with_name(contract_name(path.name)).write_text(json.dumps({"model": path.name}))
    return {"path": path, "module": module}


@needs_litert
def test_it_computes_what_eager_computes_one_image_at_a_time(model):
    backend = open_artifact("litert", model["path"], RunOptions(threads=1))
    assert backend.describe()["input_shape"] == [1, *SIZE]
    for rows in (1, 3):
        batch = torch.rand(rows, *SIZE)
        with torch.no_grad():
            logits, features = model["module"](batch)
        got_logits, got_features = backend(batch)
        assert got_logits.shape == (rows, 5) and got_features.shape == (rows, 8)
        assert torch.allclose(got_logits, logits, atol=1e-5, rtol=1e-4)
        assert torch.allclose(got_features, features, atol=1e-5, rtol=1e-4)


@needs_litert
def test_another_size_is_a_run_error_naming_the_size_it_takes(model):
    backend = open_artifact("litert", model["path"])
    with pytest.raises(ArtifactRunError, match="exactly 16x16"):
        backend(torch.rand(1, 3, 20, 20))


@needs_litert
def test_threads_set_the_interpreters_and_zero_means_every_core(model):
    assert open_artifact("litert", model["path"], RunOptions(threads=1)).describe()["litert_threads"] == 1
    every_core = len(os.sched_getaffinity(0))
    assert open_artifact("litert", model["path"], RunOptions(threads=0)).describe()["litert_threads"] == every_core


@needs_litert
def test_a_file_without_its_contract_or_on_a_gpu_is_refused(model, tmp_path):
    alone = tmp_path / "model.tflite"
    alone.write_bytes(model["path"].read_bytes())
    with pytest.raises(ArtifactError, match="model.litert.json is missing"):
        open_artifact("litert", alone)
    with pytest.raises(ArtifactError, match="run on the CPU"):
        open_artifact("litert", model["path"], RunOptions(device="cuda"))


def test_without_ai_edge_litert_it_refuses_saying_how_to_install_it(tmp_path, monkeypatch):
    # The main environment has no ai-edge-litert; in .venv-litert, block it the way a missing package fails.
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    path = tmp_path / "model.tflite"
    path.write_bytes(b"not opened: the interpreter is missing first")
    path.with_name(contract_name(path.name)).write_text(json.dumps({"model": path.name}))
    with pytest.raises(ArtifactError, match=r"ai-edge-litert package .*make litert-env"):
        open_artifact("litert", path)
