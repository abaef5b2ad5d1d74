"""``Scratch``: a copy of a folder that every run of a script starts in, put back as it was before each run.

A script under test writes files (checkpoints, logs) into its working directory; the next schedule must not
read them, and a replay must start from the files the failing run started from. So the runs of an exploration
(and of ``simdist.testing.run_script``) happen in a copy of the folder, never in the folder itself: the copy is
made once, and before each run :meth:`Scratch.reset` puts back what the last run changed. It compares every
entry with what the copy held (for a file its inode, size, modification and change times: writing a file
always changes its change time, which no program can set), deletes what was added, and copies back from the
folder only what was changed or removed. Symbolic links are copied as links (what they point to outside the
copy is not copied, so writes through them are not undone); sockets and pipes are left out. Folders that a
training run reads but does not write, and that are often large, are linked instead of copied (:data:`LINKED`:
a git repository's ``.git``, a virtual environment, caches of tools), so a run started at the root of a project
finds them where they were.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from typing import Any

__all__ = ["MAX_BYTES", "MAX_FILES", "Scratch"]

MAX_FILES = 20_000
"""The most entries a folder may hold to be copied for the runs of a script."""
MAX_BYTES = 1 << 30
"""The most bytes (1 GiB) its files may hold."""
LINKED = (".git", ".hg", ".svn", "node_modules", "__pycache__", ".tox", ".nox", ".mypy_cache", ".pytest_cache",
          ".ruff_cache", ".ipynb_checkpoints")  # fmt: skip
"""The folders linked, not copied (and any folder holding a ``pyvenv.cfg``: a virtual environment)."""


def _linked(folder: str, name: str) -> bool:
    """Whether the folder ``name`` of ``folder`` is one of those linked, not copied."""
    path = os.path.join(folder, name)
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    return name in LINKED or os.path.isfile(os.path.join(path, "pyvenv.cfg"))


def _measure(folder: str) -> tuple[int, int]:
    """``(entries, bytes of regular files)`` below ``folder``, links not followed; stops counting past the limits."""
    entries = size = 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not _linked(root, d)]
        entries += len(dirs) + len(files)
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                size += st.st_size
        if entries > MAX_FILES or size > MAX_BYTES:
            break
    return entries, size


def _scan(top: str) -> dict[str, tuple]:
    """Every entry below ``top`` by relative path: ``('dir',)``, ``('link', target)`` or ``('file', ino, size, mtime,
    ctime)``."""
    found: dict[str, tuple] = {}
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, top)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir",)
            elif stat.S_ISREG(st.st_mode):
                found[rel] = ("file", st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return found


def _left_out(folder: str, names: list[str]) -> list[str]:
    """The entries of ``folder`` not copied: those linked instead, and those neither files, folders nor links
    (sockets, pipes, devices)."""
    left_out = []
    for name in names:
        if _linked(folder, name):
            left_out.append(name)
            continue
        try:
            mode = os.lstat(os.path.join(folder, name)).st_mode
        except OSError:
            left_out.append(name)
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            left_out.append(name)
    return left_out


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


class Scratch:
    """A copy of ``source`` in a new temporary folder (``path``, named as ``source``), removed by :meth:`close`.

    Raises:
        ValueError: ``source`` is not a folder, or holds more than ``MAX_FILES`` entries or ``MAX_BYTES`` bytes
            (copying it for the runs would cost more than they do).
    """

    def __init__(self, source: str | os.PathLike):
        source = os.path.abspath(os.fspath(source))
        if not os.path.isdir(source):
            raise ValueError(f"workdir={source!r} is not a folder; expected the folder the script's runs start in")
        entries, size = _measure(source)
        if entries > MAX_FILES or size > MAX_BYTES:
            raise ValueError(
                f"workdir={source!r} holds more than {MAX_FILES:,} entries or {MAX_BYTES >> 20:,} MiB "
                f"(at least {entries:,} entries, {size >> 20:,} MiB), and every run of the script starts in a copy "
                "of it: give a smaller folder that holds what the script reads (simdist test --workdir DIR, "
                "workdir= in Python)"
            )
        self.source = source
        self.root = tempfile.mkdtemp(prefix="simdist-runs-")
        self.path = os.path.join(self.root, os.path.basename(source) or "work")
        try:
            shutil.copytree(source, self.path, symlinks=True, ignore=_left_out)
            for root, dirs, _ in os.walk(source):
                for name in [d for d in dirs if _linked(root, d)]:
                    origin = os.path.join(root, name)
                    os.symlink(origin, os.path.join(self.path, os.path.relpath(origin, source)))
                dirs[:] = [d for d in dirs if not _linked(root, d)]
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        self.held = _scan(self.path)

    def reset(self) -> None:
        """Put the copy back as it was made: what a run added is deleted, what it changed or removed copied again."""
        now = _scan(self.path)
        for rel in sorted(now.keys() - self.held.keys(), reverse=True):
            _remove(os.path.join(self.path, rel))
        changed = False
        for rel in sorted(self.held):  # a folder comes before what it holds
            was = self.held[rel]
            if now.get(rel) == was or (was[0] == "dir" and now.get(rel, ("",))[0] == "dir"):
                continue
            changed = True
            target, origin = os.path.join(self.path, rel), os.path.join(self.source, rel)
            if rel in now:
                _remove(target)
            if was[0] == "dir":
                os.makedirs(target, exist_ok=True)
            elif was[0] == "link":
                os.symlink(was[1], target)
            else:
                shutil.copy2(origin, target)
        if changed or now.keys() - self.held.keys():
            self.held = _scan(self.path)

    def close(self) -> None:
        """Remove the copy."""
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
