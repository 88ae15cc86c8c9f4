"""Rebuild the model an export was made from, from its manifest (parity re-checks, the in-process benchmark)."""

from __future__ import annotations

from contract.records import ContractError, Manifest
from models.registry import ModelEntry

# manifest.weights["kind"] -> the --weights choice that builds those weights again ("path" gives its source)
WEIGHTS_CHOICE = {"imagenet": "imagenet", "random": "random", "factory": "auto", "trained": "auto", "coco": "coco"}


def entry_from_manifest(manifest: Manifest) -> ModelEntry:
    """The registry entry, or the user's module entry, recorded in manifest.model.source."""
    import models
    from models.fine_tuned import SOURCE_KEY, fine_tuned_entry
    from models.user_tasks import AUTO, module_entry
    source = manifest.model.source
    if "module" in source:
        return module_entry(source["module"], tuple(source["input_shape"]), task=source.get("task", AUTO))[0]
    if SOURCE_KEY in source:
        return fine_tuned_entry(source["task"], source[SOURCE_KEY], weights_from_manifest(manifest),
                                num_classes=source["num_classes"])
    if "registry" in source:
        return models.get(source["registry"])
    raise ContractError(f"manifest model.source {source!r} names neither a registry model nor a module, so the "
                        "model cannot be rebuilt; re-run the export to rewrite it")


def weights_from_manifest(manifest: Manifest) -> str:
    """The --weights choice that reproduces the recorded weights."""
    kind = manifest.weights.get("kind")
    if kind == "path":
        return manifest.weights["source"]
    if kind not in WEIGHTS_CHOICE:
        raise ContractError(f"manifest weights.kind {kind!r} is not one of path, {', '.join(WEIGHTS_CHOICE)}, so "
                            "the weights cannot be rebuilt; re-run the export to rewrite it")
    return WEIGHTS_CHOICE[kind]
