"""The demonstrations of ``simdist.testing``, as tests: each bug is found, shrunk and replayed.

(a) a race on ``recv(src=None)``, found by ``explore`` (PCT) and shrunk to a few choices;
(b) a bug only at world sizes that are not powers of two, found by Hypothesis (shrunk to 3);
(c) a deadlock that only some schedules reach (``run`` passes, ``explore`` finds it);
(d) a ring all_reduce with an off-by-one chunk index, caught against ``dist.all_reduce``
    on inputs from ``collective_inputs`` under generated schedules;
and the pytest plugin (``@spmd``, ``--simdist-replay``, ``--simdist-max-schedules``) run
through pytest's ``pytester``.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings

import simdist
import simdist as dist
import simdist.testing as sdt
from simdist.backends.sim._strategies import decode_choices, encode_choices

pytest_plugins = ["pytester"]

QUIET = settings(database=None, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))


def significant(token: str) -> list[int]:
    """The choices of a ``choices:`` token up to the last non-zero one (the rest are implied)."""
    choices = list(decode_choices(token))
    while choices and choices[-1] == 0:
        choices.pop()
    return choices


# --- (a) a race on an any-source receive ---------------------------------------------------


def first_message_race(rank: int) -> None:
    """Rank 0 assumes rank 1's message arrives first; it usually does, but not always."""
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        first = dist.recv(t)  # any source
        assert first == 1, f"expected rank 1's message first, got rank {first}'s"
        for _ in range(dist.get_world_size() - 2):
            dist.recv(t)
    else:
        t += rank
        dist.send(t, dst=0)
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_a_race_found_by_pct_shrunk_and_replayed():
    sdt.run(first_message_race, 4, schedule=[])  # the default schedule (lowest rank first) passes
    with pytest.raises(simdist.RankError) as info:
        sdt.explore(first_message_race, 4, strategy="pct", max_runs=100, seed=0)
    err = info.value
    assert err.rank == 0
    assert "expected rank 1's message first" in str(err)
    assert err.schedule.startswith("choices:")
    assert 1 <= len(significant(err.schedule)) <= 4, decode_choices(err.schedule)
    with pytest.raises(simdist.RankError) as again:
        sdt.replay(first_message_race, 4, err.schedule)
    assert again.value.rank == 0
    assert isinstance(again.value.__cause__, AssertionError)
    assert "expected rank 1's message first" in str(again.value.__cause__)


@pytest.mark.timeout(120)
def test_a_explore_keeps_the_rank_exception():
    with pytest.raises(simdist.RankError) as info:
        sdt.explore(first_message_race, 4, max_runs=100, seed=0)
    assert isinstance(info.value.__cause__, AssertionError)


# --- (b) a bug only at world sizes that are not powers of two ------------------------------


def doubling_all_reduce(rank: int, world: int) -> float:
    """Recursive doubling: exchange with rank ^ mask for mask = 1, 2, 4, ... Assumes a power of two."""
    dist.init_process_group("gloo")
    t = torch.tensor([float(rank + 1)])
    mask = 1
    while mask < world:
        partner = rank ^ mask
        if partner < world:  # BUG: at other world sizes some ranks miss a partner's partial sum
            other = torch.zeros(1)
            for work in [dist.isend(t, dst=partner), dist.irecv(other, src=partner)]:
                work.wait()
            t += other
        mask <<= 1
    dist.destroy_process_group()
    return t.item()


def doubling_is_wrong(world: int) -> bool:
    res = sdt.run(doubling_all_reduce, world, args=(world,))
    return any(v != world * (world + 1) / 2 for v in res.values)


@pytest.mark.timeout(120)
def test_b_hypothesis_shrinks_world_to_three():
    assert not any(doubling_is_wrong(w) for w in (1, 2, 4, 8))
    assert find(sdt.world_sizes(1, 8), doubling_is_wrong, settings=QUIET) == 3


@pytest.mark.timeout(120)
def test_b_given_test_fails():
    @QUIET
    @given(world=sdt.world_sizes(1, 8))
    def test_doubling(world):
        assert not doubling_is_wrong(world), f"wrong sums at world {world}"

    with pytest.raises(AssertionError, match="wrong sums at world 3"):
        test_doubling()


# --- (c) a deadlock that only some schedules reach -----------------------------------------


def racing_receives(rank: int):
    """Rank 0 takes any message, then waits for rank 2's: a deadlock when rank 2's came first."""
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    first = None
    if rank == 0:
        first = dist.recv(t)
        dist.recv(t, src=2)  # BUG: assumes the first message came from rank 1
    else:
        t += rank
        dist.send(t, dst=0)
    dist.destroy_process_group()
    return first


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["pct", "random", "exhaustive"])
def test_c_deadlock_only_under_some_schedules(strategy):
    assert sdt.run(racing_receives, 3, seed=0).values == [1, None, None]
    with pytest.raises(simdist.DeadlockError) as info:
        sdt.explore(racing_receives, 3, strategy=strategy, max_runs=100, seed=0)
    err = info.value
    assert (err.blocked[0]["rank"], err.blocked[0]["op"], err.blocked[0]["peer"]) == (0, "recv", 2)
    assert 1 <= len(significant(err.schedule)) <= 4, decode_choices(err.schedule)
    with pytest.raises(simdist.DeadlockError) as again:
        sdt.replay(racing_receives, 3, err.schedule)
    assert again.value.blocked == err.blocked


# --- (d) a ring all_reduce with an off-by-one chunk index ----------------------------------


def ring_all_reduce(rank: int, inputs: sdt.CollectiveInputs, off: int) -> bool:
    """Reduce-scatter then all-gather around the ring; ``off=1`` is right, ``off=0`` the bug.

    Returns whether the result equals ``dist.all_reduce`` of the same input.
    """
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    x = inputs.input(rank)
    expected = x.clone()
    dist.all_reduce(expected)
    chunks = list(torch.tensor_split(x.reshape(-1), world))
    right, left = (rank + 1) % world, (rank - 1) % world

    def shift(send: int, recv: int, add: bool) -> None:
        buf = torch.empty_like(chunks[recv])
        for work in [dist.isend(chunks[send], dst=right), dist.irecv(buf, src=left)]:
            work.wait()
        chunks[recv].add_(buf) if add else chunks[recv].copy_(buf)

    for step in range(world - 1):  # afterwards rank r holds the sum of chunk (r + 1) % world
        shift((rank - step) % world, (rank - step - 1) % world, add=True)
    for step in range(world - 1):  # pass the sums on; off=0 starts one chunk too early
        shift((rank + off - step) % world, (rank + off - step - 1) % world, add=False)
    dist.destroy_process_group()
    return torch.equal(x, expected)


def ring_test(off: int):
    @settings(QUIET, max_examples=40)
    @given(inputs=sdt.collective_inputs(op="all_reduce", world=None), schedule=sdt.schedules())
    def test_ring(inputs, schedule):
        res = sdt.run(ring_all_reduce, inputs.world, args=(inputs, off), schedule=schedule)
        assert all(res.values), f"world {inputs.world}: ranks {res.values} match dist.all_reduce"

    return test_ring


@pytest.mark.timeout(120)
def test_d_ring_off_by_one_found():
    ring_test(off=1)()  # the correct ring passes
    with pytest.raises(AssertionError, match="world 2"):  # shrunk to the smallest world that shows it
        ring_test(off=0)()


# --- the pytest plugin --------------------------------------------------------------------

RACY_TEST = """
import torch
import simdist as dist
import simdist.testing

@simdist.testing.spmd(nprocs=3)
def test_first_message(rank):
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        first = dist.recv(t)
        assert first == 1, f"rank {first} was first"
        dist.recv(t)
    else:
        dist.send(t, dst=0)
    dist.destroy_process_group()
"""

COUNTING_TEST = """
import simdist as dist
import simdist.testing

@simdist.testing.spmd(nprocs=2)
def test_counted(rank):
    with open("calls.txt", "a") as f:
        f.write(f"{rank}\\n")
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
"""


@pytest.fixture
def inner_pytest(pytester):
    """``pytester.runpytest`` in this process (fast), with this session's plugin options kept."""
    import pytest_simdist

    saved = dict(pytest_simdist.OPTIONS)
    yield lambda *args: pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)
    pytest_simdist.OPTIONS.update(saved)


def _token(output: str) -> str:
    tokens = re.findall(r"replay token: (\S+)", output)
    assert tokens, output
    return tokens[0]


@pytest.mark.timeout(120)
def test_plugin_spmd_failure_prints_token_and_replays(pytester, inner_pytest):
    pytester.makepyfile(test_racy=RACY_TEST)
    first = inner_pytest()
    first.assert_outcomes(failed=1)
    out = first.stdout.str()
    assert "replay token" in out and "rank 2 was first" in out, out
    token = _token(out)
    assert token.startswith("choices:")

    again = inner_pytest("--simdist-replay", token)
    again.assert_outcomes(failed=1)
    assert "rank 2 was first" in again.stdout.str()
    assert _token(again.stdout.str()) == token

    # The empty schedule (every choice 0: rank 1 sends first) passes.
    passing = inner_pytest("--simdist-replay", encode_choices([]))
    passing.assert_outcomes(passed=1)


@pytest.mark.timeout(120)
def test_plugin_max_schedules(pytester, inner_pytest):
    pytester.makepyfile(test_counted=COUNTING_TEST)
    result = inner_pytest("--simdist-max-schedules", "5")
    result.assert_outcomes(passed=1)
    calls = (pytester.path / "calls.txt").read_text().split()
    assert sorted(calls) == ["0"] * 5 + ["1"] * 5  # 5 runs, fn called once per rank in each


SINGLETON_TEST = """
import os
import simdist as dist
import simdist.testing

class Settings:
    rank = None  # set once per process, as a library's state is

def owner(rank):
    if Settings.rank is None:
        Settings.rank = rank
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
    return Settings.rank, os.getpid()

def test_each_rank_owns_its_settings():
    (first, a), (second, b) = simdist.testing.run(owner, 2, seed=0).values
    assert (first, second) == (0, 1) and a != b

@simdist.testing.spmd(nprocs=2, max_runs=3)
def test_explored(rank):
    assert owner(rank)[0] == rank
"""


@pytest.mark.timeout(240)
def test_plugin_isolation_makes_every_rank_a_process(pytester, inner_pytest):
    """``--simdist-isolation processes``: simdist.testing's runs give each rank a process (a singleton of its own)."""
    pytester.makepyfile(test_singleton=SINGLETON_TEST)
    inner_pytest("--simdist-isolation", "processes").assert_outcomes(passed=2)
    inner_pytest("--simdist-isolation", "threads").assert_outcomes(failed=2)  # one process: rank 0 set it for both


@pytest.mark.timeout(120)
def test_plugin_imports_nothing_heavy():
    code = (
        "import sys, pytest_simdist; "
        "heavy = [m for m in ('torch', 'hypothesis', 'simdist') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
