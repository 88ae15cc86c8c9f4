"""Weights for a module: `auto`, `imagenet`, `random` (seeded) or a local state_dict PATH.

`imagenet` goes through torchvision's normal download and the torch hub cache; `auto` uses it when the
file is cached or the download host answers, and otherwise falls back to seeded random weights with a
warning the caller shows prominently.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from models.checkpoints import WeightsError, read_checkpoint
from models.registry import WeightsInfo

__all__ = ["WeightsError"]  # defined beside the checkpoint reader; imported from here too

RANDOM_SEED = 0
REACHABILITY_TIMEOUT_S = 5.0
RANDOM_NOTE = ("seeded; BatchNorm affine terms drawn and running statistics measured on seeded images "
               "(not the identity a fresh layer is)")
CHOICES_HELP = "auto | imagenet | random | PATH to a state_dict (.pt/.pth)"


def seeded(build: Callable[[], nn.Module], seed: int = RANDOM_SEED) -> nn.Module:
    """Build a module with a reproducible random initialisation (parity re-checks rebuild it)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


STATISTICS_IMAGES = 8  # seeded images whose activations set the running statistics


def draw_norm_statistics(module: nn.Module, input_size: int) -> None:
    """Give every BatchNorm (and other running-statistics norm) trained-looking, non-identity values.

    A fresh BatchNorm has running mean 0, variance 1, weight 1, bias 0: the identity, so an exporter that
    folds it wrongly (wrong variance, epsilon or bias) would still pass parity. Here the affine terms are
    drawn (weight U(0.6, 1.4), bias N(0, 0.1)) and the running statistics are measured, as training does,
    on seeded image-like inputs: they then match the activations each layer really sees, so the network
    neither saturates nor collapses in eval mode (drawn statistics did, for EfficientNet-Lite: its logits
    stopped depending on the image). Uses the caller's generator state (randomized() forks and seeds it)."""
    norms = [layer for layer in module.modules() if isinstance(layer, nn.modules.batchnorm._NormBase)]
    with torch.no_grad():
        for layer in norms:
            if layer.affine:
                layer.weight.uniform_(0.6, 1.4)
                layer.bias.normal_(0.0, 0.1)
        measured = [layer for layer in norms if layer.track_running_stats]
        if not measured:
            return
        momenta = [layer.momentum for layer in measured]
        for layer in measured:
            layer.reset_running_stats()
            layer.momentum = None  # a plain average over the batch
        was_training = module.training
        module.train()
        module(_image_like(STATISTICS_IMAGES, input_size))
        module.train(was_training)
        for layer, momentum in zip(measured, momenta):
            layer.momentum = momentum


def _image_like(count: int, size: int) -> torch.Tensor:
    """Normalised inputs of both kinds models meet (parity sends both): smooth colour fields with fine noise,
    as photographs mostly are, and white noise, which excites the first layers far more."""
    smooth_count = count // 2
    coarse = torch.randn(smooth_count, 3, max(2, size // 16), max(2, size // 16))
    smooth = nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    smooth = smooth + 0.2 * torch.randn(smooth_count, 3, size, size)
    noise = (torch.rand(count - smooth_count, 3, size, size) - 0.5) / 0.25  # uniform [0, 1] after ImageNet-like scaling
    return torch.cat([smooth, noise])


def randomized(build: Callable[[], nn.Module], choice: str, input_size: int = 224) -> tuple[nn.Module, WeightsInfo]:
    """`--weights random`: seeded parameters and normalisation statistics, recorded as such."""
    def build_and_draw() -> nn.Module:
        module = build()
        draw_norm_statistics(module, input_size)
        return module
    return seeded(build_and_draw), WeightsInfo("random", choice, seed=RANDOM_SEED, note=RANDOM_NOTE)


def cached_weights_path(url: str) -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url)


def download_unreachable_reason(url: str) -> str | None:
    """None when the weights host answers; otherwise why not (shown to the user in the warning)."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=REACHABILITY_TIMEOUT_S)
        return None
    except (OSError, ValueError) as error:  # URLError, timeouts, refused connections, HTTP errors
        return f"{type(error).__name__}: {getattr(error, 'reason', None) or error}"


def load_torchvision_pretrained(build: Callable[..., nn.Module], weights_enum) -> nn.Module:
    """torchvision's own path: download into (or read from) the torch hub cache, hash-checked."""
    try:
        return build(weights=weights_enum)
    except Exception as error:  # URLError, hash mismatch, truncated cache file
        raise WeightsError(
            f"could not obtain {weights_enum} from {weights_enum.url} ({error}); "
            f"check the network or place the file at {cached_weights_path(weights_enum.url)}, "
            "or pass --weights random / --weights PATH"
        ) from None


def resolve_torchvision(build: Callable[..., nn.Module], weights_enum, choice: str) -> tuple[nn.Module, WeightsInfo]:
    """Apply a --weights choice to a torchvision builder such as torchvision.models.resnet50."""
    if choice == "imagenet":
        return load_torchvision_pretrained(build, weights_enum), _imagenet_info(weights_enum, choice)
    if choice == "auto":
        cached = cached_weights_path(weights_enum.url)
        unreachable = None if cached.exists() else download_unreachable_reason(weights_enum.url)
        if unreachable is None:
            return load_torchvision_pretrained(build, weights_enum), _imagenet_info(weights_enum, choice)
        module, info = randomized(lambda: build(weights=None), choice)
        info.note = (f"ImageNet weights {weights_enum} are not cached ({cached}) and {weights_enum.url} is "
                     f"unreachable ({unreachable}): using seeded RANDOM weights, so predictions are meaningless")
        return module, info
    if choice == "random":
        return randomized(lambda: build(weights=None), choice)
    module = seeded(lambda: build(weights=None))
    return module, load_state_dict_file(module, choice)


def _imagenet_info(weights_enum, choice: str) -> WeightsInfo:
    return WeightsInfo("imagenet", choice, source=f"{weights_enum} {weights_enum.url}")


def load_state_dict_file(module: nn.Module, path: str) -> WeightsInfo:
    """Load a local state_dict with weights_only=True; name every missing, unexpected or misshapen key."""
    if not os.path.isfile(path):
        raise WeightsError(f"--weights {path!r} is not a file, nor one of: {CHOICES_HELP}")
    fit_state_dict(module, read_checkpoint(path).state, path)
    return WeightsInfo("path", path, source=os.path.abspath(path), sha256=file_sha256(path))


def fit_state_dict(module: nn.Module, state: dict[str, torch.Tensor], path: str) -> None:
    """Load `state` into `module`, or a WeightsError naming every missing, unexpected or misshapen key."""
    expected = module.state_dict()
    problems = []
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        problems.append(f"missing keys: {_few(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_few(unexpected)}")
    misshapen = [f"{k} (checkpoint {tuple(state[k].shape)}, model {tuple(expected[k].shape)})"
                 for k in sorted(set(state) & set(expected)) if state[k].shape != expected[k].shape]
    if misshapen:
        problems.append(f"shape mismatches: {_few(misshapen)}")
    if problems:
        raise WeightsError(f"checkpoint {path} does not fit the model: " + "; ".join(problems))
    module.load_state_dict(state)


def state_dict_fingerprint(module: nn.Module) -> str:
    """sha256 over the state_dict's names, dtypes, shapes and values, in name order: the same weights give the
    same fingerprint whichever file, factory or family they came from (a checkpoint file's own sha256 changes
    with how it was saved)."""
    digest = hashlib.sha256()
    for name, value in sorted(module.state_dict().items()):
        digest.update(name.encode() + b"\0")
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """Provenance: which checkpoint file exactly."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _few(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
