"""runtime/transforms.py computes what torchvision's kernels compute, bit for bit: the served preprocessing (and a
detector's whole-image resize) on real photos, decoded as a request is, equals the torchvision computation it
replaced, on whatever CPU runs the test; the float path a CPU without torch's uint8 bilinear kernel takes (and a
GPU) is compared too, by making both believe the CPU has none."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF
from torchvision.transforms.v2 import functional as F2

from contract.records import ImageContract, ResizeRule
from runtime import transforms
from runtime.images import decode_upright, pixels, preprocess, resize_whole
from tests.photos import EXPECTED_CLASSES, photo_jpeg

PHOTOS = sorted(EXPECTED_CLASSES)
CONTRACTS = [ImageContract(resize=256, crop=(224, 224)),  # ResNet's weights
             ImageContract(resize=256, crop=(224, 224), interpolation="bicubic"),  # EfficientNet-Lite0's
             ImageContract(resize=232, crop=(224, 224)),
             ImageContract(resize=96, crop=(120, 80)),  # a crop larger than the resize: zero padding
             ImageContract(resize=300, crop=(224, 224), interpolation="nearest", antialias=False),
             ImageContract(resize=299, crop=(299, 299), interpolation="bicubic", antialias=False)]


def torchvision_preprocess(image: torch.Tensor, contract: ImageContract) -> torch.Tensor:
    """runtime.images.preprocess as it was, with torchvision's own functions."""
    image = F2.resize(image, [contract.resize], interpolation=InterpolationMode(contract.interpolation),
                      antialias=contract.antialias)
    image = F2.center_crop(image, list(contract.crop)).contiguous()
    return TF.convert_image_dtype(image, torch.float)


def photo(name: str) -> torch.Tensor:
    """A real photo as a request's decode gives it: a channels-last view over PIL's pixels."""
    return pixels(decode_upright(photo_jpeg(name)))


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: f"{c.interpolation}-{c.resize}-{c.crop}")
def test_preprocess_equals_torchvisions_on_real_photos(contract):
    for name in PHOTOS:
        image = photo(name)
        for turned in (image, image.transpose(1, 2), image.flip(2)):  # as stored, turned sideways, mirrored (EXIF)
            assert torch.equal(preprocess(turned, contract), torchvision_preprocess(turned, contract)), name


def test_a_detectors_whole_image_resize_equals_torchvisions():
    rule = ResizeRule(min_side=320, max_side=512)
    for name in PHOTOS:
        image = photo(name)
        size = list(rule.size(image.shape[-2], image.shape[-1]))
        expected = TF.convert_image_dtype(
            F2.resize(image, size, interpolation=InterpolationMode.BILINEAR, antialias=True).contiguous(), torch.float)
        assert torch.equal(resize_whole(image, rule), expected), name


def test_the_float_path_of_a_cpu_without_the_uint8_kernel_equals_torchvisions(monkeypatch):
    # both ask torch which kernels this CPU has; "DEFAULT" is a CPU without AVX2, where uint8 goes through float32
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    monkeypatch.setattr(transforms.platform, "machine", lambda: "x86_64")
    contract = CONTRACTS[0]
    assert not transforms.native_dtype(torch.uint8, "bilinear", "cpu")
    for name in PHOTOS:
        image = photo(name)
        assert torch.equal(preprocess(image, contract), torchvision_preprocess(image, contract)), name


def test_float_images_and_unchanged_sizes_pass_as_torchvision_passes_them():
    image = photo(PHOTOS[0])
    as_float = image.float() / 255
    assert torch.equal(transforms.resize(as_float, [200], "bicubic"),
                       F2.resize(as_float, [200], interpolation=InterpolationMode.BICUBIC, antialias=True))
    assert transforms.resize(image, [min(image.shape[-2:])]) is image  # torchvision returns it as it is too
    assert torch.equal(transforms.to_float(as_float), TF.convert_image_dtype(as_float, torch.float))


def test_an_interpolation_no_tensor_kernel_has_is_refused_saying_which_work():
    with pytest.raises(ValueError, match="bilinear"):
        transforms.resize(photo(PHOTOS[0]), [224], "box")
