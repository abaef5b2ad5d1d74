"""``simdist run``: a torchrun-compatible launcher for simdist's process backends and the simulator.

    simdist run --nproc-per-node 4 train.py --epochs 3                # 4 processes on this machine, as torchrun
    simdist run --nproc-per-node 4 --backend socket train.py          # ... with simdist's checks for torch code
    simdist run --nnodes 2 --node-rank 0 --master-addr HOST --master-port 29500 --nproc-per-node 2 train.py
    simdist run --nproc-per-node 4 --backend sim train.py             # the same script on the simulator
    simdist run --nproc-per-node 8 --backend nccl train.py            # on GPUs (or torch-nccl, gloo, mpi)

Each rank runs the script as ``__main__`` with torchrun's environment (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, MASTER_ADDR, MASTER_PORT), so
``dist.init_process_group("gloo")`` needs no arguments. MASTER_ADDR and MASTER_PORT mean what
torchrun means: node 0's address and a port where the job's torch ``TCPStore`` listens (rank 0's
``init_process_group`` serves it, or the script's own ``TCPStore``). simdist's own store, served
by node 0's launcher for the socket and nccl backends, lives at another port (``--store-port``;
the ranks find it in SIMDIST_STORE). The ranks also get SIMDIST_SECRET and SIMDIST_BACKEND.

Which engine a rank's process groups run on (:data:`ENGINES`): the name in the code decides for
``torch.distributed`` code, as under torchrun, unless ``--backend socket`` is given, which runs
torch's groups on simdist's socket backend (checked collectives, hang reports); ``--backend``
decides for code written against ``import simdist as dist``.

Like torchrun, with more than one rank per node and OMP_NUM_THREADS unset, ranks get
OMP_NUM_THREADS=1. The launcher exits 0 when every rank exits 0; when a rank fails it stops the
others and exits non-zero.

With ``--backend sim`` a script that starts its own ranks with ``torch.multiprocessing.spawn``
(or ``start_processes``) runs once instead, as ``python script.py`` would, on a node of N
simulated GPUs; each spawn runs its function on simulated ranks (see :data:`LAUNCH_HELP`).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from queue import Empty, Queue
from typing import IO, Any

from . import _scripts, _torchrun

__all__ = ["ENGINES", "main"]

GRACE_SECONDS = 5.0
"""How long ranks get between SIGTERM and SIGKILL once the job is being stopped."""

DEFAULT_PORT = 29500
PROCESS_BACKENDS = ("socket", "nccl", "gloo", "torch-nccl", "mpi")
STORE_BACKENDS = ("socket", "nccl")  # the backends whose ranks meet in simdist's store, served by the launcher

ENGINES = {
    # --backend: (what `import simdist as dist` code runs on, what torch.distributed code runs on)
    None: ("simdist's socket backend", "torch's own backend, the one the code names (as under torchrun)"),
    "socket": ("simdist's socket backend", "simdist's socket backend, whatever name the code gives (checked)"),
    "nccl": ("simdist's NCCL backend (GPUs, through cupy)", "torch's own backend, the one the code names"),
    "gloo": ("torch's gloo", "torch's own backend, the one the code names"),
    "torch-nccl": (
        "torch's NCCL for CUDA tensors, gloo for CPU tensors",
        "torch's own backend, the one the code names",
    ),
    "mpi": ("torch's MPI", "torch's own backend, the one the code names"),
    "sim": ("the simulator", "the simulator, whatever name the code gives (checked)"),
}
"""The engine each ``--backend`` gives a rank's process groups, by the API the code uses."""
LAUNCHES = ("auto", "torchrun", "spawn")
SPAWNS = ("spawn", "start_processes")  # the functions of torch.multiprocessing that start ranks

LAUNCH_HELP = (
    "how --backend sim starts the script: 'torchrun': every rank runs it as __main__ with torchrun's "
    "environment; 'spawn': it runs once, as 'python script.py' would, on a node of N simulated GPUs "
    "(torch.cuda.device_count() == N), and each torch.multiprocessing.spawn(fn, args, nprocs) or "
    "start_processes it calls runs fn(i, *args) on nprocs simulated ranks, returning when they finish "
    "(multiprocessing.Process ranks it starts run at the first join(), one simulated rank each, in the "
    "order started); 'auto' (default): 'spawn' when the script's own source calls torch.multiprocessing.spawn, "
    "start_processes or a multiprocessing Process (the script is read, not run), else 'torchrun'"
)

# A rank process: the script becomes __main__, sys.argv is the script and its arguments, and the
# script's folder comes first on sys.path, as with ``python script.py``. It imports simdist only to
# install the torch bridge, where the launcher asks for it (``--backend socket``).
# With -m, the first argument is "-m" and the module's name, as python takes them.
_WORKER = """\
import os, runpy, sys
module = sys.argv[1] == "-m"
sys.argv = sys.argv[2 if module else 1:]
sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.abspath(sys.argv[0]))
if os.environ.get("SIMDIST_TORCH_BACKEND"):
    from simdist.torch_bridge import processes
    processes.install_from_env()
    del processes
if module:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


class _Stop(Exception):
    """The launcher itself was asked to stop (SIGTERM or SIGHUP)."""


def _parser(prog: str = "simdist run") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s [options] script [script args...]",
        description="Run a script on several ranks, like torchrun: as real processes joined by simdist's "
        "socket backend, or as simulated ranks in this process.",
        epilog="Like torchrun, when OMP_NUM_THREADS is unset and N > 1, the ranks get OMP_NUM_THREADS=1.\n\n"
        "examples:\n"
        "  simdist run --standalone --nproc-per-node 4 train.py --epochs 3   # 4 processes, as torchrun\n"
        "  simdist run --nproc-per-node 4 --backend sim train.py             # the same script, simulated\n"
        "  simdist run --nproc-per-node 2 --backend socket -m mypkg.train    # a module, collectives checked",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        default="1",
        metavar="N",
        help="ranks to start on this node: a number, or auto, cpu, gpu, xpu as torchrun counts them (default 1)",
    )
    p.add_argument(
        "--nnodes",
        default="1",
        metavar="M",
        help="number of nodes, each running its own 'simdist run'; MIN:MAX with MIN == MAX (default 1)",
    )
    p.add_argument(
        "--node-rank",
        "--node_rank",
        type=int,
        default=0,
        metavar="K",
        help="this node's index in 0..M-1; its ranks are K*N .. K*N+N-1 (default 0)",
    )
    p.add_argument(
        "--master-addr",
        "--master_addr",
        default="127.0.0.1",
        metavar="HOST",
        help="the address of node 0 (MASTER_ADDR), where the job's stores listen (default 127.0.0.1)",
    )
    p.add_argument(
        "--master-port",
        "--master_port",
        type=int,
        default=None,
        metavar="P",
        help="the port of MASTER_PORT, where the job's torch TCPStore listens, as under torchrun "
        f"(default: a free port on one node, {DEFAULT_PORT} on several)",
    )
    p.add_argument(
        "--store-port",
        "--store_port",
        type=int,
        default=None,
        metavar="Q",
        help="the port of simdist's own store, served by node 0's launcher for the socket and nccl backends "
        "(default: a free port on one node, the master port + 1 on several)",
    )
    p.add_argument(
        "--backend",
        choices=PROCESS_BACKENDS + ("sim",),
        default=None,
        help="what the ranks run on. Not given: one process per rank; torch.distributed code runs on the "
        "backend it names, as under torchrun, and simdist's API on simdist's socket backend. 'socket': the "
        "same processes, torch.distributed code too on simdist's socket backend (collectives checked across "
        "ranks, hangs reported); 'nccl': simdist's API on GPUs; 'gloo', 'torch-nccl', 'mpi': simdist's API "
        "on torch.distributed's own backends; 'sim': every rank of the job as a simulated rank in this "
        "process, each running the script in a fresh namespace (or the script once, starting its own ranks: "
        "see --launch)",
    )
    p.add_argument(
        "--log-dir",
        "--log_dir",
        default=None,
        metavar="DIR",
        help="write each rank's stdout and stderr to DIR/rank_R.log instead of this terminal, and on node 0 of a "
        "socket or nccl job the load of the job's store each second to DIR/store_load.jsonl (process backends only)",
    )
    p.add_argument(
        "--no-prefix", "--no_prefix", action="store_true", help="do not start each output line with '[rank R] '"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="socket: seconds an operation waits for its peers (SIMDIST_TIMEOUT); "
        "sim: real seconds each simulation may take",
    )
    p.add_argument("--launch", choices=LAUNCHES, default="auto", help=LAUNCH_HELP)
    p.add_argument(
        "--isolation",
        choices=("processes", "threads"),
        default="processes",
        help="sim: each simulated rank a process of its own (default: its own modules, atexit, sys.argv, signal "
        "handlers and crashes, as under torchrun; forked from a server that imported torch once) or a thread "
        "of this process (faster; module state is shared between ranks). The same seed gives the same run in both",
    )
    p.add_argument(
        "--cuda-as-cpu",
        "--cuda_as_cpu",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="sim: give ranks simulated GPUs backed by the CPU even where CUDA is available (the "
        "default without CUDA, or with fewer GPUs than ranks); each node has N of them (see docs/gpu-scripts.md). "
        "--no-cuda-as-cpu: the ranks see this machine's own torch.cuda, as under torchrun here (a script that "
        "takes a GPU branch when torch.cuda.is_available() then takes the CPU one)",
    )
    _torchrun_flags(p)
    p.add_argument("script", nargs="?", help="the Python script to run (by every rank, or once: see --launch)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script (sys.argv[1:])")
    return p


def _torchrun_flags(p: argparse.ArgumentParser) -> None:
    """torchrun's further flags, with torchrun's names (what each does here: :data:`simdist.launch._torchrun.FLAGS`)."""
    T = _torchrun.FLAGS
    g = p.add_argument_group("torchrun's further flags")
    g.add_argument("--standalone", action="store_true", help=T["--standalone"])
    g.add_argument("-m", "--module", action="store_true", help=T["--module"])
    g.add_argument("--no-python", "--no_python", action="store_true", help=T["--no-python"])
    g.add_argument("--run-path", "--run_path", action="store_true", help=T["--run-path"])
    g.add_argument("--max-restarts", "--max_restarts", type=int, default=0, metavar="R", help=T["--max-restarts"])
    g.add_argument("--role", default="default", help=T["--role"])
    g.add_argument("-r", "--redirects", default=None, metavar="SPEC", help=T["--redirects"])
    g.add_argument("-t", "--tee", default=None, metavar="SPEC", help=T["--tee"])
    g.add_argument("--local-ranks-filter", "--local_ranks_filter", default=None, metavar="RANKS",
                   help=T["--local-ranks-filter"])  # fmt: skip
    g.add_argument("--rdzv-backend", "--rdzv_backend", default=None, help=T["--rdzv-backend"])
    g.add_argument("--rdzv-endpoint", "--rdzv_endpoint", default=None, metavar="HOST:PORT", help=T["--rdzv-endpoint"])
    g.add_argument("--rdzv-id", "--rdzv_id", default=None, metavar="ID", help=T["--rdzv-id"])
    g.add_argument("--rdzv-conf", "--rdzv_conf", default=None, metavar="K=V,...", help=T["--rdzv-conf"])
    g.add_argument("--signals-to-handle", "--signals_to_handle", default=_torchrun.DEFAULT_SIGNALS,
                   metavar="SIGNALS", help=T["--signals-to-handle"])  # fmt: skip
    g.add_argument("--shutdown-timeout", "--shutdown_timeout", type=float, default=GRACE_SECONDS, metavar="S",
                   help=T["--shutdown-timeout"])  # fmt: skip
    g.add_argument("--virtual-local-rank", "--virtual_local_rank", action="store_true",
                   help=T["--virtual-local-rank"])  # fmt: skip
    for flag in ("--monitor-interval", "--start-method", "--event-log-handler", "--local-addr", *_torchrun.REFUSED):
        g.add_argument(flag, flag.replace("-", "_").replace("__", "--", 1), default=None, metavar="X", help=T[flag])


def _check(opts: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if opts.script is None:
        parser.error("the following argument is required: script (the Python script to run)")
    for flag, reason in _torchrun.REFUSED.items():
        if getattr(opts, flag[2:].replace("-", "_")) is not None:
            parser.error(f"{flag} is not supported: {reason}")
    try:
        opts.nproc_per_node = _torchrun.nproc_per_node(opts.nproc_per_node)
        opts.nnodes = _torchrun.nnodes(opts.nnodes)
        endpoint = _torchrun.rdzv(opts.rdzv_backend, opts.rdzv_endpoint, opts.rdzv_conf)
        opts.signals = _torchrun.signal_names(opts.signals_to_handle)
        opts.redirect_streams = _torchrun.streams("--redirects", opts.redirects, opts.nproc_per_node)
        opts.tee_streams = _torchrun.streams("--tee", opts.tee, opts.nproc_per_node)
        opts.shown_ranks = _torchrun.rank_filter(opts.local_ranks_filter, opts.nproc_per_node)
    except ValueError as exc:
        parser.error(str(exc))
    if opts.standalone:
        if opts.nnodes > 1:
            parser.error(f"--standalone runs one node; it cannot be combined with --nnodes={opts.nnodes}")
        endpoint = None  # torchrun: the rendezvous is auto-assigned, explicit values ignored
        opts.master_addr, opts.master_port = "127.0.0.1", None
    if endpoint is not None:
        opts.master_addr = endpoint[0]
        if endpoint[1] is not None:
            opts.master_port = endpoint[1]
    if opts.max_restarts < 0:
        parser.error(f"--max-restarts={opts.max_restarts} must be 0 or more")
    if not opts.shutdown_timeout >= 0:
        parser.error(f"--shutdown-timeout={opts.shutdown_timeout} must be 0 or more seconds")
    if (opts.redirects or opts.tee) and opts.log_dir is None:
        parser.error("--redirects and --tee write the ranks' streams into --log-dir's files: give --log-dir DIR")
    if opts.module and opts.no_python:
        parser.error("--module and --no-python cannot be combined (a module is run by python)")
    if opts.no_python and opts.backend == "socket":
        parser.error("--no-python cannot be combined with --backend socket: simdist's Python worker installs the "
                     "socket backend under torch.distributed, and an executable is not run by it")  # fmt: skip
    if opts.max_restarts and opts.nnodes > 1:
        parser.error(
            f"--max-restarts with --nnodes={opts.nnodes}: restarting needs every node's launcher to agree on a new "
            "attempt, which separate 'simdist run' launchers do not do; restart the job on every node instead"
        )
    opts.run_id = opts.rdzv_id or _torchrun.new_run_id()
    if not 0 <= opts.node_rank < opts.nnodes:
        parser.error(f"--node-rank={opts.node_rank} must be in 0..{opts.nnodes - 1} for --nnodes={opts.nnodes}")
    for flag, port in (("--master-port", opts.master_port), ("--store-port", opts.store_port)):
        if port is not None and not 0 < port < 65536:
            parser.error(f"{flag}={port} is not a TCP port")
    if opts.store_port is not None and opts.store_port == opts.master_port:
        parser.error(
            f"--store-port={opts.store_port} equals --master-port: simdist's store and the job's torch TCPStore "
            "need a port each"
        )
    if opts.timeout is not None and not opts.timeout > 0:
        parser.error(f"--timeout={opts.timeout} must be a positive number of seconds")
    if opts.no_python and opts.backend == "sim":
        parser.error("--no-python is supported with the process backends only: a simulated rank runs Python")
    if opts.module:
        if _module_spec(opts.script) is None:
            parser.error(f"-m {opts.script}: no module named {opts.script!r} (looked up as python -m does)")
    elif opts.no_python:
        if shutil.which(opts.script) is None:
            parser.error(f"--no-python: {opts.script!r} is not an executable file or a command on PATH")
    elif not os.path.isfile(opts.script):
        parser.error(f"script {opts.script!r} does not exist")
    if opts.backend == "sim":
        if opts.node_rank != 0:
            parser.error("--backend sim runs every node's ranks in this one process; leave --node-rank at 0")
        if opts.log_dir is not None:
            parser.error("--log-dir is supported with the process backends only, not --backend sim")
        if opts.virtual_local_rank:
            parser.error("--virtual-local-rank is supported with the process backends only (it sets "
                         "CUDA_VISIBLE_DEVICES per rank; simulated ranks see their node's simulated GPUs)")  # fmt: skip
    elif opts.launch == "spawn" or opts.cuda_as_cpu is not None or opts.isolation != "processes":
        flag = {True: "--launch spawn", False: "--cuda-as-cpu"}[opts.launch == "spawn"]
        if opts.isolation != "processes":
            flag = f"--isolation {opts.isolation}"
        parser.error(
            f"{flag} is supported with --backend sim only (a process backend runs the script on "
            "every rank, as torchrun does)"
        )


def _module_spec(name: str) -> Any:
    """The spec ``python -m name`` would run (the working folder first on ``sys.path``), or ``None``."""
    import importlib.util

    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:  # a package: its __main__
            spec = importlib.util.find_spec(f"{name}.__main__")
        return spec
    except (ImportError, ValueError):
        return None
    finally:
        sys.path.remove(os.getcwd())


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``simdist run``'s arguments (without the word ``run``); return the exit status.

    With ``--max-restarts R``, a job that fails is started again from the script's start, up to
    R times, as torchrun restarts its worker group (each attempt's ranks see
    TORCHELASTIC_RESTART_COUNT); a job stopped by a signal is not restarted.
    """
    parser = _parser()
    opts = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    _check(opts, parser)
    run = _run_sim if opts.backend == "sim" else _run_socket
    for attempt in range(opts.max_restarts + 1):
        opts.attempt = attempt
        status = run(opts)
        if status == 0 or getattr(opts, "stopped_by_signal", False):
            return status
        if attempt < opts.max_restarts:
            sys.stderr.write(
                f"simdist run: the job failed (exit status {status}); restarting it "
                f"({attempt + 1} of --max-restarts {opts.max_restarts})\n"
            )
    return status


# --- process backends: one process per rank -----------------------------------------------------


def _launch_env(opts: argparse.Namespace) -> dict[str, str]:
    """What the launcher adds to every rank's environment beyond the rank's own variables.

    torchrun's rule: OMP_NUM_THREADS=1 when it is unset and a node runs more than one rank.
    """
    if "OMP_NUM_THREADS" not in os.environ and opts.nproc_per_node > 1:
        return {"OMP_NUM_THREADS": "1"}
    return {}


def _rank_env(opts: argparse.Namespace, local: int, ports: tuple[int, int], secret: str) -> dict[str, str]:
    """A rank's environment: torchrun's variables, simdist's store and secret, and the bridge where asked for."""
    from simdist.core import SERVED_ENV, STORE_ENV
    from simdist.torch_bridge.processes import TORCH_BACKEND_ENV

    n, (master_port, store_port) = opts.nproc_per_node, ports
    env = {**os.environ, **_launch_env(opts), **_elastic_env(opts)}
    for key in (STORE_ENV, SERVED_ENV, TORCH_BACKEND_ENV):  # the launcher's own, never inherited
        env.pop(key, None)
    env.update(
        RANK=str(opts.node_rank * n + local),
        LOCAL_RANK=str(local),
        WORLD_SIZE=str(n * opts.nnodes),
        LOCAL_WORLD_SIZE=str(n),
        GROUP_RANK=str(opts.node_rank),
        ROLE_RANK=str(opts.node_rank * n + local),
        ROLE_WORLD_SIZE=str(n * opts.nnodes),
        MASTER_ADDR=opts.master_addr,
        MASTER_PORT=str(master_port),
        SIMDIST_SECRET=secret,
        SIMDIST_BACKEND=opts.backend or "socket",
    )
    if (opts.backend or "socket") in STORE_BACKENDS:
        env[STORE_ENV] = f"{opts.master_addr}:{store_port}"
        if _serves_store(opts):
            env[SERVED_ENV] = env[STORE_ENV]
    if opts.backend == "socket":
        env[TORCH_BACKEND_ENV] = "socket"
    if opts.timeout is not None:
        env["SIMDIST_TIMEOUT"] = str(opts.timeout)
    if opts.virtual_local_rank:  # torchrun's: each rank sees only its own GPU, as device 0
        env.update(LOCAL_RANK="0", CUDA_VISIBLE_DEVICES=str(local))
    return env


def _elastic_env(opts: argparse.Namespace) -> dict[str, str]:
    """torchrun's variables beside the ranks' own: TORCHELASTIC_*, ROLE_NAME, GROUP_WORLD_SIZE (this attempt's)."""
    return _torchrun.elastic_env(
        opts.run_id, opts.role, opts.attempt, opts.max_restarts, opts.nnodes, opts.signals_to_handle
    )


def _job_ports_and_secret(opts: argparse.Namespace) -> tuple[tuple[int, int], str]:
    """``((master port, store port), secret)``: free ports and a new secret on one node; agreed ones on several."""
    from simdist.backends.socket import SECRET_ENV, new_secret
    from simdist.core import free_port

    if opts.nnodes == 1:
        master = opts.master_port or free_port()
        store = opts.store_port or free_port()
        while store == master:
            store = free_port()
        return (master, store), new_secret()
    secret = os.environ.get(SECRET_ENV)
    if not secret and (opts.backend or "socket") not in STORE_BACKENDS:  # torch's own stores: no secret of ours
        secret = new_secret()
    if not secret:
        raise SystemExit(
            f"simdist run: --nnodes={opts.nnodes} needs the same {SECRET_ENV} on every node; create one with\n"
            f"  export {SECRET_ENV}=$(python -c 'from simdist.backends.socket import new_secret; "
            "print(new_secret())')\nand set it on each node before 'simdist run'"
        )
    master = opts.master_port or DEFAULT_PORT
    return (master, opts.store_port or master + 1), secret


def _pump(stream: IO[bytes], sinks: list[tuple[IO[str], str]], lock: threading.Lock) -> None:
    """Copy ``stream`` line by line to each ``(out, prefix)`` of ``sinks``, each line starting with its prefix."""
    with stream:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if not line.endswith("\n"):
                line += "\n"
            with lock:
                for out, prefix in sinks:
                    out.write(prefix + line)
                    out.flush()


def _describe(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"failed with exit code {code}"


def _status(code: int) -> int:
    """The launcher's exit status for a rank that ended with ``code`` (``Popen.returncode``)."""
    return 128 - code if code < 0 else min(code, 255)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the rank's process group (the rank and whatever it started)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_all(procs: list[subprocess.Popen], grace: float = GRACE_SECONDS) -> list[int]:
    """SIGTERM every rank still running, SIGKILL after ``grace`` seconds; return the ranks it stopped."""
    stopped = [i for i, p in enumerate(procs) if p.poll() is None]
    for p in procs:  # also the groups of ranks that exited: a rank's children go with it
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        _signal_group(p, signal.SIGKILL)
        p.wait()
    return stopped


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop(signal.Signals(signum).name)


def _command(opts: argparse.Namespace) -> list[str]:
    """What each rank process runs: the script (or module) under simdist's worker, or the executable itself."""
    if opts.no_python:
        return [opts.script, *opts.script_args]
    target = ["-m", opts.script] if opts.module else [opts.script]
    return [sys.executable, "-u", "-c", _WORKER, *target, *opts.script_args]


def _outputs(opts: argparse.Namespace, local: int, rank: int, files: list[IO[str]]) -> dict[str, list]:
    """Where a rank's stdout and stderr go: ``(stream, prefix)`` sinks, by name (``--redirects``, ``--tee``,
    ``--local-ranks-filter``). Files it opens are added to ``files``."""
    prefix = "" if opts.no_prefix else f"[rank {rank}] "
    sinks: dict[str, list] = {}
    for name, console in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        to_file = name in opts.redirect_streams[local] or name in opts.tee_streams[local]
        sinks[name] = []
        if local in opts.shown_ranks and name not in opts.redirect_streams[local]:
            sinks[name].append((console, prefix))
        if to_file:
            f = open(os.path.join(opts.log_dir, f"rank_{rank}.{name}.log"), "w", encoding="utf-8")  # noqa: SIM115
            files.append(f)
            sinks[name].append((f, ""))
    return sinks


def _run_socket(opts: argparse.Namespace) -> int:
    ports, secret = _job_ports_and_secret(opts)
    n, base = opts.nproc_per_node, opts.node_rank * opts.nproc_per_node
    command = _command(opts)
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    pumps: list[list[threading.Thread]] = []
    files: list[IO[str]] = []
    exits: Queue[tuple[int, int]] = Queue()
    handlers: dict[int, Any] = {}
    stopped = False
    if threading.current_thread() is threading.main_thread():
        for sig in opts.signals:
            if sig != signal.SIGINT:  # (SIGINT is KeyboardInterrupt, below)
                handlers[sig] = signal.signal(sig, _raise_stop)
    if opts.log_dir is not None:
        os.makedirs(opts.log_dir, exist_ok=True)
    one_log = opts.log_dir is not None and not (opts.redirects or opts.tee)  # every stream of a rank in one file
    server = _serve_store(opts, ports[1], secret)
    if server is not None and opts.log_dir is not None:
        server.log_load(os.path.join(opts.log_dir, "store_load.jsonl"))
    try:
        for local in range(n):
            rank = base + local
            env = _rank_env(opts, local, ports, secret)
            if one_log:
                with open(os.path.join(opts.log_dir, f"rank_{rank}.log"), "wb") as log:
                    p = subprocess.Popen(
                        command,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                threads = []
            else:
                p = subprocess.Popen(
                    command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
                sinks = _outputs(opts, local, rank, files)
                threads = [
                    threading.Thread(target=_pump, args=(p.stdout, sinks["stdout"], lock), daemon=True),
                    threading.Thread(target=_pump, args=(p.stderr, sinks["stderr"], lock), daemon=True),
                ]
            procs.append(p)
            pumps.append(threads)
            for t in threads:
                t.start()
            threading.Thread(target=lambda p=p, local=local: exits.put((local, p.wait())), daemon=True).start()
        uses_store = (opts.backend or "socket") in STORE_BACKENDS
        store = (opts.master_addr, ports[1], secret, n * opts.nnodes) if uses_store else None
        watch = None
        if store is not None:
            from simdist.backends.socket import FirstFailure

            watch = FirstFailure(*store[:3])
        status, stopped = _supervise(procs, pumps, exits, base, lock, store, watch, opts.shutdown_timeout)
    except (KeyboardInterrupt, _Stop) as exc:
        name = "SIGINT" if isinstance(exc, KeyboardInterrupt) else str(exc)
        sys.stderr.write(f"simdist run: got {name}; stopping every rank\n")
        _stop_all(procs, opts.shutdown_timeout)
        status, stopped = (130 if name == "SIGINT" else 128 + int(getattr(signal, name, 15))), True
        opts.stopped_by_signal = True
    finally:
        if not stopped:  # nothing outlives the launcher, whatever happened above
            _stop_all(procs, opts.shutdown_timeout)
        for threads in pumps:
            for t in threads:
                t.join(5)
        for f in files:
            f.close()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        if server is not None:
            server.close()
    return status


def _serves_store(opts: argparse.Namespace) -> bool:
    """Whether this launcher serves simdist's store: on node 0 of a job whose ranks meet there."""
    return (opts.backend or "socket") in STORE_BACKENDS and opts.node_rank == 0


def _serve_store(opts: argparse.Namespace, port: int, secret: str) -> Any:
    """simdist's store of the job, served by this launcher (node 0 of a socket or nccl job), or ``None``.

    Served here rather than by rank 0, it outlives the ranks: the first failure of the job can be
    read after the rank that failed, and the others, are gone.
    """
    if not _serves_store(opts):
        return None
    from simdist.backends.socket import StoreServer, is_loopback

    return StoreServer("127.0.0.1" if is_loopback(opts.master_addr) else "0.0.0.0", port, secret)


def _supervise(
    procs: list[subprocess.Popen],
    pumps: list[list[threading.Thread]],
    exits: Queue[tuple[int, int]],
    base: int,
    lock: threading.Lock,
    store: tuple[str, int, str, int] | None = None,
    watch: Any = None,
    grace: float = GRACE_SECONDS,
) -> tuple[int, bool]:
    """Wait for the ranks in the order they exit; at the first failure, stop the rest.

    ``store``: ``(host, port, secret, world size)`` of a socket job's store, where the failure is
    recorded for the other ranks (a rank killed records nothing itself) and the first failure of
    the job is read (or, once the store is gone, what ``watch``, a ``FirstFailure``, saw): a rank
    that failed only because another did is not the one reported.
    Returns the exit status and whether the ranks were stopped already.
    """
    left = len(procs)
    while left:
        try:
            local, code = exits.get(timeout=0.5)  # a timeout keeps SIGINT and SIGTERM deliverable
        except Empty:
            continue
        left -= 1
        if code == 0:
            continue
        for t in pumps[local]:  # the failed rank's last words come before the verdict
            t.join(1)
        first = None
        if store is not None:
            from simdist.backends.socket import launcher_saw

            first = launcher_saw(*store, base + local, _describe(code)) or watch.text
        others = [i for i, p in enumerate(procs) if p.poll() is None]
        with lock:
            sys.stderr.write(
                f"simdist run: rank {base + local} (local rank {local}, pid {procs[local].pid}) "
                f"{_describe(code)}; stopping {len(others)} other rank(s)\n"
            )
            if first is not None:
                sys.stderr.write(f"simdist run: the job's first failure: {first}\n")
            sys.stderr.flush()
        stopped = _stop_all(procs, grace)
        if stopped:
            with lock:
                sys.stderr.write(f"simdist run: stopped rank(s) {', '.join(str(base + i) for i in stopped)}\n")
        return _status(code), True
    return 0, False


# --- sim backend: every rank a simulated thread in this process ---------------------------------


def _spawn_line(path: str) -> int | None:
    """The line of the script's first start of ranks of its own, read, not run; ``None`` when there is none.

    A start is a call of torch.multiprocessing's ``spawn`` or ``start_processes``, or of a
    ``Process`` of ``multiprocessing`` or ``torch.multiprocessing`` (a context's too), through the
    usual imports: ``import torch.multiprocessing as mp`` then ``mp.spawn``/``mp.Process``,
    ``torch.multiprocessing.spawn``, ``from torch import multiprocessing``, ``from
    torch.multiprocessing import spawn``, ``import multiprocessing``, ``from multiprocessing import
    Process``, ``mp.get_context("spawn").Process``. ``None`` too when the file does not parse.
    """
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    modules: dict[str, tuple[str, ...]] = {}  # a name bound to a module of processes -> the starters it has
    functions: set[str] = set()
    torches: set[str] = set()
    contexts: set[str] = set()  # names bound to mp.get_context(...)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in _STARTERS and (alias.asname or "." not in alias.name):
                    modules[alias.asname or alias.name] = _STARTERS[alias.name]
                elif alias.name == "torch" or (alias.name.startswith("torch.") and not alias.asname):
                    torches.add(alias.asname or "torch")
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                if node.module == "torch" and alias.name == "multiprocessing":
                    modules[alias.asname or alias.name] = _STARTERS["torch.multiprocessing"]
                elif node.module in _STARTERS and alias.name in _STARTERS[node.module]:
                    functions.add(alias.asname or alias.name)
                elif node.module == "torch.multiprocessing.spawn" and alias.name in SPAWNS:
                    functions.add(alias.asname or alias.name)
        elif isinstance(node, ast.Assign) and _is_get_context(node.value, modules):
            contexts.update(t.id for t in node.targets if isinstance(t, ast.Name))
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in functions:
            lines.append(node.lineno)
        elif isinstance(func, ast.Attribute):
            owner = func.value
            if isinstance(owner, ast.Name) and func.attr in modules.get(owner.id, ()):
                lines.append(node.lineno)
            elif func.attr == "Process" and (
                (isinstance(owner, ast.Name) and owner.id in contexts) or _is_get_context(owner, modules)
            ):
                lines.append(node.lineno)
            elif (
                func.attr in _STARTERS["torch.multiprocessing"]
                and isinstance(owner, ast.Attribute)
                and owner.attr == "multiprocessing"
                and isinstance(owner.value, ast.Name)
                and owner.value.id in torches
            ):
                lines.append(node.lineno)
    return min(lines) if lines else None


_STARTERS = {"torch.multiprocessing": (*SPAWNS, "Process"), "multiprocessing": ("Process",)}
"""The modules whose functions (or classes) start a script's own ranks, and their names."""


def _is_get_context(node: ast.AST, modules: dict[str, tuple[str, ...]]) -> bool:
    """Whether ``node`` is ``mp.get_context(...)`` for a module of processes ``mp``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get_context"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in modules
    )


@contextlib.contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``extra`` added inside the block, and as it was before the block afterwards."""
    before = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        for key in [k for k in os.environ if k not in before]:
            del os.environ[key]
        os.environ.update(before)


def _reimports(fn: Any, start_method: str) -> bool:
    """Whether ranks of a spawn import the script again: torch's 'spawn'/'forkserver', for a function of the script."""
    if start_method == "fork" or getattr(fn, "__module__", None) != "__main__":
        return False
    if "<" in getattr(fn, "__qualname__", "<"):  # a lambda, or a function defined in a function
        raise ValueError(
            f"simdist: torch.multiprocessing.spawn got {fn!r}, which torch's '{start_method}' start method cannot "
            "send to a child process (it is pickled by name): define it at module level, or use "
            "start_method='fork' with torch.multiprocessing.start_processes"
        )
    return True


def _as(options: dict[str, Any], processes: bool) -> dict[str, Any]:
    """``options`` of a simulation whose ranks are processes (``processes``) or threads of this one."""
    return {**options, "isolation": "processes" if processes else "threads"}


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


def _run_sim(opts: argparse.Namespace) -> int:
    import torch

    from simdist import torch_bridge
    from simdist.core import DistError, RankError, RankExitError

    from ._launch import spawn
    from simdist.core._callsite import format_user_exception

    n, world = opts.nproc_per_node, opts.nproc_per_node * opts.nnodes
    script = _module_spec(opts.script).origin if opts.module else os.path.abspath(opts.script)
    as_parent = opts.launch == "spawn" or (opts.launch == "auto" and _spawn_line(script) is not None)
    if as_parent and opts.nnodes > 1:
        sys.stderr.write(
            f"simdist run: {opts.script} starts its own ranks with torch.multiprocessing.spawn, so it runs once, "
            f"as the parent on one node; --nnodes={opts.nnodes} is not supported for it. Use --nnodes 1 (the node's "
            "GPUs are --nproc-per-node), or --launch torchrun to run the script on every rank\n"
        )
        return 2
    if opts.cuda_as_cpu is None:
        cuda_as_cpu = not torch.cuda.is_available() or _too_few_gpus(n)
    else:
        cuda_as_cpu = opts.cuda_as_cpu
    processes = opts.isolation == "processes"
    options: dict[str, Any] = {"prefix_output": not opts.no_prefix, "cuda_as_cpu": cuda_as_cpu, "gpus_per_node": n}
    options["isolation"] = opts.isolation
    if opts.timeout is not None:
        options["timeout"] = opts.timeout
    master = (opts.master_addr, opts.master_port or DEFAULT_PORT)

    # A spawn of the parent, and its multiprocessing.Process ranks: each rank imports the script again for a
    # function of it (torch's 'spawn' start method). A rank process already has: its template ran the script
    # as __mp_main__ to unpickle the function, as a child of the 'spawn' start method does.
    # The 'fork' start method gives the ranks the parent's memory (its globals, closures): they run as threads
    # of the parent, whatever --isolation says.
    def start_ranks(fn: Any, args: Any, nprocs: int, start_method: str) -> None:
        own = processes and start_method != "fork"
        main = script if _reimports(fn, start_method) and not own else None
        spawn(_scripts.spawned, args=(main, fn, *args), nprocs=nprocs, backend="sim", **_as(options, own))

    def run_processes(calls: list, start_method: str) -> None:
        own = processes and start_method != "fork"
        mains = [script if _reimports(target, start_method) and not own else None for target, _, _ in calls]
        spawn(_scripts.started, args=(mains, calls), nprocs=len(calls), backend="sim", **_as(options, own))

    # runpy swaps sys.modules["__main__"] and sys.argv[0] in and out; with ranks interleaved
    # the swaps do not nest, so the launcher's own values are put back here.
    saved = (sys.argv, sys.modules.get("__main__"), list(sys.path))
    sys.argv = [script, *opts.script_args]
    sys.path.insert(0, os.getcwd() if opts.module else os.path.dirname(script))
    target = opts.script if opts.module else script
    try:
        with _environment({**_launch_env(opts), **_elastic_env(opts)}):
            if not as_parent:
                ranks_args = (target, n, world, master, opts.module)
                spawn(_scripts.script_rank, args=ranks_args, nprocs=world, backend="sim", **options)
            else:
                gpus = torch_bridge.cuda.simulated_gpus(n) if cuda_as_cpu else contextlib.nullcontext()
                with gpus, torch_bridge.spawn.starting_ranks(start_ranks, run_processes):
                    _scripts.run_main(target, opts.module, "__main__")
        return 0
    except RankError as err:
        cause = err.__cause__
        if err.exitcode is not None or isinstance(cause, RankExitError):  # a rank's process ended (os._exit, a signal)
            sys.stderr.write(f"simdist run: {err}\n")
            return 1 if err.exitcode is None else (_status(err.exitcode) or 1)
        if isinstance(cause, SystemExit):
            code = cause.code if isinstance(cause.code, int) else 1
            sys.stderr.write(f"simdist run: rank {err.rank} exited with status {code}\n")
            if not isinstance(cause.code, int):
                sys.stderr.write(f"{cause.code}\n")
            return min(code, 255) or 1
        if cause is not None:
            sys.stderr.write(getattr(cause, "rank_traceback", None) or format_user_exception(cause))
        sys.stderr.write(f"simdist run: {err}\n")
        return 1
    except DistError as err:  # DeadlockError, CollectiveMismatchError, DistTimeoutError: their reports
        sys.stderr.write(f"simdist run: {type(err).__name__}: {err}\n")
        return 1
    except SystemExit as exc:  # the parent of a spawn-style script exited
        if isinstance(exc.code, int) or exc.code is None:
            return min(exc.code or 0, 255)
        sys.stderr.write(f"{exc.code}\n")
        return 1
    except Exception as exc:  # noqa: BLE001 - the parent of a spawn-style script failed: report it as python does
        sys.stderr.write("".join(traceback.format_exception(exc)))
        sys.stderr.write(f"simdist run: {opts.script} raised {type(exc).__name__}: {exc}\n")
        return 1
    finally:
        sys.argv, main_module, sys.path[:] = saved
        if main_module is not None:
            sys.modules["__main__"] = main_module
        sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
