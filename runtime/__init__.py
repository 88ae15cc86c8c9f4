"""How to run an artifact: one backend interface and a registry keyed by artifact format.

Parity, trace-vs-script, benchmarks and the TorchServe handler all open artifacts here, so what is
proven is what is served. Imports torch, onnxruntime, the standard library, contract.errors and contract.records
only: the archive ships this package.

The names below are imported when first asked for (PEP 562): a process that needs only runtime.integrity (a
server checking an archive's signature before its workers start) does not import torch for it.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {"ArtifactError": "runtime.base", "ArtifactRunError": "runtime.base", "Backend": "runtime.base",
          "Outputs": "runtime.base", "RunOptions": "runtime.base", "UnknownFormatError": "runtime.base",
          "available_formats": "runtime.base", "open_artifact": "runtime.base",
          "IntegrityError": "runtime.integrity", "file_sha256": "runtime.integrity",
          "verify_artifact": "runtime.integrity", "verify_file": "runtime.integrity"}
__all__ = ["ArtifactError", "ArtifactRunError", "Backend", "Outputs", "RunOptions", "UnknownFormatError",
           "available_formats", "open_artifact", "IntegrityError", "file_sha256", "verify_artifact", "verify_file"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
