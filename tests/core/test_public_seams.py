"""Code outside a backend's directory reaches it only through its ``__all__``: the simulator
(``simdist.backends.sim``), the socket backend, NCCL and torch's backends alike.

Every Python source of the package, the visualizer, the app, the tutorials and the benchmarks
is parsed (not imported); relative imports are resolved against the file's own package (the
directories are installed as ``simdist``, ``simdist.backends`` and ``simdist.visualize``).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIM = "simdist.backends.sim"
SIM_PACKAGE = importlib.import_module(SIM)
BACKENDS = ["sim", "socket", "nccl", "torchdist"]
PACKAGES = {"simdist": "simdist", "backends": "simdist.backends", "visualize": "simdist.visualize"}
SCANNED = ["simdist", "backends", "visualize", "tutorials", "benchmarks", "app_pages", "app.py"]


def sources(backend: str = "sim") -> list[Path]:
    """The scanned ``.py`` files, ``backends/<backend>`` left out."""
    out = []
    for name in SCANNED:
        path = ROOT / name
        out += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return [p for p in out if (ROOT / "backends" / backend) not in p.parents]


def package_of(path: Path) -> str | None:
    """The dotted package ``path`` is installed in (``None`` outside the installed directories)."""
    parts = path.relative_to(ROOT).parts
    return ".".join([PACKAGES[parts[0]], *parts[1:-1]]) if parts[0] in PACKAGES else None


def absolute(node: ast.ImportFrom, package: str | None) -> str:
    """The absolute module a ``from ... import`` names."""
    if not node.level:
        return node.module or ""
    assert package is not None, "a relative import outside the installed packages"
    base = package.split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def uses_of(source: str, package: str | None, backend: str = "sim") -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` for each import from a backend's package or its modules in ``source``.

    ``name`` is what a ``from`` import takes from ``simdist.backends.<backend>`` itself (``None``
    for a plain import); ``module`` is the module imported, so a private one shows as
    ``simdist.backends.sim._x`` whichever syntax reached it. ``package`` is the source's own
    package, for its relative imports.
    """
    target = f"simdist.backends.{backend}"
    module_string = re.compile(re.escape(target) + r"\.\w+(\.\w+)*(:\w+)?")  # an importlib / registry target
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if a.name.startswith(target)]
        elif isinstance(node, ast.ImportFrom):
            module = absolute(node, package)
            if module == target:
                found += [
                    (node.lineno, f"{target}.{a.name}" if a.name.startswith("_") else target, a.name)
                    for a in node.names
                ]
            elif module == "simdist.backends":
                found += [(node.lineno, target, None) for a in node.names if a.name == backend]
            elif module.startswith(target + "."):
                found += [(node.lineno, module, None)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and module_string.fullmatch(node.value):
            module = node.value.partition(":")[0]
            if module != target:
                found.append((node.lineno, module, None))
    return found


def all_uses(backend: str = "sim") -> list[tuple[str, int, str, str | None]]:
    """``(file, line, module, name)`` of every use of ``backends/<backend>`` in the sources outside it."""
    return [
        (p.relative_to(ROOT).as_posix(), *use)
        for p in sources(backend)
        for use in uses_of(p.read_text(encoding="utf-8"), package_of(p), backend)
    ]


def test_the_scan_sees_the_known_users():
    """The walk finds the imports it is meant to judge (so an empty result below means something)."""
    seen = {(file, name) for file, _, _, name in all_uses()}
    assert ("simdist/launch/_launch.py", "next_schedule") in seen
    assert ("simdist/testing/_explore.py", "held") in seen
    assert ("simdist/__init__.py", "simulate") in seen  # relative: ``from .backends.sim import simulate``
    socket = {(file, name) for file, _, _, name in all_uses("socket")}
    assert ("backends/nccl/_world.py", "SocketWorld") in socket
    assert ("simdist/launch/run.py", "StoreServer") in socket


def test_the_scan_flags_private_imports():
    """Each way of reaching a private module is reported; a mention in prose is not."""
    text = (
        "import simdist.backends.sim._engine\n"
        "from simdist.backends.sim._strategies import decode_choices\n"
        "from simdist.backends.sim import _isolation, simulate\n"
        "TARGET = 'simdist.backends.sim._group:SimWorld'\n"
        "DOC = 'see simdist.backends.sim._strategies for the format'\n"
        "from .sim import _runner\n"
        "from . import sim\n"
    )
    found = uses_of(text, "simdist.backends")
    assert sorted(found) == [
        (1, f"{SIM}._engine", None),
        (2, f"{SIM}._strategies", None),
        (3, SIM, "simulate"),
        (3, f"{SIM}._isolation", "_isolation"),
        (4, f"{SIM}._group", None),
        (6, f"{SIM}._runner", "_runner"),
        (7, SIM, None),
    ]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_nothing_outside_a_backend_imports_its_private_modules(backend):
    package = f"simdist.backends.{backend}"
    bad = [f"{file}:{line}: {module}" for file, line, module, _ in all_uses(backend) if module != package]
    assert not bad, f"private modules of {package} imported from outside backends/{backend}:\n" + "\n".join(bad)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_names_taken_from_a_backend_are_public(backend):
    package = f"simdist.backends.{backend}"
    public = set(importlib.import_module(package).__all__)
    bad = [
        f"{file}:{line}: {name}"
        for file, line, module, name in all_uses(backend)
        if module == package and name is not None and name not in public
    ]
    assert not bad, f"names imported from {package} but not in its __all__:\n" + "\n".join(bad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backends_all_is_exact(backend):
    """Every name in ``__all__`` exists, once; a star import gives exactly ``__all__``."""
    package = f"simdist.backends.{backend}"
    names = importlib.import_module(package).__all__
    assert len(names) == len(set(names))
    assert all(hasattr(importlib.import_module(package), n) for n in names)
    ns: dict = {}
    exec(f"from {package} import *", ns)  # noqa: S102 - the star import is what is checked
    assert set(ns) - {"__builtins__"} == set(names)
