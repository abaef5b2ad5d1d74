"""Topologies with ``flows``: a collective's messages as TCP flows, timed against hand-counted shares of the links."""

from __future__ import annotations

import pytest
import torch

import simdist
import simdist as dist
from simdist.core._flows import Flows
from simdist.core._topology import two_level
from simdist.algorithms._chunks import CHAIN_SEGMENT_BYTES as SEGMENT

N, RATE = 1 << 20, 125e6
T = N / RATE  # one message alone on a link


def hosts(n: int, flows: bool = True, burst: float = 0.0, send_buffer: int = 0):
    """``n`` hosts of one rank, uplinks and downlinks of ``RATE``, no latency, links inside a host as good as free."""
    topo = two_level(n, per_node=1, intra_bandwidth=1e18, intra_alpha=0.0, inter_alpha=0.0, inter_bandwidth=RATE,
                     inter_burst=burst)  # fmt: skip
    topo.flows, topo.send_buffer = flows, send_buffer
    return topo


def ends(flows: Flows) -> dict[int, float]:
    """Run ``flows`` to the end: each flow's end."""
    got = {}
    while flows:
        assert flows.next_event()[2]
        got.update((key, end) for key, _, end in flows.end_due())
    return got


def test_two_flows_on_one_link_share_it_and_the_link_stays_busy():
    """Flow 0 alone until T/2, then both at half the rate: flow 0 ends at 1.5 T, flow 1 (half left) at 2 T."""
    flows = Flows(hosts(3))
    assert flows.start(0, 0, 1, N, 0.0) is None
    assert flows.next_event() == (pytest.approx(T), 0, True)
    assert flows.start(1, 2, 1, N, T / 2) is None  # both cross rank 1's downlink
    assert ends(flows) == {0: pytest.approx(1.5 * T), 1: pytest.approx(2 * T)}


def test_a_flow_held_elsewhere_leaves_the_rest_of_a_link_to_the_others():
    """Three flows into rank 1 get a third of its downlink each; the flow from rank 2 to rank 3 shares rank 2's
    uplink with one of them and takes the two thirds that one cannot use (max-min fairness), ending at 1.5 T
    rather than 2 T (an equal split of the uplink)."""
    flows = Flows(hosts(4))
    for key, (a, b) in enumerate([(0, 1), (2, 1), (3, 1), (2, 3)]):
        assert flows.start(key, a, b, N, 0.0) is None
    got = ends(flows)
    assert got[3] == pytest.approx(1.5 * T)
    assert [got[k] for k in range(3)] == pytest.approx([3 * T] * 3)


def test_a_bucket_with_credit_passes_that_much_at_once():
    """A link idle long enough holds ``burst`` bytes of credit: a message that fits passes at once, a larger
    one passes the credit at once and the rest at the rate; the credit is then spent."""
    burst = N / 4
    flows = Flows(hosts(2, burst=burst))
    flows.start(0, 0, 1, N // 8, 1.0)
    assert ends(flows) == {0: 1.0}
    flows.start(1, 0, 1, N, 1.0)  # (N / 8 of the credit left on each link)
    assert ends(flows) == {1: pytest.approx(1.0 + (N - burst + N // 8) / RATE)}
    flows.start(2, 0, 1, N, 10.0)  # idle long enough: full again
    assert ends(flows) == {2: pytest.approx(10.0 + (N - burst) / RATE)}


def folded_all_reduce(rank):
    """A recursive-doubling all_reduce at world 3: rank 0 hands its buffer to rank 1, ranks 1 and 2 exchange
    theirs, rank 1 hands the sum back to rank 0."""
    dist.init_process_group("gloo")
    t = torch.full((N // 4,), float(rank + 1))
    dist.all_reduce(t, algorithm="recursive_doubling")
    dist.destroy_process_group()
    return t[0].item()


def test_a_send_leaves_when_posted_and_shares_the_receivers_link():
    """Rank 2 posts its send to rank 1 at once; as the socket backend's sender thread does, its bytes leave then,
    sharing rank 1's downlink with rank 0's: both arrive at 2 T, then the exchange's other half and the way back
    take T each (4 T, what the socket backend measured between shaped hosts: BENCHMARKS.md (r)). Without flows a
    send waits for its receive: 3 T."""
    shared = simdist.simulate(folded_all_reduce, 3, topology=hosts(3))
    held = simdist.simulate(folded_all_reduce, 3, topology=hosts(3, flows=False))
    assert shared.values == held.values == [6.0, 6.0, 6.0]
    assert held.time == pytest.approx(3 * T)
    assert shared.time == pytest.approx(4 * T)
    first = sorted((m.t_end, m.rank, m.peer) for m in shared.trace.of_kind("message"))[:2]
    assert [(a, b) for _, a, b in first] == [(0, 1), (2, 1)] and [t for t, _, _ in first] == pytest.approx([2 * T] * 2)


def tree_broadcast(rank):
    """A binomial broadcast at world 4: rank 0 sends to rank 2, then to rank 1 while rank 2 sends to rank 3."""
    dist.init_process_group("gloo")
    t = torch.full((N // 4,), 5.0) if rank == 0 else torch.zeros(N // 4)
    dist.broadcast(t, src=0, algorithm="binomial")
    dist.destroy_process_group()
    return t[-1].item()


def test_a_send_that_fits_in_the_senders_buffer_completes_at_once():
    """With ``send_buffer`` >= N the root's send to rank 2 returns at once (the socket backend's send is done when
    its bytes are in the kernel), so its send to rank 1 shares the root's uplink with it: rank 2 has the buffer at
    2 T and rank 3 at 3 T. Without it each send waits for its bytes to arrive: 2 T in all. The flow of a larger
    send is reported when N bytes are left: its send returns then."""
    kept = simdist.simulate(tree_broadcast, 4, topology=hosts(4, send_buffer=N))
    plain = simdist.simulate(tree_broadcast, 4, topology=hosts(4))
    assert kept.values == plain.values == [5.0] * 4
    assert plain.time == pytest.approx(2 * T) and kept.time == pytest.approx(3 * T)
    flows = Flows(hosts(2))
    flows.start(0, 0, 1, 3 * N, 0.0, mark=N)
    assert flows.next_event() == (pytest.approx(2 * T), 0, False)
    assert flows.marked(0) == pytest.approx(2 * T) and flows.next_event() == (pytest.approx(3 * T), 0, True)


def chain(rank):
    """A pipelined chain broadcast of 16 MiB from rank 0: eight segments of ``CHAIN_SEGMENT_BYTES``."""
    dist.init_process_group("gloo")
    t = torch.full((8 * SEGMENT // 4,), 7.0) if rank == 0 else torch.zeros(8 * SEGMENT // 4)
    dist.broadcast(t, src=0, algorithm="chain_pipelined")
    dist.destroy_process_group()
    return t.sum().item()


def test_a_pairs_messages_follow_each_other_on_its_connection():
    """The root posts its eight segments' sends at once; one connection carries them one after another, so each
    arrives a segment time after the one before and rank 1 forwards it on: the chain ends after 9 segment times,
    not after 16 (all eight sharing the link, then forwarded)."""
    res = simdist.simulate(chain, 3, topology=hosts(3))
    assert res.values == [7.0 * 2 * SEGMENT] * 3
    seg = SEGMENT / RATE
    arrivals = sorted(m.t_end for m in res.trace.of_kind("message") if m.rank == 0)
    assert arrivals == pytest.approx([(k + 1) * seg for k in range(8)])
    assert res.time == pytest.approx(9 * seg)


def ring_program(rank):
    dist.init_process_group("gloo")
    t = torch.arange(N // 4, dtype=torch.float32) * (rank + 1)
    for algorithm in ("ring", "recursive_doubling", "rabenseifner"):
        dist.all_reduce(t, algorithm=algorithm)
    out = [torch.zeros(N // 16) for _ in range(4)]
    dist.all_gather(out, t[: N // 16], algorithm="bruck")
    dist.destroy_process_group()
    return [float(o.sum()) for o in out]


@pytest.mark.parametrize("strategy", ["round_robin", "random"])
def test_flows_keep_values_determinism_and_replay(strategy):
    """The same results as without flows; the same seed gives the same trace, event for event, and the token
    replays it."""
    topo = hosts(4, burst=N / 3)
    a = simdist.simulate(ring_program, 4, topology=topo, strategy=strategy, seed=3)
    b = simdist.simulate(ring_program, 4, topology=topo, strategy=strategy, seed=3)
    plain = simdist.simulate(ring_program, 4, topology=hosts(4, flows=False), strategy=strategy, seed=3)
    assert a.values == plain.values
    assert a.trace.events == b.trace.events and len(a.trace.of_kind("message")) > 0
    again = simdist.simulate(ring_program, 4, topology=topo, schedule=a.schedule)
    assert again.time == a.time and again.trace.events == a.trace.events


def test_flows_record_the_steps_the_visualizer_shows():
    """With ``record_steps`` (the Collectives page's runs) a flows topology records each step and each receive,
    as the default one does: the same rows but for their times."""
    kinds = ("step", "work", "received")

    def rows(res):
        return [(e.kind, e.rank, e.peer, e.step, e.snapshot) for e in res.trace.events if e.kind in kinds]

    shared = simdist.simulate(ring_program, 4, topology=hosts(4, send_buffer=N), record_steps=True)
    plain = simdist.simulate(ring_program, 4, topology=hosts(4, flows=False), record_steps=True)
    assert shared.values == plain.values
    assert len(rows(shared)) > 40 and sorted(rows(shared), key=repr) == sorted(rows(plain), key=repr)
