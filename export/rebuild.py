"""Rebuild the model an export was made from, from its manifest (parity re-checks, the in-process benchmark)."""

from __future__ import annotations

from models.contract import Manifest
from models.registry import ModelEntry


def entry_from_manifest(manifest: Manifest) -> ModelEntry:
    """The registry entry, or the user's module entry, recorded in manifest.model.source."""
    import models
    from models.user_module import user_entry
    source = manifest.model.source
    if "module" in source:
        return user_entry(source["module"], tuple(source["input_shape"]))
    return models.get(source["registry"])


def weights_from_manifest(manifest: Manifest) -> str:
    """The --weights choice that reproduces the recorded weights."""
    weights = manifest.weights
    if weights["kind"] == "path":
        return weights["source"]
    return {"imagenet": "imagenet"}.get(weights["kind"], "random")
