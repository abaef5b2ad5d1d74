"""Finding the user's line that called into simdist (for reports and traces)."""

from __future__ import annotations

import os
import sys
from types import CodeType

__all__ = ["user_call_site", "skip_directory", "is_library_file"]

_SKIP: list[str] = []
_LIBRARY: dict[CodeType, bool] = {}
_SITES: dict[tuple[CodeType, int], str] = {}


def skip_directory(path: str) -> None:
    """Treat files under ``path`` as library code, never as the user's call site."""
    path = os.path.dirname(os.path.abspath(path)) if path.endswith(".py") else os.path.abspath(path)
    if path + os.sep not in _SKIP:
        _SKIP.append(path + os.sep)
        _LIBRARY.clear()


def is_library_file(filename: str) -> bool:
    """Whether ``filename`` lies in simdist or another library skipped for call sites."""
    return filename.startswith(tuple(_SKIP))


def _is_library(code: CodeType) -> bool:
    lib = _LIBRARY.get(code)
    if lib is None:
        lib = _LIBRARY[code] = is_library_file(code.co_filename)
    return lib


def user_call_site(skip: tuple[str, ...] = ()) -> str:
    """``'file:line'`` of the innermost frame outside simdist, other skipped libraries and the folders ``skip``."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if not _is_library(code) and not (skip and code.co_filename.startswith(skip)):
            key = (code, frame.f_lasti)
            site = _SITES.get(key)
            if site is None:
                site = _SITES[key] = f"{code.co_filename}:{frame.f_lineno}"
            return site
        frame = frame.f_back
    return "<unknown>"


skip_directory(os.path.dirname(os.path.abspath(__file__)))
