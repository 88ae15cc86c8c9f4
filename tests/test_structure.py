"""The rooms and the one error family, checked from the source (what a newcomer is told is true).

contract -> models -> runtime -> gates -> export -> handlers -> serving -> measure: a room imports only rooms to its
left (sub-rooms included). contract/, runtime/ and handlers/ travel inside the TorchServe archive, so they import
nothing but each other (runtime and handlers) or the standard library (the contract); gates/, the comparisons export
and the rollout share, does not travel. Nobody reads
manifest.json's keys but the contract.
"""

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

from contract.errors import INTERRUPTIONS, VisionExportError

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ("contract", "models", "runtime", "gates", "export", "handlers", "serving", "measure")
SHIPPED = ("contract", "runtime", "handlers")  # what every archive carries, each package whole
MAX_MODULE_LINES = 400
# Reading manifest.json's keys by hand (outside contract/records.py) is what the contract replaced.
RAW_MANIFEST_READS = ('["serving"]', '["artifacts"]', '["preprocessing"]', '"default_artifact"', 'manifest["',
                      "manifest.json\").read_text", "manifest.json').read_text")


def our_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {n for n in names if n.split(".")[0] in ROOMS}


def room_sources(room: str) -> list[Path]:
    return sorted((ROOT / room).rglob("*.py"))


def room_imports(room: str) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): our_imports(p) for p in room_sources(room)}


@pytest.mark.parametrize("room", ROOMS)
def test_imports_point_one_way(room):
    allowed = set(ROOMS[: ROOMS.index(room) + 1])
    backwards = {f: sorted(n for n in names if n.split(".")[0] not in allowed)
                 for f, names in room_imports(room).items()}
    assert not {f: n for f, n in backwards.items() if n}, f"{room} imports rooms to its right"


@pytest.mark.parametrize("room", ["runtime", "handlers"])
def test_what_the_archive_ships_imports_nothing_it_does_not_ship(room):
    for file, names in room_imports(room).items():
        outside = {n for n in names if n.split(".")[0] not in SHIPPED}
        assert not outside, f"{file} imports {sorted(outside)}, which the .mar does not carry"


def test_the_archive_ships_exactly_the_packages_development_imports():
    from export.package.archive import ARCHIVE_SOURCES
    assert sorted(ARCHIVE_SOURCES) == sorted(SHIPPED)


def test_the_contract_is_standard_library_only():
    import sys
    for path in room_sources("contract"):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module.split(".")[0])
        outside = {n for n in imported if n not in sys.stdlib_module_names and n != "contract"}
        assert not outside, f"{path.name} imports {sorted(outside)}: the archive ships contract/ without dependencies"


def test_nobody_reads_manifest_keys_but_the_contract():
    offenders = {}
    for folder in ROOMS + ("examples", "docker"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "contract" / "records.py":
                continue
            found = [pattern for pattern in RAW_MANIFEST_READS if pattern in path.read_text()]
            if found:
                offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, f"raw manifest reads outside contract/records.py: {offenders}"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_itself_back_in_a_circle():
    """Imports inside functions count too: a circle there is a knot a reader has to untie by hand."""
    sources = {module_name(p): p for room in ROOMS for p in room_sources(room)}
    graph = {name: {n for n in our_imports(path) if n in sources and n != name} for name, path in sources.items()}
    circles = [cycle for cycle in _strongly_connected(graph) if len(cycle) > 1]
    assert not circles, f"import circles: {circles}"


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the groups of modules that reach each other."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            groups.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return groups


@pytest.mark.parametrize("room", ["export", "serving"])
def test_measurement_lives_in_measure_only(room):
    """Timing loops, peaks and benchmarks belong to measure/ (the one timing loop: runtime/timing.py)."""
    found = [str(p.relative_to(ROOT)) for p in room_sources(room)
             if "bench" in p.name or "time_runs(" in p.read_text() and "runtime.timing" not in p.read_text()]
    assert not found


def test_no_module_is_over_the_size_limit():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for room in ROOMS for p in room_sources(room)}
    assert not {f: n for f, n in sizes.items() if n > MAX_MODULE_LINES}


OPTIONAL_EXTRAS = {"ray"}  # pyproject.toml's optional extras beyond serving and dev: modules may need them


def our_exception_classes():
    for room in ROOMS:
        package = importlib.import_module(room)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{room}."):
            if info.name.endswith("__main__"):
                continue
            try:
                module = importlib.import_module(info.name)
            except ModuleNotFoundError as missing:
                if missing.name.split(".")[0] not in OPTIONAL_EXTRAS:
                    raise
                continue  # needs an extra not installed here: checked where it is
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                    yield cls


def test_every_error_of_ours_is_in_the_one_family_with_an_exit_code():
    classes = list(our_exception_classes())
    assert len(classes) >= 10  # the walk really found the family
    stops = [c for c in classes if issubclass(c, INTERRUPTIONS)]  # a signal's stop, as Ctrl-C is: not an error
    assert [c.__name__ for c in stops] == ["Stopped"]
    errors = [c for c in classes if c not in stops]
    outside = [f"{c.__module__}.{c.__name__}" for c in errors if not issubclass(c, VisionExportError)]
    assert not outside
    assert all(isinstance(c.exit_code, int) and c.exit_code > 0 for c in errors)
