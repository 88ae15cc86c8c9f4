"""What can be exported: the model registry and the modules it builds."""

from models.registry import (BuiltModel, InputSpec, ModelEntry, UnknownModelError, WeightsInfo, get, names,
                             register)
from models import resnet, controlflow  # noqa: F401  (registers the entries)

__all__ = ["BuiltModel", "InputSpec", "ModelEntry", "UnknownModelError", "WeightsInfo", "get", "names",
           "register"]
