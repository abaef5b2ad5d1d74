"""Communication rounds in simdist.visualize: which messages share a round, and every rank's data after each.

The truths these tests check against are computed another way: the inputs' bit encoding
(rank ``r`` contributes ``2**r``, so a partial sum's bits name the ranks it holds), the
trees and rings of the algorithms worked out by hand, the alpha terms of the cost
formulas the Compare page shows, and the causal past of each rank (the data that a
chain of messages of rounds ``<= k`` could have brought it).
"""

from __future__ import annotations

import pytest
from simdist.visualize import buffer_table, collective_run, messages_by_step, round_of, step_graph, steps, timeline

from simdist.core._trace import Event, Trace
from simdist.algorithms import ALGORITHMS, cost
from simdist.algorithms._chunks import ceil_log2, floor_log2

OPS = [op for op in ALGORITHMS if op != "barrier"]
ALL = [(op, name) for op in OPS for name in ALGORITHMS[op]]


def _edges(res, k: int) -> list[tuple[int, int]]:
    return sorted((u, v) for u, v in step_graph(res.trace, k).edges())


def _bits(table) -> list[list[set[int]]]:
    return [[set(c.ranks) for c in row.cells] for row in table.rows]


@pytest.mark.timeout(60)
def test_binomial_broadcast_on_8_ranks_has_rounds_of_1_2_4_messages():
    res = collective_run("broadcast", "binomial", 8, 512)
    assert steps(res.trace) == [1, 2, 3]
    assert [step_graph(res.trace, k).number_of_edges() for k in (1, 2, 3)] == [1, 2, 4]
    # the tree from rank 0: 0->4, then 0->2 and 4->6, then every odd rank from its left neighbour
    assert _edges(res, 1) == [(0, 4)]
    assert _edges(res, 2) == [(0, 2), (4, 6)]
    assert _edges(res, 3) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    holding = [{row.rank for row in buffer_table(res.trace, k).rows if row.cells[0].ranks} for k in range(4)]
    assert holding == [{0}, {0, 4}, {0, 2, 4, 6}, set(range(8))]  # the root's data, after each round
    assert {k: len(v) for k, v in messages_by_step(res.trace, 0).items()} == {1: 1, 2: 2, 3: 4}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [4, 8])
def test_recursive_doubling_after_round_k_holds_sums_of_2_to_the_k_ranks(world):
    res = collective_run("all_reduce", "recursive_doubling", world, 8 * 3 * world)
    assert steps(res.trace) == list(range(1, floor_log2(world) + 1))
    for k in range(len(steps(res.trace)) + 1):
        for r, row in enumerate(_bits(buffer_table(res.trace, k))):
            # after k exchanges with r xor 1, r xor 2, ...: the 2^k ranks that share r's high bits
            assert all(cell == {q for q in range(world) if q >> k == r >> k} for cell in row), (k, r)


@pytest.mark.timeout(60)
def test_recursive_doubling_on_5_ranks_folds_then_doubles():
    """p = 5 is not a power of two: rank 0 hands its data to rank 1 (round 1) and ranks 1..4
    double among themselves while that happens; ranks that start earlier get ahead. What
    holds: sums never shrink, each is exactly the rank's causal past, and after
    ⌊lg p⌋ + 2 = 4 rounds every rank holds all 5."""
    res = collective_run("all_reduce", "recursive_doubling", 5, 8 * 10)
    everyone = set(range(5))
    expected = [
        [{0}, {1}, {2}, {3}, {4}],
        [{0}, {0, 1, 2}, {2}, {3, 4}, {3, 4}],  # 0->1 (fold), 2->1, 3<->4
        [{0}, everyone, everyone, {3, 4}, {3, 4}],  # 1->2 and 4->2 bring the rest to 2, 3->1 to 1
        [{0}, everyone, everyone, everyone, everyone],  # 1->3, 2->4
        [everyone] * 5,  # 1->0 hands the result back
    ]
    assert steps(res.trace) == [1, 2, 3, 4]
    for k, sets in enumerate(expected):
        rows = _bits(buffer_table(res.trace, k))
        assert [row[0] for row in rows] == sets, k
        assert all(cell == row[0] for row in rows for cell in row)  # the whole buffer travels
        assert [row[0] for row in rows] == _causal_past(res, k)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [4, 5, 8])
def test_ring_all_reduce_holds_k_plus_1_ranks_after_its_kth_reduce_scatter_round(world):
    m = 3
    res = collective_run("all_reduce", "ring", world, 8 * m * world)
    assert steps(res.trace) == list(range(1, 2 * (world - 1) + 1))
    for k in steps(res.trace):
        assert sorted((u - v) % world for u, v in _edges(res, k)) == [world - 1] * world  # r -> r + 1
    for k in range(1, world):
        rows = _bits(buffer_table(res.trace, k))
        for r in range(world):
            g = (r - k) % world  # the chunk rank r just received and reduced
            assert rows[r][g * m : (g + 1) * m] == [{(r - j) % world for j in range(k + 1)}] * m, (k, r)
    for k in range(world, 2 * world - 1):  # the all-gather hands the finished chunks on
        rows = _bits(buffer_table(res.trace, k))
        for r in range(world):
            full = [(r + 1 - j) % world for j in range(k - world + 2)]  # finished chunks rank r holds
            assert all(rows[r][g * m] == set(range(world)) for g in full), (k, r)


# Where the α term of a formula on the Compare page counts something other than rounds:
ONE_ROUND = {("reduce", "linear"), ("all_to_all", "direct"), ("gather", "linear"), ("scatter", "linear")}
# ... the p - 1 messages through one rank's port; they are posted in one step, so all go in round 1.
UP_TREES = {("reduce", "binomial"), ("gather", "binomial")}
# ... the root's ⌈lg p⌉ receives, one after another; no message waits for another along the
# root's children, so the rounds are the tree's height ⌊lg p⌋ (fewer where p is not a power of two).


def _true_rounds(op: str, name: str, p: int) -> int:
    if (op, name) in ONE_ROUND:
        return 1
    if (op, name) in UP_TREES:
        return floor_log2(p)
    if (op, name) == ("all_reduce", "binomial"):
        return floor_log2(p) + ceil_log2(p)  # up the tree, then ⌈lg p⌉ sends from the root down
    # Every other α term counts rounds. The pipelined algorithms count their S (or C)
    # segments per hop: one at these sizes (segments are 2-4 MiB).
    return round(cost(op, name, 64 * p, p, alpha=1.0, beta=0.0))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("op,name", ALL)
def test_round_counts_match_the_compare_pages_formulas(op, name):
    for p in (2, 3, 4, 5, 8):
        res = collective_run(op, name, p, 64 * p)
        alpha = cost(op, name, 64 * p, p, alpha=1.0, beta=0.0)
        assert len(steps(res.trace)) == _true_rounds(op, name, p), (p, alpha)
        if (op, name) not in ONE_ROUND | UP_TREES | {("all_reduce", "binomial")}:
            assert len(steps(res.trace)) == alpha


def _causal_past(res, k: int) -> list[set[int]]:
    """The ranks whose data a chain of messages of rounds ``<= k`` (rising along the chain) can bring each rank."""
    world = res.trace.meta["visualize"]["world"]
    rounds = round_of(res.trace, 0)
    past = [[{r} for r in range(world)]]
    for j in range(1, k + 1):
        now = [set(s) for s in past[-1]]
        for i, rj in rounds.of.items():
            if rj == j:
                e = res.trace.events[i]
                now[e.peer] |= past[j - 1][e.rank]
        past.append(now)
    return past[k]


def _lands(op: str, name: str, rank: int, row, p: int, m: int) -> list[float]:
    """What the table after the last round turns into by the collective's end (its local work)."""
    values = [c.value for c in row.cells]
    if row.source != "work":
        return values
    if op == "reduce_scatter":  # the partial sums of every block: the rank's own is its output
        return values[rank * m : (rank + 1) * m]
    blocks = [values[i * m : (i + 1) * m] for i in range(p)]
    if op == "all_gather":  # Bruck: block i is rank (r + i)'s
        return [v for j in range(p) for v in blocks[(j - rank) % p]]
    return [v for j in range(p) for v in blocks[(rank - j) % p]]  # Bruck's all_to_all: slot i is from r - i


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [4, 5])
@pytest.mark.parametrize("op,name", ALL)
def test_every_round_shows_data_that_only_grows_toward_the_result(op, name, world):
    m = 2
    res = collective_run(op, name, world, 8 * m * world)
    meta = res.trace.meta["visualize"]
    rounds = round_of(res.trace, 0)
    last = len(steps(res.trace))
    tables = [buffer_table(res.trace, k) for k in range(last + 2)]
    final = tables[-1]
    assert all(row.source == "final" for row in final.rows) and final.step == last + 1
    active = set()  # ranks that sent or received a message so far
    for k, table in enumerate(tables[: last + 1]):
        assert table.step == k and table.rounds == last
        for i, rk in rounds.of.items():
            if rk == k:
                active |= {res.trace.events[i].rank, res.trace.events[i].peer}
        past = _causal_past(res, k)
        for row in table.rows:
            assert row.source in ("step", "work")
            held = [c for c in row.cells if c.ranks]
            assert held or row.rank not in active or k == 0, (k, row.rank)  # no blank row once it took part
            assert all(set(c.ranks) <= past[row.rank] for c in held), (k, row.rank)  # nothing arrives early
            if k == 0:
                continue
            before = tables[k - 1].rows[row.rank]
            assert before.source == row.source
            if (op, name) == ("all_to_all", "bruck"):  # blocks hop on: the ones already home only add up
                home = [c for c in row.cells if c.source_chunk == row.rank]
                assert len(home) >= len([c for c in before.cells if c.source_chunk == row.rank])
                continue
            for a, b in zip(before.cells, row.cells):
                if meta["encoding"] == "bits":
                    assert set(a.ranks) <= set(b.ranks), (k, row.rank)  # sums only gain ranks
                elif a.ranks:
                    assert a.value == b.value, (k, row.rank)  # a block that arrived stays
            assert len(row.cells) >= len(before.cells)
        assert any(c.ranks for row in table.rows for c in row.cells), k  # never a blank panel
    for r, row in enumerate(tables[last].rows):  # after the last round: the result, or what becomes it locally
        assert _lands(op, name, r, row, world, m) == [c.value for c in final.rows[r].cells], r


@pytest.mark.timeout(60)
def test_bruck_keeps_its_blocks_in_scratch_until_a_final_local_rotation():
    res = collective_run("all_to_all", "bruck", 5, 8 * 2 * 5)
    last = buffer_table(res.trace, 3)
    assert all(row.source == "work" for row in last.rows)
    # slot i of rank r holds rank r - i's block for r; the result has it at block r - i
    assert [[(c.origin, c.source_chunk) for c in row.cells][::2] for row in last.rows] == [
        [((r - i) % 5, r) for i in range(5)] for r in range(5)
    ]
    assert [[c.origin for c in row.cells][::2] for row in buffer_table(res.trace).rows] == [list(range(5))] * 5


@pytest.mark.timeout(60)
def test_timeline_arrows_carry_their_round():
    res = collective_run("all_reduce", "ring", 4, 8 * 8)
    tl = timeline(res.trace)
    assert sorted({a.round for a in tl.arrows}) == list(range(1, 7))
    assert all(a.round == a.step + 1 for a in tl.arrows)  # the ring sends once per step


@pytest.mark.timeout(60)
def test_without_received_events_a_round_is_the_senders_step_plus_one():
    res = collective_run("all_reduce", "ring", 4, 8 * 8, record_steps=False)
    assert not [e for e in res.trace.events if e.kind in ("received", "step", "work")]
    rounds = round_of(res.trace, 0)
    assert all(k == res.trace.events[i].step + 1 for i, k in rounds.of.items())
    assert rounds.count == 6


def test_rounds_reject_a_cycle_and_tables_a_negative_step():
    def msg(src, dst, step):
        return Event(src, "message", "all_reduce", peer=dst, tag=0, collective_id=0, step=step)

    def got(dst, src, step):
        return Event(dst, "received", "all_reduce", peer=src, tag=0, collective_id=0, step=step)

    # rank 0 sends after receiving rank 1's message, which rank 1 sent after receiving rank 0's
    trace = Trace([msg(0, 1, 1), msg(1, 0, 1), got(0, 1, 0), got(1, 0, 0)])
    with pytest.raises(ValueError, match="cycle"):
        round_of(trace, 0)
    res = collective_run("broadcast", "binomial", 4, 64)
    with pytest.raises(ValueError, match="step=-1"):
        buffer_table(res.trace, -1)
