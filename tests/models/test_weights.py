import pytest
import torch
import torchvision

from models import weights
from models.weights import WeightsError, load_state_dict_file, resolve_torchvision


def _resnet18():
    return torchvision.models.resnet18(weights=None)


def test_checkpoint_with_wrong_keys_names_them(tmp_path):
    state = _resnet18().state_dict()
    state["extra.weight"] = torch.zeros(1)
    del state["fc.bias"]
    path = tmp_path / "bad.pt"
    torch.save(state, path)
    with pytest.raises(WeightsError) as error:
        load_state_dict_file(_resnet18(), str(path))
    message = str(error.value)
    assert "missing keys: fc.bias" in message and "unexpected keys: extra.weight" in message


def test_checkpoint_with_wrong_shape_names_key_and_shapes(tmp_path):
    state = _resnet18().state_dict()
    state["fc.weight"] = torch.zeros(10, 512)
    path = tmp_path / "shape.pt"
    torch.save(state, path)
    with pytest.raises(WeightsError, match=r"fc.weight \(checkpoint \(10, 512\), model \(1000, 512\)\)"):
        load_state_dict_file(_resnet18(), str(path))


def test_checkpoint_loads_with_wrappers_and_records_hash(tmp_path):
    source = _resnet18()
    path = tmp_path / "wrapped.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in source.state_dict().items()}}, path)
    target = _resnet18()
    info = load_state_dict_file(target, str(path))
    assert info.kind == "path" and len(info.sha256) == 64
    assert torch.equal(target.fc.weight, source.fc.weight)


def test_checkpoint_that_is_not_a_state_dict(tmp_path):
    path = tmp_path / "junk.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsError, match="cannot read checkpoint"):
        load_state_dict_file(_resnet18(), str(path))


def test_missing_path_lists_the_choices():
    with pytest.raises(WeightsError, match="auto \\| imagenet \\| random"):
        load_state_dict_file(_resnet18(), "/nonexistent/weights.pt")


def test_auto_falls_back_to_random_with_a_note_when_weights_cannot_be_had(tmp_path, monkeypatch):
    # An empty hub cache and an unreachable host: this machine has no route to the weights server.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(weights, "download_unreachable_reason", lambda url: "URLError: no route to host")
    enum = torchvision.models.ResNet18_Weights.DEFAULT
    module, info = resolve_torchvision(torchvision.models.resnet18, enum, "auto")
    assert info.kind == "random" and "RANDOM" in info.note and enum.url in info.note
    assert "URLError: no route to host" in info.note  # the reason is shown, not swallowed


def test_imagenet_uses_the_hub_cache_when_the_file_is_there(tmp_path, monkeypatch):
    # Place a state_dict where torchvision's download would put it: torch hub then reads it, no network.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    enum = torchvision.models.ResNet18_Weights.DEFAULT
    cached = weights.cached_weights_path(enum.url)
    cached.parent.mkdir(parents=True)
    reference = weights.seeded(_resnet18, seed=123)
    torch.save(reference.state_dict(), cached)
    module, info = resolve_torchvision(torchvision.models.resnet18, enum, "auto")
    assert info.kind == "imagenet"
    assert torch.equal(module.fc.weight, reference.fc.weight)


class _RunsCodeWhenUnpickled:
    """A checkpoint that would run a command on an unrestricted torch.load (pickle's __reduce__)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os
        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "code-ran"
    torch.save({"conv1.weight": _RunsCodeWhenUnpickled(marker)}, tmp_path / "evil.pt")
    with pytest.raises(WeightsError, match="cannot read checkpoint .*evil.pt") as caught:
        load_state_dict_file(_resnet18(), str(tmp_path / "evil.pt"))
    assert "state_dict saved with torch.save" in str(caught.value)
    assert not marker.exists()  # weights_only=True refused the pickle before anything ran
