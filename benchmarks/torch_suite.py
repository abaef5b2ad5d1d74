"""(i) torch's own distributed test suite, unmodified, on gloo processes, simulated ranks and socket processes.

    python benchmarks/torch_suite.py [--only REGEX] [--sides gloo,sim,socket | --sim-only | --gloo-only |
                                     --socket-only] [--gloo-from JSON] [--timeout S] [--sim-timeout S]
                                     [--seed N] [--all] [--json PATH] [--list] [--report JSON]

torch's own test suite as the peer. The tests are the methods of ``DistributedTest._DistTestBase`` in the installed
torch (``torch/testing/_internal/distributed/distributed_test.py``), at world size 2 with
``BACKEND=gloo``, ``WORLD_SIZE=2``, ``INIT_METHOD=env://`` (the environment torch's
``run_test.py`` gives ``test_distributed_spawn.py``). Each test runs on up to three sides
(:data:`SIDES`, the case class of each from :func:`case_class`):

- **gloo**: the way torch runs it (``test/distributed/test_distributed_spawn.py``): a
  ``TestDistBackend`` subclass whose ``setUp`` spawns one process per rank; each process joins
  gloo through a ``file://`` store, runs the test method, and exits; the parent maps the exit
  codes to pass, fail or skip (``MultiProcessTestCase._check_return_codes``).
- **sim**: the same test class and method, each rank a thread of ``simdist.simulate(fn, 2)``;
  its ``torch.distributed`` calls reach the simulator through the torch bridge
  (``simdist/torch_bridge/ranks.py``). The harness replaces only what needs processes (see
  :func:`_sim_case_class`): the parent joins a simulation instead of spawned processes, and
  ``self._barrier()`` (files polled with sleeps, which cannot progress while only one rank
  thread runs) is a barrier of the simulated world.
- **socket**: the gloo side's processes, each of which installs the process bridge
  (``simdist/torch_bridge/processes.py``, ``install("socket")``) before the test joins its group,
  so every ``torch.distributed`` group of the test is a simdist socket group (real TCP between the
  rank processes, collectives checked across ranks). Each test gets a simdist store of its own
  (:func:`_socket_case_class`); torch's rendezvous (the ``file://`` store) is untouched.

Every test runs in a child process forked for it (on every side), so a crash (torch's autograd
profiler in two rank threads of one process) is that test's result ("crashed: SIGSEGV") and a
hang is killed after its limit (``--timeout`` on the process sides, ``--sim-timeout`` on the simulator,
each plus 60 s). The figure, per side other than gloo: of the tests that pass on gloo, how many pass
there (target >= 95%). Every test that passes on gloo and not there is listed with its error, the
torch call involved and a cause (``CAUSES`` in ``torch_suite_causes.py``, one table per side).

``--gloo-from`` reuses the gloo side of an earlier ``--json`` (it does not depend on simdist).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import faulthandler
import functools
import glob
import json
import linecache
import os
import re
import signal
import sys
import tempfile
import time
import traceback
import unittest
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from torch_suite_causes import CAUSES  # noqa: E402

ENV = {"BACKEND": "gloo", "WORLD_SIZE": "2", "INIT_METHOD": "env://"}
SIDES = ("gloo", "sim", "socket")
"""The ways a test runs: torch's (gloo processes), then simdist's, each compared with gloo."""
SUITE = "torch/testing/_internal/distributed/distributed_test.py"


# --- the torch side of the harness -----------------------------------------------------------------------


def _set_env(timeout: float, init_method: str | None = None) -> None:
    """The environment distributed_test.py reads at import (call before importing it)."""
    os.environ.update(ENV)
    os.environ["PYTORCH_PRINT_REPRO_ON_FAILURE"] = "0"  # torch's "To execute this test, run ..." after each error
    if init_method:
        os.environ["INIT_METHOD"] = ENV["INIT_METHOD"] = init_method
    # torch's own limit for joining a test's processes (common_distributed.TIMEOUT_DEFAULT)
    os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", str(int(timeout)))


@functools.cache
def _suite() -> Any:
    from torch.testing._internal.distributed import distributed_test

    return distributed_test


def test_names(pattern: str | None = None) -> list[str]:
    """The test methods of ``DistributedTest._DistTestBase``, sorted, filtered by ``pattern`` (regex search)."""
    base = _suite().DistributedTest._DistTestBase
    names = sorted(n for n in dir(base) if n.startswith("test") and callable(getattr(base, n)))
    return [n for n in names if pattern is None or re.search(pattern, n)]


@functools.cache
def _gloo_case_class() -> type:
    """torch's ``TestDistBackendWithSpawn`` (test/distributed/test_distributed_spawn.py), as written there."""
    import torch

    dt = _suite()

    class TorchSpawnCase(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

        @classmethod
        def _run(cls, rank, test_name, file_name, pipe, **kwargs):
            _dump_stacks_when_terminated(rank)
            super()._run(rank, test_name, file_name, pipe, **kwargs)

    # the spawned rank processes unpickle the class by name from this script (see __getattr__)
    TorchSpawnCase.__module__ = __name__
    TorchSpawnCase.__qualname__ = "TorchSpawnCase"
    return TorchSpawnCase


@functools.cache
def _socket_case_class() -> type:
    """torch's spawn case of :func:`_gloo_case_class`, each rank process on simdist's socket backend.

    What differs from it, and nothing else:

    - ``setUp`` gives the test a simdist store of its own before the ranks are spawned (they
      inherit the environment): ``$SIMDIST_STORE`` on a free loopback port, a fresh
      ``$SIMDIST_SECRET``, no ``$SIMDIST_STORE_SERVED`` (so rank 0 serves the store);
    - each rank process installs the process bridge (``processes.install("socket")``) before
      torch's ``TestDistBackend._run`` calls ``init_process_group``: from then on every group
      the test makes is a simdist socket group, whatever backend it names.
    """
    from simdist.backends.socket import SECRET_ENV, new_secret
    from simdist.core import SERVED_ENV, STORE_ENV, free_port

    class SocketSpawnCase(_gloo_case_class()):
        def setUp(self):
            os.environ.update({STORE_ENV: f"127.0.0.1:{free_port()}", SECRET_ENV: new_secret()})
            os.environ.pop(SERVED_ENV, None)
            super().setUp()

        @classmethod
        def _run(cls, rank, test_name, file_name, pipe, **kwargs):
            from simdist.torch_bridge import processes

            processes.install("socket")
            super()._run(rank, test_name, file_name, pipe, **kwargs)

    SocketSpawnCase.__module__ = __name__
    SocketSpawnCase.__qualname__ = "SocketSpawnCase"
    return SocketSpawnCase


STACKS_ENV = "TORCH_SUITE_STACKS"
"""Where a rank process writes every thread's stack when it is terminated (torch's parent terminates the
ranks of a test that ran past its timeout): this path with ``.rank<N>`` appended."""


def _dump_stacks_when_terminated(rank: int) -> None:
    """In a rank process: on SIGTERM, write every thread's stack to ``$TORCH_SUITE_STACKS.rank<rank>``, then
    end as SIGTERM would (torch's parent cannot ask a rank that left the test method for its stack)."""
    path = os.environ.get(STACKS_ENV)
    if path:
        out = open(f"{path}.rank{rank}", "w", encoding="utf-8")  # noqa: SIM115 - open until the process ends
        faulthandler.register(signal.SIGTERM, file=out, all_threads=True, chain=True)


def _terminated_stacks(path: str) -> dict[str, str]:
    """``{"terminated": ...}``: where each rank process was when it was terminated (the dumps at ``path``
    by :func:`_dump_stacks_when_terminated`): its main thread, and each other thread that was in simdist."""
    said = []
    for dump in sorted(glob.glob(f"{glob.escape(path)}.rank*"), key=lambda p: int(p.rsplit("rank", 1)[1])):
        blocks = re.findall(r"^(?:Current thread|Thread) [^\n]*\n((?:  File [^\n]*\n)+)", _read_log(dump), re.M)
        main, others = [], []
        for body in blocks:
            frames = _text_frames(body, newest_first=True)
            where = _where(frames)
            line = " -> ".join(where[k] for k in ("test_line", "simdist_frame", "deepest") if k in where)
            if frames and frames[0][0] == "<string>":  # the spawned process's main thread
                main.append(f"main thread {line}")
            elif "simdist_frame" in where:
                others.append(f"thread {line}")
        if main or others:
            said.append(f"rank {dump.rsplit('rank', 1)[1]}: " + " | ".join(main + others))
    return {"terminated": "; ".join(said)} if said else {}


def case_class(side: str) -> type:
    """The unittest case class that runs a test on ``side`` (one of :data:`SIDES`)."""
    return {"gloo": _gloo_case_class, "sim": _sim_case_class, "socket": _socket_case_class}[side]()


def __getattr__(name: str) -> Any:
    # torch's spawn start method re-imports this script in each rank process as __mp_main__ and
    # looks the test class up by name there
    if name in ("TorchSpawnCase", "SocketSpawnCase"):
        return case_class("socket" if name == "SocketSpawnCase" else "gloo")
    raise AttributeError(name)


@functools.cache
def _sim_case_class() -> type:
    """The same test class, its ranks run as threads of one simulation.

    What differs from :func:`_gloo_case_class`, and nothing else:

    - ``setUp`` spawns no process (torch's ``TestDistBackend.setUp`` still makes the temporary
      directories and the init file); the test method, called on the parent (``rank == -1``),
      goes through ``join_or_run`` to ``_join_processes``, which here runs ``simdist.simulate``
      of :meth:`_sim_rank` and maps the ranks' outcomes as ``_check_return_codes`` maps exit
      codes (an error on any rank fails the test; else a skip on rank 0 skips it);
    - :meth:`_sim_rank` is ``TestDistBackend._run`` plus ``MultiProcessTestCase.run_test`` on a
      rank thread, without what only a process has (event-listener pipe, fatal-signal handler,
      ``sys.exit``): ``sys.exit(code)`` in a test is the exit code it would have been;
    - ``_barrier`` (``Barrier.sync``: files in ``TEMP_DIR/barrier`` polled every 0.1 s) is a
      barrier of every simulated rank, on a simdist group of its own (Barrier.sync is outside
      torch's groups).
    """
    import torch.distributed as tdist
    from torch.distributed import distributed_c10d as c10d
    from torch.testing._internal import common_utils
    from torch.testing._internal.common_distributed import TEST_SKIPS

    import simdist

    dt = _suite()
    skip_codes = {s.exit_code: s.message for s in TEST_SKIPS.values()}

    class SimCase(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        sim_timeout: float | None = None
        sim_seed: int = 0

        def _join_processes(self, fn):
            outcomes: dict[int, tuple[str, Any]] = {}  # rank -> (skip|exit|unwound, detail)
            self.sim_error = None
            try:
                simdist.simulate(
                    type(self)._sim_rank,
                    int(self.world_size),
                    args=(self._current_test_name(), self.file_name, outcomes),
                    timeout=self.sim_timeout,
                    seed=self.sim_seed,
                    leaks="ignore",
                )
            except simdist.RankError as exc:
                self.sim_error = exc.__cause__ if exc.__cause__ is not None else exc
                raise self.sim_error from None
            except simdist.DistTimeoutError as exc:  # a rank still runs: where each rank thread is now
                self.sim_error = exc
                self.sim_where = _rank_stacks()
                raise
            except simdist.DistError as exc:
                self.sim_error = exc
                self.sim_where = {r: where for r, (kind, where) in sorted(outcomes.items()) if kind == "unwound"}
                raise
            failed = {r: why for r, (kind, why) in outcomes.items() if kind == "exit"}
            if failed:
                rank, why = min(failed.items())
                self.sim_error = AssertionError(f"rank {rank}: {why}")
                raise self.sim_error
            if outcomes.get(0, ("", ""))[0] == "skip":
                raise unittest.SkipTest(outcomes[0][1])

        @classmethod
        def _sim_rank(cls, rank: int, test_name: str, file_name: str, outcomes: dict) -> None:
            self = cls(test_name)
            self.rank = rank
            self.file_name = file_name
            timeout = dt.timedelta(seconds=dt.CUSTOM_PG_TIMEOUT.get(test_name, dt.default_pg_timeout))
            tdist.init_process_group(
                init_method=self.init_method,
                backend=dt.BACKEND,
                world_size=int(self.world_size),
                rank=self.rank,
                timeout=timeout,
            )
            self._barrier()
            os.environ["TORCH_SHOW_CPP_STACKTRACES"] = "1"
            common_utils.set_rng_seed()
            try:
                getattr(self, test_name)()
            except unittest.SkipTest as exc:
                outcomes[rank] = ("skip", str(exc))
                return
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if code in skip_codes:
                    outcomes[rank] = ("skip", skip_codes[code])
                elif code != 0:
                    outcomes[rank] = ("exit", f"sys.exit({exc.code!r}) in the test")
                return
            except Exception:
                raise
            except BaseException as exc:  # the simulator unwinding this rank: keep where it was blocked
                outcomes[rank] = ("unwound", _frames(exc))
                raise
            self._barrier()
            tdist.destroy_process_group()

        def _barrier(self, *args, **kwargs):
            if not tdist.is_initialized():  # between a test's destroy_process_group and its next init
                if simdist.is_initialized():
                    simdist.barrier()
                else:
                    simdist.init_process_group("sim")
                    simdist.barrier()
                    simdist.destroy_process_group()
                return
            # Barrier.sync is outside torch's groups: a simdist group of all ranks of its own, one per
            # default group (so a rank that skips a collective on the default group is not matched here)
            default = c10d._get_default_group()
            if getattr(self, "_sim_barrier", (None, None))[0] is not default:
                self._sim_barrier = (default, simdist.new_group(list(range(simdist.get_world_size()))))
            simdist.barrier(group=self._sim_barrier[1])

    return SimCase


# --- one test, one side, in a child process --------------------------------------------------------------


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _short_path(filename: str) -> str:
    """``filename`` from its package (``torch/...``) or from this checkout's root (``simdist/...``, ``backends/...``)."""
    if filename.startswith(_CHECKOUT):
        return filename[len(_CHECKOUT) :]
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1]
    return filename


_CHECKOUT = str(Path(__file__).resolve().parents[1]) + os.sep


def _where(frames: list[tuple[str, int, str]]) -> dict[str, str]:
    """Where a failure happened, from its frames (outermost first): the test's innermost line in
    distributed_test.py, the call it made out of the test, the innermost torch.distributed line
    (with its source: the ProcessGroup method torch called), and the deepest frame."""
    fmt = lambda f: f"{_short_path(f[0])}:{f[1]} in {f[2]}"  # noqa: E731
    out: dict[str, str] = {}
    if not frames:
        return out
    idx = [i for i, f in enumerate(frames) if f[0].endswith("distributed_test.py")]
    if idx:
        out["test_line"] = fmt(frames[idx[-1]])
        if idx[-1] + 1 < len(frames):
            out["call"] = fmt(frames[idx[-1] + 1])
    c10d = [
        f
        for f in frames
        if "torch/distributed/" in f[0] and "/testing/" not in f[0] and not f[0].endswith("c10d_logger.py")
    ]
    if c10d:
        f = c10d[-1]
        out["torch_call"] = fmt(f) + f": {linecache.getline(f[0], int(f[1])).strip()}"
    ours = [f for f in frames if _short_path(f[0]).startswith(("simdist/", "backends/"))]
    if ours:
        out["simdist_frame"] = fmt(ours[-1])
    out["deepest"] = fmt(frames[-1])
    return out


def _rank_stacks() -> dict[int, dict[str, str]]:
    """Where each live rank thread of the simulator is (threads named ``simdist-rank-N``)."""
    import threading

    frames = sys._current_frames()
    out = {}
    for t in threading.enumerate():
        m = re.fullmatch(r"simdist-rank-(\d+)", t.name)
        if m and t.ident in frames:
            stack = traceback.extract_stack(frames[t.ident])
            out[int(m.group(1))] = _where([(f.filename, f.lineno, f.name) for f in stack])
    return dict(sorted(out.items()))


def _text_frames(text: str, newest_first: bool = False) -> list[tuple[str, int, str]]:
    """The frames of a traceback's text (outermost first), or of a faulthandler dump (``newest_first``)."""
    frames = [(f, int(ln), fn) for f, ln, fn in re.findall(r'File "([^"]+)", line (\d+),? in (\S+)', text)]
    return frames[::-1] if newest_first else frames


def _frames(exc: BaseException) -> dict[str, str]:
    return _where([(f.filename, f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__)])


def _process_failure(text: str) -> dict[str, str]:
    """The first failed rank's error and where it happened, from torch's "Process i exited with error code 10
    and exception: <traceback>" (the parent's error on the process sides)."""
    m = re.search(
        r"Process \d+ exited with error code \d+ and exception:\n(.*?)(?:\nProcess \d+ exited|\Z)", text, re.S
    )
    block = m.group(1) if m else text
    lines = [ln for ln in block.strip().splitlines() if ln.strip()]
    # the exception: the lines not indented after the last frame (a frame's lines are indented), the first
    # three ("AssertionError: Scalars are not equal!", "Expected 1 but got 0.", ...)
    frame_lines = [i for i, ln in enumerate(lines) if ln.lstrip().startswith('File "')]
    after = [ln.strip() for ln in lines[frame_lines[-1] + 1 if frame_lines else 0 :] if not ln.startswith(" ")]
    error = " ".join(after[:3]) if after else (lines[-1].strip() if lines else "")
    return {"error": error, **_where(_text_frames(block))}


def _run_case(side: str, name: str, timeout: float, seed: int) -> dict[str, Any]:
    """Run one test method on one side in this process through unittest; its outcome as a dict."""
    cls = case_class(side)
    if side == "sim":
        cls.sim_timeout, cls.sim_seed = timeout, seed
    case = cls(name)
    result = unittest.TestResult()
    case.run(result)
    rec: dict[str, Any]
    if result.errors or result.failures or result.unexpectedSuccesses:
        rec = {"outcome": "fail"}
        err = getattr(case, "sim_error", None)
        if err is not None:
            rec["error"] = f"{type(err).__name__}: {_first_line(err)}"
            rec.update(_frames(err))
            blocked = [ln.strip() for ln in str(err).splitlines() if ln.strip().startswith("rank ")]
            if blocked:  # a DeadlockError's report: what each rank was blocked in
                rec["blocked"] = "; ".join(blocked)
            for rank, where in getattr(case, "sim_where", {}).items():  # and where, in the test
                rec.update(where)
                rec["where_by_rank"] = {
                    str(r): " -> ".join(w[k] for k in ("test_line", "deepest") if k in w)
                    for r, w in case.sim_where.items()
                }
                break
        elif result.unexpectedSuccesses:
            rec["error"] = "unexpected success"
        else:
            text = (result.errors + result.failures)[0][1]
            if side == "sim":
                rec["error"] = _first_line(text.strip().splitlines()[-1])
            else:
                rec.update(_process_failure(text))
    elif result.skipped:
        rec = {"outcome": "skip", "reason": _first_line(result.skipped[0][1])}
    else:
        rec = {"outcome": "pass"}
    return rec


def run_isolated(side: str, name: str, timeout: float, seed: int, logdir: str) -> dict[str, Any]:
    """Fork a child that runs one test on one side; its outcome, a crash or a kill after ``timeout`` + 60 s."""
    res_path = os.path.join(logdir, f"{side}-{name}.json")
    log_path = os.path.join(logdir, f"{side}-{name}.log")
    stacks_path = os.path.join(logdir, f"{side}-{name}.stacks")
    t0 = time.perf_counter()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: its own process group (so its rank processes die with it), output to a log
        code = 1
        try:
            os.setpgid(0, 0)
            fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            faulthandler.enable()  # a crash leaves every thread's Python stack in the log
            os.environ[STACKS_ENV] = stacks_path  # and so does a rank process that torch terminates
            rec = _run_case(side, name, timeout, seed)
            with open(res_path, "w", encoding="utf-8") as f:
                json.dump(rec, f)
            code = 0
        except BaseException:  # noqa: BLE001 - reported through the log
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = t0 + timeout + 60
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif time.perf_counter() > deadline:
            _kill_group(pid)
            os.waitpid(pid, 0)
            status = -1
        else:
            time.sleep(0.05)
    _kill_group(pid)  # rank processes a test left behind
    seconds = round(time.perf_counter() - t0, 2)
    if status == -1:
        rec = {"outcome": "fail", "error": f"hung: killed after {timeout + 60:.0f} s"}
    elif os.WIFSIGNALED(status):
        rec = {
            "outcome": "fail",
            "error": f"crashed: {signal.Signals(os.WTERMSIG(status)).name}",
            **_crash_frames(log_path),
        }
    elif os.path.exists(res_path):
        with open(res_path, encoding="utf-8") as f:
            rec = json.load(f)
        if rec.get("error", "").startswith("Expected exit code"):  # a rank failed outside the test method
            rec.update(_logged_failure(log_path))
        elif rec["outcome"] == "fail" and side != "sim":
            rec.update(_failed_outside(log_path))
        if rec["outcome"] == "fail" and side != "sim":
            rec.update(_terminated_stacks(stacks_path))
    else:
        rec = {"outcome": "fail", "error": f"harness error (exit code {os.WEXITSTATUS(status)}): {_log_tail(log_path)}"}
    rec["seconds"] = seconds
    stacks = glob.glob(f"{glob.escape(stacks_path)}.rank*")
    for path in (res_path, log_path, *stacks) if rec["outcome"] != "fail" else (res_path,):  # keep failures' logs
        if os.path.exists(path):
            os.remove(path)
    return rec


def _crash_frames(log_path: str) -> dict[str, str]:
    """Where a crash happened: the crashing thread's stack in faulthandler's dump (most recent call first)."""
    text = _read_log(log_path)
    blocks = re.findall(r"^(Current thread|Thread) [^\n]*\n((?:  File [^\n]*\n)+)", text, re.M)
    stacks = {kind == "Current thread": _text_frames(body, newest_first=True) for kind, body in blocks}
    where = _where(stacks.get(True, []))
    if "test_line" not in where:  # it crashed outside the ranks: where the rank in the test was meanwhile
        for kind, body in blocks:
            other = _where(_text_frames(body, newest_first=True))
            if kind == "Thread" and "test_line" in other:
                where.update({k: v for k, v in other.items() if k != "deepest"})
                break
    return where


def _logged_failure(log_path: str) -> dict[str, str]:
    """The first traceback in a test's log: a rank process that failed outside the test method (joining its
    group, torch's barrier file, ``destroy_process_group``), which torch reports by its exit code only."""
    text = _read_log(log_path)
    m = re.search(r"^Traceback \(most recent call last\):\n((?:[ \t].*\n)+)(\S.*)", text, re.M)
    return {"error": m.group(2).strip(), **_where(_text_frames(m.group(1)))} if m else {}


def _failed_outside(log_path: str) -> dict[str, str]:
    """``{"outside": ...}``: the rank processes that failed outside the test method besides the one torch
    reports (torch names only those that exited with its error code: the first of them caused the rest)."""
    text = _read_log(log_path)
    found = re.findall(
        r"^Process process (\d+):\nTraceback \(most recent call last\):\n((?:[ \t].*\n)+)(\S.*)", text, re.M
    )
    if not found:
        return {}
    said = []
    for rank, frames, error in found:
        where = _where(_text_frames(frames))
        line = where.get("test_line") or where.get("deepest") or ""
        said.append(f"rank {rank}: {error.strip()}" + (f" ({line})" if line else ""))
    return {"outside": "; ".join(said)}


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_log(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _log_tail(path: str) -> str:
    lines = [ln.strip() for ln in _read_log(path).splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


# --- causes of the failures on simdist's sides (the tables: torch_suite_causes.py) ------------------------


def classify(rec: dict[str, Any], side: str = "sim") -> tuple[str, str]:
    """``(cause, what would fix it)`` of a failure on ``side``: the first of ``CAUSES[side]`` that matches."""
    text = " | ".join(
        str(rec.get(k, "")) for k in ("error", "test_line", "call", "torch_call", "blocked", "simdist_frame", "deepest")
    )
    for cause, pattern, fix in CAUSES[side]:
        if re.search(pattern, text):
            return cause, fix
    return "unclassified", ""


# --- the report ----------------------------------------------------------------------------------------

NAMES = {"sim": "the simulator", "socket": "the socket backend"}
"""How the report names each side compared with gloo."""


def compare(results: dict[str, dict[str, Any]], side: str) -> dict[str, Any]:
    """``side`` against gloo: the figure (of the tests that pass on gloo, how many pass on ``side``) and the lists."""
    both = [n for n, r in results.items() if "gloo" in r and side in r]
    gloo_pass = [n for n in both if results[n]["gloo"]["outcome"] == "pass"]
    passed = [n for n in gloo_pass if results[n][side]["outcome"] == "pass"]
    share = len(passed) / len(gloo_pass) if gloo_pass else None
    outcome = lambda n, s: results[n][s]["outcome"]  # noqa: E731
    return {
        "gloo_pass": len(gloo_pass),
        "pass_of_gloo_pass": len(passed),
        "share": share,
        "target": 0.95,
        "met": share is not None and share >= 0.95,
        "lost": [n for n in gloo_pass if outcome(n, side) != "pass"],
        "gained": [n for n in both if outcome(n, "gloo") != "pass" and outcome(n, side) == "pass"],
        "fail": [n for n, r in results.items() if side in r and r[side]["outcome"] == "fail"],
        "extra_fail": [n for n in both if outcome(n, "gloo") == "skip" and outcome(n, side) == "fail"],
    }


def summarize(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Counts per side, and each side other than gloo compared with gloo (:func:`compare`)."""
    counts = {side: {"pass": 0, "fail": 0, "skip": 0} for side in SIDES}
    for rec in results.values():
        for side in SIDES:
            if side in rec:
                counts[side][rec[side]["outcome"]] += 1
    return {"counts": counts, "sides": {s: compare(results, s) for s in SIDES[1:] if sum(counts[s].values())}}


def report(results: dict[str, dict[str, Any]], summary: dict[str, Any], show_all: bool) -> str:
    from _common import markdown_table

    out = []
    rows = [
        [side, c["pass"], c["fail"], c["skip"], c["pass"] + c["fail"] + c["skip"]]
        for side, c in summary["counts"].items()
        if sum(c.values())
    ]
    out.append(markdown_table(["side", "pass", "fail", "skip", "tests"], rows))
    for side, cmp in summary["sides"].items():
        out += _side_report(results, side, cmp)
    skips: dict[str, int] = {}
    for rec in results.values():
        outcome = [rec[side] for side in SIDES if side in rec]
        if outcome and all(o["outcome"] == "skip" for o in outcome):
            skips[outcome[0].get("reason", "")] = skips.get(outcome[0].get("reason", ""), 0) + 1
    if skips:
        out.append("\nSkipped on every side run, by reason:\n")
        out.append(
            markdown_table(
                ["skip reason", "tests"],
                [[_cell(why), n] for why, n in sorted(skips.items(), key=lambda kv: (-kv[1], kv[0]))],
            )
        )
    if show_all:
        run = [
            s
            for s in SIDES
            if summary["counts"][s]["pass"] + summary["counts"][s]["fail"] + summary["counts"][s]["skip"]
        ]
        rows = [[n, *(_side_cell(r.get(side)) for side in run)] for n, r in sorted(results.items())]
        out.append("\nEvery test:\n")
        out.append(markdown_table(["test", *run], rows))
    return "\n".join(out)


def _side_report(results: dict[str, dict[str, Any]], side: str, cmp: dict[str, Any]) -> list[str]:
    """The figure of ``side`` and its failures by cause (or, without a gloo side, its failures)."""
    on = NAMES[side]
    if cmp["share"] is None:
        return _failure_tables(results, side, cmp["fail"], f"Fail on {on}:")
    out = [
        f"\n**{cmp['pass_of_gloo_pass']} of the {cmp['gloo_pass']} tests that pass on gloo pass on {on} "
        f"({100 * cmp['share']:.1f}%; target >= 95%: {'met' if cmp['met'] else 'missed'}).**"
    ]
    out += _failure_tables(results, side, cmp["lost"], f"Pass on gloo, not on {on}:")
    if cmp["gained"]:
        why = sorted({results[n]["gloo"].get("reason") or results[n]["gloo"].get("error", "") for n in cmp["gained"]})
        out.append(
            f"\nPass on {on}, not on gloo ({len(cmp['gained'])}; on gloo: "
            + "; ".join(_cell(w, 80) for w in why)
            + "): "
            + ", ".join(cmp["gained"])
        )
    out += _failure_tables(results, side, cmp["extra_fail"], f"Skipped on gloo, fail on {on}:")
    return out


def _failure_tables(results: dict[str, dict[str, Any]], side: str, names: list[str], title: str) -> list[str]:
    """The failures on ``side`` of ``names``, one row per test grouped by cause, then one row per cause."""
    from _common import markdown_table

    if not names:
        return []
    by_cause: dict[str, list[str]] = {}
    for n in names:
        by_cause.setdefault(results[n][side].get("cause", "unclassified"), []).append(n)
    ordered = sorted(by_cause.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    rows = []
    for cause, group in ordered:
        for n in group:
            s = results[n][side]
            rows.append(
                [
                    cause,
                    n,
                    _cell(s.get("error", s.get("reason", s["outcome"]))),
                    _cell(_short_test_line(s.get("test_line", ""))),
                    _cell(s.get("torch_call", s.get("call", "")), 90),
                ]
            )
    fixes = {cause: fix for cause, _, fix in CAUSES[side]}
    return [
        f"\n{title}\n",
        markdown_table(["cause", "test", "error", "test line", "torch call"], rows),
        "\nBy cause:\n",
        markdown_table(
            ["cause", "tests", "what would fix it"],
            [[cause, len(group), fixes.get(cause, "")] for cause, group in ordered],
        ),
    ]


def _short_test_line(where: str) -> str:
    return where.replace("torch/testing/_internal/distributed/", "")


def _cell(text: Any, width: int = 110) -> str:
    text = str(text).replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= width else text[: width - 3] + "..."


def _side_cell(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return "-"
    extra = rec.get("error") or rec.get("reason") or ""
    return _cell(f"{rec['outcome']} {rec.get('seconds', '')}s" + (f": {extra}" if extra else ""), 80)


# --- main ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", metavar="REGEX", help="only the tests whose name matches (re.search)")
    side = p.add_mutually_exclusive_group()
    side.add_argument(
        "--sides", default=",".join(SIDES), help=f"the sides to run, comma-separated (default {','.join(SIDES)})"
    )
    for s in SIDES:
        side.add_argument(f"--{s}-only", dest="sides", action="store_const", const=s, help=f"--sides {s}")
    p.add_argument(
        "--gloo-from", metavar="JSON", help="take the gloo side from an earlier --json run (and do not run it)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="real seconds per test on the process sides, gloo and socket (torch's own limit for joining a "
        "test's processes, default 300); the child is killed 60 s later",
    )
    p.add_argument(
        "--sim-timeout",
        type=float,
        default=120.0,
        help="real seconds per test on the simulator (simulate(timeout=); the slowest passing test "
        "takes about 20 s); the child is killed 60 s later",
    )
    p.add_argument("--seed", type=int, default=0, help="the simulator's schedule seed")
    p.add_argument(
        "--init-method",
        metavar="URL",
        help="INIT_METHOD for the suite (default env://; torch's CI also runs file://PATH, which "
        "enables test_barrier_timeout_global)",
    )
    p.add_argument("--all", action="store_true", help="also print every test's outcome on every side run")
    p.add_argument("--list", action="store_true", help="list the selected tests and exit")
    p.add_argument(
        "--report", metavar="JSON", help="print the report of an earlier --json run (causes re-derived) and exit"
    )
    p.add_argument(
        "--json", metavar="PATH", help="write every outcome and the figure as JSON (rewritten after each test)"
    )
    args = p.parse_args(argv)

    _set_env(args.timeout, args.init_method)
    from _common import finish_info, machine_info, write_json

    if args.report:
        with open(args.report, encoding="utf-8") as f:
            results = json.load(f)["tests"]
        for rec in results.values():
            for s, r in rec.items():
                if s in CAUSES and r["outcome"] == "fail":
                    r["cause"] = classify(r, s)[0]
        print(report(results, summarize(results), args.all))
        return 0

    names = test_names(args.only)
    if args.list:
        print("\n".join(names))
        return 0
    sides = [s for s in SIDES if s in args.sides.split(",") and not (s == "gloo" and args.gloo_from)]
    if unknown := set(args.sides.split(",")) - set(SIDES):
        p.error(f"--sides: unknown side(s) {', '.join(sorted(unknown))}; expected some of {', '.join(SIDES)}")
    earlier: dict[str, Any] = {}
    if args.gloo_from:
        with open(args.gloo_from, encoding="utf-8") as f:
            earlier = json.load(f)["tests"]
    import simdist  # imported before forking, like torch and the suite

    info = machine_info()
    results: dict[str, dict[str, Any]] = {}
    seconds = {s: 0.0 for s in SIDES}
    logdir = tempfile.mkdtemp(prefix="torch-suite-")
    t_start = time.perf_counter()
    payload: dict[str, Any] = {}
    for i, name in enumerate(names, 1):
        rec: dict[str, Any] = {}
        if args.gloo_from and "gloo" in earlier.get(name, {}):
            rec["gloo"] = earlier[name]["gloo"]
        for s in sides:
            rec[s] = run_isolated(s, name, args.sim_timeout if s == "sim" else args.timeout, args.seed, logdir)
            seconds[s] += rec[s]["seconds"]
            if s in CAUSES and rec[s]["outcome"] == "fail":
                rec[s]["cause"] = classify(rec[s], s)[0]
        results[name] = rec
        print(
            f"[{i}/{len(names)}] {name}: " + "  ".join(f"{s} {_side_cell(rec.get(s))}" for s in SIDES if s in rec),
            file=sys.stderr,
            flush=True,
        )
        if args.json:
            payload = _payload(results, seconds, time.perf_counter() - t_start, info, args, simdist, complete=False)
            write_json(args.json, payload)
    wall = time.perf_counter() - t_start
    summary = summarize(results)
    text = report(results, summary, args.all)
    seconds = {s: round(sum(r[s]["seconds"] for r in results.values() if s in r), 1) for s in SIDES}
    times = ", ".join(
        f"{s} side {seconds[s]:.0f} s" + (" (from --gloo-from)" if s not in sides else "") for s in SIDES if seconds[s]
    )
    text += f"\n\n{len(names)} tests; {times}; {wall:.0f} s in all. Logs of the failures: {logdir}"
    print(text)
    if args.json:
        payload = _payload(results, seconds, wall, finish_info(info), args, simdist, complete=True)
        payload["summary"], payload["markdown"] = summary, text
        write_json(args.json, payload)
    return 0


def _commit() -> str | None:
    """The simdist checkout's commit (``+`` when it has uncommitted changes), or ``None`` outside git."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + ("+" if git("status", "--porcelain", "--untracked-files=no") else "") if head else None
    except OSError:
        return None


def _payload(results, seconds, wall, info, args, simdist, *, complete: bool) -> dict[str, Any]:
    import torch

    return {
        "benchmark": "torch_suite",
        "suite": SUITE,
        "env": ENV,
        "machine": info,
        "complete": complete,
        "torch": torch.__version__,
        "simdist": simdist.__version__,
        "commit": _commit(),
        "timeout_s": args.timeout,
        "sim_timeout_s": args.sim_timeout,
        "seed": args.seed,
        "only": args.only,
        "gloo_from": args.gloo_from,
        "sides": [s for s in SIDES if s in args.sides.split(",") or (s == "gloo" and args.gloo_from)],
        "seconds": {**seconds, "wall": round(wall, 1)},
        "causes": CAUSES,
        "date": _dt.date.today().isoformat(),
        "tests": results,
    }


if __name__ == "__main__":
    sys.exit(main())
