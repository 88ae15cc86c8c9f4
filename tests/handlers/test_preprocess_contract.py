"""For every registered image model, the handler's tensor for a real photograph is what the weights' own
`transforms()` produce (normalisation aside: that is inside the exported graph)."""

import io

import pytest
import skimage.data
import torch
import torchvision
from PIL import Image

import models
from models.preprocess import IMAGENET_MEAN, IMAGENET_STD
from runtime.images import decode_image, preprocess

PHOTOS = {"chelsea (cat)": skimage.data.chelsea, "astronaut": skimage.data.astronaut, "coffee": skimage.data.coffee}


def jpeg(array) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


def normalise(batch: torch.Tensor) -> torch.Tensor:
    return (batch - torch.tensor(IMAGENET_MEAN).view(3, 1, 1)) / torch.tensor(IMAGENET_STD).view(3, 1, 1)


@pytest.mark.parametrize("photo", PHOTOS)
@pytest.mark.parametrize("arch", models.names("resnet"))
def test_handler_tensor_equals_the_weights_transforms(arch, photo):
    entry = models.get(arch)
    contract = entry.input_spec.record().image_contract()  # what the manifest records for the handler
    image = decode_image(jpeg(PHOTOS[photo]()))  # uint8 (3, H, W), as the handler decodes a request
    ours = preprocess(image, contract)
    transforms = torchvision.models.get_model_weights(arch).DEFAULT.transforms()
    torch.testing.assert_close(normalise(ours), transforms(image), atol=1e-5, rtol=1e-5)


def test_the_default_resnet50_contract_is_232_then_224_and_resnet18_is_256():
    assert models.get("resnet50").input_spec.preprocessing.resize == 232
    assert models.get("resnet18").input_spec.preprocessing.resize == 256
    assert {models.get(a).input_spec.preprocessing.crop for a in models.names("resnet")} == {(224, 224)}
