"""runtime/: the registry, each backend on a real small artifact, and the errors a user can cause."""

import hashlib

import pytest
import torch
from torch import nn

import runtime
from contract.errors import VisionExportError
from runtime import ArtifactError, IntegrityError, RunOptions, UnknownFormatError, open_artifact, verify_file
from runtime.base import BACKENDS, ArtifactRunError, backend_class
from runtime.eager import EagerBackend
from runtime.onnxruntime import CPU_PROVIDER, CUDA_PROVIDER, OnnxRuntimeBackend, check_session_providers, providers_for
from runtime.torchscript import TorchScriptBackend, autocast_settings


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 5)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    module = Tiny().eval()
    example = torch.rand(1, 3, 8, 8)
    torch.jit.save(torch.jit.script(module), str(folder / "tiny.pt"))
    torch.onnx.export(module, (example,), str(folder / "tiny.onnx"), dynamo=False, input_names=["input"],
                      output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    return {"module": module, "torchscript": folder / "tiny.pt", "onnx": folder / "tiny.onnx"}


@pytest.mark.parametrize("format,cls", [("torchscript", TorchScriptBackend), ("onnx", OnnxRuntimeBackend)])
def test_each_backend_runs_its_artifact_like_eager(artifacts, format, cls):
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    backend = open_artifact(format, artifacts[format], RunOptions(threads=1), name="mine")
    assert type(backend) is cls and backend.name == "mine"
    expected = EagerBackend(artifacts["module"]).predict(x)
    got = backend.predict(x)
    assert got.dtype == torch.float32 and got.device.type == "cpu"
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    described = backend.describe()
    assert described["format"] == format and described["threads"] == 1 and described["device"] == "cpu"


def test_reference_evaluator_is_a_backend_too(artifacts):
    x = torch.rand(2, 3, 8, 8)
    reference = open_artifact("onnx-reference", artifacts["onnx"])
    torch.testing.assert_close(reference(x), open_artifact("onnx", artifacts["onnx"])(x), atol=1e-5, rtol=1e-4)


def test_unknown_format_names_the_known_ones(artifacts):
    with pytest.raises(UnknownFormatError, match="no backend for artifact format 'tflite'; known formats: "
                                                 "torchscript, onnx, onnx-reference"):
        open_artifact("tflite", artifacts["onnx"])


def test_missing_file_and_unsupported_precision_are_clear(artifacts, tmp_path):
    with pytest.raises(ArtifactError, match="does not exist; re-run the export"):
        open_artifact("onnx", tmp_path / "gone.onnx")
    with pytest.raises(ArtifactError, match="onnx backend runs fp32, not fp16"):
        open_artifact("onnx", artifacts["onnx"], RunOptions(precision="fp16"))
    with pytest.raises(ArtifactError, match="precision 'int3' is not one of"):
        RunOptions(precision="int3")


def test_a_new_backend_is_one_class_plus_one_registry_line(artifacts, monkeypatch):
    monkeypatch.setitem(BACKENDS, "onnx-again", "runtime.onnxruntime:OnnxRuntimeBackend")
    assert backend_class("onnx-again") is OnnxRuntimeBackend
    assert "onnx-again" in runtime.available_formats()


def test_cuda_provider_is_asked_for_by_device_and_never_silently_dropped():
    assert providers_for(torch.device("cuda:2"), [CUDA_PROVIDER, CPU_PROVIDER]) == \
        [(CUDA_PROVIDER, {"device_id": 2}), CPU_PROVIDER]
    assert providers_for(torch.device("cpu"), [CUDA_PROVIDER, CPU_PROVIDER]) == [CPU_PROVIDER]
    with pytest.raises(ArtifactError, match="install onnxruntime-gpu"):
        providers_for(torch.device("cuda:0"), [CPU_PROVIDER])


def test_autocast_follows_the_precision():
    assert autocast_settings(RunOptions()) == {"device_type": "cpu", "dtype": torch.float32, "enabled": False}
    assert autocast_settings(RunOptions(device="cuda:0", precision="fp16"))["dtype"] == torch.float16
    assert autocast_settings(RunOptions(precision="bf16"))["enabled"] is True


def test_verify_file_names_the_file_and_both_hashes(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"exported bytes")
    recorded = hashlib.sha256(b"exported bytes").hexdigest()
    verify_file(path, recorded, "rebuild it")  # the recorded file passes
    path.write_bytes(b"tampered bytes")
    actual = hashlib.sha256(b"tampered bytes").hexdigest()
    with pytest.raises(IntegrityError) as caught:
        verify_file(path, recorded, "rebuild it")
    assert f"sha256 {actual} but the manifest records {recorded}" in str(caught.value)
    assert str(path) in str(caught.value) and isinstance(caught.value, VisionExportError)
    with pytest.raises(IntegrityError, match="missing"):
        verify_file(tmp_path / "gone", recorded, "rebuild it")


def test_a_session_that_silently_fell_back_to_the_cpu_is_refused_for_a_gpu():
    check_session_providers(torch.device("cuda:0"), [CUDA_PROVIDER, CPU_PROVIDER])
    check_session_providers(torch.device("cpu"), [CPU_PROVIDER])
    with pytest.raises(ArtifactError, match="could not start CUDAExecutionProvider .*only CPUExecutionProvider"):
        check_session_providers(torch.device("cuda:0"), [CPU_PROVIDER])


@pytest.mark.parametrize("format", ["torchscript", "onnx"])
def test_a_runtime_failing_on_an_input_is_an_artifact_run_error_with_its_cause_kept(artifacts, format):
    backend = open_artifact(format, artifacts[format], name="tiny")
    wrong_channels = torch.rand(1, 5, 8, 8)
    with pytest.raises(ArtifactRunError, match=r"tiny failed on input \(1, 5, 8, 8\): ") as caught:
        backend(wrong_channels)
    error = caught.value
    assert isinstance(error, ArtifactError) and isinstance(error, VisionExportError)
    assert error.__cause__ is not None and not isinstance(error.__cause__, ArtifactError)
    assert type(error.__cause__).__name__ in str(error)  # the runtime's own exception type is named
    assert type(error.__cause__).__name__ in error.cause_traceback()  # and its traceback is kept, not dropped
    assert backend(torch.rand(2, 3, 8, 8)).shape == (2, 5)  # the backend still serves good inputs


def test_an_artifact_error_raised_by_a_backend_passes_through_unwrapped(artifacts):
    backend = open_artifact("onnx", artifacts["onnx"], name="tiny")
    refusal = ArtifactError("refused on purpose")
    backend.predict = lambda batch: (_ for _ in ()).throw(refusal)
    with pytest.raises(ArtifactError) as caught:
        backend(torch.rand(1, 3, 8, 8))
    assert caught.value is refusal


@pytest.mark.parametrize("policy, spinning", [("PASSIVE", "0"), ("passive", "0"), ("ACTIVE", None), (None, None)])
def test_onnx_runtime_threads_stop_spinning_when_openmp_is_asked_to_wait_passively(monkeypatch, policy, spinning):
    from runtime.onnxruntime import session_options
    if policy is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    options = session_options(2)
    if spinning is None:  # ORT's default (spinning) is left alone: the key is not set at all
        with pytest.raises(RuntimeError, match="does not have configuration"):
            options.get_session_config_entry("session.intra_op.allow_spinning")
    else:
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == spinning


class Boxes(nn.Module):
    """Several outputs of several dtypes, as a detector answers: boxes (float), labels (int64), scores."""

    def forward(self, image):
        flat = image[0].mean(0)
        scores = flat.flatten()[:5].sigmoid()
        boxes = torch.stack([scores, scores, scores + 1, scores + 2], dim=1) * 10
        return boxes, (scores * 10).long(), scores


def test_every_output_comes_back_with_its_dtype(tmp_path):
    image = torch.rand(1, 3, 8, 8)
    traced = torch.jit.trace(Boxes(), image)
    traced.save(str(tmp_path / "boxes.pt"))
    torch.onnx.export(traced, (image,), str(tmp_path / "boxes.onnx"), dynamo=False, input_names=["input"],
                      output_names=["boxes", "labels", "scores"])
    eager = EagerBackend(Boxes())(image)
    for format, name in (("torchscript", "boxes.pt"), ("onnx", "boxes.onnx")):
        boxes, labels, scores = open_artifact(format, tmp_path / name)(image)
        assert boxes.dtype == scores.dtype == torch.float32 and labels.dtype == torch.int64
        assert torch.allclose(boxes, eager[0]) and torch.equal(labels, eager[1])
    assert isinstance(open_artifact("torchscript", tmp_path / "boxes.pt", RunOptions(precision="bf16"))(image)[2],
                      torch.Tensor)
