"""``simdist test``: explore a script's schedules, as ``simdist.testing.explore`` explores a function's.

    simdist test --nproc-per-node 4 train.py --steps 2

It parses torchrun's flags as ``simdist run --backend sim`` does (:mod:`simdist.launch.run`), makes the script's
:class:`~simdist.testing._script.ScriptProgram` and hands it to the one explorer (``explore_program``): the same
strategies, shrinker, replay check and ``explain`` as for functions. Each run starts in a fresh copy of the working
directory (``--workdir``), so what one schedule writes is never read by the next, and the command it prints to
replay a failure (``simdist run ... --replay TOKEN``), run in the working directory, starts from the same files.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import _sim_run
from . import run as _run

__all__ = ["main"]

CHECK_TAIL = 20
"""The last lines of a failing ``--check`` command's output that its failure quotes."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``simdist test``'s arguments (without the word ``test``); return the exit status: 0 when every schedule
    passed, 1 on a failure (after its report), 2 on a usage error."""
    from simdist.core import DistError
    from simdist.testing._explore import Plan, explore_program
    from simdist.testing._run import NondeterminismError
    from simdist.testing._script import ScriptProgram
    from simdist.testing._workdir import Scratch

    parser = _run._parser("simdist test")
    parser.set_defaults(backend="sim")
    opts = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if opts.backend != "sim":
        parser.error(f"simdist test runs the script on simulated ranks; leave out --backend {opts.backend}")
    _run._check(opts, parser)
    if opts.max_restarts:
        parser.error(
            f"--max-restarts {opts.max_restarts}: simdist test reports a run that fails as the schedule's failure; "
            "it does not restart the job"
        )
    opts.attempt = 0
    try:
        script = _sim_run.script_of(opts, {**_run._launch_env(opts), **_run._elastic_env(opts)})
        files = Scratch(os.getcwd() if opts.workdir is None else opts.workdir)
    except ValueError as exc:
        parser.error(str(exc))
    options: dict[str, Any] = {
        "prefix_output": not opts.no_prefix,
        "isolation": opts.ranks_as,
        "check_buffers": True,
        "capture_output": True,
        "timeout": opts.timeout,
    }
    if opts.cuda_as_cpu is not None:
        options["cuda_as_cpu"] = opts.cuda_as_cpu
    check = None if opts.check is None else command_check(opts.check)
    plan = Plan(opts.strategy, opts.schedules, seed=opts.seed)
    started = time.monotonic()
    with files:
        program = ScriptProgram.of(script, options, check, files)
        try:
            summary = explore_program(program, plan)
        except NondeterminismError as err:  # a failure whose replay did not fail the same way: no command replays it
            sys.stderr.write(f"simdist test: a run failed, and its replay did not fail the same way: {err}\n")
            return 1
        except DistError as err:
            if err.schedule is None:
                raise
            _report(opts, script, program, err)
            return 1
    sys.stdout.write(f"simdist test: {summary} ({time.monotonic() - started:.1f} s)\n")
    return 0


def command_check(command: str) -> Callable[[list], None]:
    """A run's check that runs the shell ``command`` where the run's files are: it fails (``AssertionError``, with the
    command's last lines) when the command exits with a status other than 0."""

    def check(values: list) -> None:
        proc = subprocess.run(command, shell=True, capture_output=True, text=True, errors="replace")
        if proc.returncode != 0:
            said = (proc.stdout + proc.stderr).rstrip().splitlines()[-CHECK_TAIL:]
            quoted = "".join(f"\n    {line}" for line in said)
            raise AssertionError(f"exited with status {proc.returncode}{quoted}")

    check.__qualname__ = f"--check {command!r}"
    return check


def _report(opts: argparse.Namespace, script: Any, program: Any, err: Any) -> None:
    """The failure's report on stderr: the rank's traceback at the user's lines, the error and its notes (how the
    schedule shrank), the schedule's decisions, and the command that replays it."""
    from simdist.core._callsite import format_user_exception
    from simdist.testing._explain import decisions

    out = sys.stderr
    out.write(f"simdist test: a schedule fails: {type(err).__name__}\n")
    cause = err.__cause__
    if cause is not None and not isinstance(cause, SystemExit):
        out.write(getattr(cause, "rank_traceback", None) or format_user_exception(cause))
    out.write(f"{err}\n")
    for note in getattr(err, "__notes__", ()):
        if "simdist.testing.explain" not in note:
            out.write(f"{note}\n")
    lines = decisions(program, err.schedule)
    if lines:
        out.write("the scheduling decisions that make this run differ from the plain one:\n")
        out.write("".join(f"  {line}\n" for line in lines))
    else:
        out.write("no scheduling decision: the plain schedule (every choice 0) fails\n")
    out.write(f"replay it: {_sim_run.replay_command(opts, script, err.schedule)}\n")
    if opts.check is not None:
        out.write(f"  then, in the job's working directory: {opts.check}\n")
    if opts.workdir is not None and os.path.abspath(opts.workdir) != os.getcwd():
        out.write(f"  (in {opts.workdir}, where each run started)\n")
