"""Launch paths: every way this machine can start the ranks of an unmodified ``torch.distributed`` program.

A path is a launcher and, under it, the engine that runs the program's collectives:

| path | launcher | a torch.distributed program's collectives run on |
| --- | --- | --- |
| ``torchrun`` | torch's ``torchrun --standalone`` | torch's backend, the one the code names |
| ``python`` | ``python script.py`` (the script starts its own ranks) | the same |
| ``simdist run`` | ``simdist run`` (no ``--backend``) | the same |
| ``simdist run --backend gloo`` | ``simdist run --backend gloo`` | the same (``--backend gloo`` is for simdist's API) |
| ``simdist run --backend socket`` | ``simdist run --backend socket`` | simdist's socket backend, through the torch bridge |
| ``simdist run --backend sim`` | ``simdist run --backend sim`` | simulated ranks, threads of the launcher's process |
| ``simdist.spawn sim`` / ``socket`` / ``gloo`` | ``simdist.spawn(fn, args, nprocs, backend=...)`` | the simulator / the socket backend / torch's gloo |

A program has a launch style: ``torchrun`` (every rank runs the script with torchrun's environment),
``spawn`` (the script calls ``torch.multiprocessing.spawn`` itself) or ``process`` (it starts
``multiprocessing.Process`` ranks itself). :func:`argv` gives a path's command for a style;
:func:`launch` runs it in a fresh subprocess, in a clean environment and with a timeout, and returns a
:class:`Launched`. tests/launch/test_launch_paths.py (programs written for the project) and
tests/support/public_programs.py (public programs, unchanged) share this module.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "PATHS",
    "SIM_PATHS",
    "STYLES",
    "Launched",
    "applies",
    "argv",
    "checkpoint_difference",
    "clean_env",
    "launch",
    "result_lines",
    "start",
]

STYLES = ("torchrun", "spawn", "process")

PATHS = {
    # name: (the styles it starts, what runs a torch.distributed program's collectives)
    "torchrun": (("torchrun", "spawn", "process"), "torch"),
    "python": (("spawn", "process"), "torch"),
    "simdist run": (("torchrun", "spawn", "process"), "torch"),
    "simdist run --backend gloo": (("torchrun", "spawn", "process"), "torch"),
    "simdist run --backend socket": (("torchrun", "spawn", "process"), "simdist"),
    "simdist run --backend sim": (("torchrun", "spawn", "process"), "simdist"),
    "simdist.spawn sim": (("spawn",), "simdist"),
    "simdist.spawn socket": (("spawn",), "simdist"),
    "simdist.spawn gloo": (("spawn",), "torch"),
}
"""Every launch path: the launch styles it can start, and whose engine runs a torch.distributed program on it."""

SIM_PATHS = ("simdist run --backend sim", "simdist.spawn sim")
"""The paths on which a program runs on simulated ranks (and simulated GPUs where the machine has none)."""

_UNSET = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
_UNSET += ("ROLE_RANK", "ROLE_WORLD_SIZE", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES")

# simdist.spawn from the command line: import the script as a module (its folder first on sys.path,
# and on PYTHONPATH for the processes of a process backend), then spawn one of its functions.
_SPAWN_DRIVER = """\
import importlib, json, sys
import simdist
folder, module, fn, args, nprocs, backend = sys.argv[1:]
sys.path.insert(0, folder)
values = simdist.spawn(getattr(importlib.import_module(module), fn), args=tuple(json.loads(args)),
                       nprocs=int(nprocs), backend=backend)
print("simdist.spawn returned", json.dumps(values, default=repr), flush=True)
"""


def applies(path: str, style: str) -> bool:
    """Whether ``path`` can start a program of launch ``style``."""
    return style in PATHS[path][0]


def argv(
    path: str,
    script: Path,
    style: str,
    world: int,
    args: tuple[str, ...] = (),
    spawn: tuple[str, tuple] | None = None,
) -> list[str]:
    """The command line that starts ``script`` (launch ``style``, ``world`` ranks) on ``path``.

    A ``torchrun`` style script is started on ``world`` ranks. A ``spawn`` or ``process`` style script
    starts its ranks itself, so every launcher starts it once, as one rank; ``--backend sim`` gives a
    ``spawn`` style parent a node of ``world`` simulated GPUs. ``spawn`` is ``(function, args)`` for
    the ``simdist.spawn`` paths: the module-level function of the script that its ranks run.
    """
    if not applies(path, style):
        raise ValueError(f"{path!r} does not start {style}-style scripts")
    py = sys.executable
    n = str(world if style == "torchrun" or (style == "spawn" and path == "simdist run --backend sim") else 1)
    if path == "torchrun":
        return [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", n, str(script), *args]
    if path == "python":
        return [py, str(script), *args]
    if path.startswith("simdist run"):
        return [py, "-m", "simdist.run", *path.split()[2:], "--nproc-per-node", n, str(script), *args]
    if spawn is None:
        raise ValueError(f"{path!r} needs the function to spawn and its arguments")
    fn, fn_args = spawn
    import json

    backend = path.split()[1]
    return [py, "-c", _SPAWN_DRIVER, str(script.parent), script.stem, fn, json.dumps(fn_args), str(world), backend]


def clean_env(extra: dict[str, str] | None = None, pythonpath: Path | None = None) -> dict[str, str]:
    """This process's environment without what a launcher sets (rank variables, ports, simdist's own, thread counts).

    PYTHONUNBUFFERED goes too, so the processes a script starts print whole lines (their output is
    written when a buffer fills or the process ends) and lines of two processes never interleave.
    """
    env = {k: v for k, v in os.environ.items() if k not in _UNSET and not k.startswith(("SIMDIST_", "TORCHELASTIC_"))}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


@dataclass
class Launched:
    """One launch: its command, exit status (``None``: killed at its timeout), output and wall time."""

    path: str
    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    cwd: Path = field(default_factory=Path)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def error(self) -> str:
        """A line saying how the launch failed: the last exception line of its output, or its status."""
        if self.returncode is None:
            return f"timed out after {self.seconds:.0f} s"
        lines = [ln.strip() for ln in (self.stderr + "\n" + self.stdout).splitlines() if ln.strip()]
        pattern = re.compile(r"^(?:\[rank \d+\] )?(?:\w+\.)*\w*(Error|Exception|Exit)\b.*\S")
        for line in reversed(lines):  # the last exception with a message (not torchrun's bare ChildFailedError:)
            if pattern.match(line) and not line.endswith(":"):
                return line
        return f"exit status {self.returncode}: " + (lines[-1].strip() if lines else "no output")

    def died_in_torchs_teardown(self, world: int) -> bool:
        """Whether the launch failed only as its ranks exited: each of the ``world`` ranks printed its final result
        line (``params=``), then one died of SIGABRT in torch's teardown ("terminate called without an active
        exception", as torch's gloo does now and then on a busy machine). A path on torch's own engine that did so
        is worth running once more: it is not what the tests check."""
        finals = {r.get("rank") for r in result_lines(self.stdout) if "params" in r}
        aborted = "terminated with signal SIGABRT" in self.stderr or "exitcode: -6" in self.stderr
        return not self.ok and len(finals) == world and aborted

    def describe(self) -> str:
        """The command and the tail of its output, for an assertion message."""
        tail = (self.stdout[-3000:] + "\n--- stderr ---\n" + self.stderr[-5000:]).strip()
        return f"{self.path}: {' '.join(self.argv[:3])} ... exit {self.returncode} in {self.seconds:.1f} s\n{tail}"


def launch(
    path: str,
    command: list[str],
    cwd: Path,
    timeout: float,
    env: dict[str, str] | None = None,
) -> Launched:
    """Run ``command`` in ``cwd`` in a new session; at ``timeout`` stop it and every process it started."""
    start = time.monotonic()
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=clean_env() if env is None else env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _stop(proc)
        out, err = proc.communicate()
        code = None
    return Launched(path, command, code, out, err, time.monotonic() - start, cwd)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the launch's process group (launchers stop their ranks on it), SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def start(
    path: str,
    script: Path,
    style: str,
    world: int,
    args: tuple[str, ...] = (),
    *,
    cwd: Path,
    timeout: float,
    spawn: tuple[str, tuple] | None = None,
    env: dict[str, str] | None = None,
) -> Launched:
    """:func:`launch` ``script`` on ``path`` (:func:`argv`), in a clean environment plus ``env``."""
    folder = script.parent if path.startswith("simdist.spawn") else None  # its processes import the script
    command = argv(path, script, style, world, args, spawn)
    return launch(path, command, cwd, timeout, clean_env(env, pythonpath=folder))


_PREFIX = re.compile(r"^\[rank \d+\] ")


def result_lines(stdout: str, marker: str = "result: ") -> list[dict[str, str]]:
    """The ``key=value`` fields of every line holding ``marker`` (after any ``[rank N] `` prefix), in order."""
    found = []
    for line in stdout.splitlines():
        line = _PREFIX.sub("", line)
        if marker in line:
            fields = line.split(marker, 1)[1].split()
            found.append(dict(f.split("=", 1) for f in fields if "=" in f))
    return found


def checkpoint_difference(a: Any, b: Any, where: str = "") -> str | None:
    """Where two loaded checkpoints differ (``None``: equal): nested dicts and lists, tensors compared exactly."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        same = same and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return None if same else f"{where or 'the value'}: {a!r} != {b!r}"
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{where or 'the top level'}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"
        for key in a:
            found = checkpoint_difference(a[key], b[key], f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            found = checkpoint_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{where or 'the value'}: {a!r} != {b!r}"
