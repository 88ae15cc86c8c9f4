"""The CUDA parity path: artifacts on the GPU (ORT CUDA provider, TorchScript on cuda) against eager on CPU."""

import pytest
import torch

import models
from export.forms import kinds
from export.pipeline import ExportOptions, Progress, export_model


def test_cuda_device_is_refused_clearly_without_a_gpu(export_main):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the refusal path does not apply")
    result = export_main("module", "x.py:f", "--input-shape", "1,3,8,8", "--device", "cuda")
    assert result.returncode == 1 and "no CUDA device is visible" in result.stderr


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine: CUDA parity not run")
def test_parity_on_cuda_passes_for_every_artifact(tmp_path):
    result = export_model(models.get("resnet18"), ExportOptions(tmp_path / "gpu", "random", device="cuda:0"),
                          Progress(quiet=True))
    assert not result.parity.failures
    assert set(result.parity.summary()) == set(kinds.default_formats())
    assert result.manifest.decision().served == "onnx-dynamo"
