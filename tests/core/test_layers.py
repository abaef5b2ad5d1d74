"""The layers of the source tree, as ``benchmarks/structure.py`` measures them (sources parsed, never imported).

Each folder imports only folders of its own layer or below (``LAYERS``), so no import circle joins two
folders. The core (``simdist.core``) is the bottom: it imports nothing of simdist outside itself. The backends
build on what ``simdist.core`` and ``simdist.algorithms`` export, never on a private module of either; the only
other part of simdist a backend reaches is the torch bridge, named below with the reason.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("structure", ROOT / "benchmarks" / "structure.py")
structure = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(structure)

# What a backend may import besides simdist.core, simdist.algorithms and the backends themselves, and why.
BEYOND_THE_CORE = {
    # the simulator gives each rank its own torch world (torch.distributed, torch.cuda, mp.spawn routed to it)
    ("simdist.backends.sim._isolation", "simdist.torch_bridge"),
    ("simdist.backends.sim._rank_process", "simdist.torch_bridge"),
    ("simdist.backends.sim._runner", "simdist.torch_bridge"),
    ("simdist.backends.sim._forkserver", "simdist.torch_bridge"),
    # a socket job's processes run torch's process groups on simdist's socket backend when asked
    ("simdist.backends.socket._spawn", "simdist.torch_bridge.processes"),
}

# The folders from the bottom up: a folder imports folders of its own layer or of a layer below.
LAYERS = [
    {"simdist.core"},  # the group interface, world and registry, arrays, errors, checks, trace, topology
    {"simdist.algorithms", "simdist.api"},  # each collective once; torch.distributed's functions over a world
    {"simdist.torch_bridge"},  # torch's process groups as simdist groups, simulated GPUs
    {"simdist.backends", "simdist.backends.sim", "simdist.backends.socket", "simdist.backends.nccl",
     "simdist.backends.torchdist"},  # the group interface implemented; sim and socket install the bridge
    {"simdist.testing"},  # programs (functions and scripts) under chosen or searched schedules, shrinking, replay
    {"simdist.launch"},  # simdist run and simdist test, spawn, calibrate, the app command
    {"simdist"},  # the public names, DDP, the console script
    {"simdist.visualize", "simdist.exercises"},  # built on all of it
]  # fmt: skip


def _edges() -> list[tuple[str, str, bool]]:
    mods = structure.modules()
    known = set(mods)
    return [
        (name, target, eager) for name, path in mods.items() for target, eager in structure.imports(name, path, known)
    ]


def test_every_folder_imports_only_its_own_layer_and_those_below():
    mods = structure.modules()
    folder = {name: structure.package_of(name, path) for name, path in mods.items()}
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    assert set(folder.values()) == set(layer), "every folder has a layer in LAYERS"
    upward = sorted(
        {(a, b) for a, b, _ in _edges() if layer[folder[b]] > layer[folder[a]]},
    )
    assert upward == [], f"imports of a layer above: {upward}"
    assert structure.measure()["folder circles"] == []


def test_the_core_imports_nothing_of_simdist_outside_itself():
    outside = sorted(
        {(a, b) for a, b, _ in _edges() if a.startswith("simdist.core") and not b.startswith("simdist.core")}
    )
    assert outside == []


def test_backends_import_what_the_core_and_the_algorithms_export():
    seen = set()
    for a, b, _ in _edges():
        if not a.startswith("simdist.backends") or b.startswith("simdist.backends"):
            continue
        if b in ("simdist.core", "simdist.algorithms"):
            continue
        assert (a, b) in BEYOND_THE_CORE, f"{a} imports {b}: a backend imports only simdist.core and simdist.algorithms"
        seen.add((a, b))
    assert seen == BEYOND_THE_CORE, f"no longer imported, take off the list: {sorted(BEYOND_THE_CORE - seen)}"


def test_the_core_exports_the_names_the_backends_use():
    import simdist.algorithms
    import simdist.core

    for package in (simdist.core, simdist.algorithms):
        missing = [name for name in package.__all__ if not hasattr(package, name)]
        assert missing == [], (package.__name__, missing)


def test_the_figures_script_runs_and_counts_every_module():
    figures = structure.measure()
    assert figures["modules"] == sum(figures["modules per folder"].values())
    assert figures["modules per folder"]["simdist.core"] >= 15
    assert figures["backends -> private modules"] == []


# The simulator's kernel: the engine owns the run's state, whose data types (``_state``) sit below it with every
# module the engine calls. None of those imports the engine (not even for a type), so none can call back into it;
# the modules above it (its ranks' groups, ranks as processes, ``simulate``) use it.
BELOW_THE_ENGINE = {"_buffers", "_discrete", "_events", "_isolation", "_options", "_record", "_report", "_state",
                    "_strategies", "_threads"}  # fmt: skip


def test_nothing_the_simulators_engine_calls_imports_it_or_what_is_above_it():
    sim = "simdist.backends.sim."
    inside = [(a[len(sim) :], b[len(sim) :]) for a, b, _ in _edges() if a.startswith(sim) and b.startswith(sim)]
    engine_uses = {b for a, b in inside if a == "_engine"}
    assert engine_uses <= BELOW_THE_ENGINE, f"the engine imports {sorted(engine_uses - BELOW_THE_ENGINE)}"
    upward = sorted((a, b) for a, b in inside if a in BELOW_THE_ENGINE and b not in BELOW_THE_ENGINE)
    assert upward == [], f"below the engine, imports of the engine or what is above it: {upward}"
    circles = [c["modules"] for c in structure.measure()["circles"] if c["folder"] == ["simdist.backends.sim"]]
    # the one circle left: SimWorld.spawn starts a run, and a run makes its ranks' SimWorlds (said in _group.py)
    assert circles == [[sim + "_group", sim + "_runner"]]


def test_every_import_circle_inside_a_folder_says_why_in_a_comment():
    mods = structure.modules()
    for circle in structure.measure()["circles"]:
        said = [m for m in circle["modules"] if "# a circle by choice" in mods[m].read_text()]
        assert said, f"the import circle {circle['modules']} says nowhere why it is the clearest form"
