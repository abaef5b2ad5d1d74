"""torch.distributed programs as people write them, on simulated ranks through the torch bridge.

- Point-to-point is asynchronous, as on gloo: ``isend``/``irecv``/``batch_isend_irecv`` post and
  return at once and complete at ``wait()``, so programs that post sends before receives (a
  ring all-reduce, a halo exchange) run under every schedule tried, while real deadlocks
  (a cycle of blocking sends, a wait on a receive nobody sends) are still reported.
- Reports, warnings and tracebacks name the user's lines, in a fresh interpreter too.
- ``get_backend()`` (and DDP's logging data) answer the name the program asked for;
  ``monitored_barrier`` reports a missing rank as gloo does, its timeout in virtual time;
  ``all_gather_coalesced`` and gloo's sparse all_reduce work, other sparse ops get a clear
  error; torch's profiler runs on every rank at once, each rank seeing its own events and
  gloo-named events for its ops.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import simdist

pytestmark = [pytest.mark.timeout(180), pytest.mark.torch_release]


# -- asynchronous point-to-point ------------------------------------------------------------------------------


def ring_all_reduce(rank: int, size: int) -> list[float]:
    """The "Writing distributed applications" style ring: isend to the right, then a blocking recv from the left."""
    dist.init_process_group("gloo")
    accum = torch.full((3,), float(rank + 1))
    send_buf, recv_buf = accum.clone(), torch.zeros(3)
    left, right = (rank - 1) % size, (rank + 1) % size
    for _ in range(size - 1):
        req = dist.isend(send_buf, right)
        dist.recv(recv_buf, left)
        accum += recv_buf
        req.wait()
        send_buf.copy_(recv_buf)
    dist.destroy_process_group()
    return accum.tolist()


def halo_exchange(rank: int, size: int, batched: bool) -> tuple[float, float]:
    """Every rank posts its two sends before its two receives (one P2POp batch, or four isend/irecv)."""
    dist.init_process_group("gloo")
    row = torch.arange(4.0) + 10 * rank
    left, right = (rank - 1) % size, (rank + 1) % size
    from_left, from_right = torch.zeros(1), torch.zeros(1)
    ops = [
        (dist.isend, row[:1].clone(), left),
        (dist.isend, row[-1:].clone(), right),
        (dist.irecv, from_left, left),
        (dist.irecv, from_right, right),
    ]
    if batched:
        works = dist.batch_isend_irecv([dist.P2POp(op, t, peer) for op, t, peer in ops])
    else:
        works = [op(t, peer) for op, t, peer in ops]
    for w in works:
        w.wait()
    assert all(w.is_completed() for w in works)
    dist.destroy_process_group()
    return from_left.item(), from_right.item()


def test_ring_all_reduce_with_isend_before_recv_runs_under_every_schedule_at_world_2():
    runs = list(simdist.enumerate_schedules(ring_all_reduce, 2, args=(2,), max_runs=1000))
    assert len(runs) > 100  # every interleaving of the posts, receives and waits, each one correct
    assert all(r.values == [[3.0] * 3] * 2 for r in runs)


@pytest.mark.parametrize("world", range(2, 9))
def test_ring_all_reduce_at_worlds_2_to_8(world):
    total = float(sum(range(1, world + 1)))
    for strategy in ("random", "pct", "round_robin"):
        for seed in range(3):
            res = simdist.simulate(ring_all_reduce, world, args=(world,), strategy=strategy, seed=seed)
            assert res.values == [[total] * 3] * world, res.schedule


@pytest.mark.parametrize("batched", [False, True], ids=["isend_irecv", "batch_isend_irecv"])
@pytest.mark.parametrize("world", range(2, 9))
def test_halo_exchange_posting_sends_first_at_worlds_2_to_8(world, batched):
    if world == 2:  # left and right are one peer: its two sends arrive in order (first its row's first value)
        expected = [(10.0 * (1 - r), 10.0 * (1 - r) + 3) for r in range(2)]
    else:
        expected = [(10.0 * ((r - 1) % world) + 3, 10.0 * ((r + 1) % world)) for r in range(world)]
    for strategy in ("random", "pct"):
        for seed in range(3):
            res = simdist.simulate(halo_exchange, world, args=(world, batched), strategy=strategy, seed=seed)
            assert res.values == expected, res.schedule


def test_isend_returns_before_the_receive_is_posted():
    def program(rank):
        dist.init_process_group("gloo")
        t = torch.tensor([float(rank)])
        if rank == 0:
            work = dist.isend(t, 1)
            posted_first = not work.is_completed()  # nobody has received yet: rank 1 waits for this barrier
            dist.barrier()
            work.wait()
            result = posted_first
        else:
            dist.barrier()
            dist.recv(t, 0)
            result = t.item()
        dist.destroy_process_group()
        return result

    for seed in range(4):
        assert simdist.simulate(program, 2, seed=seed).values == [True, 0.0]


def irecv_from_any_source(rank: int) -> list | None:
    dist.init_process_group("gloo")
    result = None
    if rank == 0:
        bufs = [torch.zeros(1), torch.zeros(1)]
        works = [dist.irecv(b) for b in bufs]
        for w in works:
            w.wait()
        result = sorted(b.item() for b in bufs)
    else:
        dist.send(torch.tensor([10.0 * rank]), 0)
    dist.destroy_process_group()
    return result


def test_irecv_from_any_source_completes_at_wait():
    for seed in range(4):
        assert simdist.simulate(irecv_from_any_source, 3, seed=seed).values[0] == [10.0, 20.0]


def waits_for_nobody(rank: int) -> None:
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        work = dist.irecv(t, 1)  # rank 1 never sends
        work.wait()
    dist.destroy_process_group()


def test_a_wait_on_a_receive_nobody_sends_is_a_deadlock_with_the_users_line():
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.simulate(waits_for_nobody, 2, leaks="ignore")
    text = str(info.value)
    assert "rank 0 is blocked in recv(src=1" in text and "test_torch_programs.py:" in text, text
    assert "torch/distributed" not in text


def blocking_cycle(rank: int, size: int) -> None:
    dist.init_process_group("gloo")
    t = torch.zeros(2)
    dist.send(t, (rank + 1) % size)  # every rank sends first, blocking: nobody receives
    dist.recv(t, (rank - 1) % size)


@pytest.mark.parametrize("world", [2, 3, 5])
def test_a_cycle_of_blocking_sends_is_still_a_deadlock(world):
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.simulate(blocking_cycle, world, args=(world,), leaks="ignore")
    assert f"({world} blocked)" in str(info.value) and "wait-for cycle" in str(info.value)


def async_collective(rank: int) -> float:
    dist.init_process_group("gloo")
    t = torch.tensor([rank + 1.0])
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    fut_value = dist.all_reduce(torch.ones(1), async_op=True).get_future().wait()[0].item()
    dist.destroy_process_group()
    return t.item() + fut_value


def test_async_collectives_complete_at_wait_and_futures_hold_the_outputs():
    assert simdist.simulate(async_collective, 3).values == [6.0 + 3.0] * 3


# -- the user's lines, in a fresh interpreter -----------------------------------------------------------------

FRESH = """
import sys, warnings
import torch
import torch.distributed as dist
from torch.distributed import init_process_group   # imported before any simulation
import simdist

def stuck(rank):
    init_process_group("gloo")
    t = torch.zeros(1)
    dist.send(t, 1 - rank)                      # LINE-SEND
    dist.recv(t, 1 - rank)

def warns(rank):
    init_process_group("gloo")
    g = dist.new_group([0])
    dist.all_reduce(torch.ones(1), group=g)     # LINE-WARN (rank 1 is not in g)
    dist.destroy_process_group()

hook = sys.excepthook
try:
    simdist.simulate(stuck, 2, leaks="ignore")
except simdist.DeadlockError as err:
    print("REPORT", str(err).replace(chr(10), " | "))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    simdist.simulate(warns, 2)
for w in caught:
    print("WARNING", w.filename, w.lineno, w.message)
print("HOOK", sys.excepthook is hook)
raise RuntimeError("after the simulations")
"""


def test_reports_warnings_and_tracebacks_name_the_users_lines_in_a_fresh_interpreter(tmp_path):
    script = tmp_path / "program.py"
    script.write_text(FRESH)
    lines = FRESH.splitlines()
    send_line = next(i for i, line in enumerate(lines, 1) if "LINE-SEND" in line)
    warn_line = next(i for i, line in enumerate(lines, 1) if "LINE-WARN" in line)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150, cwd=tmp_path)
    out, err = proc.stdout, proc.stderr
    report = next(line for line in out.splitlines() if line.startswith("REPORT"))
    assert f"program.py:{send_line}" in report and "distributed_c10d" not in report, report
    warning = next(line for line in out.splitlines() if "does not belong to the given group" in line)
    assert warning.startswith(f"WARNING {script} {warn_line} "), warning
    assert "HOOK True" in out
    # torch's init_process_group chains a "[rankN]:" exception hook per rank: undone once the simulation ends
    assert "RuntimeError: after the simulations" in err and "[rank" not in err, err


# -- torch behaviours users rely on ------------------------------------------------------------------------------


def backends_and_checks(rank: int, name: str | None) -> dict:
    if name is None:
        dist.init_process_group()
    else:
        dist.init_process_group(name)
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    # torch's own choice for this rank's devices (its simulated GPUs: "undefined" means NCCL on torch 2.14)
    torch_config = str(BackendConfig(Backend(name or "undefined")))
    out = {"backend": dist.get_backend(), "config": dist.get_backend_config(), "torch_config": torch_config}
    if name == "gloo":
        dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)
        lists = [[torch.zeros(2), torch.zeros(1)] for _ in range(2)]  # lists[r]: rank r's inputs
        dist.all_gather_coalesced(lists, [torch.full((2,), float(rank)), torch.full((1,), rank + 10.0)])
        out["coalesced"] = [[t.tolist() for t in ts] for ts in lists]
        sub = dist.new_group([0, 1])
        out["sub_backend"] = dist.get_backend(sub)
        sparse = torch.sparse_coo_tensor(torch.tensor([[rank, 3]]), torch.tensor([1.0 + rank, 5.0]), (4,))
        dist.all_reduce(sparse)  # gloo's sparse sum: each rank's entries, added up
        out["sparse_sum"] = sparse.to_dense().tolist()
        try:
            dist.all_reduce(sparse, op=dist.ReduceOp.MAX)
        except ValueError as exc:
            out["sparse_max"] = str(exc)
        try:
            dist.broadcast(torch.ones(4).to_sparse(), src=0)
        except TypeError as exc:
            out["sparse"] = str(exc)
        out["ddp_backend"] = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))._get_ddp_logging_data()[
            "backend_name"
        ]
    dist.destroy_process_group()
    return out


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore:Sparse invariant checks")
def test_get_backend_answers_the_name_the_program_gave():
    for name, config in (("gloo", "cpu:gloo,cuda:gloo"), ("nccl", "cuda:nccl"), (None, None)):
        values = simdist.simulate(backends_and_checks, 2, args=(name,)).values
        for v in values:  # torch's own names: "undefined" when no backend is given, as torch answers
            assert (v["backend"], v["config"]) == (name or "undefined", config or v["torch_config"])
    values = simdist.simulate(backends_and_checks, 2, args=("gloo",)).values
    for v in values:
        assert v["coalesced"] == [[[0.0, 0.0], [10.0]], [[1.0, 1.0], [11.0]]]
        assert v["sub_backend"] == "gloo" and v["ddp_backend"] == "gloo"
        assert v["sparse_sum"] == [1.0, 2.0, 0.0, 10.0]
        assert "sparse tensors takes ReduceOp.SUM only" in v["sparse_max"]
        assert "layout torch.sparse_coo" in v["sparse"] and ".to_dense()" in v["sparse"]


def premul_sum(rank: int) -> tuple:
    dist.init_process_group("nccl")
    t = torch.full((2,), rank + 1.0)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))  # FSDP2's way, in every release
    out = torch.zeros(1)
    src = torch.tensor([1.0, 2.0]) * (rank + 1)
    premul = dist.ReduceOp.PREMUL_SUM
    dist.reduce_scatter_tensor(out, src, op=premul(2.0) if callable(premul) else dist._make_nccl_premul_sum(2.0))
    dist.destroy_process_group()
    return t.tolist(), out.item(), src.tolist()


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_nccls_premul_sum_scales_then_sums():
    # (1 + 2) * 0.5 on every rank; rank r's block of 2 * (1 * x + 2 * x): 6 and 12; the input is left alone
    assert simdist.simulate(premul_sum, 2).values == [([1.5, 1.5], 6.0, [1.0, 2.0]), ([1.5, 1.5], 12.0, [2.0, 4.0])]


def monitored(rank: int, case: str) -> str | None:
    import simdist.sim

    dist.init_process_group("gloo")
    out = None
    if case == "late" and rank == 1:
        simdist.sim.compute(seconds=5)  # arrives 5 s (virtual) late
    if case != "missing" or rank != 1:
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=2), wait_all_ranks=case == "all")
            out = "passed"
        except RuntimeError as exc:
            out = str(exc)
    dist.barrier()
    dist.destroy_process_group()
    return out


def test_monitored_barrier_reports_the_missing_rank_as_gloo_does_in_virtual_time():
    late = "Rank {0} successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0"
    for case, world in (("ok", 3), ("all", 3), ("missing", 3), ("late", 3)):
        values = simdist.simulate(monitored, world, args=(case,), leaks="ignore").values
        if case in ("ok", "all"):
            assert values == ["passed"] * world
        elif case == "missing":  # rank 1 never calls it: rank 0's timed wait expires once no rank can run
            assert values[0] == "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms" and values[1] is None
            assert late.format(2) in values[2]
        else:  # rank 1 arrives after rank 0's timeout: too late, as on gloo
            assert values[0] == "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms"
            assert late.format(1) in values[1] and late.format(2) in values[2]


def wait_with_timeout(rank: int) -> str:
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    out = "received"
    if rank == 0:
        try:
            dist.irecv(t, 1).wait(timeout=timedelta(seconds=1))  # rank 1 sends only after the barrier
        except RuntimeError as exc:
            out = f"{type(exc).__name__}: {exc}"
    dist.barrier()
    if rank == 1:
        dist.send(t, 0)
    dist.destroy_process_group()
    return out


def test_a_wait_with_a_timeout_times_out_in_virtual_time_instead_of_deadlocking():
    values = simdist.simulate(wait_with_timeout, 2, leaks="ignore").values
    assert values[0].startswith("DistTimeoutError: rank 0: recv did not complete within its timeout of 1 s")
    assert values[1] == "received"


PROFILED = """
import torch
import torch.distributed as dist
import simdist

def main(rank, who, kind):
    dist.init_process_group("gloo")
    t = torch.ones(3, 2)
    seen = []
    for turn in range(2):
        if who == "all" or (who == "one" and rank == 0) or (who == "in-turn" and rank == turn):
            if kind == "torch":
                ctx = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
            else:
                ctx = torch.autograd.profiler.profile(record_shapes=True)
            with ctx as prof:
                dist.all_reduce(t)
                (t * 2).sum()
                if rank == 0:
                    dist.send(t, 1)
                else:
                    dist.recv(t, 0)
            events = prof.events() if kind == "torch" else prof.function_events
            seen.append(sorted((e.name, e.is_async, e.count, e.input_shapes) for e in events
                               if e.name.startswith("gloo:") or e.name == "aten::mul"))
        else:
            dist.all_reduce(t)
            dist.send(t, 1) if rank == 0 else dist.recv(t, 0)
        dist.barrier()
    dist.destroy_process_group()
    return seen

for kind in ("torch", "autograd"):
    for who in ("one", "in-turn", "all"):
        print(kind, who, simdist.simulate(main, 2, args=(who, kind)).values)
"""


def test_torch_profiler_on_every_rank_at_once_sees_its_own_rank_and_gloos_events(tmp_path):
    script = tmp_path / "profiled.py"
    script.write_text(PROFILED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]  # a second Kineto session used to end the process (SIGSEGV)
    mine = {
        0: [
            ("aten::mul", False, 1, [[3, 2], []]),
            ("gloo:all_reduce", True, 1, [[3, 2]]),
            ("gloo:send", True, 1, [[3, 2]]),
        ],
        1: [
            ("aten::mul", False, 1, [[3, 2], []]),
            ("gloo:all_reduce", True, 1, [[3, 2]]),
            ("gloo:recv", True, 1, [[3, 2]]),
        ],
    }
    expected = {"one": [[mine[0]] * 2, []], "in-turn": [[mine[0]], [mine[1]]], "all": [[mine[0]] * 2, [mine[1]] * 2]}
    for kind in ("torch", "autograd"):
        for who, values in expected.items():  # each rank sees only its own ops, once each, as on gloo
            assert f"{kind} {who} {values}" in proc.stdout.splitlines(), proc.stdout


def test_the_bridge_is_gone_after_a_simulation():
    from torch.autograd.profiler import profile
    from torch.distributed import distributed_c10d as c10d

    def bridged():
        return (
            c10d._world,
            c10d.rendezvous,
            c10d._new_process_group_helper,
            profile._prepare_trace,
            profile.__exit__,
            profile._parse_kineto_results,
            sys.excepthook,
        )

    before = bridged()
    simdist.simulate(ring_all_reduce, 2, args=(2,))
    after = bridged()
    assert before == after
    assert not dist.is_initialized()


def init_twice(rank: int, destroy: bool) -> float:
    dist.init_process_group("gloo")
    sub = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(1), group=sub)
    dist.destroy_process_group(sub)
    dist.destroy_process_group()
    dist.init_process_group("gloo")  # a second world after the first is gone
    t = torch.ones(1)
    dist.all_reduce(t)
    if destroy:
        dist.destroy_process_group()
    return t.item()


def test_destroy_process_group_destroys_the_simulated_groups():
    assert simdist.simulate(init_twice, 2, args=(True,)).leaks == []
    kept = simdist.simulate(init_twice, 2, args=(False,)).leaks
    assert kept == ["ranks [0, 1]: the default process group was never destroyed (destroy_process_group)"]
