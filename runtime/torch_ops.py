"""torchvision's operators (a detector's nms and roi_align) registered with torch before a torch artifact that calls
them is loaded: TorchScript, torch.export and AOTInductor files name them (`torchvision::nms`), and torch finds
them only once torchvision is imported. Serving imports torchvision for no other reason (runtime/transforms.py),
and the import costs every worker's start over a second, so it is imported only for an artifact that names them:
its code and graph members are read for the name, never its weights.
"""

from __future__ import annotations

import importlib
import re
import zipfile
from pathlib import Path

# a call of one, as TorchScript code writes it (ops.torchvision.nms) and a .pt2 graph (torchvision::nms); module
# paths (__torch__.torchvision.models.resnet) name torchvision too, but call none of its operators
OPERATOR_CALL = re.compile(rb"ops\.torchvision\.|torchvision::")
# members that hold tensors, not code or graphs: TorchScript's data/N, a .pt2's data/weights/ and data/constants/
TENSOR_MEMBER = re.compile(r"(^|/)data/(\d+$|weights/|constants/)")


def names_torchvision_ops(path: str | Path) -> bool:
    """Whether the artifact's code or graph names a torchvision operator; a file that is not a zip archive is
    taken to name them, as it was loaded before (with torchvision imported)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(OPERATOR_CALL.search(archive.read(member)) for member in archive.infolist()
                       if not member.is_dir() and not TENSOR_MEMBER.search(member.filename))
    except zipfile.BadZipFile:
        return True


def with_torchvision_ops(path: str | Path) -> None:
    """torchvision imported (its operators registered) when the artifact at `path` calls them."""
    if names_torchvision_ops(path):
        importlib.import_module("torchvision")
