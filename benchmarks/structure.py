"""The source tree's structure in figures: modules per folder, import circles, cross-folder imports.

Prints a table (and ``--json`` the same figures as JSON). Every figure comes from parsing the sources
(nothing is imported), so it runs on any checkout::

    python3 benchmarks/structure.py

- **modules**: ``.py`` files per installed package (``simdist``, ``simdist.core``, ``simdist.backends.sim``, ...).
- **circles**: strongly connected components of more than one module in the graph of imports, an edge for every
  ``import`` of a module of the project, at import time or inside a function; ``folder circles`` are those of the
  graph of packages (an edge where a module of one package imports a module of another; a package and its parent
  count as separate folders).
- **backends -> private**: the private modules outside ``simdist.backends`` that the backends import
  (``simdist._x`` or ``simdist.core._x``); what ``simdist.core`` and ``simdist.algorithms`` export is not counted.
- **core/api -> backends at import**: imports of ``simdist.backends`` at module level outside the backends.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
INSTALLED = {"simdist": "simdist", "backends": "simdist.backends", "visualize": "simdist.visualize"}


def modules() -> dict[str, Path]:
    """Every installed module's dotted name and its file."""
    out = {}
    for folder, package in INSTALLED.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def package_of(name: str, path: Path) -> str:
    """The package a module is in (a package's ``__init__`` is in the package itself)."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, bool]]:
    """``(module, at_import_time)`` for each project module ``path`` imports."""
    tree = ast.parse(path.read_text())
    package = package_of(name, path)
    lazy: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lazy.update(id(inner) for inner in ast.walk(node) if inner is not node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            lazy.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" for a in node.names] + [module]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, id(node) not in lazy))
                break
    return found


def measure() -> dict:
    mods = modules()
    known = set(mods)
    graph = nx.DiGraph()
    graph.add_nodes_from(known)
    at_import: list[tuple[str, str]] = []
    for name, path in mods.items():
        for target, eager in imports(name, path, known):
            graph.add_edge(name, target)
            if eager:
                at_import.append((name, target))
    folder = {name: package_of(name, path) for name, path in mods.items()}
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    folders = nx.DiGraph()
    folders.add_nodes_from(set(folder.values()))
    folders.add_edges_from((folder[a], folder[b]) for a, b in graph.edges if folder[a] != folder[b])
    folder_circles = [sorted(c) for c in nx.strongly_connected_components(folders) if len(c) > 1]
    backend_private = sorted(
        {
            b
            for a, b in graph.edges
            if a.startswith("simdist.backends.")
            and not b.startswith("simdist.backends")
            and b.rpartition(".")[2].startswith("_")
        }
    )
    to_backends = sorted(
        {
            (a, b)
            for a, b in at_import
            if b.startswith("simdist.backends")
            and not a.startswith("simdist.backends")
            and not a.startswith("simdist.visualize")
        }
    )
    per_folder: dict[str, int] = {}
    for name in mods:
        per_folder[folder[name]] = per_folder.get(folder[name], 0) + 1
    tests = ROOT / "tests"
    return {
        "modules": len(mods),
        "modules per folder": dict(sorted(per_folder.items())),
        "lines in simdist/*.py": sum(len(p.read_text().splitlines()) for p in (ROOT / "simdist").glob("*.py")),
        "circles": [{"folder": sorted({folder[m] for m in c}), "size": len(c), "modules": c} for c in circles],
        "folder circles": folder_circles,
        "backends -> private modules": backend_private,
        "non-backend -> backends at import time": [f"{a} -> {b}" for a, b in to_backends],
        "README lines": len((ROOT / "README.md").read_text().splitlines()),
        "BENCHMARKS.md lines": len((ROOT / "BENCHMARKS.md").read_text().splitlines()),
        "tests: files at the top": len(list(tests.glob("test_*.py"))),
        "tests: folders": sorted(p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith("__")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    figures = measure()
    if parser.parse_args().json:
        print(json.dumps(figures, indent=1))
        return
    print(f"modules: {figures['modules']}")
    for package, count in figures["modules per folder"].items():
        print(f"  {package:32} {count}")
    print(f"lines in simdist/*.py: {figures['lines in simdist/*.py']}")
    print(f"module circles: {len(figures['circles'])}")
    for circle in figures["circles"]:
        print(f"  {circle['size']:3} modules in {', '.join(circle['folder'])}")
    print(f"folder circles: {len(figures['folder circles'])}")
    for circle in figures["folder circles"]:
        print(f"  {' <-> '.join(circle)}")
    print(f"private modules the backends import: {len(figures['backends -> private modules'])}")
    for name in figures["backends -> private modules"]:
        print(f"  {name}")
    print(
        f"imports of simdist.backends at import time outside it: {len(figures['non-backend -> backends at import time'])}"
    )
    for edge in figures["non-backend -> backends at import time"]:
        print(f"  {edge}")
    print(f"README: {figures['README lines']} lines; BENCHMARKS.md: {figures['BENCHMARKS.md lines']} lines")
    print(f"tests: {figures['tests: files at the top']} files at the top, folders {figures['tests: folders']}")


if __name__ == "__main__":
    main()
