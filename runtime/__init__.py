"""How to run an artifact: one backend interface and a registry keyed by artifact format.

Parity, trace-vs-script, benchmarks and the TorchServe handler all open artifacts here, so what is
proven is what is served. Imports torch, onnxruntime, the standard library and models.errors only:
the archive ships this package.
"""

from runtime.base import (Backend, RunOptions, UnknownFormatError, ArtifactError, ArtifactRunError, available_formats, open_artifact,
                          register_backend)
from runtime.integrity import IntegrityError, file_sha256, verify_file

__all__ = ["Backend", "RunOptions", "UnknownFormatError", "ArtifactError", "ArtifactRunError", "available_formats", "open_artifact",
           "register_backend", "IntegrityError", "file_sha256", "verify_file"]
