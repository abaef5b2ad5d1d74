"""torch's profiler on simulated ranks: one session shared by the ranks, and events for the bridged ops.

Kineto, under every torch profiler, keeps one session per process, and simulated ranks
share one process: a second session opened by another rank thread used to end it
(SIGSEGV), and so does starting and stopping sessions from different threads. While a
simulation runs, the profilers that rank threads have open at the same time share one
session that records every thread, started and stopped by one thread of simdist's: the
first profiler opened starts it; one that closes while others are still open stops it,
keeps what it recorded, and starts it again for the others; the last one stops it. Each
rank's profiler then holds the events of its own thread from the moment it was opened, as
if the rank had the process to itself.

Each op the bridge forwards, on simulated ranks or in a process (:mod:`.processes`), is
recorded as torch's own backends record theirs: an event named ``"<backend>:<op>"``
(``gloo:all_reduce``) with the op's input shapes, asynchronous as gloo's are. It marks the
op's start: the op's real duration on the simulator says nothing about a real run (virtual
time in the trace does).
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch

__all__ = ["install", "uninstall", "install_in_process", "record_op"]

_MARK = "simdist.profiler_opened"
_members: dict[int, Any] = {}  # id(profile) -> the profiles open on rank threads, sharing the session
_saved: dict[str, Any] = {}
_kineto_thread: ThreadPoolExecutor | None = None  # the one thread that starts and stops sessions, for good


def _on_kineto_thread(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` run on the thread that starts and stops every shared session."""
    global _kineto_thread
    if _kineto_thread is None:
        _kineto_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="simdist-profiler")
    return _kineto_thread.submit(fn, *args).result()


def record_op(name: str, inputs: list) -> None:
    """Record an op's start in the profiler, as torch's own backends do (nothing while nothing profiles).

    On simulated ranks while a rank profiles (the shared session), in a process while its profiler
    is on. The record is ended at once, on another thread (so it is asynchronous, as gloo's are):
    an op's record left open while a rank waits for the baton would still be open when
    another rank stops the shared session, which Kineto does not survive.
    """
    on = _members or torch.autograd._profiler_enabled() or torch.autograd.profiler._is_profiler_enabled
    if not on:  # (the last: a session recording every thread, which the thread's own flag misses on 2.11)
        return
    handle = torch.autograd._record_function_with_args_enter(name, *inputs)
    ender = threading.Thread(target=torch.autograd._record_function_with_args_exit, args=(handle,))
    ender.start()
    ender.join()


def _all_threads(config: Any) -> Any:
    """A copy of a Kineto ``_ExperimentalConfig`` with ``profile_all_threads`` on."""
    from torch._C._profiler import _ExperimentalConfig

    names = re.findall(r"(\w+): [^,]+? = ", _ExperimentalConfig.__init__.__doc__ or "")
    state = list(config.__getstate__())
    if "profile_all_threads" not in names or len(names) != len(state):
        return config
    state[names.index("profile_all_threads")] = True
    return _ExperimentalConfig(*state)


def _start_session(prof: Any) -> None:
    prof.experimental_config = _all_threads(prof.experimental_config)
    _on_kineto_thread(_saved["prepare"], prof)
    _on_kineto_thread(_saved["start"], prof)


def _prepare_trace(prof: Any) -> None:
    if not _in_rank():
        return _saved["prepare"](prof)
    if not _members:
        _start_session(prof)
    prof.entered = True
    prof._simdist_chunks = []
    _members[id(prof)] = prof


def _start_trace(prof: Any) -> None:
    if id(prof) not in _members:
        return _saved["start"](prof)
    mark = torch.autograd._record_function_with_args_enter(f"{_MARK}.{id(prof)}")
    torch.autograd._record_function_with_args_exit(mark)


def _exit(prof: Any, *exc: Any) -> Any:
    if _members.pop(id(prof), None) is None:
        return _saved["exit"](prof, *exc)
    device = prof.use_device  # torch's __exit__ synchronizes it: here, on the rank, where its GPUs are
    if device and hasattr(getattr(torch, device, None), "synchronize"):
        getattr(torch, device).synchronize()
    prof.use_device = None
    try:
        result = _on_kineto_thread(_saved["exit"], prof, *exc)  # stops the session; kineto_results: what it recorded
    finally:
        prof.use_device = device
    prof._simdist_chunks.append(prof.kineto_results)
    for other in _members.values():
        other._simdist_chunks.append(prof.kineto_results)
    if _members:
        _start_session(next(iter(_members.values())))
    return result


def _parse(prof: Any, results: Any, *args: Any, **kwargs: Any) -> list:
    """Events of ``prof``'s own thread, from every stretch of the shared session it was open for."""
    chunks = getattr(prof, "_simdist_chunks", None)
    if not chunks:
        return _saved["parse"](prof, results, *args, **kwargs)
    mark, thread, events = f"{_MARK}.{id(prof)}", None, []
    for chunk in chunks:
        parsed = _saved["parse"](prof, chunk, *args, **kwargs)
        opened = next((e for e in parsed if e.name == mark), None)
        if opened is not None:
            thread = opened.thread
            parsed = [e for e in parsed if e.time_range.start >= opened.time_range.start and e is not opened]
        events += [e for e in parsed if e.thread == thread]
    return events


_PATCHES = {
    "prepare": ("_prepare_trace", _prepare_trace),
    "start": ("_start_trace", _start_trace),
    "exit": ("__exit__", _exit),
    "parse": ("_parse_kineto_results", _parse),
}
"""What :func:`install` replaces on torch's ``profile`` class: key in ``_saved`` -> (attribute, ours)."""


def _outside_ranks() -> bool:
    return False


_in_rank: Callable[[], bool] = _outside_ranks  # whether the calling thread is a simulated rank (given by install)


def install(in_rank: Callable[[], bool]) -> None:
    """Share torch's profiler among the rank threads of the simulation that is starting (``in_rank``: whether the
    calling thread is one of them)."""
    from torch.autograd.profiler import profile

    global _in_rank
    _in_rank = in_rank
    for key, (name, ours) in _PATCHES.items():
        _saved[key] = getattr(profile, name)
        setattr(profile, name, ours)


def install_in_process() -> None:
    """Let a rank process's profiler keep the bridged ops, on every supported torch release.

    :func:`record_op` ends each record on another thread. torch 2.13 and newer keep such a
    record, marked asynchronous; torch 2.11 keeps it only in a session that records every
    thread, so there every profiler the process opens records every thread, as gloo's worker
    threads are recorded in a gloo process.
    """
    from torch.autograd.profiler import profile

    from . import versions

    if versions.release() >= (2, 13) or getattr(profile._prepare_trace, "_simdist_all_threads", False):
        return
    prepare = profile._prepare_trace

    def prepare_all_threads(prof: Any) -> Any:
        prof.experimental_config = _all_threads(prof.experimental_config)
        return prepare(prof)

    setattr(prepare_all_threads, "_simdist_all_threads", True)
    setattr(profile, "_prepare_trace", prepare_all_threads)


def uninstall() -> None:
    """Undo :func:`install`."""
    from torch.autograd.profiler import profile

    if _saved:
        for key, (name, _) in _PATCHES.items():
            setattr(profile, name, _saved[key])
    _saved.clear()
    _members.clear()
