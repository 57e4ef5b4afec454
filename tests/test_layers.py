"""The package's imports follow DESIGN.md's arrows: cli -> (launch | doctor | report) -> plan/spec/store
-> transport, and remote/ imports nothing of the rest. Every import counts: top level, under
TYPE_CHECKING and inside functions.

`python -m tests.test_layers` prints each import that runs back up the layers.
"""

from __future__ import annotations

import ast
import graphlib
import inspect
from fnmatch import fnmatch
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "orchestrator"
MAX_BACK_UP = 3
# Store methods whose names other objects share (dict.update, HostEvents.end): the Store itself is
# kept out of the backends by name (`Store`, `store`), so these need no check of their own.
SHARED_NAMES = {"update", "end", "get", "list", "ids", "delete"}

# Top to bottom; a module takes the layer that names it (without `orchestrator.`), else the first
# with a pattern that matches it. DESIGN.md names the commands, plan/spec/store and transport; the rest sit
# where what they serve puts them.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cli", ("__main__", "cli", "cli.*")),
    ("commands", ("run", "run.*", "ft", "ft.*", "doctor", "doctor.*", "report", "report.*")),
    ("backends", ("backends", "backends.*")),
    ("run parts", ("logs", "logs.*", "telemetry", "telemetry.*", "diagnose", "diagnose.*", "fanout", "fanout.*",
                   "hostcheck", "hostcheck.*")),
    ("transport", ("transport", "transport.*")),
    ("plan/spec/store", ("plan", "spec", "spec.*", "store", "facts")),
    ("base", ("errors", "console", "console.*", "orchestrator")),
    ("remote", ("remote", "remote.*")),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports, wherever the import stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def add(target: str) -> None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in modules else base)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imports_of(path, name, set(paths)) for name, path in paths.items()}


def layer(module: str) -> int | None:
    short = module.removeprefix("orchestrator.")
    named = next((i for i, (_, patterns) in enumerate(LAYERS) if short in patterns), None)
    return named if named is not None else next(
        (i for i, (_, patterns) in enumerate(LAYERS) for p in patterns if fnmatch(short, p)), None)


def back_up(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for every import of a module in a higher layer."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer(b) < layer(a))  # type: ignore[operator]


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in import_graph() if layer(m) is None]
    assert not unplaced, f"add these to LAYERS in tests/test_layers.py: {unplaced}"


def test_at_most_two_imports_run_back_up_the_layers() -> None:
    found = back_up(import_graph())
    assert len(found) <= MAX_BACK_UP, "\n".join(f"{a} -> {b}" for a, b in found)


def test_no_import_circles() -> None:
    graphlib.TopologicalSorter(import_graph()).prepare()  # raises CycleError naming one


def test_remote_imports_nothing_of_the_rest_of_the_package() -> None:
    graph = import_graph()
    outside = {(m, t) for m, targets in graph.items() if m.startswith("orchestrator.remote")
               for t in targets if not t.startswith("orchestrator.remote")}
    assert not outside


def test_the_backend_contract_imports_nothing_of_the_run_loop() -> None:
    run_loop = {"orchestrator.run.launch", "orchestrator.run.attempt", "orchestrator.run.hostrun",
                "orchestrator.run.restarts"}
    assert not import_graph()["orchestrator.backends.base"] & run_loop


def store_uses(path: Path) -> list[str]:
    """Where a module reaches the job records' Store: an import of it (or of orchestrator.store as a
    module), a name or attribute `Store` or `store`, or a call of a method only the Store has."""
    from orchestrator.store import Store

    only_store = {name for name, _ in inspect.getmembers(Store, inspect.isfunction)
                  if not name.startswith("_")} - SHARED_NAMES
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        line = f"{path.name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{line} import {a.name}" for a in node.names if a.name == "orchestrator.store"]
        elif isinstance(node, ast.ImportFrom):
            names = {a.name for a in node.names}
            if (node.module == "orchestrator" and "store" in names) or (
                    node.module == "orchestrator.store" and "Store" in names):
                found.append(f"{line} from {node.module} import {', '.join(sorted(names))}")
        elif isinstance(node, ast.Name) and node.id in ("Store", "store"):
            found.append(f"{line} {node.id}")
        elif isinstance(node, ast.arg) and node.arg == "store":
            found.append(f"{line} argument store")
        elif isinstance(node, ast.Attribute) and (node.attr in ("Store", "store") or node.attr in only_store):
            found.append(f"{line} .{node.attr}")
    return found


def test_no_backend_reaches_the_store_its_hooks_return_what_happened_and_the_run_loop_records_it() -> None:
    found = [use for path in sorted((PACKAGE / "backends").rglob("*.py")) for use in store_uses(path)]
    assert not found, "\n".join(found)


if __name__ == "__main__":
    for importer, imported in back_up(import_graph()):
        print(f"{importer} ({LAYERS[layer(importer)][0]}) -> {imported} ({LAYERS[layer(imported)][0]})")  # type: ignore[index]
