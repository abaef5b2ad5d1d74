"""Programs written for the project (tests/programs/), unmodified torch.distributed, on every launch path here.

Three programs share one seeded training (tests/programs/toy_training.py: DDP on gloo, then
all_reduce, all_gather, broadcast and isend/recv each step):

- ``train_torchrun.py``, torchrun style, on ``torchrun`` (the reference), ``simdist run`` with no
  backend, ``--backend gloo``, ``--backend socket`` and ``--backend sim``;
- ``train_spawn.py``, ``mp.spawn`` style, on ``python train_spawn.py``, ``simdist run --backend sim``,
  ``simdist run --backend socket`` (the spawned children inherit the bridge) and ``simdist.spawn``
  on the simulator and the socket backend;
- ``train_resume.py``, checkpoint and resume: a first launch trains steps 0-1 and saves, a second
  launch on another path loads that checkpoint and trains steps 2-3.

Every path must print the reference's per-step losses, gathered losses, broadcast values, ring
tokens and final parameter checksum, and save the same checkpoint (model, optimizer momentum,
step). The world is 2 ranks, where a sum of two floats does not depend on the order of the
reduction, so every comparison is exact (no tolerance). Each path is also checked to run the
collectives where it says it does: torch's ``ProcessGroupGloo`` on torch's engines, a simdist
class on the socket backend and the simulator.

Every launch is a fresh subprocess with a clean environment and a timeout (tests/support/launch_paths.py);
the launches of the selected tests start when the first test runs, two at a time, on the one pytest-xdist
worker that runs the module. The paths through
simdist's engines (the torch bridge) are ``torch_release`` tests; the resumed runs, which chain paths
the matrix runs, are not.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from launch_paths import PATHS, Launched, checkpoint_difference, result_lines, start

# One pytest-xdist worker runs the whole file (pyproject's --dist loadfile): its launches start together, for the
# tests selected in the session (a worker that ran only some of them would start them all again).
pytestmark = pytest.mark.timeout(240)

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
WORLD, STEPS, TIMEOUT = 2, 4, 90.0
TORCH_ENGINE = "ProcessGroupGloo"
SCRIPTS = {"torchrun": "train_torchrun.py", "spawn": "train_spawn.py"}


def _programs_checksum() -> Any:
    """The programs' own checksum (toy_training.checksum), loaded from its file without touching sys.path."""
    spec = importlib.util.spec_from_file_location("_launch_paths_toy_training", PROGRAMS / "toy_training.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.checksum


checksum = _programs_checksum()


def _case(*values: str, sep: str = "-", per_release: bool = True) -> Any:
    """Test parameters (scripts, launch paths) with a short id; a path through simdist's engines depends on torch
    internals (the bridge), which makes the test ``torch_release`` where ``per_release`` (the resumed runs are
    not: they chain paths the matrix already runs on every release, and check the checkpoints between them)."""
    ids = [v.removesuffix(".py").replace(" --backend ", "-").replace(" ", "-") for v in values]
    bridged = per_release and any(PATHS.get(v, ((), "torch"))[1] == "simdist" for v in values)
    return pytest.param(*values, id=sep.join(ids), marks=[pytest.mark.torch_release] if bridged else [])


def _run(path: str, script: str, cwd: Path, *args: str, style: str = "torchrun") -> Launched:
    spawn = ("worker", (WORLD, STEPS, str(cwd))) if path.startswith("simdist.spawn") else None
    launched = start(path, PROGRAMS / script, style, WORLD, args, cwd=cwd, timeout=TIMEOUT, spawn=spawn)
    if _aborted_at_exit_by_torch(launched):
        launched = start(path, PROGRAMS / script, style, WORLD, args, cwd=cwd, timeout=TIMEOUT, spawn=spawn)
    assert launched.ok, launched.describe()
    return launched


def _aborted_at_exit_by_torch(launched: Launched) -> bool:
    """Whether a path on torch's own engine (no simdist in it) failed only as its ranks exited: every rank printed
    its final line, then one died of SIGABRT in torch's teardown ("terminate called without an active exception";
    once in a full run beside a busy process, ``python train_spawn.py``). Not what these tests check: the path
    runs once more."""
    torch_only = PATHS.get(launched.path, ((), "torch"))[1] == "torch"
    return torch_only and launched.died_in_torchs_teardown(WORLD)


def _steps(launched: Launched) -> list[tuple]:
    """The per-step result lines, sorted: what must be equal across paths."""
    return sorted(tuple(sorted(r.items())) for r in result_lines(launched.stdout) if "step" in r)


def _finals(launched: Launched) -> dict[int, dict[str, str]]:
    return {int(r["rank"]): r for r in result_lines(launched.stdout) if "params" in r}


def _checkpoint(cwd: Path) -> dict:
    return torch.load(cwd / "ckpt.pt", map_location="cpu")


def _assert_like(launched: Launched, reference: Launched, engine: str, steps: range = range(STEPS)) -> None:
    """``launched`` printed the reference's lines for ``steps`` and its final parameters, on ``engine``, and saved
    the reference's checkpoint."""
    expected = [line for line in _steps(reference) if int(dict(line)["step"]) in steps]
    assert _steps(launched) == expected, launched.describe()
    finals, ref = _finals(launched), _finals(reference)
    assert sorted(finals) == list(range(WORLD)), launched.describe()
    for rank, final in finals.items():
        assert final["params"] == ref[rank]["params"], (rank, launched.describe())
        if engine == "torch":
            assert final["engine"] == TORCH_ENGINE, f"{launched.path} ran on {final['engine']}, not torch's gloo"
        else:
            assert final["engine"] != TORCH_ENGINE, f"{launched.path} ran on torch's gloo, not on simdist"
    assert checkpoint_difference(_checkpoint(launched.cwd), _checkpoint(reference.cwd)) is None


def _reference(cwd: Path) -> Launched:
    return _trained(cwd, SCRIPTS["torchrun"], "torchrun")


def _trained(cwd: Path, script: str, path: str) -> Launched:
    """``script`` trained for ``STEPS`` steps on ``path``."""
    if script == SCRIPTS["spawn"]:
        return _run(path, script, cwd, "--world", str(WORLD), "--steps", str(STEPS), "--out", str(cwd), style="spawn")
    return _run(path, script, cwd, "--steps", str(STEPS), "--out", str(cwd))


def _resumed(cwd: Path, first: str, second: str) -> tuple[Launched, dict, Launched]:
    """Steps 0-1 on ``first`` (its launch and checkpoint), then steps 2-3 resumed on ``second``."""
    half, steps, out = str(STEPS // 2), str(STEPS), str(cwd)
    one = _run(first, "train_resume.py", cwd, "--steps", steps, "--stop", half, "--out", out)
    saved = _checkpoint(cwd)
    return one, saved, _run(second, "train_resume.py", cwd, "--steps", steps, "--out", out)


class Launches:
    """The module's launches, started when its first test runs, ``PARALLEL`` at a time in the order of the
    selected tests (on 2 cores one launch imports torch or waits for its ranks while another computes).
    Each test then reads its own launch; a launch that failed raises its assertion there."""

    PARALLEL = 2

    def __init__(self, request: pytest.FixtureRequest, tmp: pytest.TempPathFactory) -> None:
        self.pool = ThreadPoolExecutor(self.PARALLEL)
        self.reference = self.pool.submit(_reference, tmp.mktemp("torchrun"))
        self.jobs: dict[str, Future] = {}
        for item in request.session.items:
            job = JOBS.get(getattr(item, "originalname", ""))
            if item.module is request.module and job is not None:
                self.jobs[item.nodeid] = self.pool.submit(job, tmp.mktemp("launch"), **item.callspec.params)

    def __call__(self, request: pytest.FixtureRequest) -> tuple[Launched, Any]:
        """The reference launch, and the launch of the test asking."""
        return self.reference.result(), self.jobs[request.node.nodeid].result()


@pytest.fixture(scope="module")
def launches(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launches]:
    started = Launches(request, tmp_path_factory)
    yield started
    started.pool.shutdown(cancel_futures=True)


def test_the_reference_run_computes_what_the_program_says(launches: Launches) -> None:
    """Under torchrun each collective gives its documented result, and the checkpoint holds the printed parameters."""
    reference = launches.reference.result()
    lines = [r for r in result_lines(reference.stdout) if "step" in r]
    assert len(lines) == WORLD * STEPS, reference.describe()
    by = {(int(r["rank"]), int(r["step"])): r for r in lines}
    for (rank, step), r in by.items():
        losses = [float(x) for x in r["losses"].split(",")]
        assert losses[rank] == float(r["loss"])  # all_gather: every rank's loss, in rank order
        assert losses == [float(by[(q, step)]["loss"]) for q in range(WORLD)]
        mean = (torch.tensor(losses[0]) + torch.tensor(losses[1])) / WORLD  # all_reduce in float32, then / world
        assert float(r["mean"]) == mean.item()
        assert float(r["scale"]) == torch.tensor(1.0 / (1 + step)).item()  # broadcast from rank 0
        assert float(r["token"]) == 1000.0 * ((rank - 1) % WORLD) + step  # recv from the left neighbour
    finals = _finals(reference)
    assert {f["params"] for f in finals.values()} == {finals[0]["params"]}  # DDP kept the replicas equal
    assert finals[0]["engine"] == TORCH_ENGINE
    saved = _checkpoint(reference.cwd)
    assert saved["step"] == STEPS and checksum(saved["model"]) == finals[0]["params"]
    assert len(saved["optimizer"]["state"]) == 4  # a momentum buffer per parameter


TORCHRUN_PATHS = ["simdist run", "simdist run --backend gloo", "simdist run --backend socket"]
TORCHRUN_PATHS += ["simdist run --backend sim"]
SPAWN_PATHS = ["python", "simdist run --backend sim", "simdist run --backend socket", "simdist.spawn sim"]
SPAWN_PATHS += ["simdist.spawn socket"]
MATRIX = [(SCRIPTS["torchrun"], p) for p in TORCHRUN_PATHS] + [(SCRIPTS["spawn"], p) for p in SPAWN_PATHS]


@pytest.mark.parametrize(("script", "path"), [_case(s, p) for s, p in MATRIX])
def test_each_path_gives_the_reference_results(
    script: str, path: str, launches: Launches, request: pytest.FixtureRequest
) -> None:
    """train_torchrun.py on each path, and the same training started by mp.spawn (or by simdist.spawn)."""
    reference, launched = launches(request)
    _assert_like(launched, reference, PATHS[path][1])
    if path.startswith("simdist.spawn"):  # worker's return values, by rank
        assert f'simdist.spawn returned ["{_finals(reference)[0]["params"]}", ' in launched.stdout


CHAINS = [
    ("torchrun", "simdist run --backend sim"),
    ("simdist run --backend sim", "simdist run --backend socket"),
    ("simdist run --backend socket", "torchrun"),
]


@pytest.mark.parametrize(("first", "second"), [_case(a, b, sep="-then-", per_release=False) for a, b in CHAINS])
def test_a_run_resumed_on_another_path_ends_as_the_uninterrupted_one(
    first: str, second: str, launches: Launches, request: pytest.FixtureRequest
) -> None:
    """Steps 0-1 on ``first`` save a checkpoint; ``second`` resumes it for steps 2-3: the reference's results."""
    reference, (one, saved, two) = launches(request)
    half = STEPS // 2
    assert _steps(one) == [line for line in _steps(reference) if int(dict(line)["step"]) < half], one.describe()
    assert saved["step"] == half and checksum(saved["model"]) == _finals(one)[0]["params"]
    for rank in range(WORLD):
        assert f"rank {rank}: resumed at step {half}" in two.stdout, two.describe()
    _assert_like(two, reference, PATHS[second][1], steps=range(half, STEPS))


JOBS = {
    test_each_path_gives_the_reference_results.__name__: _trained,
    test_a_run_resumed_on_another_path_ends_as_the_uninterrupted_one.__name__: _resumed,
}
"""What each parametrized test launches, by test name (its parameters are the job's keyword arguments)."""
