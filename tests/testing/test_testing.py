"""simdist.testing: run, replay, strategies, explore, shrinking, the replay check and spmd.

The issue's demonstrations (a race, a non-power-of-two bug, a schedule-dependent deadlock,
an off-by-one ring) and the pytest plugin's options are in tests/testing/test_testing_demos.py.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

import simdist
import simdist as dist
import simdist.backends
import simdist.testing as sdt
from pytest_simdist import OPTIONS
from simdist.backends.sim._strategies import decode_choices

pytestmark = pytest.mark.timeout(120)


def racy(rank):
    """Rank 0 assumes rank 1's message arrives first: true under some schedules only."""
    dist.init_process_group("gloo")
    if rank == 0:
        first = dist.recv(torch.zeros(1))
        dist.recv(torch.zeros(1))
        assert first == 1, f"rank {first}'s message came first"
    else:
        dist.send(torch.tensor([float(rank)]), dst=0)
    dist.destroy_process_group()


def summed(rank):
    dist.init_process_group("gloo")
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


def fails(schedule) -> bool:
    try:
        sdt.run(racy, 3, schedule=schedule)
    except dist.RankError:
        return True
    return False


# -- run and replay ---------------------------------------------------------------------------------------


def test_run_returns_values_trace_and_a_token_that_replays():
    res = sdt.run(summed, 4, seed=5)
    assert res.values == [6.0] * 4 and len(res.trace) > 0
    again = sdt.replay(summed, 4, res.schedule)
    assert again.values == res.values and again.choices == res.choices


def test_run_without_a_seed_draws_one_and_its_token_replays_it():
    tokens = {sdt.run(racy_free, 3).schedule for _ in range(5)}
    assert len(tokens) > 1, "runs without a seed all used the same seed"
    for token in tokens:
        assert sdt.replay(racy_free, 3, token).schedule == token


def racy_free(rank):
    dist.init_process_group("gloo")
    if rank == 0:
        got = sorted(dist.recv(torch.zeros(1)) for _ in range(2))
    else:
        dist.send(torch.zeros(1), dst=0)
        got = None
    dist.destroy_process_group()
    return got


def test_replay_of_a_failure_raises_the_same_failure():
    with pytest.raises(dist.RankError) as info:
        sdt.explore(racy, 3, strategy="random", max_runs=50)
    with pytest.raises(dist.RankError) as again:
        sdt.replay(racy, 3, info.value.schedule)
    assert again.value.rank == info.value.rank == 0


def test_replay_rejects_what_is_not_a_token():
    with pytest.raises(TypeError, match="token must be a replay token"):
        sdt.replay(summed, 2, [0, 1])
    with pytest.raises(ValueError, match="not a valid replay token"):
        sdt.replay(summed, 2, "choices:!!")


def test_the_replay_option_overrides_every_run():
    token = sdt.run(racy_free, 3, seed=1).schedule
    OPTIONS["replay"] = token
    try:
        assert sdt.run(racy_free, 3, seed=99).schedule == token
    finally:
        OPTIONS["replay"] = None


# -- strategies ----------------------------------------------------------------------------------------------


def test_hypothesis_shrinks_a_failing_schedule_to_a_few_choices():
    minimal = find(sdt.schedules(), fails, settings=settings(max_examples=500, database=None, deadline=None))
    assert isinstance(minimal, sdt.Schedule) and len(minimal) <= 3
    assert (
        eval(repr(minimal), {"Schedule": sdt.Schedule}) == minimal
        and decode_choices(minimal.token) == minimal.choices[: len(decode_choices(minimal.token))]
    )
    with pytest.raises(dist.RankError):
        sdt.run(racy, 3, schedule=minimal)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=sdt.world_sizes(1, 6), schedule=sdt.schedules(), topology=sdt.topologies())
def test_any_schedule_and_topology_runs_a_correct_program(world, schedule, topology):
    res = sdt.run(summed, world, schedule=schedule, topology=topology)
    assert res.values == [float(sum(range(world)))] * world


def test_strategy_arguments_are_checked():
    with pytest.raises(ValueError, match=r"world_sizes\(3, 2\)"):
        sdt.world_sizes(3, 2)
    with pytest.raises(ValueError, match="max_choices=-1"):
        sdt.schedules(max_choices=-1)
    with pytest.raises(ValueError, match="op='nope'"):
        find(sdt.collective_inputs(op="nope"), lambda c: True)


def _apply(rank, inputs):
    dist.init_process_group("gloo")
    x, op, root, world = inputs.input(rank), inputs.op, inputs.root, inputs.world
    if op == "all_reduce":
        dist.all_reduce(x)
        out = x
    elif op == "broadcast":
        dist.broadcast(x, src=root)
        out = x
    elif op == "reduce":
        dist.reduce(x, dst=root)
        out = x if rank == root else None
    elif op == "all_gather_into_tensor":
        out = torch.zeros((world * x.shape[0], *x.shape[1:]) if x.dim() else (world,), dtype=x.dtype)
        dist.all_gather_into_tensor(out, x)
    elif op == "reduce_scatter_tensor":
        out = torch.zeros((x.shape[0] // world, *x.shape[1:]), dtype=x.dtype)
        dist.reduce_scatter_tensor(out, x)
    elif op == "all_to_all_single":
        out = torch.zeros_like(x)
        dist.all_to_all_single(out, x)
    elif op == "gather":
        out = [torch.zeros_like(x) for _ in range(world)] if rank == root else None
        dist.gather(x, out, dst=root)
    else:  # scatter
        ref = inputs.tensors[root][0]
        out = torch.zeros_like(ref)
        dist.scatter(out, x, src=root)
    dist.destroy_process_group()
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=sdt.collective_inputs())
def test_collective_inputs_are_valid_for_their_op(inputs):
    values = sdt.run(_apply, inputs.world, args=(inputs,)).values
    if inputs.op == "all_reduce":  # small integers: the sum is exact in every dtype
        want = sum(t.to(torch.float64) for t in inputs.tensors)
        assert all(torch.equal(v.to(torch.float64), want) for v in values)
    if inputs.op == "broadcast":
        assert all(torch.equal(v, inputs.tensors[inputs.root]) for v in values)


# -- explore and shrinking -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["pct", "random", "exhaustive"])
def test_explore_finds_the_race_and_returns_its_minimal_schedule(strategy):
    with pytest.raises(dist.RankError) as info:
        sdt.explore(racy, 3, strategy=strategy, max_runs=200)
    err = info.value
    assert len(decode_choices(err.schedule)) <= 3
    assert "rank 2's message came first" in str(err)


def test_explore_summarizes_a_program_that_never_fails():
    summary = sdt.explore(racy_free, 3, strategy="exhaustive", max_runs=1000)
    assert summary.complete and summary.runs == summary.interleavings > 1
    assert "no failure" in str(summary)
    partial = sdt.explore(racy_free, 3, strategy="random", max_runs=20)
    assert partial.runs == 20 and not partial.complete and 1 <= partial.interleavings <= 20


def test_explore_arguments_are_checked():
    with pytest.raises(ValueError, match="strategy='dfs'"):
        sdt.explore(summed, 2, strategy="dfs")
    with pytest.raises(ValueError, match="max_runs=0"):
        sdt.explore(summed, 2, max_runs=0)
    with pytest.raises(ValueError, match="depth=0"):
        sdt.explore(summed, 2, depth=0)


def test_explore_draws_progress_when_asked(capsys):
    sdt.explore(summed, 2, max_runs=3, progress=True)
    assert "simdist explore: 3/3 runs" in capsys.readouterr().err


def test_spmd_turns_a_rank_function_into_a_test():
    test_ok = sdt.spmd(nprocs=[1, 2, 3], max_runs=5)(summed)
    assert test_ok.__name__ == "summed" and not hasattr(test_ok, "__wrapped__")
    test_ok()
    with pytest.raises(dist.RankError) as info:
        sdt.spmd(nprocs=3, strategy="random", max_runs=100)(racy)()
    assert info.value.schedule.startswith("choices:")
    with pytest.raises(ValueError, match="nprocs=0"):
        sdt.spmd(nprocs=0)


# -- the replay check: programs the simulator cannot replay --------------------------------------------------------

_calls = {"n": 0}


def fails_first_time_only(rank):
    dist.init_process_group("gloo")
    if rank == 0:
        _calls["n"] += 1
        assert _calls["n"] > 1, "first call"
    dist.destroy_process_group()


def test_a_failure_that_does_not_replay_is_a_nondeterminism_error_naming_global_state():
    _calls["n"] = 0
    with pytest.raises(sdt.NondeterminismError) as info:
        sdt.run(fails_first_time_only, 2, seed=0)
    err = info.value
    assert isinstance(err.first, dist.RankError) and err.second is None
    assert "passed" in str(err) and "state outside the run" in str(err)


def reads_the_clock(rank):
    dist.init_process_group("gloo")
    if rank == 0:
        _calls["n"] += 1
        time.perf_counter()
        assert _calls["n"] > 1
    dist.destroy_process_group()


def starts_a_thread(rank):
    dist.init_process_group("gloo")
    if rank == 0:
        _calls["n"] += 1
        threading.Thread(target=lambda: None).start()
        assert _calls["n"] > 1
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("fn", "cause"),
    [(reads_the_clock, "reads the clock: time.perf_counter()"), (starts_a_thread, "starts its own threads")],
)
def test_the_replay_check_names_the_clock_or_a_thread(fn, cause):
    _calls["n"] = 0
    with pytest.raises(sdt.NondeterminismError) as info:
        sdt.run(fn, 2, seed=0)
    assert cause in str(info.value) and "test_testing.py" in str(info.value)
    library = [str(Path(simdist.__file__).parent), str(Path(simdist.backends.__file__).parent)]
    assert info.value.causes and all("test_testing.py:" in c for c in info.value.causes)
    assert not any(lib + os.sep in c for lib in library for c in info.value.causes)


def test_runs_without_a_seed_are_reproducible_under_hypothesis():
    """Hypothesis resets the generator behind seedless runs for each example, so a test replays exactly
    (to vary the interleaving, draw it: ``schedule=sdt.schedules()``)."""

    def tokens_of_one_test_session() -> list[str]:
        seen: list[str] = []

        @settings(max_examples=10, derandomize=True, database=None, deadline=None)
        @given(st.integers(0, 3))
        def inner(n):
            seen.append(sdt.run(racy_free, 3).schedule)

        inner()
        return seen

    first, second = tokens_of_one_test_session(), tokens_of_one_test_session()
    assert first and first == second
