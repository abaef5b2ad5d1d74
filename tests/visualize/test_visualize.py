"""simdist.visualize: step graphs, buffer tables, timelines, wait-for graphs, algorithm comparison, figures."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import simdist as dist
from simdist import ReduceOp
from simdist.algorithms import ALGORITHMS, FORMULAS, cost
from simdist.visualize import (
    Crossover,
    buffer_figure,
    buffer_table,
    chunk_colors,
    collective_run,
    compare_algorithms,
    comparison_figure,
    crossovers,
    graph_figure,
    positions,
    rank_colors,
    step_graph,
    steps,
    timeline,
    timeline_figure,
    wait_for,
    wait_for_figure,
)

WORLDS = [2, 3, 4, 5, 6, 7, 8, 16]


class _Counting:
    """A transport that moves no data and counts each rank's sends per step (one step per yield)."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size, self.step, self.sent = rank, size, 0, {}

    def isend(self, buf, peer, tag=0, *, chunk=None):
        self.sent[self.step] = self.sent.get(self.step, 0) + 1

    def irecv(self, buf, peer, tag=0, *, chunk=None):
        return None

    def wait(self, handles):
        pass


def _sends_per_step(op: str, name: str, world: int, n: int) -> dict[int, int]:
    """Messages the algorithm sends in each step, summed over ranks, by running it without a network."""
    total: dict[int, int] = {}
    for rank in range(world):
        t = _Counting(rank, world)
        buf = np.zeros(n)
        gen = ALGORITHMS[op][name](t, buf, ReduceOp.SUM) if op == "all_reduce" else ALGORITHMS[op][name](t, buf, 0)
        for _ in gen:
            t.step += 1
        for s, k in t.sent.items():
            total[s] = total.get(s, 0) + k
    return total


CASES = [("all_reduce", "ring"), ("all_reduce", "recursive_doubling"), ("all_reduce", "rabenseifner"),
         ("broadcast", "binomial")]  # fmt: skip


@pytest.mark.timeout(60)
@pytest.mark.parametrize("op,name", CASES)
def test_rounds_draw_every_message_once(op, name):
    for world in WORLDS:
        n = 4 * world + 1  # uneven chunks
        res = collective_run(op, name, world, 8 * n)
        expected = _sends_per_step(op, name, world, n)
        rounds = steps(res.trace)
        assert rounds == list(range(1, len(rounds) + 1))
        got = [step_graph(res.trace, k).number_of_edges() for k in rounds]
        assert all(got) and sum(got) == sum(expected.values()), (world, got, expected)
        g = step_graph(res.trace, rounds[0])
        assert sorted(n for n in g.nodes) == list(range(world))
        assert all(len(g.nodes[r]["pos"]) == 2 for r in g.nodes)
        for _, _, d in g.edges(data=True):
            assert d["nbytes"] > 0 and d["t_end"] >= d["t_start"]


@pytest.mark.timeout(30)
def test_positions_cover_every_rank_for_each_topology():
    for topo in ("switch", "ring", "fully_connected", "two_level"):
        pos = positions(topo, 16)
        pts = [pos[r] for r in range(16)]
        assert len(set(pts)) == 16, topo
    assert "spine" in positions("two_level", 16) and "switch" in positions("switch", 4)


@pytest.mark.timeout(30)
def test_buffer_table_after_last_ring_step_holds_the_sum_everywhere():
    world = 16
    res = collective_run("all_reduce", "ring", world, 8 * 64)
    last = steps(res.trace)[-1]
    table = buffer_table(res.trace, last)
    assert len(table.rows) == world and table.encoding == "bits"
    for row in table.rows:
        assert len(row.cells) == 64
        for cell in row.cells:
            assert cell.value == 2**world - 1
            assert cell.ranks == tuple(range(world))
    chunks = [c.chunk for c in table.rows[0].cells]
    assert chunks == [i // 4 for i in range(64)]
    before = buffer_table(res.trace, 0)
    assert all(c.ranks == (r.rank,) for r in before.rows for c in r.cells)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", sorted(ALGORITHMS["all_gather"]))
def test_all_gather_origins_chunk_i_from_rank_i(name):
    world, m = 6, 3
    res = collective_run("all_gather", name, world, 8 * m * world)
    table = buffer_table(res.trace)  # after the collective
    assert all(row.source == "final" for row in table.rows)
    for row in table.rows:
        assert [c.origin for c in row.cells] == [i // m for i in range(world * m)]
        assert all(c.chunk == c.origin for c in row.cells)
    if name == "ring":  # blocks land in place at every step: anything present sits in its own chunk
        for s in steps(res.trace):
            for row in buffer_table(res.trace, s).rows:
                assert all(c.origin == c.chunk for c in row.cells if c.ranks)


@pytest.mark.timeout(30)
def test_timeline_lanes_arrows_and_no_contention_in_a_ring_all_reduce():
    world = 8
    res = collective_run("all_reduce", "ring", world, 1 << 16)
    tl = timeline(res.trace)
    assert sorted(tl.lanes) == list(range(world))
    assert all(len(tl.lanes[r]) == 1 and tl.lanes[r][0].kind == "collective" for r in range(world))
    assert len(tl.arrows) == len(res.trace.of_kind("message")) == 2 * (world - 1) * world
    assert {(a.src, a.dst) for a in tl.arrows} == {(r, (r + 1) % world) for r in range(world)}
    assert tl.contention == []
    assert set(tl.links) == {(r, "switch") for r in range(world)} | {("switch", r) for r in range(world)}


def _two_to_one(rank):
    dist.init_process_group("sim", rank=rank, world_size=4)
    x = torch.zeros(1 << 14)
    if rank in (1, 2):
        dist.send(x, dst=0)
    elif rank == 0:
        reqs = [dist.irecv(torch.zeros(1 << 14), src=s) for s in (1, 2)]
        for r in reqs:
            r.wait()
    dist.destroy_process_group()


def _disjoint_pairs(rank):
    dist.init_process_group("sim", rank=rank, world_size=4)
    x = torch.zeros(1 << 14)
    if rank % 2 == 0:
        dist.send(x, dst=rank + 1)
    else:
        dist.recv(x, src=rank - 1)
    dist.destroy_process_group()


@pytest.mark.timeout(30)
def test_timeline_detects_contention_on_a_shared_switch_link():
    tl = timeline(dist.simulate(_two_to_one, 4, topology="switch", seed=0).trace)
    assert len(tl.arrows) == 2
    assert tl.contention and all(c.link == ("switch", 0) for c in tl.contention)
    first, second = sorted(tl.arrows, key=lambda a: a.t_start)
    assert second.t_start >= first.t_start + first.nbytes / 12.5e9 - 1e-15  # it queued behind the first
    clear = timeline(dist.simulate(_disjoint_pairs, 4, topology="switch", seed=0).trace)
    assert len(clear.arrows) == 2 and clear.contention == []
    assert sorted(clear.lanes) == [0, 1, 2, 3]


def _recv_from_next(rank, world):
    dist.init_process_group("sim", rank=rank, world_size=world)
    dist.recv(torch.zeros(1), src=(rank + 1) % world)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("world", [2, 16])
def test_wait_for_graph_of_a_real_deadlock_has_the_cycle(world):
    with pytest.raises(dist.DeadlockError) as info:
        dist.simulate(_recv_from_next, world, args=(world,), seed=0)
    g = wait_for(info.value)
    cycle = g.graph["cycle"]
    assert sorted(cycle) == list(range(world))
    for a, b in zip(cycle, cycle[1:] + cycle[:1]):
        assert g.has_edge(a, b) and g.edges[a, b]["in_cycle"]
    for r in range(world):
        label = g.nodes[r]["label"]
        assert f"recv(src={(r + 1) % world}" in label and "test_visualize.py:" in label
        assert len(g.nodes[r]["pos"]) == 2
    fig = wait_for_figure(g)
    assert type(fig).__name__ == "Figure"


@pytest.mark.timeout(10)
def test_crossovers_on_a_synthetic_case():
    sizes = [1, 10, 100, 1000]
    times = {"latency": [1.0, 1.1, 2.0, 11.0], "bandwidth": [3.0, 3.0, 3.0, 3.0], "never": [9.0] * 4}
    assert crossovers(sizes, times) == [Crossover(100, 1000, "latency", "bandwidth")]
    assert crossovers(sizes, {"a": [1, 2, 1, 2], "b": [2, 1, 2, 1]}) == [
        Crossover(1, 10, "a", "b"), Crossover(10, 100, "b", "a"), Crossover(100, 1000, "a", "b")]  # fmt: skip
    assert crossovers(sizes, {"a": [1, 1, 1, 1], "b": [1, 1, 1, 1]}) == []  # ties: the first listed
    with pytest.raises(ValueError, match="times"):
        crossovers(sizes, {"a": [1, 2]})


@pytest.mark.timeout(60)
def test_compare_algorithms_gives_a_curve_and_formula_per_algorithm():
    sizes = [1 << 20, 64]
    cmp = compare_algorithms("all_reduce", 4, sizes)
    assert cmp.sizes == (64, 1 << 20)
    assert [c.algorithm for c in cmp.curves] == list(ALGORITHMS["all_reduce"])
    for c in cmp.curves:
        assert c.formula == FORMULAS["all_reduce"][c.algorithm]
        assert len(c.simulated) == len(c.model) == 2 and all(t > 0 for t in c.simulated)
        assert list(c.model) == [cost("all_reduce", c.algorithm, n, 4, cmp.alpha, cmp.beta) for n in cmp.sizes]
    assert list(cmp.crossovers) == crossovers(cmp.sizes, {c.algorithm: c.simulated for c in cmp.curves})
    rd = next(c for c in cmp.curves if c.algorithm == "recursive_doubling")
    rab = next(c for c in cmp.curves if c.algorithm == "rabenseifner")
    assert rd.simulated[0] < rab.simulated[0] and rab.simulated[1] < rd.simulated[1]


@pytest.mark.timeout(60)
def test_every_figure_builder_works_at_world_16():
    res = collective_run("all_reduce", "rabenseifner", 16, 1 << 20)
    figs = [
        graph_figure(step_graph(res.trace, steps(res.trace)[0])),
        graph_figure(step_graph(collective_run("all_to_all", "direct", 16, 4096, "two_level").trace, 1)),
        buffer_figure(buffer_table(res.trace, steps(res.trace)[2])),
        buffer_figure(buffer_table(collective_run("all_to_all", "bruck", 16, 8 * 64).trace, 1)),
        timeline_figure(timeline(res.trace)),
        timeline_figure(timeline(dist.simulate(_two_to_one, 4, seed=0).trace)),
        comparison_figure(compare_algorithms("broadcast", 16, [1024, 1 << 20])),
    ]
    for fig in figs:
        assert type(fig).__name__ == "Figure"
        fig.to_dict()


@pytest.mark.timeout(10)
def test_colors_are_stable_and_distinct_for_16_ranks():
    colors = rank_colors(16)
    assert len(set(colors)) == 16
    assert rank_colors(8) == colors[:8] and chunk_colors(16) == colors
    rgb = [tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)) for c in colors]
    assert min(sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5 for a, b in itertools.combinations(rgb, 2)) > 40
    assert len(set(rank_colors(40))) == 40


@pytest.mark.timeout(30)
def test_origins_of_moved_and_reduced_blocks():
    world, m = 5, 2
    a2a = buffer_table(collective_run("all_to_all", "pairwise", world, 8 * m * world).trace)
    for row in a2a.rows:  # block r of rank j's output is block j of rank r's input
        assert [(c.origin, c.source_chunk) for c in row.cells] == [(i // m, row.rank) for i in range(world * m)]
    rs = buffer_table(collective_run("reduce_scatter", "ring", world, 8 * m * world).trace)
    assert all(c.chunk == row.rank and c.ranks == tuple(range(world)) for row in rs.rows for c in row.cells)
    bc = collective_run("broadcast", "binomial", world, 8 * 10)
    before = buffer_table(bc.trace, 0)
    assert [c.origin for c in before.rows[0].cells] == [0] * 10
    assert all(not c.ranks for row in before.rows[1:] for c in row.cells)
    assert all(c.origin == 0 for row in buffer_table(bc.trace).rows for c in row.cells)
