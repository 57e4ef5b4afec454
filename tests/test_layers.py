"""The package's imports follow ARCHITECTURE.md's layers: each package (a folder of orchestrator/) or
module of its own sits on one layer of the picture there, and imports only its own layer and those
below it. Every import counts: top level, under TYPE_CHECKING and inside functions.

`python -m tests.test_layers` prints each import that runs back up the layers.
"""

from __future__ import annotations

import ast
import functools
import graphlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "orchestrator"
ARCHITECTURE = REPO / "ARCHITECTURE.md"
MAX_OWN_MODULES = 8
MAX_LINES = 600
# A row of the picture: the layer's name, then its packages (`name/`) and modules (`name.py`).
ROW = re.compile(r"^\s*([a-z][a-z ]*?)\s{2,}((?:[\w]+(?:/|\.py)\s*)+)$")


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


if __name__ == "__main__":
    names = [name for name, _ in layers()]
    for importer, imported in back_up(import_graph()):
        print(f"{importer} ({names[layer(importer)]}) -> {imported} ({names[layer(imported)]})")
