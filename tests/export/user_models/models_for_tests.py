"""User-style model files for the `python -m export module FILE:factory` tests."""

import collections

import torch
from torch import nn


class GatedNet(nn.Module):
    """A user's model with a data-dependent branch: bright images take another head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.dark_head = nn.Linear(4, 2)
        self.bright_head = nn.Linear(4, 2)

    def forward(self, x):
        features = self.conv(x).mean(dim=(2, 3))
        if x.mean() > 0.75:
            return self.bright_head(features)
        return self.dark_head(features)


class PlainNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def gated():
    return GatedNet()


def plain():
    return PlainNet()


def not_a_module():
    return "oops"


class ScriptedDiffers(nn.Module):
    """Computes something else once scripted: torch.jit.is_scripting() is True only inside TorchScript, so
    eager and the trace agree while the scripted artifact (and ONNX made from it) is off by 1."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        logits = self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))
        if torch.jit.is_scripting():
            return logits + 1.0
        return logits


def scripted_differs():
    return ScriptedDiffers()


class NoisyInEval(nn.Module):
    """Samples noise even in eval mode: the eval check must refuse it before anything is written."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(x.mean(dim=(2, 3)) + torch.rand(1))


def noisy_in_eval():
    return NoisyInEval()


Settings = collections.namedtuple("Settings", ["widen", "bright"])  # as efficientnet-lite-pytorch keeps block args


class Unscriptable(nn.Module):
    """Reads its settings from a namedtuple attribute, which torch.jit.script cannot compile (the error of
    efficientnet-lite-pytorch's blocks): scripted and onnx-scripted cannot be made, the other forms can."""

    def __init__(self):
        super().__init__()
        self.settings = Settings(widen=2, bright=0.75)
        self.conv = nn.Conv2d(3, 4 * self.settings.widen, 3, padding=1)
        self.head = nn.Linear(4 * self.settings.widen, 3)

    def forward(self, x):
        features = torch.relu(self.conv(x)).mean(dim=(2, 3))
        if self.settings.widen != 1:
            features = features * 2
        return self.head(features)


class UnscriptableGated(Unscriptable):
    """Unscriptable and with a data-dependent branch: the trace records one path and silently diverges, and no
    scripted form exists to keep the branch. Nothing may be served; trace vs script must still catch it."""

    def forward(self, x):
        features = torch.relu(self.conv(x)).mean(dim=(2, 3)) * self.settings.widen
        if x.mean() > self.settings.bright:
            return self.head(features) + 1.0
        return self.head(features)


class BatchBaked(nn.Module):
    """Turns the batch size into a Python int: the trace bakes in batch 1 (TracerWarning), so the traced forms
    cannot run batch 2 at all; the scripted forms can."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 16, 3)

    def forward(self, x):
        pooled = torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 4)
        return self.head(pooled.reshape(int(x.shape[0]), -1))


def unscriptable():
    return Unscriptable()


def unscriptable_gated():
    return UnscriptableGated()


def batch_baked():
    return BatchBaked()
