"""Where rank processes come from: a fork server that imported torch and simdist once.

Starting a Python process that imports torch takes a second or more; forking one that has
imported it takes milliseconds. The *base server* is a process of its own (``python -c``, in a
session of its own, so a terminal's Ctrl-C reaches only the coordinator), started on first use
with the coordinator's ``sys.path``. It imports torch, numpy and simdist, and forks before any
thread or CUDA state exists in it. A *template* is a child of it that has also prepared for one
kind of run: the coordinator's working directory, its ``__main__`` module where the run's
function lives there (run again as ``__mp_main__``, as multiprocessing's spawn start method
does) and the function's module, imported by name. Every rank of such a run is forked from its
template, so each starts as a fresh process that has just imported the program.

A server (base or template) does one thing at a time, on one socket to the coordinator:

======================================  ==========================================================
coordinator -> server                   server -> coordinator
======================================  ==========================================================
``("fork", id, "rank", None)`` + fds    ``("forked", id, pid)`` + its pidfd, or ``("failed", id,
(the rank's socket, stdout, stderr)     text)``
``("fork", id, "template", prep)`` +    the same; the template then serves on the socket
fds (its socket, stdout, stderr)
``("signal", pid, signum)``             ``("exit", pid, status)`` whenever a child ends (``waitpid``)
======================================  ==========================================================

When the coordinator's socket closes (the coordinator ended), a server kills its children and
exits; every child also dies with its server (``PR_SET_PDEATHSIG``). So no rank process outlives
the program that simulates.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import OrderedDict
from typing import Any

from ._channel import Channel, ChannelClosed

__all__ = ["Server", "base_server", "template_for", "RankStartError"]

START_TIMEOUT = 120.0
"""Seconds the base server may take to start (it imports torch; a loaded machine is slow)."""
FORK_TIMEOUT = 60.0
"""Seconds a fork may take to be answered (a template imports the program's module first)."""
TEMPLATES_KEPT = 4
"""Templates a coordinator keeps at most (the least recently used one is ended first)."""
MAX_SPARES = 64
"""Rank processes a template starts ahead of the next run at most (as many as the last run took)."""

_BOOT = "import sys, json; sys.path[:] = json.loads(sys.argv[1]); from simdist.backends.sim import _forkserver; "
_BOOT += "_forkserver.boot(int(sys.argv[2]))"


class RankStartError(RuntimeError):
    """A rank process could not be started (its template failed to import the program, say)."""


# -- in the server ---------------------------------------------------------------------------------------------


def boot(fd: int) -> None:
    """The base server's main: import what every rank needs, then serve on socket ``fd`` (never returns)."""
    import numpy  # noqa: F401
    import torch
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    from simdist import torch_bridge  # noqa: F401  (importing this module imported simdist and its API)

    from . import _rank_process

    _rank_process.install_torch()  # what every rank process has: torch.distributed routed to its world
    del torch
    atexit._clear()  # torch's and the server's own exit handlers: a rank runs its program's (and exits at once after)
    gc.collect()
    gc.freeze()  # the children never scan (and so never copy) what the server imported
    _huge_pages()
    _serve(Channel(socket.socket(fileno=fd)), ("ready", os.getpid()))


class _Serving:
    """A server's state: its socket to the coordinator, its children, and (a template's) spare rank processes."""

    def __init__(self, chan: Channel):
        self.chan = chan
        self.children: set[int] = set()
        self.spares: list[tuple[int, int]] = []  # (pid, the coordinator's end of its socket), started ahead
        self.want = 0  # spares to keep: as many as the last run took
        self.wake = os.pipe()
        for fd in self.wake:
            os.set_blocking(fd, False)

    def kill_all(self) -> None:
        for pid in self.children:
            _kill(pid, signal.SIGKILL)


def _serve(chan: Channel, hello: tuple) -> None:
    state = _Serving(chan)
    signal.set_wakeup_fd(state.wake[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)
    try:
        _loop(state, hello)
    except (ChannelClosed, OSError):  # the coordinator is gone: so are the children
        state.kill_all()
        os._exit(0)


def _loop(state: _Serving, hello: tuple) -> None:
    chan, wake_r = state.chan, state.wake[0]
    chan.send(hello)
    while True:
        ready, _, _ = select.select(
            [chan.sock.fileno(), wake_r], [], [], None if len(state.spares) >= state.want else 0
        )
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        _reap(state)
        if chan.sock.fileno() not in ready:
            if len(state.spares) < state.want:  # nothing asked meanwhile: start the next run's processes
                state.spares.append(_fork_rank(state))
            continue
        msg, fds = chan.recv()
        while True:
            _handle(state, msg, fds)
            if not chan.ready():
                break
            msg, fds = chan.recv()


def _reap(state: _Serving) -> None:
    while state.children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        state.children.discard(pid)
        state.chan.send(("exit", pid, status))


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _handle(state: _Serving, msg: tuple, fds: list[int]) -> None:
    if msg[0] == "signal":
        if msg[1] in state.children:
            _kill(msg[1], msg[2])
        return
    if msg[0] == "ranks":  # ("ranks", id, n): n rank processes, spares first
        _, req, n = msg
        state.want = min(n, MAX_SPARES)
        taken = [state.spares.pop(0) if state.spares else _fork_rank(state) for _ in range(n)]
        for pid, sock in taken:
            pidfd = os.pidfd_open(pid)
            try:
                state.chan.send(("forked", req, pid), [sock, pidfd])
            finally:
                os.close(pidfd)
                os.close(sock)
        return
    _, req, prep = msg  # ("template", id, prep) + fds (its socket, stdout, stderr)
    pid = _fork(state, lambda: _template(prep, fds[0]), fds)
    pidfd = os.pidfd_open(pid)
    try:
        state.chan.send(("forked", req, pid), [pidfd])
    finally:
        os.close(pidfd)


def _fork_rank(state: _Serving) -> tuple[int, int]:
    """A new rank process, waiting for its turn: its pid and the coordinator's end of its socket."""
    ours, theirs = socket.socketpair()

    def rank() -> int:
        from ._rank_process import main

        ours.close()
        return main(Channel(theirs))

    pid = _fork(state, rank, [])
    theirs.close()
    return pid, ours.detach()


def _fork(state: _Serving, run: Any, fds: list[int]) -> int:
    """Fork a child that runs ``run()`` and exits with what it returns; ``fds``: its socket, stdout and stderr."""
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            _child_setup(state, fds, me)
            code = run() or 0
        except BaseException:  # noqa: BLE001 - a child reports what ended it, then exits
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 - a stream that cannot flush loses its text
                    pass
            ctypes.CDLL(None).fflush(None)  # C's buffered output too: os._exit does not flush it
            os._exit(code)
    for fd in fds:
        os.close(fd)
    state.children.add(pid)
    return pid


_PR_SET_PDEATHSIG = 1


def _child_setup(state: _Serving, fds: list[int], parent: int) -> None:
    """In a new child: die with the server, drop the server's descriptors and handlers (and take stdout, stderr)."""
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    state.chan.close()
    for fd in state.wake:
        os.close(fd)
    for _pid, sock in state.spares:
        os.close(sock)
    if fds:
        os.dup2(fds[1], 1)
        os.dup2(fds[2], 2)
        os.close(fds[1])
        os.close(fds[2])


_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25
_HUGE = 2 << 20


def _huge_pages() -> None:
    """Back this process's anonymous memory (torch's heap, mostly) with 2 MiB pages where the kernel can.

    A fork copies the page tables of the parent's anonymous memory and an exit tears them down: with
    2 MiB pages that is one entry where there were 512, and forking a rank (with its exit) takes half
    the time. A rank's first write to such a page splits it and copies 4 KiB, as before. Best effort:
    a kernel without transparent huge pages (or without ``MADV_COLLAPSE``, Linux 6.1) leaves it as it is.
    """
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        with open("/proc/self/maps", encoding="ascii") as maps:
            regions = [line.split() for line in maps]
    except (OSError, AttributeError):
        return
    for fields in regions:
        if fields[1] != "rw-p" or (len(fields) > 5 and fields[5] != "[heap]"):
            continue  # private writable anonymous memory only
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        start, end = -(-lo // _HUGE) * _HUGE, hi // _HUGE * _HUGE
        if end > start and madvise(start, end - start, _MADV_HUGEPAGE) == 0:
            madvise(start, end - start, _MADV_COLLAPSE)


def _template(prep: dict, fd: int) -> None:
    """A template's main: prepare as ``prep`` says, then serve forks of ranks on socket ``fd`` (never returns)."""
    chan = Channel(socket.socket(fileno=fd))
    try:
        sys.path[:] = prep["sys_path"]
        os.chdir(prep["cwd"])
        os.environ.clear()
        os.environ.update(prep["environ"])
        if prep.get("main_path") or prep.get("main_name"):
            _main_again(prep.get("main_path"), prep.get("main_name"))
        for name in prep["modules"]:
            __import__(name)
    except BaseException as exc:  # noqa: BLE001 - told to the coordinator, which raises it for the run
        chan.send(("broken", "".join(traceback.format_exception_only(type(exc), exc)).strip()))
        os._exit(0)
    if threading.active_count() > 1:
        chan.send(("broken", "importing the program started threads, which a fork cannot copy"))
        os._exit(0)
    gc.collect()
    gc.freeze()
    _serve(chan, ("ready", os.getpid()))


def _main_again(path: str | None, name: str | None) -> None:
    """Run the program's ``__main__`` again as ``__mp_main__`` and make it ``__main__`` (multiprocessing's way)."""
    import runpy
    import types

    module = types.ModuleType("__mp_main__")
    if name:
        module.__dict__.update(runpy.run_module(name, run_name="__mp_main__", alter_sys=True))
    else:
        assert path is not None
        module.__dict__.update(runpy.run_path(path, run_name="__mp_main__"))
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module


# -- in the coordinator ----------------------------------------------------------------------------------------


class Server:
    """The coordinator's handle on one server: forks, signals, and the exit status of each child it forked."""

    def __init__(self, chan: Channel, pid: int, what: str, timeout: float):
        self.chan = chan
        self.pid = pid
        self.what = what
        self.lock = threading.Lock()  # one sender at a time
        self.cond = threading.Condition()
        self.replies: dict[int, list] = {}
        self.exits: dict[int, int] = {}
        self.released: set[int] = set()  # children whose exit status no one will ask for
        self.closed = False
        self.broken: str | None = None
        self.hello: tuple | None = None
        self._ids = 0
        self.reader = threading.Thread(target=self._read, name=f"simdist-{what}", daemon=True)
        self.reader.start()
        with self.cond:
            if not self.cond.wait_for(lambda: self.hello is not None or self.closed, timeout):
                self.close()
                raise RankStartError(f"the {what} did not start within {timeout:g} s")
        if self.hello is None or self.hello[0] != "ready":
            self.close()
            why = self.broken or "it ended while starting"
            raise RankStartError(f"the {what} could not start: {why}")

    def _read(self) -> None:
        while True:
            try:
                msg, fds = self.chan.recv()
            except (ChannelClosed, OSError):
                with self.cond:
                    self.closed = True
                    self.cond.notify_all()
                return
            with self.cond:
                if msg[0] == "exit":
                    if msg[1] in self.released:
                        self.released.discard(msg[1])
                    else:
                        self.exits[msg[1]] = msg[2]
                elif msg[0] == "forked":
                    self.replies.setdefault(msg[1], []).append((msg, fds))
                elif msg[0] == "broken":
                    self.broken = msg[1]
                    self.hello = msg
                else:
                    self.hello = msg
                self.cond.notify_all()

    def template(self, prep: dict, fds: list[int]) -> tuple[int, int]:
        """A new template prepared as ``prep`` says, given ``fds`` (its socket, stdout, stderr): its pid and a pidfd."""
        ((pid, got),) = self._ask(("template", prep), 1, fds)
        return pid, got[0]

    def ranks(self, n: int) -> list[tuple[int, int, int]]:
        """``n`` rank processes waiting for their turn: for each its pid, a pidfd and the coordinator's end of its
        socket. A template starts as many ahead of the next call while the run goes on."""
        return [(pid, got[1], got[0]) for pid, got in self._ask(("ranks", n), n, [])]

    def _ask(self, what: tuple, n: int, fds: list[int]) -> list[tuple[int, list[int]]]:
        with self.lock:
            self._ids += 1
            req = self._ids
            try:
                self.chan.send((what[0], req, *what[1:]), fds)
            except OSError as exc:
                raise RankStartError(f"the {self.what} is gone ({exc})") from None
        got: list[tuple[int, list[int]]] = []
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.replies.get(req, ())) >= n or self.closed, FORK_TIMEOUT):
                failure = f"the {self.what} did not start its processes within {FORK_TIMEOUT:g} s"
            elif len(self.replies.get(req, ())) < n:
                failure = f"the {self.what} ended ({self.broken or 'its socket closed'})"
            else:
                failure = None
            for msg, received in self.replies.pop(req, []):
                got.append((msg[2], received))
        if failure is not None:
            for pid, received in got:
                for fd in received:
                    os.close(fd)
                self.signal(pid, signal.SIGKILL)
                self.release(pid)
            raise RankStartError(failure)
        return got

    def signal(self, pid: int, signum: int) -> None:
        """Send ``signum`` to child ``pid`` if it has not been reaped (so never to a reused pid)."""
        with self.lock:
            try:
                self.chan.send(("signal", pid, signum))
            except OSError:
                pass

    def status(self, pid: int, timeout: float) -> int | None:
        """Child ``pid``'s ``waitpid`` status once it has ended, waiting up to ``timeout`` seconds; else ``None``."""
        with self.cond:
            self.cond.wait_for(lambda: pid in self.exits or self.closed, timeout)
            return self.exits.pop(pid, None)

    def release(self, pid: int) -> None:
        """No one will ask for child ``pid``'s exit status: drop it, now or when it comes."""
        with self.cond:
            if self.exits.pop(pid, None) is None:
                self.released.add(pid)

    @property
    def alive(self) -> bool:
        return not self.closed

    def close(self) -> None:
        """End the server: it kills its children and exits."""
        with self.lock:
            try:
                self.chan.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.reader.join(5)
        self.chan.close()


_lock = threading.Lock()
_base: Server | None = None
_base_proc: subprocess.Popen | None = None
_templates: OrderedDict[str, Server] = OrderedDict()


def base_server() -> Server:
    """The base server, started on first use (and again if it ended)."""
    global _base, _base_proc
    with _lock:
        if _base is not None and _base.alive:
            return _base
        ours, theirs = socket.socketpair()
        started = time.monotonic()
        _base_proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, json.dumps(sys.path), str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        theirs.close()
        _base = Server(Channel(ours), _base_proc.pid, "rank processes' fork server", START_TIMEOUT)
        _base.started_in = time.monotonic() - started  # type: ignore[attr-defined]
        threading.Thread(target=_base_proc.wait, name="simdist-fork-server-reaper", daemon=True).start()
        return _base


def template_for(prep: dict) -> Server:
    """The template prepared as ``prep`` says (made on first use from the base server; a few are kept)."""
    key = json.dumps({k: v for k, v in prep.items() if k != "environ"}, sort_keys=True)
    with _lock:
        server = _templates.get(key)
        if server is not None and server.alive:
            _templates.move_to_end(key)
            return server
    base = base_server()
    ours, theirs = socket.socketpair()
    try:
        pid, pidfd = base.template(prep, [theirs.fileno(), 1, 2])
    finally:
        theirs.close()
    os.close(pidfd)
    server = Server(Channel(ours), pid, f"template of module {', '.join(prep['modules'])}", FORK_TIMEOUT)
    with _lock:
        old = _templates.pop(key, None)
        _templates[key] = server
        evicted = [_templates.popitem(last=False)[1] for _ in range(max(0, len(_templates) - TEMPLATES_KEPT))]
    for s in [*evicted, *([old] if old is not None else [])]:
        s.close()
    return server


def shutdown() -> None:
    """End every server of this process (their children die with them)."""
    global _base
    with _lock:
        servers = [*_templates.values(), *([_base] if _base is not None else [])]
        _templates.clear()
        _base = None
    for s in servers:
        s.close()
