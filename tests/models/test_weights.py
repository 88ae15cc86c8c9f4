import copy

import pytest
import torch
import torchvision

import models
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


# ---------------------------------------------------------------- --weights random: drawn BatchNorm terms

DRAWN_FAMILIES = ("resnet18", "efficientnet-lite0")


def _norm_layers(module: torch.nn.Module) -> list[torch.nn.BatchNorm2d]:
    return [layer for layer in module.modules() if isinstance(layer, torch.nn.BatchNorm2d)]


def _is_identity(layer: torch.nn.BatchNorm2d) -> dict[str, bool]:
    """Which of a BatchNorm's four folded terms still hold a fresh layer's value."""
    return {"running_mean": bool((layer.running_mean == 0).all()), "running_var": bool((layer.running_var == 1).all()),
            "weight": bool((layer.weight == 1).all()), "bias": bool((layer.bias == 0).all())}


def _logits(module: torch.nn.Module) -> torch.Tensor:
    from export.checks.parity import structured_images  # photo-like inputs: gradients, shapes, noise
    with torch.no_grad():
        return module.eval()(structured_images(4, 3, 224, 224, seed=3))


@pytest.fixture(scope="module")
def drawn() -> dict:
    """Each family's --weights random build, drawn once for this module (tests that change one take a copy)."""
    return {name: models.get(name).build("random") for name in DRAWN_FAMILIES}


@pytest.mark.parametrize("name", DRAWN_FAMILIES)
def test_random_weights_move_every_batchnorm_term_off_the_identity(name, drawn):
    module = drawn[name].module
    layers = _norm_layers(module)
    assert layers
    still_identity = {f"{index}.{term}" for index, layer in enumerate(layers)
                      for term, fresh in _is_identity(layer).items() if fresh}
    assert not still_identity  # any term left at its fresh value is one a wrong fold could ignore unseen


@pytest.mark.parametrize("name", DRAWN_FAMILIES)
def test_random_weights_are_drawn_the_same_every_build(name, drawn):
    first = drawn[name].module.state_dict()
    second = models.get(name).build("random").module.state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[key], second[key]) for key in first)


@pytest.mark.parametrize("name", DRAWN_FAMILIES)
def test_random_network_gives_finite_logits_that_depend_on_the_image(name, drawn):
    logits = _logits(drawn[name].module)
    assert torch.isfinite(logits).all()
    across_classes = logits.std(dim=1).min().item()
    across_images = (logits - logits.mean(dim=0)).abs().max().item()
    assert across_classes > 0.05  # not a flat output
    assert across_images > 1e-2 * across_classes  # the image still reaches the logits


@pytest.mark.parametrize("name", DRAWN_FAMILIES)
def test_a_state_dict_path_is_loaded_as_is_without_a_draw(name, drawn, tmp_path):
    fresh = copy.deepcopy(drawn[name].module.network)
    for layer in _norm_layers(fresh):
        layer.reset_parameters()  # back to the identity: a draw afterwards would show
    path = tmp_path / "fresh.pt"
    torch.save(fresh.state_dict(), path)
    loaded = models.get(name).build(str(path)).module.network.state_dict()
    assert all(torch.equal(loaded[key], value) for key, value in fresh.state_dict().items())


USER_FACTORY = '''
from torch import nn

def with_norm():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
'''


def test_a_user_module_keeps_what_its_factory_made(tmp_path):
    from models.user_module import user_entry
    source = tmp_path / "user_norm.py"
    source.write_text(USER_FACTORY)
    module = user_entry(f"{source}:with_norm", (1, 3, 16, 16)).build("random").module
    assert all(_is_identity(module[1]).values())  # the factory's BatchNorm, not drawn
    expected = weights.seeded(lambda: torch.nn.Conv2d(3, 4, 3))
    assert torch.equal(module[0].weight, expected.weight)  # the same seeded initialisation as before
