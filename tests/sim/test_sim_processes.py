"""Ranks as processes (``isolation="processes"``): the runs of threads mode, with each rank's own process.

The same program, seed and schedule give the same values, trace, choices and replay token in
both modes (the golden corpus: ``test_sim_golden.py``; here the reports of failing runs). What
only a process has: module state, ``atexit``, ``sys.argv``, signal handlers, a crash of its own.
What a process can do that a thread cannot (end itself, be killed, segfault) fails the run with a
``RankError`` naming the exit status or signal, and no rank process outlives its run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import simdist
import simdist as dist
import simdist.testing as sdt

MODES = ("threads", "processes")
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.slow,
]  # slow: starts processes or explores many schedules (quick feedback: -m 'not slow')


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie not yet reaped counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _all_gone(pids, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while not all(_gone(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- the same run in both modes --------------------------------------------------------------------------------


def ring(rank: int, n: int):
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    t = torch.arange(n, dtype=torch.float32) + rank
    got = torch.zeros(n)
    works = [dist.isend(t, dst=(rank + 1) % world), dist.irecv(got, src=(rank - 1) % world)]
    for w in works:
        w.wait()
    dist.all_reduce(got)
    # any source: which sender comes first is a choice of the scheduler
    src = [dist.recv(torch.zeros(1)) for _ in range(world - 1)] if rank == 0 else None
    if rank != 0:
        dist.send(torch.ones(1) * rank, dst=0)
    dist.barrier()
    dist.destroy_process_group()
    return got.tolist(), src


def deadlock(rank: int):
    dist.init_process_group("gloo")
    dist.recv(torch.zeros(1), src=1 - rank)


def mismatch(rank: int):
    dist.init_process_group("gloo")
    dist.all_reduce(torch.zeros(3, dtype=torch.float32 if rank == 0 else torch.int32))


def race(rank: int):
    dist.init_process_group("gloo")
    t = torch.ones(4)
    if rank == 0:
        w = dist.isend(t, dst=1)
        t.add_(1)  # written while the send is in flight
        w.wait()
    else:
        dist.recv(t, src=0)
    dist.destroy_process_group()


def leak(rank: int):
    dist.init_process_group("gloo")
    if rank == 0:
        dist.isend(torch.ones(2), dst=1)  # never waited for, never received
    dist.destroy_process_group()


def first_message(rank: int):
    """Rank 0 assumes rank 1's message comes first (a race only some schedules show)."""
    dist.init_process_group("gloo")
    if rank == 0:
        t = torch.zeros(1)
        assert dist.recv(t) == 1, "rank 2's message came first"
        dist.recv(t)
    else:
        dist.send(torch.ones(1), dst=0)
    dist.destroy_process_group()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_same_run_in_both_modes(seed):
    a, b = (simdist.simulate(ring, 4, args=(5,), seed=seed, isolation=m) for m in MODES)
    assert a.values == b.values and a.schedule == b.schedule and a.choices == b.choices
    assert a.trace.to_json() == b.trace.to_json()
    assert a.points == b.points and a.leaks == b.leaks


def torch_arrivals(rank: int):
    """Through torch.distributed: any-source receives (torch asks each work its source after waiting), a work polled
    with is_completed() and a work waited twice."""
    import torch.distributed as tdist

    tdist.init_process_group("gloo")
    world = tdist.get_world_size()
    if rank == 0:
        got = []
        for _ in range(world - 1):
            t = torch.zeros(1)
            got.append(tdist.recv(t))
        work = tdist.irecv(torch.zeros(1), src=1, tag=5)
        for _ in range(3):  # polling is no scheduling point: rank 1 cannot send meanwhile
            work.is_completed()
        work.wait()
        work.wait()
        return got
    tdist.send(torch.tensor([float(rank)]), dst=0)
    if rank == 1:
        sent = tdist.isend(torch.ones(1), dst=0, tag=5)
        sent.wait()
        sent.wait()
    tdist.destroy_process_group()
    return None


@pytest.mark.parametrize("seed", range(6))
def test_a_torch_distributed_program_makes_the_same_choices_in_both_modes(seed):
    """A wait on a work the rank already saw complete is no scheduling point in either mode (a rank process knows
    its work completed), so torch's any-source receive, which asks its source after waiting, schedules alike."""
    a, b = (simdist.simulate(torch_arrivals, 4, seed=seed, isolation=m, leaks="ignore") for m in MODES)
    assert a.values == b.values and a.choices == b.choices and a.option_counts == b.option_counts
    assert a.trace.to_json() == b.trace.to_json() and a.points == b.points


@pytest.mark.parametrize(
    "program,world,error",
    [
        (deadlock, 2, simdist.DeadlockError),
        (mismatch, 2, simdist.CollectiveMismatchError),
        (race, 2, simdist.BufferRaceError),
    ],
    ids=["deadlock", "mismatch", "buffer race"],
)
def test_a_failing_run_is_reported_the_same_in_both_modes(program, world, error):
    errors = []
    for mode in MODES:
        with pytest.raises(error) as info:
            simdist.simulate(program, world, isolation=mode, check_buffers=True)
        errors.append(info.value)
    a, b = errors
    assert str(a) == str(b) and a.schedule == b.schedule and a.choices == b.choices
    assert "test_sim_processes.py:" in str(b)  # the user's lines, sent by each rank process
    if error is simdist.DeadlockError:
        assert a.blocked == b.blocked and sorted(a.graph.edges) == sorted(b.graph.edges)


def test_leaks_are_the_same_in_both_modes():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", simdist.LeakWarning)
        a, b = (simdist.simulate(leak, 2, isolation=m) for m in MODES)
    assert a.leaks and a.leaks == b.leaks


def test_explore_finds_and_shrinks_the_same_schedule_in_both_modes():
    found = []
    for mode in MODES:
        with pytest.raises(simdist.RankError) as info:
            sdt.explore(first_message, 3, max_runs=50, seed=0, isolation=mode)
        found.append(info.value)
    assert found[0].schedule == found[1].schedule
    assert "rank 2's message came first" in str(found[1])


def test_spawn_and_testing_run_take_isolation():
    assert (
        simdist.spawn(ring, args=(3,), nprocs=3, backend="sim", isolation="processes")
        == simdist.simulate(ring, 3, args=(3,)).values
    )
    assert (
        sdt.run(ring, 3, args=(3,), seed=4, isolation="processes").values == sdt.run(ring, 3, args=(3,), seed=4).values
    )


# -- what a process has of its own -----------------------------------------------------------------------------


class Registry:
    """A library's state kept in a class attribute, set once per process (as accelerate's state is)."""

    owner: int | None = None


def singleton(rank: int):
    if Registry.owner is None:
        Registry.owner = rank
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
    return Registry.owner


def test_a_class_level_singleton_is_each_ranks_own():
    assert simdist.simulate(singleton, 3, isolation="processes").values == [0, 1, 2]
    shared = simdist.simulate(singleton, 3, isolation="threads").values
    assert shared != [0, 1, 2]  # one process: the first rank to set it wins for every rank


def own_process(rank: int, folder: str):
    import atexit

    sys.argv.append(f"rank{rank}")
    os.environ["MINE"] = str(rank)
    signal.signal(signal.SIGUSR1, lambda *_: None)  # a thread other than the main one may not do this
    atexit.register(lambda: Path(folder, f"atexit{rank}").write_text(os.environ["MINE"]))
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
    return os.getpid(), sys.argv[-1]


def test_a_rank_process_has_its_own_argv_environment_signal_handlers_and_atexit(tmp_path):
    argv = list(sys.argv)
    values = simdist.simulate(own_process, 3, args=(str(tmp_path),), isolation="processes").values
    assert len({pid for pid, _ in values}) == 3 and os.getpid() not in {pid for pid, _ in values}
    assert [arg for _, arg in values] == ["rank0", "rank1", "rank2"]
    assert sys.argv == argv and "MINE" not in os.environ
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atexit0", "atexit1", "atexit2"]
    assert Path(tmp_path, "atexit2").read_text() == "2"
    assert _all_gone(pid for pid, _ in values)


# -- what only a process can do: end early, be killed, crash ---------------------------------------------------


def ends_early(rank: int, how: str, folder: str):
    import ctypes

    Path(folder, f"pid{rank}").write_text(str(os.getpid()))
    dist.init_process_group("gloo")
    dist.barrier()
    if rank == 1:
        if how == "exit":
            os._exit(7)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "segfault":
            ctypes.string_at(0)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("how,code,words", [("exit", 7, "exited with status 7"), ("kill", -9, "killed by SIGKILL"),
                                            ("segfault", -11, "killed by SIGSEGV")])  # fmt: skip
def test_a_rank_process_that_ends_early_fails_the_run_naming_its_status(tmp_path, how, code, words, capfd):
    with pytest.raises(simdist.RankError) as info:
        simdist.simulate(ends_early, 3, args=(how, str(tmp_path)), isolation="processes")
    err = info.value
    assert err.rank == 1 and err.exitcode == code and isinstance(err.__cause__, simdist.RankExitError)
    assert words in str(err) and "test_sim_processes.py:" in str(err) and err.schedule in str(err)
    pids = [int(p.read_text()) for p in tmp_path.glob("pid*")]
    assert len(pids) == 3 and _all_gone(pids)  # the other ranks were unwound: no process is left


def spins(rank: int, folder: str):
    dist.init_process_group("gloo")
    Path(folder, f"pid{rank}").write_text(str(os.getpid()))
    if rank == 0:
        while True:  # never reaches a scheduling point
            pass
    dist.barrier()


def test_a_timeout_kills_a_rank_process_that_never_returns(tmp_path):
    start = time.monotonic()
    with pytest.raises(simdist.DistTimeoutError, match="timeout=1.0"):
        simdist.simulate(spins, 2, args=(str(tmp_path),), timeout=1.0, isolation="processes")
    assert time.monotonic() - start < 30
    pids = [int(p.read_text()) for p in tmp_path.glob("pid*")]
    assert pids and _all_gone(pids)


CTRL_C = """\
import os, signal, sys
import simdist, simdist as dist
sys.path.insert(0, {here!r})
signal.signal(signal.SIGINT, signal.default_int_handler)
from test_sim_processes import loops

if __name__ == "__main__":
    try:
        simdist.simulate(loops, 3, isolation="processes")
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    print("after", simdist.simulate(loops, 2, args=(False,), isolation="processes").values, flush=True)
"""


def loops(rank: int, forever: bool = True):
    dist.init_process_group("gloo")
    print("pid", os.getpid(), flush=True)
    if rank == 0 and forever:
        print("started", flush=True)
        while True:
            pass
    dist.barrier()
    dist.destroy_process_group()
    return rank


def test_ctrl_c_stops_the_run_and_its_processes(tmp_path):
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C.format(here=str(Path(__file__).parent)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("started"):
            proc.send_signal(signal.SIGINT)
            break
    out, _ = proc.communicate(timeout=120)
    lines += out.splitlines(keepends=True)
    assert proc.returncode == 0, lines
    assert "interrupted\n" in lines and "after [0, 1]\n" in lines, lines
    pids = [int(line.split()[1]) for line in lines if line.startswith("pid")]
    assert len(pids) >= 3 and _all_gone(pids)


# -- what cannot be a process ----------------------------------------------------------------------------------


def test_a_function_that_cannot_be_sent_to_a_process_is_refused_saying_why():
    with pytest.raises(TypeError, match="isolation='processes' sends fn=.*define it at module level"):
        simdist.simulate(lambda rank: rank, 2, isolation="processes")
    with pytest.raises(ValueError, match="isolation='sideways' is not a kind of rank"):
        simdist.simulate(ring, 2, args=(1,), isolation="sideways")


def nests(rank: int):
    simdist.simulate(ring, 2, args=(1,), isolation="processes")


def test_a_rank_process_cannot_start_a_simulation():
    with pytest.raises(simdist.RankError) as info:
        simdist.simulate(nests, 1, isolation="processes")
    assert "simulations cannot be nested" in str(info.value.__cause__)


def prints(rank: int):
    dist.init_process_group("gloo")
    for i in range(3):
        print(f"line {i} of rank {rank}")
        dist.barrier()
    print("no newline", end="")
    dist.destroy_process_group()


def test_printed_lines_come_in_the_order_the_ranks_ran(capsys):
    both = []
    for mode in MODES:
        simdist.simulate(prints, 3, seed=5, prefix_output=True, isolation=mode)
        both.append(capsys.readouterr().out)
    assert both[0] == both[1] and "[rank 2] line 1 of rank 2\n" in both[1]
