"""This user's secret for socket jobs started by hand on one host: a random file only its owner reads.

``simdist run`` and ``spawn`` give every job a fresh ``$SIMDIST_SECRET``. Ranks started by
hand on loopback without one share this per-user secret instead, so another local user
(who cannot read the file) cannot join the job. The file is ``$XDG_RUNTIME_DIR/simdist/secret``
when that directory is set and owned by this user, else ``$XDG_CONFIG_HOME/simdist/secret``
(``~/.config/simdist/secret`` by default). It is created on first use with 64 random hex
characters, mode 0600, in a directory of mode 0700, atomically: the secret is written to a
temporary file that is then hard-linked into place, so ranks starting together all read the
one that was linked first. A file with another owner or any group or other permission, and
a directory that others can write to, are refused.
"""

from __future__ import annotations

import os
import secrets
import stat
import tempfile
from pathlib import Path

__all__ = ["user_secret", "user_secret_path"]

_FIX = (
    "or set SIMDIST_SECRET to the same value for every rank, e.g. "
    "export SIMDIST_SECRET=$(python3 -c 'import secrets; print(secrets.token_hex(32))') "
    "(simdist run and spawn set one for you)"
)


def user_secret_path() -> Path:
    """Where this user's secret lives: the runtime directory if usable, else the config directory."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        try:
            st = os.stat(runtime)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            return Path(runtime, "simdist", "secret")
    config = os.environ.get("XDG_CONFIG_HOME")
    if config and os.path.isabs(config):
        return Path(config, "simdist", "secret")
    try:
        home = Path.home()
    except (RuntimeError, KeyError) as exc:
        raise PermissionError(f"cannot find a home directory for the per-user simdist secret ({exc}); {_FIX}") from exc
    return home / ".config" / "simdist" / "secret"


def user_secret() -> bytes:
    """This user's secret (read from :func:`user_secret_path`, created there on first use).

    Raises:
        PermissionError: the file or its directory has another owner, the file can be read or
            written by group or others, or the directory can be written by them; the message
            names the path and the fix.
        OSError: the file cannot be created or read (the message says how to set SIMDIST_SECRET).
    """
    path = user_secret_path()
    try:
        _private_directory(path.parent)
        try:
            return _read(path)
        except FileNotFoundError:
            pass
        _create(path)
        return _read(path)
    except PermissionError:
        raise
    except OSError as exc:
        raise OSError(exc.errno, f"cannot use the per-user simdist secret {path}: {exc}; {_FIX}") from exc


def _refuse(path: Path, why: str, fix: str) -> PermissionError:
    return PermissionError(
        f"refusing the per-user simdist secret {path}: {why}, so other users could read or replace it; {fix}, {_FIX}"
    )


def _check(path: Path, st: os.stat_result, kind: int, forbidden: int, mode: str) -> None:
    """Refuse ``path`` unless it is a ``kind`` (``stat.S_IFDIR``, ``S_IFREG``), this user's, without ``forbidden`` bits."""
    remove = "remove it (a new secret is created on next use)"
    if stat.S_IFMT(st.st_mode) != kind:
        raise _refuse(path, "it is not a " + ("directory" if kind == stat.S_IFDIR else "regular file"), remove)
    if st.st_uid != os.getuid():
        raise _refuse(path, f"it is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})", remove)
    if st.st_mode & forbidden:
        raise _refuse(
            path,
            f"it has mode {stat.S_IMODE(st.st_mode):04o} (group or others have access)",
            f"run `chmod {mode} {path}` (or {remove})",
        )


def _private_directory(directory: Path) -> None:
    """Create ``directory`` with mode 0700 if missing; refuse one that is not this user's alone to write."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    _check(directory, os.stat(directory), stat.S_IFDIR, 0o022, "700")


def _read(path: Path) -> bytes:
    """The secret in ``path`` after checking the opened file's owner and mode; FileNotFoundError if absent."""
    with open(path, "rb") as f:
        _check(path, os.fstat(f.fileno()), stat.S_IFREG, 0o077, "600")
        secret = f.read(4096).strip()
    if not secret:
        raise OSError(f"{path} is empty; remove it (a new secret is created on next use)")
    return secret


def _create(path: Path) -> None:
    """Write a fresh secret to a private temporary file and link it to ``path`` unless one is there."""
    fd, temporary = tempfile.mkstemp(prefix=".secret-", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass  # another rank linked its secret first: every rank reads that one
    finally:
        os.unlink(temporary)
