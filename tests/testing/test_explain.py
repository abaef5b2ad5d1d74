"""``simdist.testing.explain``: a schedule's decisions in the program's words, also noted on failures.

The expected call sites come from this file's own source (the lines marked ``# <-``), the
expected ranks from what the failing rank saw (whose message came first).
"""

from __future__ import annotations

import inspect
import os
import re

import pytest
import torch

import simdist
import simdist as dist
import simdist.testing as sdt
from simdist.testing._explain import MAX_NOTED


def first_message_race(rank: int) -> None:
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        first = dist.recv(t)  # <- race recv
        assert first == 1, f"got rank {first}'s"
        for _ in range(dist.get_world_size() - 2):
            dist.recv(t)
    else:
        dist.send(t, dst=0)  # <- race send
    dist.destroy_process_group()


def late_any_source(rank: int) -> None:
    """Rank 0 takes rank 2's first message, then any source: rank 1's and rank 2's second are both waiting."""
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        dist.recv(t, src=2)
        first = dist.recv(t)  # <- any source
        assert first == 1, f"got rank {first}'s"
        dist.recv(t)
    elif rank == 1:
        dist.send(t, dst=0)
    else:
        dist.send(t, dst=0)
        dist.send(t, dst=0)  # <- second send
    dist.destroy_process_group()


def many_rounds(rank: int) -> None:
    """Every rank passes a token around a ring 12 times, then rank 0 fails (on every schedule)."""
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    world = dist.get_world_size()
    for _ in range(12):
        if rank % 2 == 0:
            dist.send(t, dst=(rank + 1) % world)
            dist.recv(t, src=(rank - 1) % world)
        else:
            dist.recv(t, src=(rank - 1) % world)
            dist.send(t, dst=(rank + 1) % world)
    dist.destroy_process_group()
    assert rank != 0, "rank 0 always fails"


def site(fn, marker: str) -> str:
    """``file:line`` of the line of ``fn`` marked ``# <- marker``, as explain writes it (relative to the cwd)."""
    lines, start = inspect.getsourcelines(fn)
    offset = next(i for i, line in enumerate(lines) if line.rstrip().endswith(f"# <- {marker}"))
    return f"{os.path.relpath(__file__)}:{start + offset}"


def test_explain_names_the_rank_that_went_first_and_the_lines_that_matched():
    with pytest.raises(simdist.RankError) as info:
        sdt.explore(first_message_race, 4, strategy="pct", max_runs=100, seed=0)
    first = int(re.search(r"got rank (\d)'s", str(info.value.__cause__))[1])
    lines = sdt.explain(first_message_race, 4, info.value.schedule)
    assert len(lines) == sum(1 for c in info.value.choices if c) == 1
    assert re.fullmatch(
        rf"rank {first} ran before rank 1 at step \d+: rank 0's recv at {re.escape(site(first_message_race, 'race recv'))}"
        rf" matched rank {first}'s send at {re.escape(site(first_message_race, 'race send'))}",
        lines[0],
    ), lines
    assert lines[0] in "\n".join(info.value.__notes__)  # the failure lists the same decision


def test_explain_names_which_sender_an_any_source_recv_matched():
    with pytest.raises(simdist.RankError) as info:
        sdt.explore(late_any_source, 3, strategy="exhaustive", max_runs=200)
    assert "got rank 2's" in str(info.value.__cause__)
    assert len(sdt.explain(late_any_source, 3, info.value.schedule)) == 1  # one preemption suffices
    # the schedules that let both ranks' messages wait, then pick rank 2's at the any-source receive
    explained = []
    for i in range(40):
        try:
            sdt.run(late_any_source, 3, schedule=[0] * i + [1])
        except simdist.RankError as err:
            explained.append(sdt.explain(late_any_source, 3, err.schedule))
    matches = [lines for lines in explained if lines and "before rank 1's" in lines[0]]
    assert matches, explained
    lines = matches[0]
    assert len(lines) == 1, lines
    assert re.fullmatch(
        rf"rank 0's recv at {re.escape(site(late_any_source, 'any source'))} matched rank 2's send before rank 1's "
        rf"at step \d+: the send at {re.escape(site(late_any_source, 'second send'))}",
        lines[0],
    ), lines


def test_explain_takes_a_schedule_and_says_nothing_of_the_plain_run():
    assert sdt.explain(first_message_race, 4, sdt.Schedule([0, 0], world=4)) == []
    assert sdt.run(first_message_race, 4, schedule=[]).values == [None] * 4
    with pytest.raises(ValueError, match="made for world size 4, not nprocs=3"):
        sdt.explain(first_message_race, 3, "choices:0,2@world=4")


def test_a_failure_with_many_decisions_is_not_noted_but_explain_lists_them_all():
    with pytest.raises(simdist.RankError) as info:
        sdt.run(many_rounds, 4, seed=5)
    err = info.value
    decisions = sum(1 for c in err.choices if c)
    assert decisions > MAX_NOTED
    assert not any("scheduling decisions" in note for note in getattr(err, "__notes__", []))
    lines = sdt.explain(many_rounds, 4, err.schedule)
    assert len(lines) == decisions
    assert all(re.match(r"rank \d ran before rank \d at step \d+", line) for line in lines), lines
