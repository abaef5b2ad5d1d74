"""Code outside ``backends/sim`` reaches the simulator only through ``simdist.backends.sim.__all__``.

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

ROOT = Path(__file__).resolve().parent.parent
SIM = "simdist.backends.sim"
SIM_PACKAGE = importlib.import_module(SIM)
PACKAGES = {"simdist": "simdist", "backends": "simdist.backends", "visualize": "simdist.visualize"}
SCANNED = ["simdist", "backends", "visualize", "tutorials", "benchmarks", "app_pages", "app.py"]
MODULE_STRING = re.compile(r"simdist\.backends\.sim\.\w+(\.\w+)*(:\w+)?")  # an importlib / registry target


def sources() -> list[Path]:
    """The scanned ``.py`` files, ``backends/sim`` left out."""
    out = []
    for name in SCANNED:
        path = ROOT / name
        out += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return [p for p in out if (ROOT / "backends" / "sim") not in p.parents]


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


def uses_of_sim(source: str, package: str | None) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` for each import from the simulator package or its modules in ``source``.

    ``name`` is what a ``from`` import takes from ``simdist.backends.sim`` itself (``None``
    for a plain import); ``module`` is the module imported, so a private one shows as
    ``simdist.backends.sim._x`` whichever syntax reached it. ``package`` is the source's own
    package, for its relative imports.
    """
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if a.name.startswith(SIM)]
        elif isinstance(node, ast.ImportFrom):
            module = absolute(node, package)
            if module == SIM:
                found += [
                    (node.lineno, f"{SIM}.{a.name}" if a.name.startswith("_") else SIM, a.name) for a in node.names
                ]
            elif module == "simdist.backends":
                found += [(node.lineno, SIM, None) for a in node.names if a.name == "sim"]
            elif module.startswith(SIM + "."):
                found += [(node.lineno, module, None)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.fullmatch(node.value):
            module = node.value.partition(":")[0]
            if module != SIM:
                found.append((node.lineno, module, None))
    return found


def all_uses() -> list[tuple[str, int, str, str | None]]:
    """``(file, line, module, name)`` of every use of the simulator in the scanned sources."""
    return [
        (p.relative_to(ROOT).as_posix(), *use)
        for p in sources()
        for use in uses_of_sim(p.read_text(encoding="utf-8"), package_of(p))
    ]


def test_the_scan_sees_the_known_users():
    """The walk finds the imports it is meant to judge (so an empty result below means something)."""
    seen = {(file, name) for file, _, _, name in all_uses()}
    assert ("simdist/_launch.py", "next_schedule") in seen
    assert ("simdist/testing/_explore.py", "held") in seen
    assert ("simdist/__init__.py", "simulate") in seen  # relative: ``from .backends.sim import simulate``


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
    found = uses_of_sim(text, "simdist.backends")
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
def test_nothing_outside_the_simulator_imports_its_private_modules():
    bad = [f"{file}:{line}: {module}" for file, line, module, _ in all_uses() if module != SIM]
    assert not bad, "private simulator modules imported from outside backends/sim:\n" + "\n".join(bad)


@pytest.mark.timeout(60)
def test_names_taken_from_the_simulator_are_public():
    public = set(SIM_PACKAGE.__all__)
    bad = [
        f"{file}:{line}: {name}"
        for file, line, module, name in all_uses()
        if module == SIM and name is not None and name not in public
    ]
    assert not bad, "names imported from simdist.backends.sim but not in its __all__:\n" + "\n".join(bad)


def test_sim_all_is_exact():
    """Every name in ``__all__`` exists, once; a star import gives exactly ``__all__``."""
    names = SIM_PACKAGE.__all__
    assert len(names) == len(set(names))
    assert all(hasattr(SIM_PACKAGE, n) for n in names), [n for n in names if not hasattr(SIM_PACKAGE, n)]
    ns: dict = {}
    exec(f"from {SIM} import *", ns)  # noqa: S102 - the star import is what is checked
    assert set(ns) - {"__builtins__"} == set(names)
