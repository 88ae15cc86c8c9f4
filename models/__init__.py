"""What can be exported: the model registry and the modules it builds.

Every module of this package is imported here, so a family is one new module that registers itself.
"""

import importlib
import pkgutil

from models.registry import (
    BuiltModel,
    Family,
    InputSpec,
    ModelEntry,
    UnknownModelError,
    WeightsInfo,
    entry_of,
    families,
    family,
    get,
    names,
    register,
    register_family,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["BuiltModel", "Family", "InputSpec", "ModelEntry", "UnknownModelError", "WeightsInfo", "entry_of",
           "families", "family", "get", "names", "register", "register_family"]
