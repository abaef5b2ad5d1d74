"""Readable replay tokens: ``Schedule`` round trips, old tokens, and what ``--simdist-replay`` accepts.

A token reads ``choices:0,2@world=4@test=NODEID``; tokens of earlier versions (``choices:dgAC``)
still replay. Through ``pytester``: a token records its test and world size, ``--simdist-replay``
refuses another test's or world size's token and replays its own, a failing test's traceback
shows no simdist frame, and Hypothesis's explanation lines point at the user's code.
"""

from __future__ import annotations

import os
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simdist
import simdist as dist
import simdist.backends
import simdist.testing as sdt
from simdist.backends.sim._strategies import READABLE_CHARS, decode_choices
from simdist.testing import Schedule

pytest_plugins = ["pytester"]


def first_message_race(rank: int) -> None:
    """Rank 0 assumes rank 1's message arrives first."""
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        first = dist.recv(t)
        assert first == 1, f"expected rank 1's message first, got rank {first}'s"
        for _ in range(dist.get_world_size() - 2):
            dist.recv(t)
    else:
        dist.send(t, dst=0)
    dist.destroy_process_group()


# --- Schedule and its token -----------------------------------------------------------------------------------

choice_lists = st.lists(st.integers(0, 300), max_size=150)
node_ids = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() == s and s)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    choices=choice_lists,
    world=st.none() | st.integers(1, 4096),
    test=st.none() | node_ids,
    script=st.none() | st.text(min_size=1, max_size=20),
)
def test_a_schedule_round_trips_through_its_token_and_its_repr(choices, world, test, script):
    s = Schedule(choices, world=world, test=test, script=script)
    assert eval(repr(s), {"Schedule": Schedule}) == s
    token = s.token
    back = Schedule.from_token(token)
    assert back.token == token
    significant = list(choices)
    while significant and significant[-1] == 0:  # trailing zeros are implied: the token leaves them out
        significant.pop()
    assert back == Schedule(significant, world=world, test=test, script=script)
    assert back.choices == significant and (back.world, back.test, back.script) == (world, test, script)


def test_short_schedules_read_as_decimals_long_ones_are_compact():
    assert Schedule([0, 2], world=4).token == "choices:0,2@world=4"
    assert Schedule([]).token == "choices:0" and Schedule.from_token("choices:0") == Schedule([])
    assert repr(Schedule([0, 2], world=4, test="t.py::x")) == "Schedule([0, 2], world=4, test='t.py::x')"
    long = Schedule([7, 3, 11] * 100, world=3)
    head = long.token.split("@")[0]
    assert "," not in head and len(head) < len(",".join(map(str, long))) and len(head) > READABLE_CHARS // 4
    assert Schedule.from_token(long.token) == long


def test_schedule_equality_counts_world_and_test():
    assert Schedule([1, 2], world=3) != Schedule([1, 2], world=4)
    assert Schedule([1, 2], test="a") != Schedule([1, 2], test="b")
    assert Schedule([1, 2]) == [1, 2]  # still a list of choices


def test_old_tokens_still_replay():
    # "choices:dgAC" is how earlier versions wrote [0, 2] (saved in tutorials/05's old output)
    assert decode_choices("choices:dgAC") == [0, 2] == Schedule.from_token("choices:dgAC")
    with pytest.raises(simdist.RankError) as old:
        sdt.replay(first_message_race, 4, "choices:dgAC")
    with pytest.raises(simdist.RankError) as new:
        sdt.replay(first_message_race, 4, "choices:0,2")
    assert str(old.value.__cause__) == str(new.value.__cause__)
    assert str(old.value.__cause__).startswith("expected rank 1's message first, got rank 3's")
    assert old.value.choices == new.value.choices


def test_a_token_records_the_world_size_and_replays_only_there():
    with pytest.raises(simdist.RankError) as info:
        sdt.run(first_message_race, 4, schedule=[0, 2])
    token = info.value.schedule
    assert token.endswith(
        "@world=4@test=tests/sim/test_schedule_tokens.py::test_a_token_records_the_world_size_and_replays_only_there"
    ), token
    with pytest.raises(ValueError, match=r"was made for world size 4, not nprocs=3"):
        simdist.simulate(first_message_race, 3, schedule=token)
    with pytest.raises(ValueError, match=r"was made for world size 4, not nprocs=5"):
        sdt.replay(first_message_race, 5, Schedule([0, 2], world=4))
    res = sdt.run(first_message_race, 4, schedule=Schedule([0, 0], world=4))
    assert res.schedule.startswith("choices:0@world=4")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([0, -1],), r"choices=\[0, -1\] has -1; a schedule's choices are non-negative ints"),
        (([True],), r"choices=\[True\] has True"),
        (([0], 0), r"world=0 must be a positive int"),
        (([0], None, ""), r"test='' must be a pytest node id"),
        (([0], None, None, ""), r"script='' must be a script's file name"),
    ],
)
def test_bad_schedules_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        Schedule(*args)


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("random:3@world=2", r"token='random:3@world=2' is a seeded strategy's token"),
        ("choices:0,1@world=x", r"schedule='choices:0,1@world=x' is not a valid replay token; expected SCHEDULE"),
        ("choices:0,1@world=0", r"with N a positive int"),
        ("choices:!!", r"schedule='choices:!!' is not a valid replay token"),
        ("choices:0@world=2@script=", r"expected SCHEDULE\[@world=N\]\[@script=NAME\]\[@test=NODEID\]"),
    ],
)
def test_bad_tokens_are_refused(token, message):
    with pytest.raises(ValueError, match=message):
        Schedule.from_token(token)


# --- the pytest plugin -------------------------------------------------------------------------------------------

RACY_TESTS = """
import torch
import simdist as dist
import simdist.testing as sdt


def race(rank):
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        first = dist.recv(t)
        assert first == 1, f"rank {first} was first"
        for _ in range(dist.get_world_size() - 2):
            dist.recv(t)
    else:
        dist.send(t, dst=0)
    dist.destroy_process_group()


def test_three():
    sdt.run(race, 3)


def test_other():
    sdt.run(race, 3)


@sdt.spmd(nprocs=[2, 3, 4])
def test_worlds(rank):
    race(rank)
"""


@pytest.fixture
def inner_pytest(pytester):
    """``pytester.runpytest`` in this process, with this session's plugin options kept."""
    import pytest_simdist

    saved = dict(pytest_simdist.OPTIONS)
    pytester.makepyfile(test_racy=RACY_TESTS)
    yield lambda *args: pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)
    pytest_simdist.OPTIONS.update(saved)


def _outcome(result, test: str) -> str:
    found = re.search(rf"test_racy.py::{test} (PASSED|FAILED)", result.stdout.str())
    assert found, result.stdout.str()
    return found[1]


@pytest.mark.timeout(180)
def test_replay_refuses_another_tests_token_and_replays_its_own(inner_pytest):
    token = "choices:0,1@world=3@test=test_racy.py::test_three"
    result = inner_pytest("-v", "-k", "test_three or test_other", "--simdist-replay", token)
    out = result.stdout.str()
    assert _outcome(result, "test_three") == "FAILED" and "rank 2 was first" in out  # its own: replayed, it fails
    assert _outcome(result, "test_other") == "FAILED"
    assert (
        "--simdist-replay choices:0,1@world=3@test=test_racy.py::test_three was made for the test "
        "test_racy.py::test_three, not this one (test_racy.py::test_other)"
    ) in out, out
    # the same choices without a test or world size (made by hand) apply anywhere
    result = inner_pytest("-v", "-k", "test_three or test_other", "--simdist-replay", "choices:0,1")
    assert _outcome(result, "test_three") == _outcome(result, "test_other") == "FAILED"
    assert result.stdout.str().count("rank 2 was first") >= 2
    result = inner_pytest("-v", "-k", "test_three or test_other", "--simdist-replay", "choices:0")
    assert _outcome(result, "test_three") == _outcome(result, "test_other") == "PASSED"


@pytest.mark.timeout(180)
def test_replay_refuses_another_world_size(inner_pytest):
    result = inner_pytest("-v", "-k", "test_three", "--simdist-replay", "choices:0,1@world=4")
    assert _outcome(result, "test_three") == "FAILED"
    assert "--simdist-replay choices:0,1@world=4 was made for a run of 4 ranks, not of nprocs=3" in result.stdout.str()


@pytest.mark.timeout(180)
def test_a_failing_spmd_test_prints_a_token_that_replays_only_its_world(inner_pytest):
    first = inner_pytest("-v", "-k", "test_worlds")
    tokens = re.findall(r"replay token: (\S+)", first.stdout.str())
    assert tokens, first.stdout.str()
    token = tokens[0]
    schedule = Schedule.from_token(token)
    assert schedule.test == "test_racy.py::test_worlds" and schedule.world == 3  # world 2 has no race
    again = inner_pytest("-v", "-k", "test_worlds", "--simdist-replay", token)
    assert _outcome(again, "test_worlds") == "FAILED"
    assert re.findall(r"replay token: (\S+)", again.stdout.str())[0] == token
    assert "not of nprocs" not in again.stdout.str()  # worlds 2 and 4 are not run under the token


def _library_dirs() -> tuple[str, ...]:
    return tuple(os.path.dirname(m.__file__) for m in (simdist, simdist.backends))


@pytest.mark.timeout(180)
def test_a_failing_tests_traceback_shows_no_simdist_frame(inner_pytest):
    # replayed: a seedless run takes the next seed of the process, which fails only if rank 2 sends first
    token = "choices:0,1@world=3@test=test_racy.py::test_three"
    result = inner_pytest("-k", "test_three", "--tb=long", "--simdist-replay", token)
    out = result.stdout.str()
    assert "rank 2 was first" in out, out
    frames = re.findall(r"^(\S+\.py):\d+: ", out, flags=re.MULTILINE)  # pytest's 'file:line: Error' after each frame
    assert frames and set(frames) == {"test_racy.py"}, frames
    assert not any(d in out for d in _library_dirs()), out
    assert "_engine.py" not in out and "_runner.py" not in out


HYPOTHESIS_TEST = """
import torch
from hypothesis import given, settings
import simdist as dist
import simdist.testing as sdt


def race(rank):
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        first = dist.recv(t)
        if first != 1:
            raise AssertionError(f"rank {first} was first")  # only failing runs come here
        dist.recv(t)
    else:
        dist.send(t, dst=0)
    dist.destroy_process_group()


@settings(database=None, max_examples=200, deadline=None, derandomize=True)
@given(schedule=sdt.schedules())
def test_drawn(schedule):
    sdt.run(race, 3, schedule=schedule)
"""


@pytest.mark.timeout(300)
def test_hypothesis_explanation_points_at_the_users_code(pytester, inner_pytest):
    pytester.makepyfile(test_hyp=HYPOTHESIS_TEST)
    result = inner_pytest("test_hyp.py")
    out = result.stdout.str()
    result.assert_outcomes(failed=1)
    assert "Schedule([" in out  # Hypothesis prints the failing schedule as an evaluable repr
    lines = (pytester.path / "test_hyp.py").read_text().splitlines()
    raise_line = next(i for i, line in enumerate(lines, 1) if "only failing runs come here" in line)
    explained = re.findall(r"^E\s+(/\S+\.py):(\d+)$", out, flags=re.MULTILINE)
    assert "Explanation:" in out, out
    assert explained == [(str(pytester.path / "test_hyp.py"), str(raise_line))], out
