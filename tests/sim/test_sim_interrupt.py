"""Interrupting a simulation stops it: Ctrl-C or ``timeout=`` leave no rank thread, and later runs are exact.

Each case runs in a fresh Python process: a script starts a simulation whose rank 0 loops
outside simdist (spinning in Python, or sleeping in a Python loop) while the other ranks
block in ``recv``. The test sends SIGINT once the script printed ``started`` (or the run's
``timeout=`` expires); the script then checks that no rank thread is left, runs a
deterministic simulation and prints a hash of its values and trace. That hash must equal
the one of the same simulation in a process that ran nothing before, and the process must
exit with code 0 (not killed by SIGABRT at exit).

Last, each script calls a function under a trace function (as Hypothesis and coverage run
code). An asynchronous exception cleared or left pending keeps CPython's (< 3.13) flag of
pending asynchronous exceptions set for good, and 3.11 then spins at the entry of the next
function called under a trace function: ``faulthandler`` ends such a script with its stacks.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import simdist
import simdist as dist

pytestmark = pytest.mark.slow  # slow: starts processes or explores many schedules (quick feedback: -m 'not slow')

SCRIPT = textwrap.dedent(
    """
    import faulthandler, hashlib, signal, sys, threading, time
    import torch
    import simdist, simdist as dist

    # Ctrl-C raises KeyboardInterrupt even where the suite runs with SIGINT ignored (a shell's background job)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def det(rank):
        import random, numpy as np
        dist.init_process_group("gloo")
        t = torch.tensor([random.random(), float(np.random.rand()), float(torch.rand(1))])
        dist.all_reduce(t)
        return t.tolist()

    def det_hash():
        r = simdist.simulate(det, 4, seed=3)
        return hashlib.sha256((repr(r.values) + r.schedule + r.trace.to_json()).encode()).hexdigest()

    caught = []

    def hang(rank, mode):
        dist.init_process_group("gloo")
        if rank == 0:
            x = 0
            while mode == "catch" and len(caught) < 2:  # swallows injected Aborts, two at most
                try:
                    if not caught:
                        print("started", flush=True)  # in the try: the first Abort is always swallowed
                    while True:
                        x += 1
                except BaseException as exc:
                    caught.append(type(exc).__name__)
            if mode != "catch":
                print("started", flush=True)
            while mode in ("spin", "catch"):
                x += 1
            while True:
                time.sleep(0.01)
        dist.recv(torch.zeros(1), src=0)

    def fails(rank):
        dist.init_process_group("gloo")
        if rank == 0:
            raise ValueError("rank 0 fails")
        dist.recv(torch.zeros(1), src=0)

    def traced():
        return 1

    def rank_threads():
        return [t.name for t in threading.enumerate() if t.name.startswith("simdist-rank-")]

    how, mode = sys.argv[1], sys.argv[2]
    if how == "fresh":
        print("hash", det_hash())
    elif how == "sigint":
        try:
            simdist.simulate(hang, 3, (mode,))
            print("finished")
        except KeyboardInterrupt:
            print("interrupted")
        print("caught", *caught)
    elif how == "timeout":
        try:
            simdist.simulate(hang, 3, (mode,), timeout=0.5)
            print("finished")
        except simdist.DistTimeoutError as err:
            print("timed out:", str(err).splitlines()[0])
    elif how == "fails":
        try:
            simdist.simulate(fails, 3)
        except simdist.RankError as err:
            print("rank error", err.rank)
    elif how == "concurrent":
        hashes = []
        def other():
            for _ in range(3):
                hashes.append(det_hash())
        t = threading.Thread(target=other)
        t.start()
        try:
            simdist.simulate(hang, 3, (mode,), timeout=0.5)
        except simdist.DistTimeoutError as err:
            print("timed out:", str(err).splitlines()[0])
        t.join()
        print("other", *hashes)
    print("left", rank_threads(), flush=True)
    print("hash", det_hash(), flush=True)
    faulthandler.dump_traceback_later(60, exit=True)
    sys.settrace(lambda *args: None)
    traced()
    sys.settrace(None)
    faulthandler.cancel_dump_traceback_later()
    print("traced call returned", flush=True)
    """
)

LIMIT = 240  # s for one script, a bound never reached


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    """The script, at one path for every case (the trace names call sites by file)."""
    path = tmp_path_factory.mktemp("interrupt") / "interrupt_script.py"
    path.write_text(SCRIPT)
    return path


def _run(path, how: str, mode: str) -> tuple[int, list[str]]:
    """Run the script; with ``sigint``, send SIGINT once it printed ``started``. Its exit code and lines."""
    proc = subprocess.Popen(
        [sys.executable, str(path), how, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        lines = []
        if how == "sigint":
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if line.startswith("started"):
                    proc.send_signal(signal.SIGINT)
                    break
        out, err = proc.communicate(timeout=LIMIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines += out.splitlines()
    assert proc.returncode == 0, (proc.returncode, lines, err)
    return proc.returncode, lines


def _check_after(lines: list[str], fresh_hash: str) -> None:
    """No rank thread left, the next run exact, a call under a trace function returned."""
    assert "left []" in lines, lines
    assert _hash(lines) == fresh_hash
    assert "traced call returned" in lines, lines


def _hash(lines: list[str]) -> str:
    return next(line.split()[1] for line in lines if line.startswith("hash "))


@pytest.fixture(scope="module")
def fresh_hash(script) -> str:
    _, lines = _run(script, "fresh", "-")
    return _hash(lines)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["spin", "block", "catch"])
def test_sigint_stops_the_run_and_later_runs_are_exact(script, fresh_hash, mode):
    code, lines = _run(script, "sigint", mode)
    assert "interrupted" in lines, lines
    if mode == "catch":  # stopped all the same: injected again after it swallowed one
        caught = next(line.split()[1:] for line in lines if line.startswith("caught"))
        assert caught and set(caught) == {"Abort"}, lines
    _check_after(lines, fresh_hash)
    assert code == 0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["spin", "block"])
def test_timeout_stops_the_run_and_later_runs_are_exact(script, fresh_hash, mode):
    code, lines = _run(script, "timeout", mode)
    timed_out = [line for line in lines if line.startswith("timed out:")]
    assert timed_out and "timeout=0.5" in timed_out[0] and "rank threads were stopped" in timed_out[0], lines
    _check_after(lines, fresh_hash)
    assert code == 0


@pytest.mark.timeout(600)
def test_a_failing_run_leaves_no_asynchronous_exception_behind(script, fresh_hash):
    """The hang of Hypothesis's shrinking: a run whose rank fails, then code under a trace function."""
    code, lines = _run(script, "fails", "-")
    assert "rank error 0" in lines, lines
    _check_after(lines, fresh_hash)
    assert code == 0


@pytest.mark.timeout(600)
def test_a_run_timing_out_beside_another_leaves_the_other_exact(script, fresh_hash):
    code, lines = _run(script, "concurrent", "spin")
    assert any(line.startswith("timed out:") for line in lines), lines
    other = next(line.split()[1:] for line in lines if line.startswith("other"))
    assert other == [fresh_hash] * 3
    _check_after(lines, fresh_hash)
    assert code == 0


def _stuck_in_c(rank: int, release) -> None:
    dist.init_process_group("gloo")
    if rank == 0:
        release.wait(120)  # a lock wait in C: an injected exception arrives only when it returns
    dist.barrier()


@pytest.mark.timeout(300)
def test_a_rank_stuck_in_c_code_is_named_in_the_error_and_ends_once_it_returns():
    release = threading.Event()
    before = {t.ident for t in threading.enumerate()}
    try:
        with pytest.raises(simdist.DistTimeoutError) as info:
            simdist.simulate(_stuck_in_c, 2, (release,), timeout=0.5)
    finally:
        release.set()
    assert "rank thread(s) [0, 1] did not stop within" in str(info.value)
    deadline = time.monotonic() + 120
    while any(t.ident not in before and t.name.startswith("simdist-rank-") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the stuck run's rank threads did not end once released"
        time.sleep(0.05)
