"""The cost model's setup terms: fresh_from, memcpy, check_overhead, call_overhead, and the copies and page faults
inside algorithms on the host's cores (each counted another way)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import simdist
import simdist as dist
from simdist.core import _topology_file as F
from simdist.launch._calibrate import fit_check, fit_memory
from simdist.core._topology import FRESH_BYTES, Topology, fully_connected
from simdist.algorithms._chunks import copy
from simdist.algorithms._transport import Timed

ALPHA, BANDWIDTH = 5e-6, 1e9
MIB = 1 << 20
FLOAT = 4

pytestmark = pytest.mark.timeout(60)


def _topo(world: int, **terms) -> Topology:
    topo = fully_connected(world, ALPHA, BANDWIDTH)
    for key, value in terms.items():
        setattr(topo, key, value)
    return topo


def _ends(program, world: int, **terms) -> list[float]:
    """Each rank's end of its last collective on a fully connected network with ``terms`` set."""
    res = simdist.simulate(program, world, topology=_topo(world, **terms))
    ends = [0.0] * world
    for e in res.trace.events:
        if e.kind == "collective":
            ends[e.rank] = max(ends[e.rank], e.t_end)
    return ends


# --- what each term adds ------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("term", ["check_overhead", "call_overhead"])
def test_check_and_call_overheads_delay_every_rank_alike(world, term):
    """Every rank starts the collective later by ceil(log2 p) rounds of the check, or by the call overhead."""
    seconds = 3e-5

    def program(rank):
        dist.init_process_group("gloo")
        dist.all_reduce(torch.ones(1 << 10), algorithm="ring")

    base = _ends(program, world)
    more = _ends(program, world, **{term: seconds})
    rounds = math.ceil(math.log2(world))
    expected = rounds * seconds if term == "check_overhead" else seconds
    assert [m - b for m, b in zip(more, base)] == pytest.approx([expected] * world, rel=1e-9)


def test_one_rank_groups_pay_no_check_or_call():
    def program(rank):
        dist.init_process_group("gloo")
        dist.all_reduce(torch.ones(8))

    assert _ends(program, 1, check_overhead=1e-3, call_overhead=1e-3) == _ends(program, 1)


@pytest.mark.parametrize("fresh_from", [4 * MIB, 8 * MIB])
def test_gather_lists_stage_a_new_buffer_and_copy_it_on_the_root(fresh_from):
    """gather's root allocates p * n bytes for the gather_list (fresh from fresh_from) and copies them out; linear
    gather copies the root's own n bytes into place."""
    world, numel, fresh, memcpy = 3, 1 << 19, 3e-10, 5e-11  # 2 MiB a rank, 6 MiB on the root
    total = world * numel * FLOAT

    def program(rank):
        dist.init_process_group("gloo")
        outs = [torch.empty(numel) for _ in range(world)] if rank == 0 else None
        dist.gather(torch.ones(numel), outs, dst=0, algorithm="linear")

    base = _ends(program, world)
    more = _ends(program, world, fresh_memory=fresh, fresh_from=fresh_from, memcpy=memcpy)
    faults = total * fresh if total >= fresh_from else 0.0
    own = numel * FLOAT
    assert more[0] - base[0] == pytest.approx(faults + (total + own) * memcpy, rel=1e-9)
    assert all(m - b <= more[0] - base[0] + 1e-15 for m, b in zip(more[1:], base[1:]))  # senders wait for it


def test_scatter_and_all_to_all_lists_count_every_staged_byte():
    """scatter's root concatenates its list (p n bytes); all_to_all with lists stages input and output (2 p n);
    each also copies the rank's own block (n bytes) inside the algorithm."""
    world, numel, memcpy = 2, 1 << 10, 1e-9

    def scatter(rank):
        dist.init_process_group("gloo")
        ins = [torch.ones(numel) for _ in range(world)] if rank == 0 else None
        dist.scatter(torch.empty(numel), ins, src=0, algorithm="linear")

    def all_to_all(rank):
        dist.init_process_group("gloo")
        outs = [torch.empty(numel) for _ in range(world)]
        dist.all_to_all(outs, [torch.ones(numel) for _ in range(world)], algorithm="pairwise")

    root_extra = _ends(scatter, world, memcpy=memcpy)[0] - _ends(scatter, world)[0]
    assert root_extra == pytest.approx((world + 1) * numel * FLOAT * memcpy, rel=1e-9)
    extra = [m - b for m, b in zip(_ends(all_to_all, world, memcpy=memcpy), _ends(all_to_all, world))]
    assert extra == pytest.approx([(2 * world + 1) * numel * FLOAT * memcpy] * world, rel=1e-9)


def test_tensor_forms_stage_nothing():
    """all_gather_into_tensor and reduce_scatter_tensor work in the caller's tensors: memcpy adds only the ring's
    own copies (all_gather: the rank's input into its block; reduce_scatter: the finished block into the output)."""
    world, numel, memcpy = 2, 1 << 12, 1e-6

    def program(rank):
        dist.init_process_group("gloo")
        dist.all_gather_into_tensor(torch.empty(world * numel), torch.ones(numel), algorithm="ring")
        dist.reduce_scatter_tensor(torch.empty(numel), torch.ones(world * numel), algorithm="ring")

    extra = [m - b for m, b in zip(_ends(program, world, memcpy=memcpy), _ends(program, world))]
    assert extra == pytest.approx([2 * numel * FLOAT * memcpy] * world, rel=1e-9)


def test_fresh_from_is_the_smallest_buffer_charged():
    topo = _topo(2, fresh_memory=2e-10, fresh_from=32 * MIB)
    assert topo.fresh(32 * MIB - 1) == 0.0 and topo.fresh(32 * MIB) == 32 * MIB * 2e-10
    assert _topo(2).fresh_from == FRESH_BYTES and topo.copy().fresh_from == 32 * MIB


# --- copies and page faults inside the algorithms ----------------------------------------------------


class _Tally(Timed):
    """A timed transport that adds up what it is charged (the real ``copy`` helper calls it)."""

    def __init__(self):
        self.copied_bytes = 0

    def copied(self, nbytes: int) -> None:
        self.copied_bytes += nbytes


def test_copy_charges_the_bytes_of_its_destination_and_copies_them():
    t, src, dst = _Tally(), torch.arange(6.0), torch.zeros(6)
    copy(t, dst, src)
    assert t.copied_bytes == 6 * FLOAT and torch.equal(dst, src)
    copy(object(), dst, torch.ones(6))  # an untimed transport (the socket backend's) charges nothing
    assert torch.equal(dst, torch.ones(6))


@pytest.mark.parametrize(("world", "blocks"), [(4, 4 + 2 * 2 + 2 * 2 + 4), (5, 5 + 2 * 2 + 2 * 2 + 2 * 1 + 5)])
def test_bruck_all_to_all_charges_every_block_it_packs_and_unpacks(world, blocks):
    """Bruck copies p blocks into its slots, packs and unpacks the blocks whose distance has bit k set at step k
    (world 4: 2 and 2; world 5: 2, 2 and 1), and copies p blocks out: every rank, alike."""
    numel, memcpy = 1 << 10, 1e-9

    def program(rank):
        dist.init_process_group("gloo")
        dist.all_to_all_single(torch.empty(world * numel), torch.ones(world * numel), algorithm="bruck")

    extra = [m - b for m, b in zip(_ends(program, world, memcpy=memcpy), _ends(program, world))]
    assert extra == pytest.approx([blocks * numel * FLOAT * memcpy] * world, rel=1e-9)


def test_a_rank_keeps_its_core_and_leaves_the_other_to_its_neighbour():
    """Of the cores free by the time a rank is ready it takes the one it (or anyone) freed last."""
    topo = _topo(2, host_cores=2)
    assert topo.compute(0, 1.0, 0.0) == 1.0 and topo.compute(0, 1.0, 1.0) == 2.0
    assert topo.compute(1, 1.0, 0.0) == 1.0  # the second core stayed free for rank 1
    assert topo.compute(1, 1.0, 0.5) == 2.0  # both busy (until 2.0 and 1.0): the one free first


@pytest.mark.parametrize("cores", [1, 2])
def test_scratch_faults_of_ranks_on_one_host_share_its_cores(cores):
    """Two ranks that fault in a new scratch buffer at the same time on a host of one core take turns: the host's
    last rank ends n * fresh_memory later than on two cores."""
    world, numel, fresh = 2, 1 << 18, 1e-9
    nbytes = numel * FLOAT

    def program(rank):
        dist.init_process_group("gloo")
        dist.all_reduce(torch.ones(numel), algorithm="recursive_doubling")

    terms = {"fresh_memory": fresh, "fresh_from": 1}
    free = _ends(program, world, **terms)
    shared = _ends(program, world, host_cores=cores, **terms)
    assert max(shared) - max(free) == pytest.approx((2 - cores) * nbytes * fresh, rel=1e-9)


# --- calibration's arithmetic -----------------------------------------------------------------------


def test_fit_memory_finds_the_threshold_the_fault_cost_and_the_copy_rate():
    fault, copy = 3e-10, 5e-11
    sizes = [4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB, 64 * MIB, 128 * MIB]
    used = {n: copy for n in sizes}
    fresh = {n: copy + (fault if n >= 32 * MIB else 0.01 * fault) for n in sizes}
    assert fit_memory(fresh, used) == pytest.approx({"fresh_memory": fault, "fresh_from": 32 * MIB, "memcpy": copy})
    everywhere = {n: copy + fault for n in sizes}
    assert fit_memory(everywhere, used)["fresh_from"] == 4 * MIB


def test_fit_check_divides_by_the_rounds_of_the_check():
    per_round = 1e-4
    gathers = {2: (3e-4 + per_round, 3e-4), 4: (5e-4 + 2 * per_round, 5e-4)}
    assert fit_check(gathers) == pytest.approx(per_round)


# --- the file format -----------------------------------------------------------------------------


def _spec(**extra) -> dict:
    return {"format": 1, "name": "t", "layout": "fully_connected", "alpha": ALPHA, "bandwidth": BANDWIDTH, **extra}


def test_new_terms_round_trip_through_a_file(tmp_path):
    written = _spec(fresh_memory=3e-10, fresh_from=32 * MIB, memcpy=5e-11, check_overhead=2e-4, call_overhead=3e-5)
    path = F.write_topology_file(tmp_path / "t.json", written)
    assert F.read_topology_file(path) == written == json.loads(path.read_text())
    topo = F.load_topology(path, 3)
    got = (topo.fresh_memory, topo.fresh_from, topo.memcpy, topo.check_overhead, topo.call_overhead)
    assert got == (3e-10, 32 * MIB, 5e-11, 2e-4, 3e-5)


def test_files_without_the_new_terms_load_with_them_off(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(_spec(gamma=1e-10, fresh_memory=3e-10)))
    topo = F.load_topology(path, 2)
    assert (topo.fresh_from, topo.memcpy, topo.check_overhead, topo.call_overhead) == (FRESH_BYTES, 0.0, 0.0, 0.0)
    assert topo.setup(2, (MIB,), MIB) == MIB * 3e-10
    assert topo.link_queues is False and topo.flows is False


@pytest.mark.parametrize("field", ["link_queues", "flows"])
@pytest.mark.parametrize("on", [False, True])
def test_link_sharing_fields_round_trip_through_a_file(tmp_path, field, on):
    path = F.write_topology_file(tmp_path / "q.json", _spec(**{field: on}))
    topo = F.load_topology(path, 2)
    assert F.read_topology_file(path)[field] is on and getattr(topo, field) is on and getattr(topo.copy(), field) is on


def test_send_buffer_round_trips_through_a_file(tmp_path):
    path = F.write_topology_file(tmp_path / "s.json", _spec(flows=True, send_buffer=3 << 20))
    topo = F.load_topology(path, 2)
    assert F.read_topology_file(path)["send_buffer"] == topo.send_buffer == topo.copy().send_buffer == 3 << 20
    assert F.load_topology(F.write_topology_file(tmp_path / "z.json", _spec()), 2).send_buffer == 0


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"memcpy": -1e-9}, "memcpy=-1e-09; expected a number of seconds >= 0"),
        ({"check_overhead": "fast"}, "check_overhead='fast' is not a valid float"),
        ({"call_overhead": -1.0}, "call_overhead=-1.0; expected a number of seconds >= 0"),
        ({"fresh_from": 0}, "fresh_from=0; expected a positive number"),
        ({"fresh_from": 1.5}, "fresh_from=1.5 is not a valid int"),
        ({"link_queues": 1}, "link_queues=1 is not a valid bool"),
        ({"link_queues": "yes"}, "link_queues='yes' is not a valid bool"),
        ({"flows": 0}, "flows=0 is not a valid bool"),
        ({"send_buffer": -1}, "send_buffer=-1; expected a number of bytes >= 0"),
        ({"send_buffer": 1.5}, "send_buffer=1.5 is not a valid int"),
    ],
)
def test_bad_new_terms_name_the_field(tmp_path, change, words):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_spec(**change)))
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(".", r"\.")):
        F.read_topology_file(path)
