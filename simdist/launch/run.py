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
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from queue import Empty, Queue
from typing import IO, Any

from . import _sim_run, _torchrun

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


RUN_DESCRIPTION = (
    "Run a script on several ranks, like torchrun: as real processes joined by simdist's socket backend, or as "
    "simulated ranks (--backend sim), one schedule chosen by --seed or replayed by --replay."
)
RUN_EXAMPLES = (
    "Like torchrun, when OMP_NUM_THREADS is unset and N > 1, the ranks get OMP_NUM_THREADS=1.\n\n"
    "examples:\n"
    "  simdist run --standalone --nproc-per-node 4 train.py --epochs 3   # 4 processes, as torchrun\n"
    "  simdist run --nproc-per-node 4 --backend sim train.py             # the same script, simulated\n"
    "  simdist run --nproc-per-node 4 --backend sim --seed 7 --trace run.json train.py\n"
    "  simdist run --nproc-per-node 4 --backend sim --replay 'choices:0,2@world=4@script=train.py' train.py\n"
    "  simdist run --nproc-per-node 2 --backend socket -m mypkg.train    # a module, collectives checked"
)
TEST_DESCRIPTION = (
    "Explore a script's schedules on simulated ranks, as simdist.testing.explore does for functions: run it under "
    "up to --schedules schedules, each in a fresh copy of the working directory; on the first failure (an exception "
    "or exit status other than 0 in a rank, a deadlock, a collective mismatch, a buffer race, a timeout, or --check "
    "failing) shrink the schedule, print the report and the command that replays it, and exit 1; else exit 0. "
    "It takes torchrun's flags, as simdist run --backend sim does."
)
TEST_EXAMPLES = (
    "examples:\n"
    "  simdist test --nproc-per-node 4 train.py                          # 100 schedules (PCT), ranks as processes\n"
    "  simdist test --nproc-per-node 4 --schedules 500 --isolation threads train.py --steps 2\n"
    "  simdist test --nproc-per-node 2 --strategy exhaustive --check 'python verify.py' train.py"
)


class _Stop(Exception):
    """The launcher itself was asked to stop (SIGTERM or SIGHUP)."""


def _parser(prog: str = "simdist run") -> argparse.ArgumentParser:
    test = prog == "simdist test"
    p = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s [options] script [script args...]",
        description=TEST_DESCRIPTION if test else RUN_DESCRIPTION,
        epilog=TEST_EXAMPLES if test else RUN_EXAMPLES,
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
        default=None,
        help="sim: each simulated rank a process of its own (default, where the system has pidfd, as Linux does: "
        "its own modules, atexit, sys.argv, signal handlers and crashes, as under torchrun; forked from a server "
        "that imported torch once) or a thread of this process (faster; module state is shared between ranks). "
        "The same seed gives the same run in both",
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
    _schedule_flags(p, test=test)
    _torchrun_flags(p)
    if test:  # taken (a process backend's, refused), not shown: simdist test runs on simulated ranks only
        for action in p._actions:
            if action.dest in PROCESS_ONLY:
                action.help = argparse.SUPPRESS
    p.add_argument("script", nargs="?", help="the Python script to run (by every rank, or once: see --launch)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script (sys.argv[1:])")
    return p


def _schedule_flags(p: argparse.ArgumentParser, test: bool) -> None:
    """The simulator's flags: how a run is scheduled (``simdist run --backend sim``) or explored (``simdist test``),
    its level of detail and network, and its trace."""
    g = p.add_argument_group("the simulator (--backend sim)" if not test else "the schedules")
    if test:
        g.add_argument("--schedules", type=_positive, default=100, metavar="N",
                       help="the most schedules to run (default 100)")  # fmt: skip
        g.add_argument("--strategy", choices=("pct", "random", "exhaustive"), default="pct",
                       help="pct (default): priority change points, which find bugs that need a few ill-timed "
                       "preemptions; random; exhaustive: every schedule, fewest preemptions first")  # fmt: skip
        g.add_argument("--seed", type=_seed, default=None, metavar="S",
                       help="the exploration's seed (default 0): another seed, other schedules")  # fmt: skip
        g.add_argument("--check", default=None, metavar="CMD",
                       help="a shell command run after each job in the job's working directory: a run whose "
                       "command exits non-zero fails (for instance, a check of the checkpoints it wrote)")  # fmt: skip
        g.add_argument("--workdir", default=None, metavar="DIR",
                       help="the folder each run starts in a fresh copy of (default: the current directory); "
                       "what a run writes there is never seen by the next")  # fmt: skip
        return
    g.add_argument("--seed", type=_seed, default=None, metavar="N",
                   help="the seed of the scheduler's choices (default 0): another seed, another interleaving")  # fmt: skip
    g.add_argument("--strategy", choices=("random", "pct", "round_robin"), default=None,
                   help="how the scheduler chooses the next rank: seeded at random (default), PCT (priority change "
                   "points), or in turn")  # fmt: skip
    g.add_argument("--replay", default=None, metavar="TOKEN",
                   help="replay the run of a replay token (printed after every run and by simdist test): the same "
                   "output, failure and trace")  # fmt: skip
    g.add_argument("--trace", default=None, metavar="FILE",
                   help="write the run's trace to FILE, in simdist's JSON (the app's Traces page opens it, "
                   "simdist.Trace.load reads it); a script that starts ranks twice writes FILE's second as NAME.2.json")  # fmt: skip
    g.add_argument("--trace-format", "--trace_format", choices=("simdist", "perfetto"), default="simdist",
                   help="--trace's format: simdist's JSON (default) or the Chrome/Perfetto JSON (ui.perfetto.dev)")  # fmt: skip
    g.add_argument("--detail", choices=("messages", "collectives"), default=None,
                   help="messages (default): each collective's algorithm message by message; collectives: a "
                   "collective in one step once every member has arrived, charged its algorithm's cost")  # fmt: skip
    g.add_argument("--topology", default=None, metavar="FILE",
                   help="the network of the virtual clock: a topology file (simdist calibrate writes one) or a "
                   "name of simdist.TOPOLOGIES (default: 'switch')")  # fmt: skip


def _positive(text: str) -> int:
    """A number of schedules: a whole number of at least 1 (argparse reports the error as usage)."""
    if not text.strip().isdecimal() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of schedules; expected a whole number >= 1")
    return int(text)


def _seed(text: str) -> int:
    """A seed: a whole number of at least 0 (argparse reports the error as usage)."""
    if not text.strip().isdecimal():
        raise argparse.ArgumentTypeError(f"{text!r} is not a seed; expected a whole number >= 0")
    return int(text)


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
        from simdist.testing._script import module_file

        try:
            module_file(opts.script)
        except ValueError as exc:
            parser.error(str(exc))
    elif opts.no_python:
        if shutil.which(opts.script) is None:
            parser.error(f"--no-python: {opts.script!r} is not an executable file or a command on PATH")
    elif not os.path.isfile(opts.script):
        parser.error(f"script {opts.script!r} does not exist")
    if opts.backend == "sim":
        _check_sim(opts, parser)
        if opts.node_rank != 0:
            parser.error("--backend sim runs every node's ranks in this one process; leave --node-rank at 0")
        if opts.log_dir is not None:
            parser.error("--log-dir is supported with the process backends only, not --backend sim")
        if opts.virtual_local_rank:
            parser.error("--virtual-local-rank is supported with the process backends only (it sets "
                         "CUDA_VISIBLE_DEVICES per rank; simulated ranks see their node's simulated GPUs)")  # fmt: skip
    elif opts.launch == "spawn" or opts.cuda_as_cpu is not None or opts.isolation is not None or _sim_flag(opts):
        flag = {True: "--launch spawn", False: "--cuda-as-cpu"}[opts.launch == "spawn"]
        if opts.isolation is not None:
            flag = f"--isolation {opts.isolation}"
        flag = _sim_flag(opts) or flag
        parser.error(
            f"{flag} is supported with --backend sim only (a process backend runs the script on "
            "every rank, as torchrun does)"
        )


SIM_FLAGS = ("seed", "strategy", "replay", "trace", "detail", "topology")
PROCESS_ONLY = (
    "backend",
    "log_dir",
    "store_port",
    "no_python",
    "redirects",
    "tee",
    "local_ranks_filter",
    "virtual_local_rank",
)
"""The flags (by their ``opts`` name) that only process backends take: ``simdist test``'s help leaves them out."""
"""The flags (by their ``opts`` name) that only the simulator takes."""


def _sim_flag(opts: argparse.Namespace) -> str | None:
    """The first of the simulator's flags given (``--seed``, ...), or ``None``."""
    given = [name for name in SIM_FLAGS if getattr(opts, name, None) is not None]
    return f"--{given[0]}" if given else None


def _check_sim(opts: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Check the simulator's flags; decide the ranks' isolation (``opts.ranks_as``), saying so where processes cannot
    be had."""
    from simdist.testing._script import default_isolation

    opts.ranks_as = default_isolation(opts.isolation, lambda line: sys.stderr.write(line + "\n"))
    if opts.isolation == "processes" and not hasattr(os, "pidfd_open"):
        parser.error("--isolation processes needs Linux (pidfd); leave it out, or give --isolation threads")
    if parser.prog == "simdist test":
        if opts.workdir is not None and not os.path.isdir(opts.workdir):
            parser.error(f"--workdir {opts.workdir!r} is not a folder")
        return
    if opts.replay is not None:
        if opts.seed is not None or opts.strategy is not None:
            parser.error("--replay replays a recorded run; it cannot be combined with --seed or --strategy")
        _check_token(opts, parser)
    if opts.topology is not None:
        from simdist.core._topology import TOPOLOGIES

        if opts.topology not in TOPOLOGIES and not os.path.isfile(opts.topology):
            parser.error(f"--topology {opts.topology!r} is neither a topology file nor one of {', '.join(TOPOLOGIES)}")
    if opts.trace is not None and os.path.isdir(opts.trace):
        parser.error(f"--trace {opts.trace!r} is a folder; expected a file name to write the trace to")
    if opts.trace is None and opts.trace_format != "simdist":
        parser.error("--trace-format says the format of --trace FILE: give --trace FILE")


def _check_token(opts: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``--replay TOKEN``: a replay token of this script at this world size (else a usage error naming both)."""
    from simdist.backends.sim import make_strategy, split_token

    token = opts.replay
    try:
        parts = split_token(token)
        make_strategy(schedule=token)
    except ValueError:
        parser.error(
            f"--replay {token!r} is not a replay token; expected one that simdist run or simdist test printed, "
            "such as random:7@world=4@script=train.py or choices:0,1@world=4@script=train.py"
        )
    world = opts.nproc_per_node * opts.nnodes
    if parts.world is not None and parts.world != world:
        parser.error(
            f"--replay {token!r} was made for a job of {parts.world} ranks, and this one has {world} "
            f"(--nproc-per-node {opts.nproc_per_node}, --nnodes {opts.nnodes}): give --nproc-per-node "
            f"{parts.world // opts.nnodes if parts.world % opts.nnodes == 0 else parts.world}"
        )
    name = opts.script if opts.module else os.path.basename(opts.script)
    if parts.script is not None and parts.script != name:
        parser.error(f"--replay {token!r} was made for the script {parts.script!r}, not for {name!r}")


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
        return _sim_run.exit_status(code), True
    return 0, False


# --- sim backend: every rank a simulated rank, in this process or one process each -------------


def _run_sim(opts: argparse.Namespace) -> int:
    """One run of the script on simulated ranks (:func:`simdist.launch._sim_run.run`), with torchrun's environment."""
    return _sim_run.run(opts, {**_launch_env(opts), **_elastic_env(opts)})


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


if __name__ == "__main__":
    raise SystemExit(main())
