"""torchrun's flags as ``simdist run`` reads them: their values, their environment, and what each one does here.

:data:`FLAGS` names every flag of torchrun (torch 2.11-2.15) and what ``simdist run`` does with
it; a test compares it with ``torchrun --help`` on the installed torch. The parsers below turn
torchrun's value forms (``--nproc-per-node auto``, ``--nnodes 1:2``, ``--redirects 0:1,1:2``) into
plain values, raising ``ValueError`` with the flag, the value and what was expected.
"""

from __future__ import annotations

import os
import signal
import uuid

__all__ = [
    "FLAGS",
    "REFUSED",
    "RDZV_BACKENDS",
    "nproc_per_node",
    "nnodes",
    "streams",
    "rank_filter",
    "rdzv",
    "signal_names",
    "elastic_env",
    "new_run_id",
]

FLAGS: dict[str, str] = {
    "--nnodes": "nodes of the job; MIN:MAX with MIN == MAX is that number, a range (elastic membership) is refused",
    "--nproc-per-node": "ranks per node: N, or auto/cpu/gpu/xpu as torchrun counts them",
    "--rdzv-backend": "static or c10d: both meet at --rdzv-endpoint (or --master-addr/--master-port); etcd refused",
    "--rdzv-endpoint": "HOST[:PORT]: the job's MASTER_ADDR and MASTER_PORT, where rank 0's TCPStore listens",
    "--rdzv-id": "the job's id, TORCHELASTIC_RUN_ID in every rank (default: a new one)",
    "--rdzv-conf": "checked as KEY=VALUE pairs; the agent timeouts they set have no counterpart (no agent)",
    "--standalone": "one node, on 127.0.0.1 and a free port (the default on one node); refused with --nnodes > 1",
    "--max-restarts": "restarts of the whole job from the script's start after a failure (TORCHELASTIC_RESTART_COUNT)",
    "--monitor-interval": "accepted; the launcher is told of each rank's exit at once, so it has nothing to poll",
    "--start-method": "accepted; each rank is a fresh process (or a simulated one) whatever the method",
    "--event-log-handler": "accepted; simdist run emits no torchelastic events",
    "--role": "ROLE_NAME of every rank (default 'default')",
    "--module": "run the script as a module, as python -m does (-m)",
    "--no-python": "run the script as an executable, not with python (process backends; refused on --backend sim)",
    "--run-path": "accepted: every rank runs the script with runpy.run_path already",
    "--log-dir": "each rank's output to DIR/rank_R.log (with --redirects/--tee: DIR/rank_R.stdout.log, .stderr.log)",
    "--redirects": "streams (0 none, 1 stdout, 2 stderr, 3 both; or LOCAL:STREAMS,...) into --log-dir's files only",
    "--tee": "streams (as --redirects) into --log-dir's files and to the console",
    "--local-ranks-filter": "the local ranks whose output the console shows (files get every rank's)",
    "--duplicate-stdout-filters": "refused: " + "copying matching lines to a second file is not supported; use --tee",
    "--duplicate-stderr-filters": "refused: " + "copying matching lines to a second file is not supported; use --tee",
    "--node-rank": "this node's index; its ranks are K*N .. K*N+N-1",
    "--master-addr": "node 0's address: MASTER_ADDR",
    "--master-port": "MASTER_PORT: where rank 0's torch TCPStore listens",
    "--local-addr": "accepted; ranks connect from the address the system picks",
    "--logs-specs": "refused: torchrun's log-spec plugins are torchelastic entry points; use --log-dir",
    "--numa-binding": "refused: simdist run does not bind ranks to NUMA nodes",
    "--signals-to-handle": "the signals that stop every rank (TORCHELASTIC_SIGNALS_TO_HANDLE)",
    "--shutdown-timeout": "seconds ranks get between SIGTERM and SIGKILL when the job stops",
    "--virtual-local-rank": "LOCAL_RANK 0 in every rank and CUDA_VISIBLE_DEVICES its own GPU (process backends)",
}
"""Every flag of torchrun, and what ``simdist run`` does with it."""

REFUSED = {flag: text.removeprefix("refused: ") for flag, text in FLAGS.items() if text.startswith("refused: ")}
"""The flags ``simdist run`` accepts only to refuse with a reason."""

RDZV_BACKENDS = ("static", "c10d")
DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


def nproc_per_node(value: str) -> int:
    """``--nproc-per-node``'s ranks: an integer >= 1, or ``auto``/``cpu``/``gpu``/``xpu`` counted as torchrun does.

    ``auto`` is the GPUs where CUDA (or XPU) is available, else the CPUs; ``gpu`` and ``xpu`` fail
    where there are none.
    """
    text = value.strip().lower()
    if text.isdigit() or (text.startswith("-") and text[1:].isdigit()):
        n = int(text)
        if n < 1:
            raise ValueError(f"--nproc-per-node={value}: expected at least 1")
        return n
    if text not in ("auto", "cpu", "gpu", "xpu"):
        raise ValueError(f"--nproc-per-node={value!r}: expected a number or one of auto, cpu, gpu, xpu")
    if text == "cpu":
        return os.cpu_count() or 1
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    xpus = torch.xpu.device_count() if hasattr(torch, "xpu") and torch.xpu.is_available() else 0
    if text == "auto":
        return gpus or xpus or os.cpu_count() or 1
    count = gpus if text == "gpu" else xpus
    if not count:
        raise ValueError(
            f"--nproc-per-node={text}: this machine has no {'CUDA GPU' if text == 'gpu' else 'XPU'}; give the number "
            "of ranks (with --backend sim they get simulated GPUs)"
        )
    return count


def nnodes(value: str) -> int:
    """``--nnodes``'s node count: ``M``, or ``MIN:MAX`` where ``MIN == MAX`` (a range needs elastic membership)."""
    low, sep, high = value.partition(":")
    try:
        lo, hi = int(low), int(high) if sep else int(low)
    except ValueError:
        raise ValueError(f"--nnodes={value!r}: expected a number of nodes, or MIN:MAX") from None
    if lo < 1 or hi < lo:
        raise ValueError(f"--nnodes={value}: expected 1 <= MIN <= MAX")
    if lo != hi:
        raise ValueError(
            f"--nnodes={value}: a range of nodes needs elastic membership (nodes joining and leaving a running job), "
            f"which simdist run does not do; give a fixed number, e.g. --nnodes {hi}"
        )
    return lo


def streams(flag: str, value: str | None, local_ranks: int) -> list[set[str]]:
    """Per local rank, the streams ``--redirects``/``--tee`` name: ``"3"`` for all, or ``"0:1,1:2"`` per local rank."""
    if value is None:
        return [set() for _ in range(local_ranks)]
    names = {0: set(), 1: {"stdout"}, 2: {"stderr"}, 3: {"stdout", "stderr"}}

    def one(text: str) -> set[str]:
        if not text.strip().isdigit() or int(text) not in names:
            raise ValueError(f"{flag}={value!r}: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both)")
        return set(names[int(text)])

    if ":" not in value:
        return [one(value) for _ in range(local_ranks)]
    out: list[set[str]] = [set() for _ in range(local_ranks)]
    for part in value.split(","):
        rank, _, kinds = part.partition(":")
        if not rank.strip().isdigit() or not 0 <= int(rank) < local_ranks:
            raise ValueError(f"{flag}={value!r}: {rank!r} is not a local rank in 0..{local_ranks - 1}")
        out[int(rank)] = one(kinds)
    return out


def rank_filter(value: str | None, local_ranks: int) -> set[int]:
    """The local ranks ``--local-ranks-filter`` keeps on the console (every rank without it)."""
    if value is None or not value.strip():
        return set(range(local_ranks))
    kept = set()
    for part in value.split(","):
        if not part.strip().isdigit() or not 0 <= int(part) < local_ranks:
            raise ValueError(f"--local-ranks-filter={value!r}: {part!r} is not a local rank in 0..{local_ranks - 1}")
        kept.add(int(part))
    return kept


def signal_names(value: str) -> list[signal.Signals]:
    """The signals ``--signals-to-handle`` names (``SIGTERM,SIGHUP``)."""
    out = []
    for name in value.split(","):
        name = name.strip().upper()
        try:
            out.append(signal.Signals[name])
        except KeyError:
            raise ValueError(f"--signals-to-handle={value!r}: {name!r} is not a signal name (e.g. SIGTERM)") from None
    return out


def rdzv(backend: str | None, endpoint: str | None, conf: str | None) -> tuple[str, int | None] | None:
    """``(host, port)`` of ``--rdzv-endpoint`` (``None`` without one), the backend and conf checked."""
    if backend is not None and backend not in RDZV_BACKENDS:
        raise ValueError(
            f"--rdzv-backend={backend!r}: expected one of {', '.join(RDZV_BACKENDS)} (an etcd rendezvous needs an etcd "
            "server and elastic membership, which simdist run does not use)"
        )
    for pair in (conf or "").split(","):
        if pair.strip() and "=" not in pair:
            raise ValueError(f"--rdzv-conf={conf!r}: {pair!r} is not KEY=VALUE")
    if not endpoint:
        return None
    host, sep, port = endpoint.rpartition(":")
    if not sep or host.endswith(":") and not host.startswith("["):  # no port (an IPv6 address alone)
        return endpoint.strip("[]"), None
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--rdzv-endpoint={endpoint!r}: expected HOST or HOST:PORT")
    return host.strip("[]"), int(port)


def new_run_id() -> str:
    return str(uuid.uuid4())


def elastic_env(run_id: str, role: str, restart: int, max_restarts: int, nnodes: int, signals: str) -> dict[str, str]:
    """The variables torchrun's agent gives every rank beside the ranks' own (so ``is_torchelastic_launched()``).

    TORCHELASTIC_USE_AGENT_STORE is ``False``: no agent serves a store, so rank 0's
    ``init_process_group`` serves MASTER_PORT's TCPStore, as without torchrun.
    """
    return {
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": str(restart),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": signals,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "ROLE_NAME": role,
        "GROUP_WORLD_SIZE": str(nnodes),
    }
