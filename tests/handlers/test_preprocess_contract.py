"""For every registered image model, the handler's tensor for a real photograph is what the weights' own
`transforms()` produce (normalisation aside: that is inside the exported graph): from a PIL image (the served
path: PIL resizes the crop window only) within one level of transforms() on that PIL image, the form torchvision's
accuracies were measured on; from a uint8 tensor (a GPU decoder's) exactly transforms() on that tensor."""

import io

import pytest
import skimage.data
import torch
import torchvision
from PIL import Image

import models
from models.preprocess import IMAGENET_MEAN, IMAGENET_STD
from contract.records import ImageContract
from runtime.images import crop_window, decode_image, decode_upright, preprocess

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


ONE_LEVEL = 1 / 255


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
    difference = (ours - reference).abs()
    assert ours.shape == reference.shape and float(difference.max()) <= ONE_LEVEL + 1e-6
    assert float((difference > ONE_LEVEL / 2).float().mean()) < 0.01  # PIL's rounding of its first pass, rarely


# 640x480 with resize 256 -> 341x256 (torchvision truncates 341.33); the centre crop keeps columns from
# round((341 - 224) / 2) = 58 (Python rounds half to even, as torchvision's center_crop does) and rows from 16
SX, SY = 640 / 341, 480 / 256


@pytest.mark.parametrize("size, window", [
    ((640, 480), (58 * SX, 16 * SY, 282 * SX, 240 * SY)),
    ((480, 640), (16 * SY, 58 * SX, 240 * SY, 282 * SX)),
    ((256, 256), (16.0, 16.0, 240.0, 240.0)),  # already the resize: the crop itself
])
def test_the_crop_window_is_resize_then_centre_crop_in_source_pixels(size, window):
    assert crop_window(size, ImageContract(resize=256, crop=(224, 224))) == pytest.approx(window)


def test_pil_leaves_to_torchvision_what_it_cannot_compute_alike():
    assert crop_window((640, 480), ImageContract(resize=256, crop=(224, 224), antialias=False)) is None
    assert crop_window((640, 480), ImageContract(resize=256, crop=(224, 224), interpolation="nearest")) is None
    assert crop_window((640, 480), ImageContract(resize=200, crop=(224, 224))) is None  # torchvision pads
    image = Image.new("RGB", (640, 480), (10, 200, 30))
    padded = preprocess(image, ImageContract(resize=200, crop=(224, 224)))
    assert tuple(padded.shape) == (3, 224, 224) and float(padded[:, 0, 0].abs().sum()) == 0.0  # the padding
