"""``SimOptions``: how a simulation runs, one frozen object for ``simulate``, ``simdist.testing.run`` and ``spawn``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._threads import RankPool

__all__ = ["SimOptions", "DETAILS", "ISOLATIONS", "STEPS_UP_TO"]

DETAILS = ("messages", "collectives")
ISOLATIONS = ("threads", "processes")
STEPS_UP_TO = 64
"""The largest world whose runs record step snapshots unless told (``record_steps=None``)."""


@dataclass(frozen=True)
class SimOptions:
    """How a simulation runs: every option of :func:`simdist.simulate`, checked once, when made.

    ``simulate``, :func:`simdist.testing.run` and ``simdist.spawn(backend="sim")`` take one (``options=``) and
    each field as a keyword of its own (a keyword wins over the object's field). A bad value raises at once,
    naming the field, the value and what was expected.

    Attributes:
        seed: the seed of the strategy (default 0): another seed, another interleaving.
        strategy: ``'random'`` (default), ``'round_robin'``, ``'pct'`` or a ``Strategy``.
        schedule: a replay token (``SimResult.schedule`` or an error's ``.schedule``) or a
            list of scheduler choices: replays that run exactly. A token that records its
            world size (``@world=N``) replays only at that size.
        detail: ``'messages'`` runs each collective's algorithm message by message;
            ``'collectives'`` completes each collective in one step once every member has
            arrived, charging the algorithm's alpha-beta cost (for thousands of ranks).
        topology: ``None`` (``'switch'``), a name from ``simdist.TOPOLOGIES``, a networkx graph, a Topology,
            or a topology file (a ``.json`` path, as ``simdist calibrate`` writes). Besides links' latency
            and bandwidth a Topology may charge reductions (``gamma``), bandwidth shared by a rank or a
            host, page faults of new buffers (``fresh_memory`` from ``fresh_from`` bytes), copies that
            stage list arguments (``memcpy``) and a fixed start of every collective (``call_overhead``,
            ``check_overhead`` per round of the socket backend's cross-rank check); all off by default
            (formulas in :mod:`simdist.core._topology`).
        eager_limit: sends of at most this many bytes complete at once (buffered); larger
            ones wait for their receive, as on real transports. 0: every send waits.
        timeout: real seconds after which a run that does not finish raises ``DistTimeoutError``
            once its rank threads are stopped (as after Ctrl-C while waiting here); a rank stuck in C
            code is named in the error and no longer holds up other simulations of the process.
        record_steps: record the leading values of each algorithm step's buffer in the trace
            (``'step'``/``'received'`` events, which the visualizer's step views show). Default
            ``None``: at worlds up to ``STEPS_UP_TO`` (64) ranks; a collective at message detail
            makes about two per message, so at thousands of ranks they would cost more than the
            messages. ``True`` records them at any size.
        prefix_output: prefix each line a rank prints with ``[rank N]``.
        cpu_time: add each rank's measured CPU time to its virtual clock (not deterministic).
        cuda_as_cpu: give each rank simulated GPUs backed by the CPU: ``torch.cuda`` answers for them
            and tensors moved to them stay on the CPU (default: when CUDA is unavailable, or when the
            calling thread's GPUs are simulated, as in a script's parent under simdist run). What is
            mapped is listed in docs/gpu-scripts.md.
        gpus_per_node: how many simulated GPUs each rank sees (``torch.cuda.device_count()``);
            default the world size, one node holding every rank.
        leaks: ``'warn'`` (a ``LeakWarning``), ``'error'`` or ``'ignore'`` for what the run leaves behind.
        algorithms: the default algorithm per collective (``{"all_reduce": "ring"}``) for
            every group of the run; a call's ``algorithm=`` still wins.
        pin_cpu: run the rank threads on one CPU core (only one runs at a time, and
            hand-offs within a core are several times faster than across cores).
        test: the pytest node id of the test this run belongs to (``simdist.testing`` passes
            it): the replay token records it (``@test=...``), and ``pytest --simdist-replay``
            refuses the token in any other test.
        check_buffers: raise ``BufferRaceError`` when a rank writes to the buffer of its own
            ``isend``/``irecv`` (also in ``batch_isend_irecv`` and through torch) before the
            operation completed, under every schedule. It copies each such buffer when the
            operation is posted (see BENCHMARKS.md (l) for the cost); ``simdist.testing`` turns it on.
        pool: a ``RankPool`` whose threads run the ranks, parked between runs (``simdist.testing``
            passes one per exploration: no thread is started per run); default: a new thread per
            rank, ended before the run returns. A run on a pooled thread starts as on a new thread
            (generators, environment, world, grad mode), except for the user's own thread-local data.
        trace_file: a path: write the trace there as the run goes (simdist JSON, as ``Trace.to_json``,
            finished also when the run fails), keeping in memory only events that may still change;
            ``SimResult.trace`` then reads the file when its events are asked for. For long runs at
            thousands of ranks.
        isolation: ``'threads'`` (default): every rank a thread of this process, with its generators,
            ``os.environ`` and stdout kept apart by simdist. ``'processes'``: every rank a process of its own
            (forked from a server that imported torch once), with its own modules, ``atexit``, ``sys.argv``,
            signal handlers and crashes, as under torchrun; ``fn`` and ``args`` are pickled to it (``fn``
            defined at module level, as for multiprocessing's spawn). The same arguments give the same
            values, trace and replay token in both modes. Linux only.
        script: the file name of the script this run is of (``simdist run`` and ``simdist.testing``'s script
            functions pass it): the replay token records it (``@script=...``), and a token that names a
            script replays only a run of that script.
        capture_output: keep what each rank writes to ``sys.stdout`` and ``sys.stderr`` in
            ``SimResult.output`` instead of printing it (what C code writes to the file descriptors
            themselves is printed as usual).

    Example:
        >>> import simdist
        >>> opts = simdist.SimOptions(detail="collectives", topology="ring")
        >>> opts.detail, simdist.SimOptions.of(opts, {"seed": 3}).seed
        ('collectives', 3)
    """

    seed: int | None = None
    strategy: Any = None
    schedule: Any = None
    detail: str = "messages"
    topology: Any = None
    eager_limit: int = 0
    timeout: float | None = None
    record_steps: bool | None = None
    prefix_output: bool = False
    cpu_time: bool = False
    cuda_as_cpu: bool | None = None
    gpus_per_node: int | None = None
    leaks: str = "warn"
    algorithms: Mapping[str, str] | None = None
    pin_cpu: bool = True
    test: str | None = None
    check_buffers: bool = False
    pool: RankPool | None = None
    trace_file: Any = None
    isolation: str = "threads"
    script: str | None = None
    capture_output: bool = False

    def __post_init__(self) -> None:
        if self.detail not in DETAILS:
            raise ValueError(f"detail={self.detail!r} is not a level of detail; expected one of {DETAILS}")
        if isinstance(self.eager_limit, bool) or not isinstance(self.eager_limit, int):
            raise TypeError(f"eager_limit={self.eager_limit!r} must be an int number of bytes")
        if self.eager_limit < 0:
            raise ValueError(f"eager_limit={self.eager_limit!r} must be a non-negative number of bytes")
        if self.leaks not in ("warn", "error", "ignore"):
            raise ValueError(f"leaks={self.leaks!r} must be 'warn', 'error' or 'ignore'")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"timeout={self.timeout!r} must be a positive number of seconds or None")
        gpus = self.gpus_per_node
        if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
            raise ValueError(f"gpus_per_node={gpus!r} must be a positive int (the GPUs each rank sees) or None")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"isolation={self.isolation!r} is not a kind of rank; expected one of {ISOLATIONS}")
        if self.test is not None and (not isinstance(self.test, str) or not self.test):
            raise ValueError(f"test={self.test!r} must be a pytest node id (a non-empty str) or None")
        if self.script is not None and (not isinstance(self.script, str) or not self.script):
            raise ValueError(f"script={self.script!r} must be a script's file name (a non-empty str) or None")
        if not isinstance(self.capture_output, bool):
            raise TypeError(f"capture_output={self.capture_output!r} must be a bool")
        if not isinstance(self.check_buffers, bool):
            raise TypeError(f"check_buffers={self.check_buffers!r} must be a bool")
        if self.record_steps is not None and not isinstance(self.record_steps, bool):
            raise TypeError(
                f"record_steps={self.record_steps!r} must be True, False or None (on up to {STEPS_UP_TO} ranks)"
            )
        if self.pool is not None and not isinstance(self.pool, RankPool):
            raise TypeError(f"pool={self.pool!r} must be a simdist.backends.sim.RankPool or None")
        if self.algorithms is not None:
            from simdist import algorithms as registry

            if not isinstance(self.algorithms, Mapping):
                raise TypeError(
                    "algorithms must be a dict of collective name -> algorithm name, "
                    f"got {type(self.algorithms).__name__}"
                )
            for op, name in self.algorithms.items():
                registry.get(op, name)

    @classmethod
    def of(cls, options: SimOptions | None, fields: Mapping[str, Any]) -> SimOptions:
        """``options`` (default: every field's default) with the ``fields`` given as keywords in its place.

        Raises:
            TypeError: ``options`` is not a SimOptions, or a keyword names no option (the options are listed).
        """
        if options is not None and not isinstance(options, SimOptions):
            raise TypeError(f"options={options!r} must be a simdist.SimOptions or None")
        unknown = sorted(set(fields) - set(NAMES))
        if unknown:
            names = ", ".join(map(repr, unknown))
            raise TypeError(
                f"unexpected keyword argument {names}: not an option of the simulator; expected one of {NAMES}"
            )
        if options is None:
            return cls(**fields)
        return dataclasses.replace(options, **fields) if fields else options

    def fields(self) -> dict[str, Any]:
        """Every option by name (the values themselves, not copies)."""
        return {name: getattr(self, name) for name in NAMES}


NAMES = tuple(f.name for f in dataclasses.fields(SimOptions))
"""The names of the options, in their order."""
