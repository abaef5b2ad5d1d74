"""Public programs (pytorch/examples, pytorch/tutorials), unchanged, on every launch path: tests/support/public_programs.py.

The programs run only where ``$SIMDIST_PUBLIC_PROGRAMS`` names a folder of fetched programs
(``benchmarks/public_programs.py extract`` makes one); elsewhere each of those tests skips, saying so.
A program that needs CUDA is skipped, with the reason, on every path but the simulator's. A run
whose results differ from the program's first path fails. Expected failures, each with its reason:
a run on another engine than its path names (a script starting ``multiprocessing.Process`` ranks),
and the failures the pinned list knows of that are not simdist's (``Program.known``). The tests of
the harness itself (the pinned list, assembling a page, reading results) need no folder and always run.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import public_programs as pp
from launch_paths import PATHS, SIM_PATHS, applies

# The programs listen where their authors wrote (the tutorials' MASTER_PORT=29500): one at a time, on the one
# pytest-xdist worker that runs this file (pyproject's --dist loadfile).
pytestmark = pytest.mark.timeout(600)

_done: dict[tuple[str, str], pp.Outcome] = {}


def _outcome(program: pp.Program, path: str, tmp: pytest.TempPathFactory, again: bool = False) -> pp.Outcome:
    """``program`` run on ``path`` (once per session, unless ``again``)."""
    key = (program.name, path + " (again)" if again else path)
    if key not in _done:
        _done[key] = pp.run(program, path, pp.folder(), tmp.mktemp("public"))
    return _done[key]


def _expect_ran(outcome: pp.Outcome) -> None:
    tail = outcome.launched[-1].describe() if outcome.launched else ""
    assert outcome.status == "ran", f"{outcome.program} on {outcome.path}: {outcome.reason}\n{tail}"


CASES = [
    pytest.param(p.name, path, id=f"{p.name} {path}".replace(" --backend ", "-").replace(" ", "-"))
    for p in pp.PROGRAMS
    for path in PATHS
    if applies(path, p.style) and (p.spawn is not None or not path.startswith("simdist.spawn"))
]


@pytest.mark.parametrize(("name", "path"), CASES)
def test_a_public_program_gives_the_same_results_on_each_path(
    name: str, path: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    program, root = pp.by_name(name), pp.folder()
    reason = pp.skip_reason(program, path, root)
    if reason is not None:
        pytest.skip(reason)
    outcome = _outcome(program, path, tmp_path_factory)
    known = pp.known_failure(program, path)
    if known is not None:
        assert outcome.status == "failed", f"{name} on {path} no longer fails ({known}): take it off the list"
        pytest.xfail(f"{known} (observed: {outcome.reason})")
    _expect_ran(outcome)
    first = pp.reference_path(program, root)
    if first != path:
        reference = _outcome(program, first, tmp_path_factory)
        _expect_ran(reference)
        assert pp.difference(reference, outcome) is None, pp.difference(reference, outcome)
    elif program.same_as:  # the same training in another program: the same model after the first launch
        other = pp.by_name(program.same_as)
        theirs = _outcome(other, pp.reference_path(other, root) or first, tmp_path_factory)
        _expect_ran(theirs)
        assert outcome.model == theirs.model, f"{name}'s model differs from {other.name}'s"
    if outcome.engine_note:
        pytest.xfail(outcome.engine_note)


@pytest.mark.parametrize("name", [p.name for p in pp.PROGRAMS if applies(SIM_PATHS[0], p.style)])
def test_a_public_program_gives_the_same_results_twice_on_the_simulator(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    program, root = pp.by_name(name), pp.folder()
    reason = pp.skip_reason(program, SIM_PATHS[0], root)
    if reason is not None:
        pytest.skip(reason)
    once, twice = (_outcome(program, SIM_PATHS[0], tmp_path_factory, again) for again in (False, True))
    _expect_ran(once)
    _expect_ran(twice)
    assert pp.difference(once, twice) is None and once.model == twice.model


# -- the harness itself: no folder needed -------------------------------------------------------------------


def test_the_pinned_list_is_complete() -> None:
    names = [p.name for p in pp.PROGRAMS]
    assert len(names) == len(set(names))
    for p in pp.PROGRAMS:
        for source in (p.source, *p.beside):
            assert len(source.commit) == 40 and len(source.sha256) == 64, source
        assert p.style in ("torchrun", "spawn", "process") and p.world >= 1
        assert p.compare or p.unrunnable, f"{p.name}: nothing to compare"
        assert not p.same_as or p.same_as in names
        assert ("glue" in p.recipe) == bool(p.glue), p.name
        assert all(isinstance(r, str) or 0 < r[0] <= r[1] for r in p.recipe), p.name
        assert bool(p.recipe) == p.source.path.endswith(".rst"), p.name


def test_without_the_folder_every_program_skips_saying_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(pp.ENV, raising=False)
    assert pp.folder() is None
    program = pp.PROGRAMS[0]
    assert pp.skip_reason(program, "torchrun", None) == f"${pp.ENV} does not name a folder of fetched programs"
    monkeypatch.setenv(pp.ENV, str(tmp_path))
    assert pp.folder() == tmp_path
    assert "is absent (fetch pytorch/examples at 77f55b912142)" in pp.skip_reason(program, SIM_PATHS[0], tmp_path)
    copy = program.source.local(tmp_path)
    copy.parent.mkdir(parents=True)
    copy.write_text("print('another version')\n")
    assert "sha256 differs" in pp.skip_reason(program, SIM_PATHS[0], tmp_path)


def test_a_page_is_assembled_from_its_recipe_and_glue(tmp_path: Path) -> None:
    page = "Title\n\n.. code:: python\n\n    import os\n    def f():\n        return 1\n\ntext\n\n    print(f())\n"
    source = pp.Source("o/r", "0" * 40, "p.rst", hashlib.sha256(page.encode()).hexdigest())
    (tmp_path / "o" / "r").mkdir(parents=True)
    (tmp_path / "o" / "r" / "p.rst").write_text(page)
    program = pp.Program("x", source, "process", 2, ("x",), recipe=((5, 7), "glue", (11, 11)), glue="g = 2\n")
    assert pp.skip_reason(program, "python", tmp_path) is None
    assert pp.assemble(program, tmp_path) == "import os\ndef f():\n    return 1\n\ng = 2\n\nprint(f())\n"
    needs = pp.Program("y", source, "torchrun", 2, ("x",), recipe=((5, 7),), needs_cuda="GPUs")
    assert pp.skip_reason(needs, "torchrun", tmp_path) == (
        "needs CUDA: GPUs (this machine has none; simulated GPUs exist only on the simulator)"
    )
    assert pp.skip_reason(needs, "simdist run --backend sim", tmp_path) is None
    assert pp.skip_reason(needs, "python", tmp_path) == "python does not start torchrun-style scripts"


def test_results_are_read_without_launcher_prefixes_and_pids() -> None:
    program = pp.by_name("ddp/example")
    out = "[rank 1] [4242]: world_size = 2, rank = 1, backend=nccl \n[77] rank = 0, world_size = 2\nnoise\n"
    assert pp.lines(program, out) == ["[pid] rank = 0, world_size = 2", "[pid]: world_size = 2, rank = 1, backend=nccl"]
    torch = pytest.importorskip("torch")
    a = {"MODEL_STATE": {"w": torch.ones(2)}, "EPOCHS_RUN": 1}
    assert pp.digest(a) == pp.digest({"EPOCHS_RUN": 1, "MODEL_STATE": {"w": torch.ones(2)}})
    assert pp.digest(a) != pp.digest({"MODEL_STATE": {"w": torch.ones(2).double()}, "EPOCHS_RUN": 1})
    assert pp.digest(torch.tensor(1.0)) != pp.digest(torch.tensor(2.0))
