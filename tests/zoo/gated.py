"""A user's model with data-dependent control flow: dark and bright images take different heads.

Expected forms: scripted, onnx-scripted (If kept), traced and onnx-traced (both exist but record the one branch
their example took, so trace vs script finds them silently wrong on the other and they are not served).
Refused: onnx-dynamo (torch.export cannot branch on a tensor's value without torch.cond).
"""

import torch
from torch import nn


class GatedNet(nn.Module):
    def __init__(self, classes: int = 3):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.dark_head = nn.Linear(8, classes)
        self.bright_head = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.features(x)
        if x.mean() > 0.5:
            return self.bright_head(features)
        return self.dark_head(features)


def factory():
    return GatedNet()
