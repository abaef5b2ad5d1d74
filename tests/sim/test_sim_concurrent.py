"""Simulations from several threads of one process at once, each exactly as it runs alone.

A Streamlit server serves every browser session from a thread of one process, so the
visualizer runs simulations concurrently. Each job below runs alone first; then one thread
per job runs them all at once, released together by a barrier, for several rounds. Every
outcome must equal the lone one: values, replay token, choices, points, virtual time and
the trace's JSON byte for byte; for a failing job the error's type, text and token; and the
lines each job printed, in order. Meanwhile an observer thread (not a rank) must see the
real ``os.environ`` and an unprefixed ``sys.stdout``, and afterwards the caller's generator
states, ``os.environ`` and ``sys.stdout`` must be the ones it had.
"""

from __future__ import annotations

import io
import itertools
import os
import random
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import simdist
import simdist as dist
from simdist import visualize as V

ROUNDS = 3
JOIN_TIMEOUT = 240.0  # s for one round of every job at once (a bound, never reached)
_LOG: list[str] = []  # the tag of each step of the jobs below, in the order the steps ran
_SHARED_RING = simdist.TOPOLOGIES["ring"](4)  # one Topology object given to two jobs at once

pytestmark = pytest.mark.slow  # slow: starts processes or explores many schedules (quick feedback: -m 'not slow')


# -- the programs ----------------------------------------------------------------------------------------


def rng_prints_env(rank: int, tag: str) -> list:
    """Global generators, prints and a per-rank environment, with scheduling points between."""
    dist.init_process_group("gloo")
    os.environ["SIMDIST_CONCURRENT_RANK"] = f"{tag}:{rank}"
    out = []
    for step in range(4):
        draws = (
            random.random(),
            float(np.random.randn()),
            float(np.random.rand()),
            float(torch.rand(1)),
            float(torch.randn(1)),
        )
        print(f"{tag} rank {rank} step {step} first draw {draws[0]:.9f}")
        _LOG.append(tag)
        t = torch.full((3,), float(rank)) + torch.rand(3)
        dist.all_reduce(t)
        out.append((draws, t.tolist()))
    out.append((os.environ.get("SIMDIST_CONCURRENT_RANK"), os.environ.get("SIMDIST_CONCURRENT_BASE")))
    dist.destroy_process_group()
    return out


def torch_ddp(rank: int, tag: str) -> list:
    """torch.distributed through the bridge: an NCCL program on simulated GPUs, torch's own DDP."""
    import torch.distributed as tdist
    from torch import nn

    tdist.init_process_group("nccl")
    torch.cuda.set_device(rank)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2)).to(f"cuda:{rank}")
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    for step in range(2):
        ddp(torch.randn(4, 6, device="cuda")).square().sum().backward()
        _LOG.append(tag)
    t = torch.arange(3.0) + rank
    tdist.broadcast(t, src=1)
    out = [p.grad.sum().item() for p in model.parameters()] + t.tolist() + [tdist.get_backend()]
    tdist.destroy_process_group()
    return out


def simdist_ddp(rank: int, widths: tuple) -> list:
    """simdist's DDP, as the app's DDP page runs it."""
    from torch import nn

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(a, b) for a, b in itertools.pairwise(widths)])
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=0.001)
    ddp(torch.randn(8, widths[0])).pow(2).mean().backward()
    _LOG.append("simdist-ddp")
    dist.destroy_process_group()
    return [p.grad.sum().item() for p in model.parameters()]


def timed(rank: int, tag: str) -> float:
    """Annotated computation and messages: virtual time, contention on the topology's links."""
    dist.init_process_group("gloo")
    dist.compute(seconds=1e-4 * (rank + 1))
    t = torch.ones(4096) * rank
    peer = rank ^ 1
    if rank % 2 == 0:
        dist.send(t, peer)
    else:
        dist.recv(t, peer)
    _LOG.append(tag)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return float(t.sum())


def failing(rank: int, tag: str) -> None:
    dist.init_process_group("gloo")
    t = torch.ones(2) * rank
    dist.all_reduce(t)
    _LOG.append(tag)
    if rank == 2:
        raise ValueError(f"{tag}: rank 2 gives up holding {t.tolist()}")
    dist.barrier()


def nesting(rank: int, tag: str) -> None:
    dist.init_process_group("gloo")
    dist.barrier()
    _LOG.append(tag)
    if rank == 1:
        simdist.simulate(timed, 2, (tag,))
    dist.barrier()


# -- the jobs: each gives an outcome that can be compared with ==  ---------------------------------------

JOBS = {
    "<all-reduce>": lambda: V.collective_run("all_reduce", "ring", 4, 4096),
    "<all-gather>": lambda: V.collective_run("all_gather", "bruck", 5, 960, topology="ring"),
    "<broadcast>": lambda: V.collective_run("broadcast", "scatter_allgather", 6, 2048, seed=3),
    "<torch-ddp>": lambda: simdist.simulate(torch_ddp, 2, ("<torch-ddp>",), cuda_as_cpu=True, seed=1),
    "<simdist-ddp>": lambda: simdist.simulate(simdist_ddp, 3, ((16, 16, 16, 16),), seed=0),
    "<rng-prefixed>": lambda: simdist.simulate(rng_prints_env, 3, ("<rng-prefixed>",), seed=5, prefix_output=True),
    "<rng-plain>": lambda: simdist.simulate(rng_prints_env, 4, ("<rng-plain>",), strategy="round_robin"),
    "<rng-spawn>": lambda: simdist.spawn(rng_prints_env, ("<rng-spawn>",), nprocs=2, backend="sim", seed=9),
    "<deadlock>": lambda: V.run_scenario("send around a ring"),
    "<failing>": lambda: simdist.simulate(failing, 4, ("<failing>",), seed=2),
    "<nesting>": lambda: simdist.simulate(nesting, 2, ("<nesting>",)),
    "<time-ring-a>": lambda: simdist.simulate(timed, 4, ("<time-ring-a>",), topology=_SHARED_RING, seed=4),
    "<time-ring-b>": lambda: simdist.simulate(
        timed, 4, ("<time-ring-b>",), topology=_SHARED_RING, seed=7, detail="collectives"
    ),
}


def outcome(job: str) -> tuple:
    """Everything job ``job`` gives, as a comparable value."""
    try:
        res = JOBS[job]()
    except simdist.DistError as err:
        return "raised", type(err).__name__, str(err), err.schedule, repr(err.__cause__)
    if isinstance(res, simdist.DistError):  # run_scenario returns its DeadlockError
        return "returned", type(res).__name__, str(res), res.schedule
    if isinstance(res, list):  # spawn: the values only
        return "values", res
    return "result", res.values, res.schedule, res.choices, res.points, res.time, res.trace.to_json()


class Lines:
    """A ``sys.stdout`` that keeps what is written (each write is one append)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def take(self) -> str:
        text, self.parts = "".join(self.parts), []
        return text


CALLER_MARK = "@caller-not-a-rank@\n"


def printed(text: str, job: str) -> list[str]:
    return [line for line in text.replace(CALLER_MARK, "").splitlines() if job in line]


def caller_state() -> tuple:
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    return random.getstate(), (keys.tobytes(), pos, has_gauss, gauss), torch.get_rng_state(), os.environ, sys.stdout


def same_state(a: tuple, b: tuple) -> bool:
    return a[:2] == b[:2] and torch.equal(a[2], b[2]) and a[3] is b[3] and a[4] is b[4]


def interleaved(log: list[str]) -> bool:
    """Whether some job's steps ran with another job's steps between them."""
    runs = [tag for i, tag in enumerate(log) if i == 0 or log[i - 1] != tag]
    return len(runs) > len(set(runs))


def run_at_once(jobs: list[str]) -> dict[str, tuple]:
    """Run every job on its own thread, released together; each job's outcome (or the exception it escaped with)."""
    results: dict[str, tuple] = {}
    start = threading.Barrier(len(jobs))

    def worker(job: str) -> None:
        start.wait(timeout=JOIN_TIMEOUT)
        try:
            results[job] = outcome(job)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            results[job] = ("escaped", repr(exc))

    threads = [threading.Thread(target=worker, args=(job,), name=f"caller {job}") for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a concurrent simulation did not finish"
    return results


@pytest.mark.timeout(600)
def test_simulations_at_once_equal_each_alone(monkeypatch):
    monkeypatch.setenv("SIMDIST_CONCURRENT_BASE", "base")
    monkeypatch.delenv("SIMDIST_CONCURRENT_RANK", raising=False)
    random.seed(11)
    np.random.seed(11)
    np.random.randn()  # leaves numpy's second normal cached: the caller's state must keep it
    torch.manual_seed(11)
    out = Lines()
    monkeypatch.setattr(sys, "stdout", out)
    before = caller_state()

    alone = {job: outcome(job) for job in JOBS}
    alone_text = out.take()
    assert same_state(caller_state(), before)
    # the jobs do what they are meant to, alone
    assert alone["<deadlock>"][1] == "DeadlockError" and "replay token" in alone["<deadlock>"][2]
    assert alone["<failing>"][1] == "RankError" and "rank 2 gives up" in alone["<failing>"][2]
    assert "cannot be nested" in alone["<nesting>"][4]
    assert printed(alone_text, "<rng-prefixed>")[0].startswith("[rank ")
    assert not any(line.startswith("[rank") for line in printed(alone_text, "<rng-plain>"))
    values = alone["<rng-plain>"][1]
    assert [v[-1] for v in values] == [(f"<rng-plain>:{r}", "base") for r in range(4)]
    assert values[3][0][0][0] == random.Random(3).random()  # rank 3's first draw: its generator seeded with 3

    seen: list[str] = []  # what the observer saw wrong
    done = threading.Event()

    def observe() -> None:
        """A thread that is not a rank, reading os.environ and writing to sys.stdout while simulations run."""
        while not done.is_set():
            if os.environ.get("SIMDIST_CONCURRENT_RANK") is not None:
                seen.append(f"a rank's variable: {os.environ.get('SIMDIST_CONCURRENT_RANK')}")
            if os.environ.get("SIMDIST_CONCURRENT_BASE") != "base":
                seen.append("the real environment is not seen")
            sys.stdout.write(CALLER_MARK)
            time.sleep(0.002)

    overlapped = False
    observer = threading.Thread(target=observe, name="observer")
    observer.start()
    try:
        for round_ in range(ROUNDS):
            _LOG.clear()
            together = run_at_once(list(JOBS))
            text = out.take()
            overlapped = overlapped or interleaved(_LOG)
            for job in JOBS:
                assert together[job] == alone[job], f"round {round_}: {job} differs from its lone run"
                assert printed(text, job) == printed(alone_text, job), f"round {round_}: {job} printed otherwise"
            assert "] " + CALLER_MARK not in text, "a line the observer wrote was prefixed"
    finally:
        done.set()
        observer.join(10)
    assert not seen, seen[:3]
    assert overlapped, "the simulations never ran interleaved"
    assert same_state(caller_state(), before)
    assert os.environ.get("SIMDIST_CONCURRENT_RANK") is None


def stuck(rank: int, release: threading.Event) -> None:
    dist.init_process_group("gloo")
    if rank == 0:
        release.wait(120)  # outside simdist, holding the turn
    dist.barrier()


@pytest.mark.timeout(300)
def test_a_run_timing_out_with_a_stuck_rank_does_not_hold_up_the_others():
    expected = outcome("<time-ring-a>")
    release = threading.Event()
    before = {t.ident for t in threading.enumerate()}
    results: dict[str, object] = {}

    def stuck_run() -> None:
        try:
            simdist.simulate(stuck, 2, (release,), timeout=1.0)
            results["stuck"] = "finished"
        except simdist.DistTimeoutError as err:
            results["stuck"] = err

    def other_run() -> None:
        results["other"] = outcome("<time-ring-a>")

    try:
        threads = [threading.Thread(target=stuck_run), threading.Thread(target=other_run)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_TIMEOUT)
        assert not any(t.is_alive() for t in threads)
        assert results["other"] == expected
        assert isinstance(results["stuck"], simdist.DistTimeoutError), results["stuck"]
        assert "timeout=1.0" in str(results["stuck"])
        assert outcome("<time-ring-a>") == expected  # while the stuck rank is still stuck
    finally:
        release.set()
    deadline = time.monotonic() + 60
    while any(t.ident not in before and t.name.startswith("simdist-rank-") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the stuck run's rank threads did not end once released"
        time.sleep(0.05)


def test_nested_simulate_is_refused_naming_the_rank():
    with pytest.raises(simdist.RankError) as info:
        simdist.simulate(nesting, 2, ("<nesting>",))
    cause = info.value.__cause__
    assert isinstance(cause, RuntimeError)
    assert re.search(r"simulated rank 1 started a simulation; simulations cannot be nested", str(cause))


def test_a_finished_rank_leaves_no_cached_normal_to_the_next():
    """numpy's legacy normal() caches a second value; a rank that finishes with one cached must not hand it on."""

    def program(rank: int) -> list | None:
        dist.init_process_group("gloo")
        t = torch.zeros(1)
        if rank == 0:
            dist.recv(t, 1)
            np.random.randn()  # caches a second normal, then finishes
            return None
        np.random.randn(), np.random.randn()  # a whole pair: nothing cached
        dist.send(t, 0)
        return [float(np.random.randn()) for _ in range(3)]

    np.random.seed(1)
    expected = [float(x) for x in np.random.randn(5)[2:]]
    for seed in range(12):
        for strategy in ("random", "round_robin"):
            res = simdist.simulate(program, 2, seed=seed, strategy=strategy, leaks="ignore")
            assert res.values[1] == expected, (seed, strategy)


def test_a_topology_object_given_to_a_run_is_left_as_it_was():
    """Runs at once may share one: each runs on a copy (the big test above runs two on one object)."""
    topo = simdist.TOPOLOGIES["ring"](8)
    first = simdist.simulate(timed, 4, ("<a>",), topology=topo)
    again = simdist.simulate(timed, 4, ("<a>",), topology=simdist.TOPOLOGIES["ring"](8))
    assert topo.size == 8
    assert first.trace.to_json() == again.trace.to_json()


STRADDLING_PRINT = '''
import sys, threading
import simdist


class Slow:
    """A stream whose first write waits until the simulation running beside it has ended."""

    def __init__(self, real):
        self.real, self.entered, self.gate = real, threading.Event(), threading.Event()

    def write(self, text):
        if not self.entered.is_set():
            self.entered.set()
            self.gate.wait(60)
        return self.real.write(text)

    def flush(self):
        self.real.flush()


inside, release = threading.Event(), threading.Event()


def fn(rank):
    inside.set()
    release.wait(60)


sys.stdout = slow = Slow(sys.__stdout__)
sim = threading.Thread(target=lambda: simdist.simulate(fn, 2))
sim.start()
inside.wait(60)
stand_in = type(sys.stdout).__name__


def end_the_run():
    slow.entered.wait(60)
    release.set()
    sim.join(60)
    junk = [type("Junk", (), {})() for _ in range(20000)]  # reuses freed memory
    slow.gate.set()


threading.Thread(target=end_the_run).start()
print("printed through", stand_in, "as the run ended")
print("put back", type(sys.stdout).__name__)
'''


@pytest.mark.timeout(120)
def test_a_print_that_straddles_the_end_of_the_last_run_completes(tmp_path):
    """``print`` holds ``sys.stdout`` by a borrowed reference while it writes (CPython 3.10-3.13):
    the stand-in must outlive the run that put the real stream back, or the print crashes the process."""
    script = tmp_path / "straddle.py"
    script.write_text(STRADDLING_PRINT)
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", str(script)], capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert proc.stdout.splitlines() == ["printed through _Stream as the run ended", "put back Slow"], proc.stdout


def test_the_stand_in_of_a_stream_is_made_once_and_the_kept_ones_are_bounded(monkeypatch):
    from simdist.backends.sim import _isolation

    monkeypatch.setattr(_isolation, "_STAND_INS", {})  # the process's own stand-ins are left as they are
    streams = [io.StringIO() for _ in range(_isolation.MAX_STAND_INS + 1)]
    first = _isolation._stand_in(streams[0], "stdout")
    assert _isolation._stand_in(streams[0], "stdout") is first and first.inner is streams[0]
    assert _isolation._stand_in(first, "stdout") is first  # a stand-in put back by the program is not wrapped again
    assert _isolation._stand_in(streams[0], "stderr") is not first  # one stream as stdout and as stderr: two
    for stream in streams[1:]:
        _isolation._stand_in(stream, "stdout")
    assert len(_isolation._STAND_INS) <= _isolation.MAX_STAND_INS
    assert (id(streams[0]), "stdout") not in _isolation._STAND_INS  # the oldest was dropped
    assert _isolation._stand_in(streams[-1], "stdout").inner is streams[-1]
