"""A user's file imported beside this project without either shadowing the other.

This project's packages have generic top-level names (`models`, `runtime`, `export`, ...), already imported when a
user's file is loaded. A user whose folder holds a package of the same name would silently get ours. So the file
is executed with its own folder first on the path and our colliding packages set aside; the user's packages it
imported are then kept under private names (`user_models`, ...), the `__module__` of what they define follows
(TorchScript reads a class's source through it), and ours are put back. While the user's factory runs, its own
packages answer to their real names again, for imports it makes inside functions."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

PROJECT_ROOT = Path(__file__).resolve().parents[1]
USER_PREFIX = "user_"  # the private name of a user's package that shares a top-level name with ours


def our_packages() -> set[str]:
    """This project's top-level package names (the folders beside models/ that are packages)."""
    return {p.name for p in PROJECT_ROOT.iterdir() if (p / "__init__.py").is_file()}


def colliding_names(folder: Path) -> set[str]:
    """Our top-level names that the user's folder also defines (a package or a module)."""
    return {name for name in our_packages() if (folder / name / "__init__.py").is_file() or (folder / f"{name}.py").is_file()}


def _family(name: str) -> list[str]:
    return [key for key in list(sys.modules) if key == name or key.startswith(name + ".")]


@contextlib.contextmanager
def _set_aside(names: set[str]):
    """Our modules of these names out of sys.modules for the duration; put back afterwards."""
    ours = {key: sys.modules.pop(key) for name in names for key in _family(name)}
    try:
        yield
    finally:
        for name in names:
            for key in _family(name):
                sys.modules.pop(key)
        sys.modules.update(ours)


def _rename(module: ModuleType, old: str, new: str) -> None:
    """The user's module known as `new`; what it defines says so (inspect and TorchScript look modules up by it)."""
    module.__name__ = new
    for value in vars(module).values():
        if (inspect.isclass(value) or inspect.isfunction(value)) and value.__module__ == old:
            value.__module__ = new


class UserModules:
    """The user's packages that share a top-level name with ours, under their private names."""

    def __init__(self, modules: dict[str, ModuleType]):
        self.modules = modules  # real name (models, models.net) -> the user's module

    @contextlib.contextmanager
    def active(self):
        """The user's packages answer to their real names (their code importing inside a function finds them)."""
        if not self.modules:
            yield
            return
        with _set_aside({name.partition(".")[0] for name in self.modules}):
            sys.modules.update(self.modules)
            yield


def execute_user_file(path: str, module_name: str) -> tuple[ModuleType, UserModules]:
    """Runs the user's file as `module_name` (registered: TorchScript needs its source by name); the user's folder
    stays on the path, after ours, for imports of its other modules."""
    folder = Path(path).resolve().parent
    names = colliding_names(folder)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, str(folder))
    user: dict[str, ModuleType] = {}
    try:
        with _set_aside(names):
            spec.loader.exec_module(module)
            user = {key: sys.modules[key] for name in names for key in _family(name)}
    finally:
        sys.path.remove(str(folder))
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
    for key, value in user.items():
        private = USER_PREFIX + key
        _rename(value, key, private)
        sys.modules[private] = value
    return module, UserModules(user)
