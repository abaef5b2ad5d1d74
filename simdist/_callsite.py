"""Finding the user's line that called into simdist (for reports and traces)."""

from __future__ import annotations

import os
import sys

__all__ = ["user_call_site", "skip_directory"]

_SKIP: list[str] = []


def skip_directory(path: str) -> None:
    """Treat files under ``path`` as library code, never as the user's call site."""
    path = os.path.dirname(os.path.abspath(path)) if path.endswith(".py") else os.path.abspath(path)
    if path not in _SKIP:
        _SKIP.append(path + os.sep)


def user_call_site() -> str:
    """``'file:line'`` of the innermost frame outside simdist (and other skipped libraries)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not any(name.startswith(d) for d in _SKIP):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


skip_directory(os.path.dirname(os.path.abspath(__file__)))
