"""``simdist run --backend sim``: one run of a script on simulated ranks, scheduled by a seed or replayed from a token;
its report, the command that replays it, and its trace (also what ``simdist test`` reports with)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import traceback
from typing import Any

__all__ = ["exit_status", "replay_command", "run", "script_of"]


def run(opts: argparse.Namespace, env: dict[str, str]) -> int:
    """One run of the script on simulated ranks, scheduled as ``--seed``/``--strategy``/``--replay`` say: its exit
    status, after a line with the replay token and the job's virtual time (or, on a failure, its report and the
    command that replays it)."""
    import torch

    from simdist.core import DistError, RankError, RankExitError
    from simdist.core._callsite import format_user_exception
    from simdist.testing._script import ScriptError, ScriptProgram

    n = opts.nproc_per_node
    try:
        script = script_of(opts, env)
    except ValueError as exc:
        sys.stderr.write(f"simdist run: {exc}\n")
        return 2
    if opts.cuda_as_cpu is None:
        cuda_as_cpu = not torch.cuda.is_available() or _too_few_gpus(n)
    else:
        cuda_as_cpu = opts.cuda_as_cpu
    options: dict[str, Any] = {
        "prefix_output": not opts.no_prefix,
        "cuda_as_cpu": cuda_as_cpu,
        "gpus_per_node": n,
        "isolation": opts.ranks_as,
        "detail": opts.detail or "messages",
        "topology": opts.topology,
        "trace_file": opts.trace,
    }
    if opts.timeout is not None:
        options["timeout"] = opts.timeout
    program = ScriptProgram.of(script, options)
    how = {"schedule": opts.replay} if opts.replay else {"seed": opts.seed, "strategy": opts.strategy}
    try:
        res = program.simulate(**how)
        sys.stdout.flush()
        sys.stderr.write(
            f"simdist run: {_ranks(script, res)} finished in {_virtual(res.time)} of virtual time; "
            f"replay token: {res.schedule}\n"
        )
        return 0
    except RankError as err:
        cause = err.__cause__
        status = 1
        if err.exitcode is not None or isinstance(cause, RankExitError):  # a rank's process ended (os._exit, a signal)
            sys.stderr.write(f"simdist run: {err}\n")
            status = 1 if err.exitcode is None else (exit_status(err.exitcode) or 1)
        elif isinstance(cause, SystemExit):
            code = cause.code if isinstance(cause.code, int) else 1
            sys.stderr.write(f"simdist run: rank {err.rank} exited with status {code}\n")
            if not isinstance(cause.code, int):
                sys.stderr.write(f"{cause.code}\n")
            status = min(code, 255) or 1
        else:
            if cause is not None:
                sys.stderr.write(getattr(cause, "rank_traceback", None) or format_user_exception(cause))
            sys.stderr.write(f"simdist run: {err}\n")
        return _replay_hint(opts, script, err, status)
    except ScriptError as err:  # the parent of a script that starts its own ranks failed
        cause = err.__cause__
        if isinstance(cause, SystemExit):
            if not (isinstance(cause.code, int) or cause.code is None):
                sys.stderr.write(f"{cause.code}\n")
            status = min(cause.code, 255) if isinstance(cause.code, int) else 1
        else:
            assert cause is not None
            sys.stderr.write("".join(traceback.format_exception(cause)))
            sys.stderr.write(f"simdist run: {opts.script} raised {type(cause).__name__}: {cause}\n")
            status = 1
        return _replay_hint(opts, script, err, status) if status else 0
    except DistError as err:  # DeadlockError, CollectiveMismatchError, DistTimeoutError: their reports
        sys.stderr.write(f"simdist run: {type(err).__name__}: {err}\n")
        return _replay_hint(opts, script, err, 1)
    finally:
        sys.stdout.flush()
        if opts.trace is not None:
            _finish_trace(opts.trace, opts.trace_format)


def script_of(opts: argparse.Namespace, env: dict[str, str]) -> Any:
    """The :class:`~simdist.testing._script.Script` that ``simdist run --backend sim`` (or ``simdist test``) runs,
    its ranks given torchrun's variables and ``env``."""
    from simdist.testing._script import DEFAULT_MASTER, Script

    master = (opts.master_addr, opts.master_port or DEFAULT_MASTER[1])
    return Script.of(
        opts.script,
        opts.nproc_per_node,
        opts.script_args,
        nnodes=opts.nnodes,
        module=opts.module,
        launch=opts.launch,
        master=master,
        env=env,
    )


def _ranks(script: Any, res: Any) -> str:
    return f"the script and its {len(res.values)} ranks" if script.launch == "spawn" else f"{script.world} ranks"


def _virtual(seconds: float) -> str:
    """``seconds`` of virtual time in words, in the largest unit that keeps it at least 1."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds * 1e9:.4g} ns"


def _replay_hint(opts: argparse.Namespace, script: Any, err: Any, status: int) -> int:
    """Say the command that replays the failed run ``err`` (when it has a token); return ``status``."""
    if err.schedule:
        sys.stderr.write(f"simdist run: replay this run: {replay_command(opts, script, err.schedule)}\n")
    return status


def replay_command(opts: argparse.Namespace, script: Any, token: str) -> str:
    """The ``simdist run`` command line that replays the run of ``token``: the script, its arguments and the flags
    that decide what the ranks see (ranks per node, nodes, how it is launched, simulated GPUs, detail, topology)."""
    from simdist.testing._script import spawn_line

    words = ["simdist", "run", "--backend", "sim", "--nproc-per-node", str(opts.nproc_per_node)]
    if opts.nnodes > 1:
        words += ["--nnodes", str(opts.nnodes)]
    if script.launch != ("spawn" if spawn_line(script.path) is not None else "torchrun"):
        words += ["--launch", script.launch]
    if opts.cuda_as_cpu is not None:
        words.append("--cuda-as-cpu" if opts.cuda_as_cpu else "--no-cuda-as-cpu")
    for flag in ("detail", "topology"):
        if getattr(opts, flag, None) is not None:
            words += [f"--{flag}", str(getattr(opts, flag))]
    words += ["--replay", token]
    words += ["-m", opts.script] if opts.module else [opts.script]
    return shlex.join(words + list(opts.script_args))


def _finish_trace(path: str, form: str) -> None:
    """Say where the run's trace went; in the Chrome/Perfetto format when ``form`` says so."""
    if not os.path.exists(path):
        return
    if form == "perfetto":
        from simdist.core import Trace

        text = Trace.load(path).to_chrome_json()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        sys.stderr.write(f"simdist run: trace written to {path} (Chrome/Perfetto JSON: open it at ui.perfetto.dev)\n")
    else:
        sys.stderr.write(
            f"simdist run: trace written to {path} (simdist's JSON: the app's Traces page opens it, "
            "simdist.Trace.load reads it)\n"
        )


def _too_few_gpus(per_node: int) -> bool:
    """True, after saying so once on stderr, when this machine has CUDA but fewer GPUs than ``per_node``: the
    ranks then get simulated GPUs, as where CUDA is missing, so a script for N GPUs runs on a smaller machine."""
    import torch

    real = torch.cuda.device_count()
    if real >= per_node:
        return False
    sys.stderr.write(
        f"simdist run: --nproc-per-node {per_node} asks for {per_node} GPUs per node and this machine has {real}: "
        "the ranks get simulated GPUs backed by the CPU, as with --cuda-as-cpu (docs/gpu-scripts.md). For the real "
        f"GPUs, give --nproc-per-node {real} or fewer\n"
    )
    return True


def exit_status(code: int) -> int:
    """The launcher's exit status for a rank that ended with ``code`` (``Popen.returncode``)."""
    return 128 - code if code < 0 else min(code, 255)
