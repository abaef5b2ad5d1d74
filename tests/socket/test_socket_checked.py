"""Collectives checked across ranks on the socket backend: the simulator's report, on every rank.

Each mismatch program runs twice: in real processes over loopback (every rank catches the
error and returns what it says) and on the simulator (round-robin, so rank 0 arrives first,
as group rank 0 is the reference on sockets), which is the independent truth: the socket
backend must raise the same ``CollectiveMismatchError`` on every rank, with the same text.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from simdist.backends.socket import _checked
from test_socket_backend import every_collective

import simdist
import simdist as dist
from simdist.core._errors import ProtocolError
from simdist.core._signatures import decode_signature, encode_signature, mismatch_error, signature_digest

pytestmark = pytest.mark.timeout(120)

HERE = os.path.basename(__file__)

VARIANTS = {
    "dtype": {"dtype"},  # float32 against int32: the same bytes, garbage without the check
    "shape": {"shape"},  # (2, 3) against (3, 2): the same count
    "count": {"shape"},  # 6 elements against 5
    "counts": {"counts"},  # reduce_scatter with other input sizes
    "op": {"op"},  # all_reduce against broadcast
    "root": {"root"},
    "reduce_op": {"reduce_op"},
    "async_op": {"async_op"},
}


def _collective(variant: str, odd: bool, world: int) -> None:
    """The collective of ``variant``: the last rank (``odd``) calls it differently from the others."""
    t = torch.ones(6)
    if variant == "dtype":
        dist.all_reduce(torch.ones(6, dtype=torch.int32 if odd else torch.float32))
    elif variant == "shape":
        dist.all_reduce(torch.ones((3, 2) if odd else (2, 3)))
    elif variant == "count":
        dist.all_reduce(torch.ones(5 if odd else 6))
    elif variant == "counts":
        n = 1 if odd else 2
        dist.reduce_scatter(torch.zeros(n), [torch.ones(n) for _ in range(world)])
    elif variant == "op":
        dist.broadcast(t, src=0) if odd else dist.all_reduce(t)
    elif variant == "root":
        dist.broadcast(t, src=1 if odd else 0)
    elif variant == "reduce_op":
        dist.all_reduce(t, op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
    elif variant == "async_op":
        work = dist.all_reduce(t, async_op=odd)
        if work is not None:
            work.wait()
    else:
        raise ValueError(variant)


def mismatched(rank: int, world: int, variant: str):
    """What this rank's ``CollectiveMismatchError`` says, then the result of a matching all_reduce."""
    dist.init_process_group("gloo")
    caught = None
    try:
        _collective(variant, rank == world - 1, world)
    except simdist.CollectiveMismatchError as err:
        caught = (str(err), err.ranks, err.fields, err.call_sites)
    after = torch.full((3,), float(rank))
    dist.all_reduce(after)  # the group goes on: the check left no message behind
    dist.destroy_process_group()
    return caught, after.tolist()


def _simulated(world: int, variant: str) -> simdist.CollectiveMismatchError:
    with pytest.raises(simdist.CollectiveMismatchError) as info:
        simdist.simulate(mismatched, world, args=(world, variant), strategy="round_robin")
    return info.value


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rank_raises_what_the_simulator_reports(variant, world):
    truth = _simulated(world, variant)
    results = simdist.spawn(mismatched, args=(world, variant), nprocs=world, backend="socket", timeout=60)
    expected_text = str(truth).split("\nreplay token")[0]
    for rank, (caught, after) in enumerate(results):
        assert caught is not None, f"rank {rank} raised nothing"
        text, ranks, fields, sites = caught
        assert text == expected_text, f"rank {rank}"
        assert ranks == truth.ranks == (0, world - 1)
        assert fields == truth.fields and VARIANTS[variant] <= set(fields)
        assert sites == truth.call_sites and all(HERE in s for s in sites)
        for name, (a, b) in fields.items():
            assert f"{name}: {a!r} on rank 0 vs {b!r} on rank {world - 1}" in text
        assert after == [float(sum(range(world)))] * 3


def subgroup_mismatch(rank: int):
    """Ranks 0 and 2 of 3 disagree on a group of their own; rank 1 is not in it."""
    dist.init_process_group("gloo")
    group = dist.new_group([0, 2])
    caught = None
    if rank != 1:
        try:
            dist.all_reduce(torch.ones(4, dtype=torch.float64 if rank == 2 else torch.float32), group=group)
        except simdist.CollectiveMismatchError as err:
            caught = (str(err), err.ranks, err.fields)
    dist.barrier()
    dist.destroy_process_group()
    return caught


def test_a_subgroup_reports_global_ranks_and_its_own_sequence():
    with pytest.raises(simdist.CollectiveMismatchError) as info:
        simdist.simulate(subgroup_mismatch, 3, strategy="round_robin")
    truth = info.value
    results = simdist.spawn(subgroup_mismatch, nprocs=3, backend="socket", timeout=60)
    assert results[1] is None
    for text, ranks, fields in (results[0], results[2]):
        assert text == str(truth).split("\nreplay token")[0]
        assert "on group 1 (collective 1 of the group)" in text
        assert ranks == (0, 2) and fields == {"dtype": ("float32", "float64")}


def dtype_garbage(rank: int):
    """float32 ones on rank 0, int32 ones on rank 1: the same bytes, so nothing on the wire objects."""
    dist.init_process_group("gloo")
    t = torch.ones(4, dtype=torch.int32 if rank == 1 else torch.float32)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()


def test_switched_off_the_mismatch_goes_through_as_garbage(monkeypatch):
    monkeypatch.setenv(_checked.CHECK_ENV, "0")
    values = simdist.spawn(dtype_garbage, nprocs=2, backend="socket", timeout=60)
    one_as_int = torch.tensor(1.0).view(torch.int32).item()  # 0x3f800000
    # rank 0 adds the int 1 read as a float (a denormal, lost to rounding); rank 1 the float 1.0 read as an int
    assert values == [[1.0] * 4, [1 + one_as_int] * 4]


def test_switched_on_by_default_the_same_program_raises(monkeypatch):
    monkeypatch.delenv(_checked.CHECK_ENV, raising=False)
    with pytest.raises(simdist.RankError) as info:
        simdist.spawn(dtype_garbage, nprocs=2, backend="socket", timeout=60)
    assert isinstance(info.value.__cause__, simdist.CollectiveMismatchError)
    assert "dtype: 'float32' on rank 0 vs 'int32' on rank 1" in str(info.value.__cause__)


def test_matching_collectives_give_the_same_results_checked_or_not(monkeypatch):
    checked = simdist.spawn(every_collective, args=(3,), nprocs=3, backend="socket", timeout=60)
    monkeypatch.setenv(_checked.CHECK_ENV, "0")
    unchecked = simdist.spawn(every_collective, args=(3,), nprocs=3, backend="socket", timeout=60)
    assert checked == unchecked  # floats too: the same algorithms in the same order
    n = 3
    assert checked[0]["all_reduce"] == [n * i + 10 * sum(range(n)) for i in range(6)]  # the formula, not a run
    assert checked[0]["all_gather"] == [[i + 10 * r for i in range(6)] for r in range(n)]


def init_with_own_setting(rank: int, settings_: list):
    os.environ[_checked.CHECK_ENV] = settings_[rank]
    dist.init_process_group("gloo")
    dist.destroy_process_group()


def test_ranks_that_disagree_on_the_setting_fail_at_init():
    with pytest.raises(simdist.RankError) as info:
        simdist.spawn(init_with_own_setting, args=(["1", "0"],), nprocs=2, backend="socket", timeout=30)
    err = info.value.__cause__
    assert info.value.rank == 1 and isinstance(err, ValueError)
    assert str(err) == (
        f"environment variable {_checked.CHECK_ENV} is 0 on rank 1 but 1 on rank 0: every rank "
        "must use the same setting"
    )


@pytest.mark.parametrize("value", ["yes", "", "2", "off"])
def test_a_bad_setting_names_the_variable_and_the_value(monkeypatch, value):
    monkeypatch.setenv(_checked.CHECK_ENV, value)
    with pytest.raises(ValueError, match=f"{_checked.CHECK_ENV}={value!r} must be '1'.*or '0'"):
        _checked.checks_enabled()


# --- the signature's wire form ------------------------------------------------------------

_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.text(max_size=20),
    st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=6).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=12), _VALUES, max_size=8))
def test_signatures_round_trip_and_equal_ones_share_a_digest(signature):
    data = encode_signature(signature)
    assert decode_signature(data) == signature
    assert signature_digest(dict(reversed(list(signature.items())))) == signature_digest(signature)
    for cut in range(len(data)):
        with pytest.raises(ProtocolError):
            decode_signature(data[:cut])
    with pytest.raises(ProtocolError, match="left over"):
        decode_signature(data + b"\0")


def test_an_all_reduce_signature_is_a_few_dozen_bytes():
    sig = {
        "op": "all_reduce",
        "dtype": "float32",
        "shape": (1024,),
        "algorithm": "recursive_doubling",
        "async_op": False,
        "reduce_op": "SUM",
        "group": 0,
        "ranks": (0, 1),
        "seq": 7,
    }
    data = encode_signature(sig)
    assert len(data) <= 128  # 16 bytes travel when signatures agree
    assert len(signature_digest(sig)) == 16
    other = {**sig, "dtype": "int32"}
    assert signature_digest(other) != signature_digest(sig)
    err = mismatch_error(0, 7, (0, sig, "a.py:1"), (1, other, "a.py:2"))
    assert err.fields == {"dtype": ("float32", "int32")} and err.ranks == (0, 1)
    assert mismatch_error(0, 7, (0, sig, "a.py:1"), (1, dict(sig), "a.py:2")) is None


@pytest.mark.parametrize("value", [1.5, (1, (2,)), (True,), 1 << 64, object()])
def test_values_outside_the_table_are_refused_with_the_field_named(value):
    with pytest.raises(TypeError, match="signature field 'x'"):
        encode_signature({"x": value})
