"""Finding the user's line that called into simdist (for reports and traces)."""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

__all__ = [
    "INSTALLED",
    "is_library_file",
    "is_user_file",
    "set_remote_site",
    "skip_directory",
    "format_user_exception",
    "trace_user_code",
    "user_call_site",
    "user_stacklevel",
    "user_tracer",
]

INSTALLED = tuple(sorted({sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")}))
"""Python's own library and installed packages."""

_SKIP: list[str] = []
_LIBRARY: dict[str, bool] = {}  # by file name
# by file name, code and instruction: code objects compare equal across files (co_filename is not compared), so two
# copies of one script in two folders have equal code
_SITES: dict[tuple[str, CodeType, int], str] = {}


def skip_directory(path: str) -> None:
    """Treat files under ``path`` as library code, never as the user's call site."""
    path = os.path.dirname(os.path.abspath(path)) if path.endswith(".py") else os.path.abspath(path)
    if path + os.sep not in _SKIP:
        _SKIP.append(path + os.sep)
        _LIBRARY.clear()


def is_library_file(filename: str) -> bool:
    """Whether ``filename`` lies in simdist or another library skipped for call sites."""
    return filename.startswith(tuple(_SKIP))


def is_user_file(filename: str, skip: tuple[str, ...] = ()) -> bool:
    """Whether ``filename`` is the user's: not simdist, a skipped library, Python's own, installed, frozen or in ``skip``."""
    return not filename.startswith((*_SKIP, *INSTALLED, "<frozen", *skip))


def _is_library(filename: str) -> bool:
    lib = _LIBRARY.get(filename)
    if lib is None:
        lib = _LIBRARY[filename] = is_library_file(filename)
    return lib


class _Remote(threading.local):
    site: str | None = None  # a class default: a thread that never set one has none


_remote = _Remote()


def set_remote_site(site: str | None) -> None:
    """Make ``site`` the calling thread's user call site until changed (``None``: find it on the stack again).

    The thread of a rank that runs as a process makes that process's calls; the user's line is
    in the process, which sends it with each call.
    """
    _remote.site = site


def user_call_site(skip: tuple[str, ...] = ()) -> str:
    """``'file:line'`` of the innermost frame outside simdist, other skipped libraries and the folders ``skip``.

    On the thread of a rank process, the line its current call came from (:func:`set_remote_site`).
    """
    remote = _remote.site
    if remote is not None:
        return remote
    frame: FrameType | None = sys._getframe(1)
    library = _LIBRARY.get
    while frame is not None:
        code = frame.f_code
        filename = code.co_filename
        lib = library(filename)  # (inlined _is_library: a call site is looked up at every operation)
        if lib is None:
            lib = _is_library(filename)
        if not lib and not (skip and filename.startswith(skip)):
            key = (filename, code, frame.f_lasti)
            site = _SITES.get(key)
            if site is None:
                site = _SITES[key] = f"{filename}:{frame.f_lineno}"
            return site
        frame = frame.f_back
    return "<unknown>"


def format_user_exception(exc: BaseException) -> str:
    """``exc`` formatted as Python prints it, without the frames of simdist and Python's ``runpy``.

    What a person reads of a rank's failure: the program's own lines, as when it runs alone.
    """
    import traceback

    report = traceback.TracebackException.from_exception(exc)
    for part in _chain(report):
        kept = [f for f in part.stack if not (is_library_file(f.filename) or f.filename.startswith("<frozen runpy"))]
        part.stack = traceback.StackSummary.from_list(kept)
    return "".join(report.format())


def _chain(report: Any) -> list:
    """``report`` and the reports of its causes and contexts."""
    out, seen = [], set()
    while report is not None and id(report) not in seen:
        seen.add(id(report))
        out.append(report)
        report = report.__cause__ or (None if report.__suppress_context__ else report.__context__)
    return out


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by our caller point at the user's line."""
    frame: FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and _is_library(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


def user_tracer(trace: Callable | None) -> Callable | None:
    """``trace`` (a ``sys.settrace`` function) made blind to frames of simdist and other skipped libraries.

    A tracer that reports lines to the user (Hypothesis's explain phase) then names the
    user's lines only, also in rank threads that run under it.
    """
    if trace is None or isinstance(trace, _UserTracer):
        return trace
    return _UserTracer(trace)


class _UserTracer:
    __slots__ = ("inner",)

    def __init__(self, inner: Callable):
        self.inner = inner

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Callable | None:
        if event == "call" and _is_library(frame.f_code.co_filename):
            return None
        return self.inner(frame, event, arg)


def trace_user_code(frame: FrameType) -> Callable | None:
    """Limit this thread's trace function to the user's frames and stop tracing ``frame`` (simdist's, running).

    Returns the trace function to put back with ``sys.settrace`` when ``frame`` returns, or ``None``.
    """
    trace = sys.gettrace()
    if trace is None:
        return None
    frame.f_trace = None
    sys.settrace(user_tracer(trace))
    return trace


skip_directory(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the whole simdist package
