"""Ranks as processes (``isolation="processes"``): each rank thread stands in for its rank's process.

The engine is the one of threads mode. What runs on a rank's thread is not the program but
:meth:`ProcessRanks.serve`: it starts the rank's process (forked at the run's start, from a
template that has imported the program: :mod:`._forkserver`), then makes, on the rank's
``SimWorld``, each call the process sends (:mod:`._rank_process`) and answers it once it
returns. So the scheduler, matching, collectives, virtual time, checks and trace see the same
calls from the same ranks as in threads mode, and a seed or schedule gives the same run in both.
While the process runs the program, its thread waits for the next call, holding the baton as a
rank thread does while it runs user code.

What threads mode isolates by hand a process has by itself: its module state, generators,
``os.environ``, ``sys.argv``, ``atexit``, signal handlers, torch's process groups and compile
caches. A rank process that ends before its function returned (``os._exit``, a signal, a crash)
makes the run fail with a ``RankError`` naming its exit status or signal. A run that is stopped
(a timeout, Ctrl-C) kills the processes still running; a failed run unwinds them at their pending
call. Once a run has returned, none of its processes is left.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable

from simdist.core import set_remote_site
from simdist.core import RankExitError, add_note
from simdist.core import GroupMember

from . import _channel as C
from . import _forkserver, _isolation
from ._state import Abort

if TYPE_CHECKING:
    from ._engine import Engine
    from ._state import RankState, Settings

__all__ = ["ProcessRanks", "prepare"]
__tracebackhide__ = True

EXIT_WAIT = 5.0
"""Seconds a run waits at most for a rank process that ended its connection to be reaped (its exit status)."""
STOP_WAIT = 5.0
"""Seconds a failed run waits for its rank processes to end once told to, before killing them."""


def prepare(fn: Callable, args: tuple) -> tuple[dict, bytes, bytes]:
    """What a template of ``fn``'s runs prepares, and ``fn`` and ``args`` as the rank processes receive them.

    Raises:
        TypeError: ``fn`` or ``args`` cannot be sent to another process (a lambda, a closure, an
            open file), as for multiprocessing's spawn start method.
    """
    try:
        fn_bytes = pickle.dumps(_by_name(fn), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - any pickling failure: the same advice
        raise TypeError(
            f"isolation='processes' sends fn={fn!r:.80} to each rank's process by name, as multiprocessing's "
            f"spawn start method does, and it cannot be ({type(exc).__name__}: {exc}): define it at module level "
            "(not a lambda or a nested function), or use isolation='threads'"
        ) from None
    try:
        args_bytes = pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001
        raise TypeError(
            f"isolation='processes' sends args to each rank's process, and they cannot be pickled "
            f"({type(exc).__name__}: {exc}); pass plain data, or use isolation='threads'"
        ) from None
    modules = sorted({m for m in (getattr(fn, "__module__", None),) if m and m != "__main__"})
    prep: dict[str, Any] = {"sys_path": list(sys.path), "cwd": os.getcwd(), "environ": dict(os.environ)}
    prep["modules"] = modules
    if b"__main__" in fn_bytes or b"__main__" in args_bytes:
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if spec is not None and spec.name not in ("__main__", "__mp_main__"):
            prep["main_name"] = spec.name.removesuffix(".__main__") if spec.name.endswith(".__main__") else spec.name
        elif main is not None and getattr(main, "__file__", None):
            prep["main_path"] = os.path.abspath(str(main.__file__))
    return prep, fn_bytes, args_bytes


HOLDERS = ("spmd_function", "__wrapped__")
"""Where a decorator's result keeps the function it decorated (``@simdist.testing.spmd``, ``functools.wraps``)."""


def _by_name(fn: Callable) -> Any:
    """``fn``, or where its module's name for it leads to it when a decorator took that name (``@spmd``)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module not in sys.modules or "<locals>" in qualname:
        return fn
    holder = _named(sys.modules[module], qualname, None)
    for attr in HOLDERS if holder is not fn else ():
        if getattr(holder, attr, None) is fn:
            return _Held(module, qualname, attr)
    return fn


def _named(obj: Any, qualname: str, *default: Any) -> Any:
    """What the dotted ``qualname`` names in ``obj`` (``default``, if given, where a part is missing)."""
    for part in qualname.split("."):
        obj = getattr(obj, part, *default)
    return obj


class _Held:
    """Pickles as the way from a module's name to a function its decorator holds."""

    def __init__(self, module: str, qualname: str, attr: str):
        self.way = (module, qualname, attr)

    def __reduce__(self) -> tuple:
        return (_held, self.way)


def _held(module: str, qualname: str, attr: str) -> Callable:
    return getattr(_named(importlib.import_module(module), qualname), attr)


class _Child:
    """One rank's process, as its thread sees it."""

    __slots__ = ("pid", "pidfd", "chan", "server", "ended", "last")

    def __init__(self, pid: int, pidfd: int, chan: C.Channel, server: _forkserver.Server):
        self.pid, self.pidfd, self.chan, self.server = pid, pidfd, chan, server
        self.ended = False  # it told how it ended, or its connection closed
        self.last: str | None = None  # where its last call came from

    def kill(self) -> None:
        """SIGKILL the process (its pidfd names it, so never another process)."""
        if self.pidfd >= 0:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except (ProcessLookupError, OSError):
                pass

    def close(self) -> None:
        self.chan.close()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


class ProcessRanks:
    """The rank processes of one run, and the engine's rank hooks for them (threads mode's:
    :class:`._isolation.ThreadRanks`, the same methods)."""

    def __init__(self, fn: Callable, args: tuple, settings: Settings):
        self.prep, self.fn_bytes, self.args_bytes = prepare(fn, args)
        self.settings = settings
        self.size = settings.size
        self.children: list[_Child | None] = [None] * self.size
        self.store: Any = None
        self.store_lock = threading.Lock()
        self.environ: dict[str, str] = {}
        self.streams: dict[str, Any] = {}

    # -- the engine's hooks (those of _isolation.ThreadRanks) ----------------------------------------------------

    def enter(self) -> None:
        """Start the run's rank processes (they wait for their turn); raise if they cannot be started."""
        from . import _rank_process

        if _rank_process.IN_RANK:
            raise RuntimeError(
                "a simulated rank's process started a simulation; simulations cannot be nested (a rank called "
                "simdist.simulate or simdist.spawn): start it from outside the simulated ranks"
            )
        _isolation.refuse_nested()
        self.environ = dict(os.environ)
        self.streams = {"stdout": sys.stdout, "stderr": sys.stderr}
        server = _forkserver.template_for(self.prep)
        for rank, (pid, pidfd, sock) in enumerate(server.ranks(self.size)):
            self.children[rank] = _Child(pid, pidfd, C.Channel(socket.socket(fileno=sock)), server)

    def leave(self) -> None:
        """Once every rank thread has ended: no process of the run is left (the unfinished ones are killed)."""
        for child in self.children:
            if child is None:
                continue
            if not child.ended:
                child.kill()
                child.server.status(child.pid, STOP_WAIT)
            else:
                child.server.release(child.pid)
            child.close()
        if self.store is not None:
            self.store = None

    def take_turn(self, rs: RankState, aborting: bool) -> None:
        """Nothing process-wide to install: the rank's state lives in its process."""

    def end_turn(self, rs: RankState, to: RankState | None = None, done: bool = False) -> None:
        pass

    def abandon(self, ranks: list) -> bool:
        return False

    def enter_thread(self, rs: RankState, now: Callable[[], float]) -> None:
        """Make the calling thread the stand-in of rank ``rs``'s process: stopping the run kills the process."""
        child = self.children[rs.rank]
        if child is not None:
            rs.user.on_inject = child.kill
        rs.cpu = _ReportedCpu()
        if self.settings.pin_core is not None:
            _isolation.pin_thread(self.settings.pin_core)

    def leave_thread(self, rs: RankState) -> None:
        set_remote_site(None)

    # -- a rank's thread -----------------------------------------------------------------------------------------

    def serve(self, rank: int) -> Any:
        """Rank ``rank``'s part of the run: run its process, making each of its calls on the rank's world."""
        from simdist.core import thread_world

        child = self.children[rank]
        assert child is not None
        world = thread_world()
        child.chan.send(("go", self._setup(rank, world)), [1, 2])  # (its stdout and stderr: this process's now)
        served = _Served(self, world, child)
        return served.loop()

    def _setup(self, rank: int, world: Any) -> dict:
        settings = self.settings
        streams = [self.streams["stdout"], self.streams["stderr"]]
        return {
            "rank": rank,
            "size": self.size,
            "environ": self.environ,
            "cwd": self.prep["cwd"],
            "argv": list(sys.argv),
            "fn": self.fn_bytes,
            "args": self.args_bytes,
            "tty": [_isatty(s) for s in streams],
            "encoding": [getattr(s, "encoding", None) or "utf-8" for s in streams],
            "pin": settings.pin_core,
            "check_buffers": bool(getattr(world, "check_buffers", False)),
            "cuda_as_cpu": settings.cuda_as_cpu,
            "gpus_per_node": settings.gpus_per_node,
            "cpu_time": settings.cpu_time,
        }

    def store_port(self) -> int:
        """The port of the run's ``TCPStore`` (torch's rendezvous of its ranks), served from here; made on first use."""
        with self.store_lock:
            if self.store is None:
                import datetime

                import torch.distributed as tdist

                self.store = tdist.TCPStore(
                    "127.0.0.1", 0, self.size, True, datetime.timedelta(seconds=300), wait_for_workers=False
                )
            return self.store.port


class _ReportedCpu:
    """A rank process's CPU time as it last reported it (with ``cpu_time``, its virtual clock counts it)."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # noqa: BLE001 - a stream without a terminal
        return False


class _Served:
    """One rank process's calls, made on its rank's world (a ``SimWorld``, on the engine) by its thread."""

    def __init__(self, ranks: ProcessRanks, world: Any, child: _Child):
        self.ranks, self.world, self.child = ranks, world, child
        self.engine: Engine = world.engine
        self.rs: RankState = world.me
        rs = self.rs
        assert isinstance(rs.cpu, _ReportedCpu), "enter_thread gave the rank its reported clock"
        self.cpu = rs.cpu
        self.segments = C.Segments()
        self.groups: dict[int, Any] = {}
        self.works: dict[int, tuple[Any, bool]] = {}
        self.prefix = f"[rank {rs.rank}] " if ranks.settings.prefix_output else None
        self.at_start = {"stdout": True, "stderr": True}
        self.handlers: dict[str, Callable[[tuple], Any]] = {
            "init": self._init,
            "new_group": self._new_group,
            "destroy": self._destroy,
            "op": self._op,
            "batch": self._batch,
            "wait": self._wait,
            "poll": self._poll,
            "compute": self._compute,
            "algorithm": self._algorithm,
            "desc": self._desc,
            "out": self._out,
            "now": self._now,
            "store": self._store,
            "race": self._race,
        }

    def loop(self) -> Any:
        chan, child = self.child.chan, self.child
        while True:
            try:
                (cpu, news, msgs, reply), fds = chan.recv()
            except C.ChannelClosed:
                child.ended = True
                raise self._exited() from None
            self.segments.apply(news, fds)
            self.cpu.seconds = cpu
            result = None
            if msgs and msgs[-1][0] == "end":  # (the rank's last frame: what it printed, then how it ended)
                for msg in msgs[:-1]:
                    self.handlers[msg[0]](msg)
                child.ended = True
                return self._end(msgs[-1][1])
            try:
                for msg in msgs:
                    result = self.handlers[msg[0]](msg)
            except Abort:
                if reply:
                    _send(chan, ("abort",))
                raise
            except Exception as exc:  # noqa: BLE001 - raised in the rank's process, at its call
                _send(chan, ("err", _transportable(exc)))
                continue
            if reply:
                _send(chan, ("ok", result))

    # -- how the process ended -----------------------------------------------------------------------------------

    def _end(self, outcome: tuple) -> Any:
        kind = outcome[0]
        if kind == "value":
            return pickle.loads(outcome[1])
        if kind == "unpicklable":
            raise TypeError(
                f"rank {self.rs.rank} returned a value that cannot be sent back from its process ({outcome[1]}); "
                "return plain data (lists, numbers, tensors), or use isolation='threads'"
            )
        exc = _loaded(outcome[1], outcome[2])
        add_note(exc, f"(rank {self.rs.rank}'s traceback, in its process)\n{outcome[2].rstrip()}")
        exc.rank_traceback = outcome[2]  # type: ignore[attr-defined]  # (what simdist run prints of it)
        raise exc.with_traceback(None)

    def _exited(self) -> BaseException:
        if self.engine.aborting:
            return Abort()
        status = self.child.server.status(self.child.pid, EXIT_WAIT)
        code = None if status is None else os.waitstatus_to_exitcode(status)
        last = f" (its last call: at {self.child.last})" if self.child.last else " (before its first call)"
        if code is None:
            what = "closed its connection to the simulator and did not end"
        elif code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            what = f"was killed by {name}"
        else:
            what = f"exited with status {code} (os._exit, or a crash that ended it)"
        return RankExitError(f"its process {what} before its function returned{last}", exitcode=code)

    # -- the calls -------------------------------------------------------------------------------------------------

    def _site(self, site: str | None) -> None:
        self.child.last = site
        set_remote_site(site)

    def _init(self, msg: tuple) -> None:
        _, backend, world_size, rank, site = msg
        self._site(site)
        self.world.init(backend, init_method=None, timeout=None, world_size=world_size, rank=rank, store=None)
        self.groups = {0: self.world.default_group}

    def _new_group(self, msg: tuple) -> tuple[int, int] | None:
        _, ranks, backend, site = msg
        self._site(site)
        group = self.world.new_group(ranks, backend=backend, timeout=None)
        if group is GroupMember.NON_GROUP_MEMBER:
            return None
        self.groups[group.group_id] = group
        return group.group_id, group.rank

    def _destroy(self, msg: tuple) -> None:
        _, gid, site = msg
        self._site(site)
        world = self.world
        group = None if gid is None else self.groups[gid]
        if group is None or group is world.default_group:
            doomed = [g for g in (world.default_group, *world.groups) if g is not None]
        else:
            doomed = [group]
        world.destroy(group)
        for g in doomed:
            g.destroyed = True

    def _op(self, msg: tuple) -> None:
        _, wid, gid, method, packed, wire = msg
        opts = C.options_in(wire)
        self._site(opts.call_site)
        args = C.unpack(packed, self.segments.by_id)
        self.works[wid] = (getattr(self.groups[gid], method)(*args, opts), method == "recv")

    def _batch(self, msg: tuple) -> None:
        _, gid, ops = msg
        segments = self.segments.by_id
        unpacked = [(kind, C.view_of(ref, segments), peer, C.options_in(wire)) for _wid, kind, ref, peer, wire in ops]
        self._site(unpacked[0][3].call_site if unpacked else None)
        works = self.groups[gid].batch_p2p(unpacked)
        for (wid, kind, _ref, _peer, _opts), work in zip(ops, works):
            self.works[wid] = (work, kind == "recv")

    def _wait(self, msg: tuple) -> int | None:
        _, wid, timeout, site = msg
        self._site(site)
        work, is_recv = self.works[wid]
        work.wait(timeout)
        del self.works[wid]  # (the rank asks nothing more of a completed work)
        return work.source_rank() if is_recv else None

    def _poll(self, msg: tuple) -> tuple[bool, int | None]:
        _, wid, site = msg
        self._site(site)
        work, is_recv = self.works[wid]
        if not work.is_completed():
            return False, None
        del self.works[wid]
        return True, (work.source_rank() if is_recv else None)

    def _compute(self, msg: tuple) -> None:
        _, seconds, site, op = msg
        self.world.compute(seconds, site, op)

    def _algorithm(self, msg: tuple) -> None:
        _, gid, op, name, site = msg
        self._site(site)
        self.groups[gid].set_default_algorithm(op, name)

    def _desc(self, msg: tuple) -> None:
        group = self.groups.get(msg[1])
        if group is not None:
            group.group_desc = msg[2]

    def _out(self, msg: tuple) -> None:
        _, name, text = msg
        if self.rs.output is not None:  # capture_output: kept, not printed
            self.rs.output[name == "stderr"].append(text)
            return
        stream = self.ranks.streams[name]
        if self.prefix is not None and name == "stdout":
            out = []
            for line in text.splitlines(keepends=True):
                if self.at_start[name]:
                    out.append(self.prefix)
                out.append(line)
                self.at_start[name] = line.endswith("\n")
            text = "".join(out)
        try:
            stream.write(text)
            if "\n" in text:
                stream.flush()
        except (OSError, ValueError):  # a closed stream: the text is lost, as it would be for a rank thread
            pass

    def _now(self, msg: tuple) -> float:
        return self.engine.now(self.rs)

    def _store(self, msg: tuple) -> int:
        return self.ranks.store_port()

    def _race(self, msg: tuple) -> None:
        self.engine.fail(msg[1])


def _send(chan: C.Channel, answer: tuple) -> None:
    try:
        chan.send(answer)
    except OSError:  # the process is gone: its end is found at the next receive
        pass


def _transportable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a ``RuntimeError`` saying what it was."""
    try:
        pickle.loads(pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL))
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _loaded(data: bytes | None, tb: str) -> BaseException:
    """The exception a rank process raised, from its pickle, or a stand-in naming it when it did not pickle."""
    if data is not None:
        try:
            return pickle.loads(data)
        except Exception:  # noqa: BLE001 - the stand-in below
            pass
    last = tb.rstrip().splitlines()[-1] if tb.strip() else "an exception"
    return RuntimeError(f"(in the rank's process) {last}")
