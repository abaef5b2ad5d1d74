"""Backends by name: the registry rejects bad entries and imports nothing until a backend is used."""

from __future__ import annotations

import subprocess
import sys

import pytest

import simdist
from simdist.core import _registry


def test_sim_is_registered_and_loads():
    spec = _registry.backend_spec("sim")
    assert spec.available()
    assert spec.load().__name__ == "SimWorld"


def test_duplicates_and_non_specs_are_rejected():
    with pytest.raises(ValueError, match="'sim' is already registered"):
        simdist.register_backend(simdist.BackendSpec("sim", "x:y"))
    with pytest.raises(TypeError, match="spec must be a BackendSpec"):
        simdist.register_backend("sim")  # type: ignore[arg-type]


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"backend='nope' is not a known backend; expected one of \[.*'sim'"):
        _registry.backend_spec("nope")


def test_availability_is_checked_without_importing():
    spec = simdist.BackendSpec("needs-missing", "nowhere:thing", requires=("a_module_that_does_not_exist",))
    assert not spec.available()
    simdist.register_backend(spec)
    try:
        assert "needs-missing" in _registry.backend_names()
        with pytest.raises(ModuleNotFoundError):
            spec.load()
    finally:
        _registry._REGISTRY.pop("needs-missing")


def test_importing_simdist_imports_no_heavy_optional_library():
    code = "import sys, simdist; print(sorted(m for m in ('streamlit', 'cupy', 'plotly') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def _init_and_name(rank, name):
    simdist.init_process_group(name)
    backend = simdist.get_backend()
    simdist.destroy_process_group()
    return backend


def test_inside_a_simulation_names_are_checked_by_the_registry():
    """torch's names and every registered name bind to the simulator; anything else gets the registry's error."""
    for name in [*_registry.TORCH_NAMES, *_registry.backend_names()]:
        assert simdist.simulate(_init_and_name, 2, (name,)).values == [name, name]
    with pytest.raises(simdist.RankError) as caught:
        simdist.simulate(_init_and_name, 2, ("torch-gloo",))  # not registered: torch's gloo is "gloo"
    assert str(caught.value.__cause__) == (
        f"backend='torch-gloo' is not a known backend; expected one of {_registry.backend_names()}"
    )
