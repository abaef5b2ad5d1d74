"""Virtual time, topologies, link contention, the two levels of detail, and traces."""

from __future__ import annotations

import json
import time

import networkx as nx
import pytest
import torch

import simdist
import simdist as dist
import simdist.sim
from simdist import algorithms
from simdist.core._topology import DEFAULT_ALPHA, DEFAULT_BANDWIDTH, as_topology, two_level

MB = 1 << 20


def one_message(rank, nbytes):
    dist.init_process_group("gloo")
    t = torch.zeros(nbytes // 4)
    if rank == 0:
        dist.send(t, dst=1)
    elif rank == 1:
        dist.recv(t, src=0)


def test_message_cost_is_alpha_plus_bytes_over_bandwidth():
    res = simdist.simulate(one_message, 2, (MB,))
    (msg,) = res.trace.of_kind("message")
    expected = 2 * DEFAULT_ALPHA + MB / DEFAULT_BANDWIDTH  # two links through the switch
    assert msg.t_end - msg.t_start == pytest.approx(expected)
    assert res.time == pytest.approx(expected)


def test_custom_graph_topology_uses_link_parameters():
    g = nx.Graph()
    g.add_edge(0, 1, alpha=1e-3, bandwidth=1e6)
    res = simdist.simulate(one_message, 2, (4000,), topology=g)
    (msg,) = res.trace.of_kind("message")
    assert msg.t_end - msg.t_start == pytest.approx(1e-3 + 4000 / 1e6)


def test_link_contention_serialises_messages_on_a_shared_link():
    def fan_in(rank):
        dist.init_process_group("gloo")
        t = torch.zeros(MB // 4)
        if rank == 0:
            works = [dist.irecv(torch.zeros(MB // 4), src=s) for s in (1, 2, 3)]
            for w in works:
                w.wait()
        else:
            dist.send(t, dst=0)

    res = simdist.simulate(fan_in, 4, topology="switch")
    msgs = sorted(res.trace.of_kind("message"), key=lambda e: e.t_start)
    per = MB / DEFAULT_BANDWIDTH
    assert [m.t_start for m in msgs] == pytest.approx([0.0, per, 2 * per])
    full = simdist.simulate(fan_in, 4, topology="fully_connected")
    assert [m.t_start for m in full.trace.of_kind("message")] == pytest.approx([0.0] * 3)
    assert res.time > 2.5 * full.time


def late_and_early_gather(rank):
    """Rank 1 reaches a linear gather to rank 0 after 1 ms of work, rank 2 at once: their messages share rank 0's
    downlink."""
    dist.init_process_group("gloo")
    if rank == 1:
        simdist.sim.compute(seconds=1e-3)
    t = torch.full((MB // 4,), float(rank))
    outs = [torch.zeros(MB // 4) for _ in range(3)] if rank == 0 else None
    dist.gather(t, outs, dst=0, algorithm="linear")
    dist.destroy_process_group()
    return None if outs is None else [o[0].item() for o in outs]


@pytest.mark.parametrize("strategy", ["round_robin", "random", "pct"])
def test_a_collectives_messages_take_a_shared_link_in_virtual_time_order(strategy):
    """Whichever rank the schedule runs first, rank 2's message (ready at 0) takes rank 0's downlink first and
    rank 1's (ready at 1 ms) then, as soon as it is ready: the link is shared in the order of virtual time, not in
    the order the ranks were simulated."""
    per = MB / DEFAULT_BANDWIDTH
    for seed in range(4):
        res = simdist.simulate(late_and_early_gather, 3, strategy=strategy, seed=seed)
        assert res.values[0] == [0.0, 1.0, 2.0]
        start = {m.rank: m.t_start for m in res.trace.of_kind("message")}
        assert start[2] == 0.0 and start[1] == pytest.approx(1e-3)
        assert 1e-3 > per  # (rank 2's message has left before rank 1's is ready)


@pytest.mark.parametrize("queues", [False, True])
def test_link_queues_let_a_link_serve_while_a_message_waits_for_its_far_link(queues):
    """Four machines, each sending n bytes to each other one at once (an all_to_all). Holding a whole route, a
    message waits with its uplink idle until the receiver's downlink is free too: 5 rounds in this order. With
    link queues every uplink and downlink stays busy: 3 rounds, what TCP's shared links take
    (BENCHMARKS.md (o))."""
    n, rate = 1 << 20, 125e6
    topo = two_level(4, per_node=1, intra_bandwidth=1e15, intra_alpha=0.0, inter_alpha=0.0, inter_bandwidth=rate)
    topo.link_queues = queues
    arrivals = [topo.transfer(a, b, n, 0.0)[1] for a in range(4) for b in range(4) if a != b]
    assert max(arrivals) / (n / rate) == pytest.approx(3.0 if queues else 5.0, rel=1e-6)
    assert topo.copy().link_queues is queues


def test_compute_advances_the_clock_and_overlaps_async_work():
    def program(rank, overlap):
        dist.init_process_group("gloo")
        t = torch.zeros(MB // 4)
        work = dist.all_reduce(t, async_op=True)
        if not overlap:
            work.wait()
        simdist.compute(seconds=1e-3)
        if overlap:
            work.wait()

    serial = simdist.simulate(program, 4, (False,)).time
    overlapped = simdist.simulate(program, 4, (True,)).time
    assert serial > overlapped >= 1e-3
    comm = serial - 1e-3
    assert overlapped == pytest.approx(max(1e-3, comm), rel=1e-6)
    res = simdist.simulate(program, 2, (True,))
    (c,) = [e for e in res.trace.of_kind("compute") if e.rank == 0]
    assert c.t_end - c.t_start == pytest.approx(1e-3)


@pytest.mark.parametrize(
    "op,algorithm", [("all_reduce", "ring"), ("all_reduce", "recursive_doubling"), ("broadcast", "binomial")]
)
def test_collectives_detail_charges_the_alpha_beta_cost(op, algorithm):
    def program(rank):
        dist.init_process_group("gloo")
        t = torch.ones(64 * 1024)
        if op == "all_reduce":
            dist.all_reduce(t, algorithm=algorithm)
        else:
            dist.broadcast(t, src=0, algorithm=algorithm)
        return float(t[0])

    res = simdist.simulate(program, 8, detail="collectives", topology="fully_connected")
    alpha, beta = DEFAULT_ALPHA, 1 / DEFAULT_BANDWIDTH
    assert res.time == pytest.approx(algorithms.cost(op, algorithm, 256 * 1024, 8, alpha, beta))
    assert res.values == [8.0 if op == "all_reduce" else 1.0] * 8
    messages = simdist.simulate(program, 8, detail="messages", topology="fully_connected")
    assert messages.values == res.values
    assert not res.trace.of_kind("message") and messages.trace.of_kind("message")


def test_collectives_detail_charges_hierarchical_for_the_machines():
    """On two machines of four ranks the hierarchical all_reduce costs its formula with k = 4, H = 2."""

    def program(rank):
        dist.init_process_group("gloo")
        t = torch.ones(64 * 1024)
        dist.all_reduce(t, algorithm="hierarchical")
        return float(t[0])

    res = simdist.simulate(program, 8, detail="collectives", topology="two_level")
    alpha, beta = as_topology("two_level", 8).alpha_beta()
    flat = algorithms.cost("all_reduce", "hierarchical", 256 * 1024, 8, alpha, beta)
    assert res.time == pytest.approx(
        algorithms.cost("all_reduce", "hierarchical", 256 * 1024, 8, alpha, beta, per_machine=4)
    )
    assert res.time < flat and res.values == [8.0] * 8


def test_collectives_detail_scales_to_a_thousand_ranks():
    def program(rank):
        dist.init_process_group("gloo")
        t = torch.ones(256)
        dist.all_reduce(t)
        return float(t[0])

    res = simdist.simulate(program, 1024, detail="collectives")
    assert set(res.values) == {1024.0}


def test_named_topologies_route_every_pair():
    for name in simdist.TOPOLOGIES:
        topo = as_topology(name, 10)
        for a in range(10):
            for b in range(10):
                if a != b:
                    links, alpha, bw = topo.path(a, b)
                    assert links[0][0] == a and links[-1][1] == b and alpha > 0 and bw > 0
        if name != "fully_connected":
            assert all(r in topo.graph for r in range(10))


def test_two_level_is_slower_across_nodes():
    topo = as_topology("two_level", 8)
    assert topo.path(0, 1)[1] < topo.path(0, 5)[1]
    assert topo.path(0, 1)[2] > topo.path(0, 5)[2]


def _all_reduce_algorithm(rank: int, n: int) -> str:
    dist.init_process_group("gloo")
    t = torch.ones(n)
    dist.all_reduce(t)
    assert (t == dist.get_world_size()).all()
    dist.destroy_process_group()
    return rank


@pytest.mark.parametrize(
    ("topology", "n", "expected"),
    [
        ("two_level", 1 << 18, "hierarchical"),  # 2 machines of 4 ranks
        ("two_level", 1 << 10, None),  # small: the model's choice
        ("switch", 1 << 18, None),  # one machine
    ],
)
def test_the_choice_across_machines_is_the_socket_backends(topology, n, expected):
    """On a topology of machines the simulator picks an all_reduce as the socket backend does across machines."""
    res = simdist.simulate(_all_reduce_algorithm, 8, (n,), topology=topology)
    picked = {e.algorithm for e in res.trace.events if e.op == "all_reduce"}
    alpha, beta = as_topology(topology, 8).alpha_beta()
    model = algorithms.choose("all_reduce", 4 * n, 8, alpha=alpha, beta=beta)
    assert picked == {expected or model} and model != "hierarchical", picked


def test_trace_events_and_chrome_json():
    def program(rank):
        dist.init_process_group("gloo")
        t = torch.arange(8.0) + rank
        dist.all_reduce(t, algorithm="ring")
        if rank == 0:
            dist.send(t, dst=1)
        elif rank == 1:
            dist.recv(t, src=0)

    res = simdist.simulate(program, 4)
    kinds = {e.kind for e in res.trace}
    assert {"message", "collective", "step", "send", "recv"} <= kinds
    for e in res.trace.of_kind("message"):
        assert e.t_end >= e.t_start and e.peer is not None and e.call_site
    steps = [e for e in res.trace.of_kind("step") if e.rank == 0]
    assert steps and all(len(e.snapshot) == 8 for e in steps)
    assert steps[-1].snapshot == [float(6 + 4 * i) for i in range(8)]
    chrome = json.loads(res.trace.to_chrome_json())
    assert {ev["ph"] for ev in chrome["traceEvents"]} >= {"M", "X", "s", "f", "i"}
    names = {ev["args"]["name"] for ev in chrome["traceEvents"] if ev["ph"] == "M"}
    assert names == {f"rank {r}" for r in range(4)}
    back = simdist.Trace.from_json(res.trace.to_json())
    assert back.events == res.trace.events and back.meta == res.trace.meta


def timed_waits(rank):
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    results = []
    if rank == 0:
        for timeout in (10.0, 1.0, 1.0):  # rank 1 sends at 2 s of virtual time, then never again
            try:
                dist.irecv(t, src=1).wait(timeout=timeout)
                results.append(("received", t.item()))
            except simdist.DistTimeoutError as exc:
                results.append(("timed out", str(exc)))
    else:
        dist.compute(seconds=2.0)
        dist.send(torch.ones(1), dst=0)
    dist.barrier()
    dist.destroy_process_group()
    return results


def test_a_wait_with_a_timeout_ends_in_virtual_time():
    values = simdist.simulate(timed_waits, 2, leaks="ignore").values
    received, late, alone = values[0]
    assert received == ("received", 1.0)
    # the next message never comes: the wait times out once no other rank can run (rank 1 is in the barrier)
    assert late[0] == alone[0] == "timed out" and "within its timeout of 1 s (virtual time)" in late[1]


_WITHOUT_NETWORKX = """
import sys
import torch
import simdist


def one(rank):
    simdist.init_process_group("gloo")
    t = torch.ones(4)
    simdist.all_reduce(t)
    simdist.destroy_process_group()
    return float(t[0])


assert simdist.simulate(one, 4).values == [4.0] * 4
assert simdist.simulate(one, 4, topology="ring").values == [4.0] * 4  # (its routes are computed without a graph)
print("networkx" in sys.modules)


def stuck(rank):
    simdist.init_process_group("gloo")
    if rank:
        simdist.barrier()


try:
    simdist.simulate(stuck, 3)
except simdist.DeadlockError as err:
    print(sorted(err.graph.edges))
"""


@pytest.mark.timeout(120)
def test_networkx_is_imported_only_when_a_graph_is_needed():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_NETWORKX], capture_output=True, text=True, timeout=110, check=True
    ).stdout.split("\n")
    assert out[0] == "False"  # named topologies route without it (importing it took 0.15 s of a first run)
    assert out[1] == "[(1, 0), (2, 0)]"  # a deadlock's wait-for graph is still a networkx graph


def two_ring_all_reduces(rank):
    dist.init_process_group("gloo")
    t = torch.ones(1 << 20)
    dist.all_reduce(t, algorithm="ring")
    dist.all_reduce(t, algorithm="ring")
    dist.destroy_process_group()


def test_with_cpu_time_the_rank_that_completes_a_collective_is_not_charged_for_simulating_it():
    """With ``cpu_time=True`` a rank's clock gains its own CPU time. The last member to join a collective runs
    every member's messages in its thread (round robin: rank 7); that work is the simulator's, not the rank's:
    its clock moves between the two all_reduces by its own few calls, 4% of the run's CPU time here (the code
    before charged it the whole collective: 24-25%). A first run takes the costs a process pays once."""
    simdist.simulate(two_ring_all_reduces, 8, cpu_time=True, strategy="round_robin")
    shares = []
    for _ in range(3):  # the least of three: a busy machine's noise only adds CPU time to a run
        cpu = time.process_time()
        res = simdist.simulate(two_ring_all_reduces, 8, cpu_time=True, strategy="round_robin")
        cpu = time.process_time() - cpu
        by_rank: dict[int, list] = {}
        for e in res.trace.of_kind("collective"):
            by_rank.setdefault(e.rank, []).append(e)
        gap = {r: b[1].t_start - b[0].t_end for r, b in by_rank.items()}
        shares.append(gap[7] / cpu)
    assert min(shares) < 0.12, shares
