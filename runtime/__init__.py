"""How to run an artifact: one backend interface and a registry keyed by artifact format.

Parity, trace-vs-script, benchmarks and the TorchServe handler all open artifacts here, so what is
proven is what is served. Imports torch, onnxruntime, the standard library, contract.errors and contract.records
only: the archive ships this package.
"""

from runtime.base import (
                          ArtifactError,
                          ArtifactRunError,
                          Backend,
                          Outputs,
                          RunOptions,
                          UnknownFormatError,
                          available_formats,
                          open_artifact,
)
from runtime.integrity import IntegrityError, file_sha256, verify_artifact, verify_file

__all__ = ["ArtifactError", "ArtifactRunError", "Backend", "Outputs", "RunOptions", "UnknownFormatError", "available_formats",
           "open_artifact", "IntegrityError", "file_sha256", "verify_artifact", "verify_file"]
