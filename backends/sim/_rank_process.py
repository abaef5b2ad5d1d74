"""A simulated rank as a process of its own: the world and groups it sees, whose every call goes to the engine.

A rank process runs the program (``fn(rank, *args)``, or a script's ranks under ``simdist run``)
with its own modules, ``os.environ``, ``sys.argv``, ``atexit``, signal handlers and crashes, as a
rank of torchrun has. Its simdist world is a :class:`RemoteWorld`: where a rank thread's
``SimWorld`` calls the engine, this one sends the call to the rank's proxy thread in the
coordinator (:mod:`._proxy`), which makes exactly that call on the rank's ``SimWorld`` and
answers once it returns. Exactly one rank runs at a time, so a rank process runs only while its
proxy holds the baton: between two of its calls, or from its start to its first.

Arrays travel through shared memory (:mod:`._channel`): a call's arrays are copied in when it is
made, and its outputs copied back once it has completed (``wait()``, an ``is_completed()`` that
answers ``True``). A call that does not return a work the program may keep (a blocking
collective, ``send``, ``recv``) is not sent alone: it goes with the ``wait()`` that follows it,
one message and one answer for the pair. What the rank prints goes the same way, ahead of its
next call, so the coordinator prints every rank's lines in the order the ranks ran.
"""

from __future__ import annotations

import atexit
import faulthandler
import io
import os
import pickle
import random
import sys
import threading
import time
from typing import Any, Sequence

import numpy as np
import torch

from simdist.core import format_user_exception, user_call_site
from simdist.core import GroupMember, Options, ProcessGroup
from simdist.core import Work
from simdist.core import World, set_thread_world

from . import _channel as C
from ._buffers import BufferCheck, posted_over

__all__ = ["main", "RemoteWorld", "RemoteGroup", "RemoteWork", "Aborted", "IN_RANK"]

IN_RANK = False
"""True in a rank process (where a simulation may not be started: they do not nest)."""


class Aborted(BaseException):
    """The run has failed elsewhere: raised in the rank at its pending call, to unwind it (never seen by users)."""


# what each method of ProcessGroup writes: the positions of its output arguments
_OUTPUTS: dict[str, tuple[int, ...]] = {
    "send": (),
    "recv": (0,),
    "broadcast": (0,),
    "all_reduce": (0,),
    "reduce": (0,),
    "all_gather": (0,),
    "all_gather_into_tensor": (0,),
    "gather": (1,),
    "scatter": (0,),
    "reduce_scatter": (0,),
    "reduce_scatter_tensor": (0,),
    "all_to_all": (0,),
    "all_to_all_single": (0,),
    "barrier": (),
}

FLUSH_BYTES = 1 << 16
"""Printed text held back at most before it is sent on its own (it otherwise goes with the next call)."""


class _Link:
    """The rank's end of its connection to its proxy: calls and their answers, printed text, shared memory."""

    def __init__(self, chan: C.Channel, cpu_time: bool = False):
        self.chan = chan
        self.cpu = time.thread_time if cpu_time else _no_cpu  # what each frame reports of the rank's CPU time
        self.arena = C.Arena()
        self.lock = threading.Lock()  # one frame at a time (a thread of the rank may print meanwhile)
        self.outbox: list[tuple] = []
        self.held = 0  # characters of printed text in the outbox
        self.ended = False  # the rank's end was told: nothing more goes to the proxy
        self.aborted = False
        self.checks: dict[int, BufferCheck] = {}  # the buffer checks of sends and receives in flight, by work
        self.pairs: dict[int, list] = {}  # and their arrays with shared views

    def _frame(self, msgs: list[tuple], reply: bool) -> None:
        news, fds = self.arena.take_news()
        self.chan.send((self.cpu(), news, msgs, reply), fds)
        for fd in fds:
            os.close(fd)

    def defer(self, msg: tuple) -> None:
        """Send ``msg`` with the next frame (it needs no answer of its own)."""
        with self.lock:
            self.outbox.append(msg)

    def call(self, msg: tuple) -> Any:
        """Send ``msg`` (after what is deferred) and return the proxy's answer, or raise what the call raised."""
        if self.aborted or self.ended:
            raise Aborted
        with self.lock:
            msgs, self.outbox, self.held = self.outbox, [], 0
            msgs.append(msg)
            self._frame(msgs, True)
            try:
                answer, _ = self.chan.recv()
            except C.ChannelClosed:
                self.aborted = True
                raise Aborted from None
        if answer[0] == "ok":
            return answer[1]
        if answer[0] == "abort":
            self.aborted = True
            raise Aborted
        raise answer[1]

    def flush(self) -> None:
        """Send what is deferred now, without waiting for anything."""
        with self.lock:
            if self.outbox and not (self.ended or self.aborted):
                msgs, self.outbox, self.held = self.outbox, [], 0
                self._frame(msgs, False)

    def out(self, stream: str, text: str) -> None:
        with self.lock:
            last = self.outbox[-1] if self.outbox else None
            if last is not None and last[0] == "out" and last[1] == stream:
                self.outbox[-1] = ("out", stream, last[2] + text)
            else:
                self.outbox.append(("out", stream, text))
            self.held += len(text)
            big = self.held >= FLUSH_BYTES
        if big:
            self.flush()

    def end(self, outcome: tuple) -> None:
        """Tell the proxy how the rank ended (nothing is sent after this)."""
        with self.lock:
            if self.ended or self.aborted:
                return
            msgs, self.outbox = self.outbox, []
            msgs.append(("end", outcome))
            try:
                self._frame(msgs, False)
            except OSError:
                pass
            self.ended = True


def _no_cpu() -> float:
    return 0.0


class _Stream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` of a rank process: text goes to its proxy, which prints it in turn."""

    def __init__(self, link: _Link, name: str, fd: int, tty: bool, encoding: str):
        self.link, self.name, self.fd, self.tty = link, name, fd, tty
        self._encoding = encoding

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "backslashreplace" if self.name == "stderr" else "strict"

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self.link.ended or self.link.aborted:
            os.write(self.fd, text.encode(self._encoding, "replace"))
        elif text:
            self.link.out(self.name, text)
        return len(text)

    def flush(self) -> None:
        self.link.flush()

    def isatty(self) -> bool:
        return self.tty

    def fileno(self) -> int:
        return self.fd

    def writable(self) -> bool:
        return True

    @property
    def buffer(self) -> Any:
        return _Bytes(self)


class _Bytes(io.RawIOBase):
    """``sys.stdout.buffer`` of a rank process: bytes are decoded and printed as the stream's text."""

    def __init__(self, stream: _Stream):
        self.stream = stream

    def write(self, data: Any) -> int:
        self.stream.write(bytes(data).decode(self.stream.encoding, "replace"))
        return len(data)

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self.stream.flush()


# -- the world, groups and works the rank's program sees ---------------------------------------------------------


class RemoteWork(Work):
    """A work of the rank's proxy: waiting is the proxy's ``wait()`` of the engine's work."""

    def __init__(
        self, link: _Link, wid: int, outputs: list, copies: list, regions: list, site: str | None, check: Any = None
    ):
        self.link, self.wid = link, wid
        self.site = site  # a blocking call's line: its wait() follows at once, from the same line
        self.outs = outputs
        self.copies = copies  # (array, shared view) for each output array
        self.regions = regions
        self.check = check  # the buffer check of an asynchronous send or receive (see _buffers)
        self.source: int | None = None
        self.done = False

    def _landed(self, source: int | None) -> None:
        """The operation has completed: its outputs land in the rank's arrays, its shared memory is freed."""
        self.done, self.source = True, source
        C.copy_back(self.copies)
        for seg in self.regions:
            self.link.arena.free(seg)
        self.copies = self.regions = []
        if self.check is not None:
            self.link.checks.pop(self.wid, None)
            self.link.pairs.pop(self.wid, None)

    def _refresh(self) -> None:
        if self.check is not None:
            C.refresh(self.check[1])

    def wait(self, timeout: float | None = None) -> bool:
        if not self.done:
            self._refresh()
            site = self.site or user_call_site()
            self.site = None
            self._landed(self.link.call(("wait", self.wid, timeout, site)))
        return True

    def is_completed(self) -> bool:
        if not self.done:
            self._refresh()
            done, source = self.link.call(("poll", self.wid, user_call_site()))
            if done:
                self._landed(source)
        return self.done

    def source_rank(self) -> int:
        if not self.done or self.source is None:
            return super().source_rank()
        return self.source

    def _outputs(self) -> list:
        return self.outs


class RemoteGroup(ProcessGroup):
    """One rank's handle on a group of simulated ranks, whose operations run in the coordinator."""

    backend = "sim"

    def __init__(self, world: RemoteWorld, rank: int, ranks: Sequence[int], group_id: int):
        super().__init__(rank, ranks, group_id)
        self.world = world
        self._desc: str | None = None

    @property  # type: ignore[override]
    def group_desc(self) -> str | None:
        return self._desc

    @group_desc.setter
    def group_desc(self, desc: str | None) -> None:
        self._desc = desc
        self.world.link.defer(("desc", self.group_id, desc))

    def set_default_algorithm(self, op: str, algorithm: str | None) -> None:
        self.world.link.call(("algorithm", self.group_id, op, algorithm, user_call_site()))
        super().set_default_algorithm(op, algorithm)

    def _start(self, method: str, args: tuple, opts: Options) -> Work:
        link = self.world.link
        packed, regions, views = C.pack(args, link.arena)
        outputs = [args[i] for i in _OUTPUTS[method]]
        copies = [pair for out in outputs for pair in C.views_of(out, views)]
        wid = self.world.next_work()
        check = None
        if method in ("send", "recv") and opts.async_op and self.world.check_buffers:
            check = self._check(method, args[0], wid, opts, views)
        msg = ("op", wid, self.group_id, method, packed, C.options_out(opts))
        if opts.async_op:
            link.call(msg)
            return RemoteWork(link, wid, outputs, copies, regions, None, check)
        link.defer(msg)  # its wait() follows at once: one frame for both
        return RemoteWork(link, wid, outputs, copies, regions, opts.call_site, check)

    def _check(self, kind: str, tensor: Any, wid: int, opts: Options, views: dict) -> tuple:
        """The rank's side of the buffer check of an asynchronous send or receive (see :mod:`._buffers`).

        A post over memory in flight is found here, where the rank's own arrays are; the
        comparison at completion is the proxy's, on shared memory refreshed from the array.
        """
        checks = self.world.link.checks
        if checks:
            race = posted_over(checks, kind, tensor, self.world.rank, opts.call_site)
            if race is not None:
                self.world.link.call(("race", race))
        checks[wid] = BufferCheck(kind, tensor, None, None, self.world.rank, opts.call_site)
        pairs = self.world.link.pairs[wid] = C.views_of(tensor, views)
        return (checks[wid], pairs)

    def send(self, tensor: Any, dst: int, opts: Options) -> Work:
        return self._start("send", (tensor, dst), opts)

    def recv(self, tensor: Any, src: int | None, opts: Options) -> Work:
        return self._start("recv", (tensor, src), opts)

    def broadcast(self, tensor: Any, opts: Options) -> Work:
        return self._start("broadcast", (tensor,), opts)

    def all_reduce(self, tensor: Any, opts: Options) -> Work:
        return self._start("all_reduce", (tensor,), opts)

    def reduce(self, tensor: Any, opts: Options) -> Work:
        return self._start("reduce", (tensor,), opts)

    def all_gather(self, output_list: list, tensor: Any, opts: Options) -> Work:
        return self._start("all_gather", (output_list, tensor), opts)

    def all_gather_into_tensor(self, output: Any, input: Any, opts: Options) -> Work:
        return self._start("all_gather_into_tensor", (output, input), opts)

    def gather(self, tensor: Any, gather_list: list | None, opts: Options) -> Work:
        return self._start("gather", (tensor, gather_list), opts)

    def scatter(self, tensor: Any, scatter_list: list | None, opts: Options) -> Work:
        return self._start("scatter", (tensor, scatter_list), opts)

    def reduce_scatter(self, output: Any, input_list: list, opts: Options) -> Work:
        return self._start("reduce_scatter", (output, input_list), opts)

    def reduce_scatter_tensor(self, output: Any, input: Any, opts: Options) -> Work:
        return self._start("reduce_scatter_tensor", (output, input), opts)

    def all_to_all(self, output_list: list, input_list: list, opts: Options) -> Work:
        return self._start("all_to_all", (output_list, input_list), opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts: Options) -> Work:
        return self._start("all_to_all_single", (output, input, output_split_sizes, input_split_sizes), opts)

    def barrier(self, opts: Options) -> Work:
        return self._start("barrier", (), opts)

    def batch_p2p(self, ops: Sequence[tuple[str, Any, int, Options]]) -> list[Work]:
        link = self.world.link
        works: list[Work] = []
        batch = []
        for kind, t, peer, opts in ops:  # each its own shared copy: its operation may complete before the others
            packed, regions, views = C.pack((t,), link.arena)
            wid = self.world.next_work()
            check = self._check(kind, t, wid, opts, views) if opts.async_op and self.world.check_buffers else None
            copies = C.views_of(t, views) if kind == "recv" else []
            works.append(RemoteWork(link, wid, [t], copies, regions, None, check))
            batch.append((wid, kind, packed[0], peer, C.options_out(opts)))
        link.call(("batch", self.group_id, batch))
        return works


class RemoteWorld(World):
    """The world of a rank process: the same ranks and groups as a rank thread's ``SimWorld``, held by its proxy."""

    def __init__(self, link: _Link, rank: int, size: int, check_buffers: bool):
        self.link = link
        self.rank, self.size = rank, size
        self.groups: list[ProcessGroup] = []
        self.check_buffers = check_buffers
        self._works = 0

    def next_work(self) -> int:
        self._works += 1
        return self._works

    def init(self, backend, *, init_method, timeout, world_size, rank, store) -> None:
        self.link.call(("init", backend, world_size, rank, user_call_site()))
        self.backend = backend or "sim"
        self.default_group = RemoteGroup(self, self.rank, range(self.size), 0)
        self.groups = [self.default_group]

    def new_group(self, ranks, *, backend, timeout):
        got = self.link.call(("new_group", list(ranks), backend, user_call_site()))
        if got is None:
            return GroupMember.NON_GROUP_MEMBER
        group = RemoteGroup(self, got[1], ranks, got[0])
        self.groups.append(group)
        return group

    def destroy(self, group) -> None:
        self.link.call(("destroy", None if group is None else group.group_id, user_call_site()))
        if self.destroy_subgroup(group):
            return
        self.groups = []
        self.default_group = None
        self.backend = None

    def compute(self, seconds: float, call_site: str, op: str = "compute") -> None:
        self.link.defer(("compute", seconds, call_site, op))

    def now(self) -> float:
        """This rank's virtual time (what a simulated GPU's event records)."""
        return self.link.call(("now",))


# -- the process -----------------------------------------------------------------------------------------------


def _seed(rank: int) -> None:
    """Seed the global generators with ``rank``, as a rank thread starts (``_isolation``)."""
    random.seed(rank)
    np.random.seed(rank)
    torch.default_generator.manual_seed(rank)


def _store_factory(link: _Link, size: int):
    """torch's rendezvous store of the run: a client of the ``TCPStore`` the coordinator serves, made on first use."""

    def make() -> Any:
        import datetime

        import torch.distributed as tdist

        port = link.call(("store",))
        return tdist.TCPStore("127.0.0.1", port, size, False, datetime.timedelta(seconds=300), wait_for_workers=False)

    return make


def _settle_streams(link: _Link) -> None:
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, _Stream):
            stream.flush()


def main(chan: C.Channel) -> int:
    """The rank process: wait for its turn, run its part of the program, tell how it ended; the exit status."""
    try:
        (kind, setup), fds = chan.recv()
    except C.ChannelClosed:
        return 0
    for fd, std in zip(fds, (1, 2)):  # the coordinator's stdout and stderr when the run started
        os.dup2(fd, std)
        os.close(fd)
    global IN_RANK
    IN_RANK = True
    link = _Link(chan, setup["cpu_time"])
    rank = setup["rank"]
    os.environ.clear()
    os.environ.update(setup["environ"])
    os.chdir(setup["cwd"])
    sys.argv[:] = setup["argv"]
    faulthandler.enable(file=sys.__stderr__ if sys.__stderr__ is not None else sys.stderr, all_threads=True)
    sys.stdout = _Stream(link, "stdout", 1, setup["tty"][0], setup["encoding"][0])
    sys.stderr = _Stream(link, "stderr", 2, setup["tty"][1], setup["encoding"][1])
    if setup["pin"] is not None:
        os.sched_setaffinity(0, {setup["pin"]})
    world = RemoteWorld(link, rank, setup["size"], setup["check_buffers"])
    set_thread_world(world)
    _enter_torch(setup, link, world)
    _seed(rank)
    outcome: tuple
    try:
        fn = pickle.loads(setup["fn"])
        args = pickle.loads(setup["args"])
        value = fn(rank, *args)
        atexit._run_exitfuncs()
        _settle_checks(link)
        try:
            outcome = ("value", pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception as exc:  # noqa: BLE001 - told as the rank's failure
            outcome = ("unpicklable", f"{type(value).__name__}: {exc}")
    except Aborted:
        os._exit(0)
    except BaseException as exc:  # noqa: BLE001 - the rank's failure is the run's result
        if link.aborted:
            os._exit(0)
        outcome = ("raised", _exception_bytes(exc), format_user_exception(exc))
        _settle_streams(link)
        link.end(outcome)
        atexit._run_exitfuncs()
        return 1
    _settle_streams(link)
    link.end(outcome)
    return 0


def _settle_checks(link: _Link) -> None:
    """Refresh the shared copies of sends and receives never waited for (the end-of-run buffer check reads them)."""
    for pairs in link.pairs.values():
        C.refresh(pairs)


def _exception_bytes(exc: BaseException) -> bytes | None:
    try:
        data = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - the proxy makes a stand-in from the text
        return None


def install_torch() -> None:
    """Route torch.distributed to simdist as on rank threads, process-wide (the fork server does it once)."""
    from simdist import torch_bridge

    torch_bridge.spawn.install()
    torch_bridge.ranks.install()
    torch_bridge.cuda.install()


def _enter_torch(setup: dict, link: _Link, world: RemoteWorld) -> None:
    """Make the process's main thread a rank of torch.distributed, with its simulated GPUs, as a rank thread is."""
    from simdist import torch_bridge

    torch_bridge.ranks.enter_rank(None, _store_factory(link, setup["size"]))
    if setup["cuda_as_cpu"]:
        torch_bridge.cuda.enter_thread(setup["gpus_per_node"], world.now)
