"""Finding the user's line that called into simdist (for reports and traces)."""

from __future__ import annotations

import os
import sys
from types import CodeType

__all__ = ["user_call_site", "skip_directory"]

_SKIP: list[str] = []
_LIBRARY: dict[CodeType, bool] = {}
_SITES: dict[tuple[CodeType, int], str] = {}


def skip_directory(path: str) -> None:
    """Treat files under ``path`` as library code, never as the user's call site."""
    path = os.path.dirname(os.path.abspath(path)) if path.endswith(".py") else os.path.abspath(path)
    if path + os.sep not in _SKIP:
        _SKIP.append(path + os.sep)
        _LIBRARY.clear()


def _is_library(code: CodeType) -> bool:
    lib = _LIBRARY.get(code)
    if lib is None:
        lib = _LIBRARY[code] = code.co_filename.startswith(tuple(_SKIP))
    return lib


def user_call_site() -> str:
    """``'file:line'`` of the innermost frame outside simdist (and other skipped libraries)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if not _is_library(code):
            key = (code, frame.f_lasti)
            site = _SITES.get(key)
            if site is None:
                site = _SITES[key] = f"{code.co_filename}:{frame.f_lineno}"
            return site
        frame = frame.f_back
    return "<unknown>"


skip_directory(os.path.dirname(os.path.abspath(__file__)))
