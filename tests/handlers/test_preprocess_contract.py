"""For every registered image model, the handler's tensor for a real photograph is what the weights' own
`transforms()` produce (normalisation aside: that is inside the exported graph), within one level: on the CPU
torchvision.transforms.v2 resizes the uint8 pixels with its fixed-point kernel, which computes PIL's antialiased
filter (the form torchvision's accuracies were measured on, a PIL image), where transforms() on a tensor resizes in
float32 and rounds otherwise (up to 18 % of its values a level away from PIL's)."""

import io

import pytest
import skimage.data
import torch
import torchvision
from PIL import Image

import models
from contract.records import ImageContract
from models.preprocess import IMAGENET_MEAN, IMAGENET_STD
from runtime.images import decode_image, decode_upright, preprocess

PHOTOS = {"chelsea (cat)": skimage.data.chelsea, "astronaut": skimage.data.astronaut, "coffee": skimage.data.coffee}


def jpeg(array) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


ONE_LEVEL = 1 / 255


def assert_within_one_level(ours: torch.Tensor, reference: torch.Tensor) -> None:
    """No value more than one level (1/255) away, and values a level away rare (rounding, not another filter)."""
    difference = (ours - reference).abs()
    assert ours.shape == reference.shape and float(difference.max()) <= ONE_LEVEL + 1e-6, float(difference.max())
    assert float((difference > ONE_LEVEL / 2).float().mean()) < 0.01


@pytest.mark.parametrize("photo", PHOTOS)
@pytest.mark.parametrize("arch", models.names("resnet"))
def test_handler_tensor_is_the_weights_transforms_of_the_pil_image_within_one_level(arch, photo):
    contract = models.get(arch).input_spec.record().image_contract()  # what the manifest records for the handler
    data = jpeg(PHOTOS[photo]())
    ours = preprocess(decode_upright(data), contract)
    transforms = torchvision.models.get_model_weights(arch).DEFAULT.transforms()
    reference = transforms(Image.open(io.BytesIO(data)).convert("RGB"))
    assert_within_one_level(ours, reference * torch.tensor(IMAGENET_STD).view(3, 1, 1)
                            + torch.tensor(IMAGENET_MEAN).view(3, 1, 1))


@pytest.mark.parametrize("photo", PHOTOS)
def test_a_pil_image_and_its_uint8_tensor_make_the_same_row(photo):
    contract = models.get("resnet50").input_spec.record().image_contract()
    data = jpeg(PHOTOS[photo]())
    assert torch.equal(preprocess(decode_upright(data), contract), preprocess(decode_image(data), contract))


def test_the_default_resnet50_contract_is_232_then_224_and_resnet18_is_256():
    assert models.get("resnet50").input_spec.preprocessing.resize == 232
    assert models.get("resnet18").input_spec.preprocessing.resize == 256
    assert {models.get(a).input_spec.preprocessing.crop for a in models.names("resnet")} == {(224, 224)}


@pytest.mark.parametrize("photo", PHOTOS)
@pytest.mark.parametrize("arch", models.names("resnet") + models.names("efficientnet"))
def test_served_tensor_is_within_one_level_of_the_transforms_of_the_pil_image(arch, photo):
    contract = models.get(arch).input_spec.record().image_contract()
    data = jpeg(PHOTOS[photo]())
    ours = preprocess(decode_upright(data), contract)
    pil = Image.open(io.BytesIO(data)).convert("RGB")
    reference = torchvision.transforms.Compose([
        torchvision.transforms.Resize(contract.resize, getattr(torchvision.transforms.InterpolationMode,
                                                                contract.interpolation.upper())),
        torchvision.transforms.CenterCrop(contract.crop), torchvision.transforms.PILToTensor()])(pil).float() / 255
    assert_within_one_level(ours, reference)


def test_a_crop_larger_than_the_resize_is_padded_as_torchvision_does():
    image = Image.new("RGB", (640, 480), (10, 200, 30))
    padded = preprocess(image, ImageContract(resize=200, crop=(224, 224)))
    assert tuple(padded.shape) == (3, 224, 224) and float(padded[:, 0, 0].abs().sum()) == 0.0  # the padding
