"""The package's imports follow ARCHITECTURE.md's layers: each package (a folder of orchestrator/) or
module of its own sits on one layer of the picture there, and imports only its own layer and those
below it. Every import counts: top level, under TYPE_CHECKING and inside functions.

`python -m tests.test_layers` prints each import that runs back up the layers.
"""

from __future__ import annotations

import ast
import functools
import graphlib
import inspect
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "orchestrator"
ARCHITECTURE = REPO / "ARCHITECTURE.md"
MAX_OWN_MODULES = 8
MAX_LINES = 600
# A row of the picture: the layer's name, then its packages (`name/`) and modules (`name.py`).
ROW = re.compile(r"^\s*([a-z][a-z ]*?)\s{2,}((?:[\w]+(?:/|\.py)\s*)+)$")
# Store methods whose names other objects share (dict.update, HostEvents.end): the Store itself is
# kept out of the backends by name (`Store`, `store`), so these need no check of their own.
SHARED_NAMES = {"update", "end", "get", "list", "ids", "delete"}


@functools.cache
def layers() -> list[tuple[str, list[str]]]:
    """ARCHITECTURE.md's picture of the layers, top to bottom: (layer, its packages and modules)."""
    text = ARCHITECTURE.read_text()
    picture = text.split("## Layers", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    return [(m.group(1), m.group(2).split()) for m in map(ROW.match, picture.splitlines()) if m]


def parts() -> list[str]:
    """What orchestrator/ holds: its packages (`name/`) and its own modules (`name.py`)."""
    return sorted(f"{p.name}/" if p.is_dir() else p.name for p in PACKAGE.iterdir()
                  if not p.is_symlink() and (p.suffix == ".py" or (p / "__init__.py").exists()))


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


def layer(module: str) -> int:
    """The layer (0 = top) of a module of the package, from the picture's row that names its part."""
    rest = module.split(".")[1:]
    part = "__init__.py" if not rest else f"{rest[0]}/" if (PACKAGE / rest[0]).is_dir() else f"{rest[0]}.py"
    return next(i for i, (_, names) in enumerate(layers()) if part in names)


def back_up(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for every import of a module in a higher layer."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer(b) < layer(a))


def test_the_architecture_page_places_every_package_and_module_once() -> None:
    placed = [name for _, names in layers() for name in names]
    assert sorted(placed) == parts(), "ARCHITECTURE.md's picture of the layers and orchestrator/ differ"


def test_no_import_runs_back_up_the_layers() -> None:
    found = back_up(import_graph())
    assert not found, "\n".join(f"{a} -> {b}" for a, b in found)


def test_orchestrator_keeps_few_modules_of_its_own_beside_its_packages() -> None:
    own = [name for name in parts() if name.endswith(".py")]
    assert len(own) <= MAX_OWN_MODULES, own


def test_every_package_says_what_it_is_and_the_architecture_page_links_it() -> None:
    text = ARCHITECTURE.read_text()
    for name in parts():
        if name.endswith("/"):
            assert ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text())), f"{name}: no docstring"
            assert f"](orchestrator/{name})" in text, f"ARCHITECTURE.md does not link orchestrator/{name}"


def test_no_module_is_over_600_lines() -> None:
    lines = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert not {path: n for path, n in lines.items() if n > MAX_LINES}


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


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each group of modules that import each other, even through others (none is the rule)."""
    found: list[list[str]] = []
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        group = sorted(m for m in reach(graph, start) if start in reach(graph, m))
        done.update(group)
        if len(group) > 1:
            found.append(group)
    return found


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules `start` imports, directly or through others, and itself."""
    seen, todo = {start}, [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


if __name__ == "__main__":
    names = [name for name, _ in layers()]
    graph = import_graph()
    for importer, imported in back_up(graph):
        print(f"{importer} ({names[layer(importer)]}) -> {imported} ({names[layer(imported)]})")
    for group in circles(graph):
        print("circle: " + " <-> ".join(group))
    print(f"{len(back_up(graph))} imports back up, {len(circles(graph))} circles")
