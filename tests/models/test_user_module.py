"""A user's module: honest weights provenance (loaded or a random initialisation this tool seeded), the state_dict
fingerprint that recognises the same weights, and --labels files (models.user_module, models.weights)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from torch import nn

from models.user_module import RANDOM_FACTORY_NOTE, UserModuleError, factory_weights, load_factory, read_labels_file
from models.weights import RANDOM_SEED, state_dict_fingerprint


def _trained() -> nn.Module:
    """A factory that loads its weights (here: sets them), as a user's factory with a checkpoint does."""
    module = nn.Sequential(nn.Conv2d(3, 2, 1), nn.BatchNorm2d(2))
    with torch.no_grad():
        for index, tensor in enumerate(module.state_dict().values()):
            if tensor.is_floating_point():
                tensor.copy_(torch.arange(tensor.numel()).reshape(tensor.shape) * 0.01 + index)
    return module


def test_weights_the_factory_loads_are_reported_as_built_and_never_as_seeded():
    module, info = factory_weights(_trained, "f.py:trained", "auto")
    assert info.kind == "factory" and info.seed is None and not info.note
    assert info.line().startswith("as the factory built them") and "seeded" not in info.line()
    assert state_dict_fingerprint(module) == state_dict_fingerprint(_trained())


def test_a_random_initialisation_is_reported_as_seeded_by_this_tool_with_a_warning():
    module, info = factory_weights(lambda: nn.Linear(3, 2), "f.py:fresh", "auto")
    assert (info.kind, info.seed, info.note) == ("random", RANDOM_SEED, RANDOM_FACTORY_NOTE)
    assert "seeded by this tool (seed 0)" in info.line()
    torch.manual_seed(RANDOM_SEED)
    assert torch.equal(module.weight, nn.Linear(3, 2).weight)  # a re-check rebuilds the same weights


def test_the_fingerprint_recognises_the_same_weights_and_nothing_else():
    first, second = _trained(), _trained()
    assert state_dict_fingerprint(first) == state_dict_fingerprint(second)
    with torch.no_grad():
        second[1].running_var[0] += 1e-6  # a buffer counts too
    assert state_dict_fingerprint(first) != state_dict_fingerprint(second)
    renamed = nn.Sequential()
    renamed.add_module("conv", first[0])
    renamed.add_module("norm", first[1])
    assert state_dict_fingerprint(renamed) != state_dict_fingerprint(first)  # names are part of it


@pytest.mark.parametrize("text", ['["cat", "dog", "fish"]', '{"1": "dog", "0": "cat", "2": "fish"}',
                                  "cat\ndog\nfish\n\n"])
def test_labels_files_in_each_format(tmp_path, text):
    path = tmp_path / "labels"
    path.write_text(text)
    assert read_labels_file(path) == ["cat", "dog", "fish"]


@pytest.mark.parametrize("text, message", [
    ('{"0": "cat", "2": "fish"}', "from 0 to 1 without gaps"),
    ('{"first": "cat"}', "keys must be class indices"),
    ("cat\n\nfish\n", "some empty"),
    ("42", "a list of names or an object"),
])
def test_a_bad_labels_file_is_named_with_what_to_fix(tmp_path, text, message):
    path = tmp_path / "labels.json"
    path.write_text(text)
    with pytest.raises(UserModuleError, match=message):
        read_labels_file(path)
    with pytest.raises(UserModuleError, match="cannot be read"):
        read_labels_file(tmp_path / "missing.txt")


def test_labels_round_trip_through_json(tmp_path):
    names = [f"species-{i}" for i in range(1500)]
    (tmp_path / "l.json").write_text(json.dumps(names))
    assert read_labels_file(tmp_path / "l.json") == names


USERS_MODELS_PACKAGE = {
    "models/__init__.py": "from models.net import TinyNet\n",
    "models/net.py": ("import torch\n\n\nclass TinyNet(torch.nn.Module):\n"
                      "    def __init__(self):\n        super().__init__()\n"
                      "        self.conv = torch.nn.Conv2d(3, 4, 3)\n\n"
                      "    def forward(self, x):\n        if x.shape[0] > 1:\n            return self.conv(x).mean((2, 3))\n"
                      "        return self.conv(x).amax((2, 3))\n"),
    "build.py": ("from models import TinyNet\n\n\ndef tiny():\n    return TinyNet()\n\n\n"
                 "def tiny_imported_late():\n    from models.net import TinyNet as Late\n    return Late()\n"),
}


@pytest.fixture
def users_models_package(tmp_path):
    """A user's folder with a package of its own called `models`, as this project's is."""
    for name, text in USERS_MODELS_PACKAGE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("factory", ["tiny", "tiny_imported_late"])
def test_a_users_own_models_package_is_the_one_its_file_imports(users_models_package, factory):
    import models
    import models.registry
    ours = sys.modules["models"]
    module = load_factory(f"{users_models_package / 'build.py'}:{factory}")()
    assert type(module).__name__ == "TinyNet" and type(module).__module__ == "user_models.net"
    assert sys.modules["models"] is ours and models.registry.get("resnet50").name == "resnet50"  # ours, untouched
    scripted = torch.jit.script(module)  # TorchScript finds the user's source through its module's new name
    batch = torch.rand(1, 3, 8, 8)
    assert torch.equal(scripted(batch), module(batch))
