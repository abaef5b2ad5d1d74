"""The torch bridge is one subpackage, ``simdist/torch_bridge``, and nothing else touches torch.distributed's internals.

Checked on the sources (parsed, not imported) and, for what importing does, in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BRIDGE = ROOT / "simdist" / "torch_bridge"
MODULES = {"cuda", "factory", "gpu_memory", "group", "processes", "profiler", "ranks", "spawn", "versions"}
INTERNALS = ("distributed_c10d", "_distributed_c10d", "_functional_collectives", "_World", "_new_process_group_helper")
"""Names of torch.distributed's internals that only the bridge may use."""


def _sources() -> list[Path]:
    out = []
    for folder in ("simdist", "backends", "visualize"):
        out += [p for p in sorted((ROOT / folder).rglob("*.py")) if BRIDGE not in p.parents]
    return out


def test_the_bridge_is_one_subpackage() -> None:
    assert not sorted(p.name for p in (ROOT / "simdist").glob("_torch_*.py"))
    found = {p.stem for p in BRIDGE.glob("*.py")} - {"__init__"}
    assert found == MODULES
    for name in MODULES:
        tree = ast.parse((BRIDGE / f"{name}.py").read_text())
        assert ast.get_docstring(tree), f"simdist/torch_bridge/{name}.py says nothing of what it is"
    init = (BRIDGE / "__init__.py").read_text()
    for name in MODULES:
        assert f":mod:`.{name}`" in init, f"the package's docstring does not name {name}"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_outside_the_bridge_names_torch_distributed_internals(path: Path) -> None:
    tree = ast.parse(path.read_text())
    used = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in INTERNALS:
            used.append((node.lineno, node.attr))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            used += [(node.lineno, n) for n in names if any(i in n.split(".") for i in INTERNALS)]
    assert not used, f"{path.relative_to(ROOT)} uses torch.distributed internals: {used}"


def test_importing_simdist_changes_nothing_of_torch() -> None:
    program = textwrap.dedent(
        """
        import torch.distributed as td
        import torch.multiprocessing as tmp
        from torch.distributed import distributed_c10d as c10d
        before = (c10d._new_process_group_helper, c10d.rendezvous, c10d._world, tmp.spawn, tmp.start_processes)
        import simdist, simdist.torch_bridge
        after = (c10d._new_process_group_helper, c10d.rendezvous, c10d._world, tmp.spawn, tmp.start_processes)
        assert before == after, "import simdist patched torch"
        assert "simdist" not in td.Backend.backend_list, td.Backend.backend_list
        assert simdist.torch_bridge.processes.installed() is None
        print("untouched")
        """
    )
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "untouched" in proc.stdout, proc.stderr
