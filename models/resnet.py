"""torchvision ResNets, wrapped with in-graph ImageNet preprocessing."""

from __future__ import annotations

import torchvision

from contract.records import ImageContract
from models.preprocess import ImagePreprocess
from models.probes import resize_probes
from models.registry import BuiltModel, Family, InputSpec, ModelEntry, register, register_family
from models.weights import resolve_torchvision

RESNET_ARCHS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
DEFAULT_ARCH = "resnet50"
INPUT_SIZE = 224
OTHER_SIZE = 320  # a size that takes the resize branch the 224x224 trace never saw


def imagenet_labels(arch: str) -> list[str]:
    """Class names from torchvision's weights metadata (shipped with torchvision, no download)."""
    return list(torchvision.models.get_model_weights(arch).DEFAULT.meta["categories"])


def weights_preprocessing(arch: str) -> ImageContract:
    """The evaluation transform of the arch's DEFAULT weights, read from torchvision (resnet50/101/152:
    shorter side 232, resnet18/34: 256; then a 224 centre crop). Normalisation is inside the graph."""
    weights = torchvision.models.get_model_weights(arch).DEFAULT
    transform = weights.transforms()
    crop = transform.crop_size[0]
    return ImageContract(resize=transform.resize_size[0], crop=(crop, crop),
                         interpolation=transform.interpolation.value, antialias=bool(transform.antialias),
                         source=f"torchvision {weights}.transforms()")


def _builder(arch: str):
    def build(weights: str) -> BuiltModel:
        network, info = resolve_torchvision(
            getattr(torchvision.models, arch), torchvision.models.get_model_weights(arch).DEFAULT, weights)
        return BuiltModel(ImagePreprocess(network, size=INPUT_SIZE), info, imagenet_labels(arch))
    return build


def _probe_inputs():
    return resize_probes(INPUT_SIZE, OTHER_SIZE)


for _arch in RESNET_ARCHS:
    register(ModelEntry(
        name=_arch,
        family="resnet",
        description=f"torchvision {_arch} with in-graph resize + ImageNet normalisation",
        input_spec=InputSpec(shape=(1, 3, INPUT_SIZE, INPUT_SIZE), resizes_in_graph=True, min_size=32,
                             preprocessing=weights_preprocessing(_arch)),
        build=_builder(_arch),
        probe_inputs=_probe_inputs,
        source={"registry": _arch},
    ))

register_family(Family("resnet", "a torchvision ResNet with in-graph preprocessing (torchvision's ImageNet weights "
                                 "when they can be downloaded)", RESNET_ARCHS, DEFAULT_ARCH))
