"""Traces as files: loading several (one per rank of a real run), what a trace holds, its timeline figure.

A simulated run's trace counts *virtual* seconds and holds every message; a real run's
(the socket backend with ``SIMDIST_TRACE=DIR``) counts *real* seconds since rank 0
joined the job and holds each rank's collectives and point-to-point sends and receives,
not the messages inside its collectives.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from simdist.core._trace import Trace

from ._figures import timeline_figure
from ._graph import world_of
from ._timeline import timeline

__all__ = [
    "CallLine",
    "TraceSummary",
    "LoadedTraces",
    "call_lines",
    "trace_clock",
    "summarize",
    "load_traces",
    "trace_figure",
]


def trace_clock(trace: Trace) -> str:
    """``'real'`` for a trace of a real run (its metadata names a clock in real seconds, or a
    backend other than the simulator), else ``'virtual'`` (the simulator's).

    Args:
        trace: a ``simdist.Trace``.

    Returns:
        ``'real'`` or ``'virtual'``.

    Example:
        >>> from simdist.visualize import collective_run, trace_clock
        >>> trace_clock(collective_run("all_reduce", "ring", 4, 64).trace)
        'virtual'
    """
    meta = trace.meta
    if str(meta.get("clock", "")).startswith("real"):
        return "real"
    return "real" if meta.get("backend") not in (None, "sim") else "virtual"


@dataclass(frozen=True)
class TraceSummary:
    """What a trace holds.

    Attributes:
        clock: ``'virtual'`` (simulated seconds) or ``'real'`` (wall-clock seconds).
        ranks: the number of ranks.
        collectives: the collectives run (each counted once, however many ranks took part).
        messages: the messages recorded: on a simulated run every message (point-to-point and
            inside collectives); on a real run each point-to-point send (the messages inside
            its collectives are not recorded).
        duration: seconds from 0 to the last event's end.
    """

    clock: str
    ranks: int
    collectives: int
    messages: int
    duration: float

    def describe(self) -> str:
        """One short line for a title: the kind of run and what it holds."""
        run = "simulated run (virtual time)" if self.clock == "virtual" else "real run (wall-clock time)"
        counts = ", ".join(
            f"{n} {what}{'' if n == 1 else 's'}"
            for n, what in ((self.ranks, "rank"), (self.collectives, "collective"), (self.messages, "message"))
        )
        return f"{run}: {counts}"

    @property
    def note(self) -> str:
        """What the counts mean for this kind of run."""
        if self.clock == "virtual":
            return "Times are the simulator's virtual clock; messages count every message, collectives' included."
        return (
            "Times are real seconds since rank 0 joined, by each host's wall clock; messages count the "
            "point-to-point sends; the messages inside collectives are not recorded on real runs."
        )


def summarize(trace: Trace) -> TraceSummary:
    """The :class:`TraceSummary` of ``trace``.

    Args:
        trace: a ``simdist.Trace``.

    Returns:
        A ``TraceSummary`` (``clock``, ``ranks``, ``collectives``, ``messages``, ``duration``);
        ``describe()`` says it in words.

    Example:
        >>> from simdist.visualize import collective_run, summarize
        >>> summarize(collective_run("all_reduce", "ring", 4, 64).trace).describe()
        'simulated run (virtual time): 4 ranks, 1 collective, 24 messages'
    """
    clock = trace_clock(trace)
    colls = {(e.group, e.collective_id) for e in trace.events if e.kind == "collective"}
    if clock == "virtual":
        messages = sum(1 for e in trace.events if e.kind == "message")
    else:
        messages = sum(1 for e in trace.events if e.kind == "send")
    ranks = max(world_of(trace), int(trace.meta.get("world_size") or 0))
    return TraceSummary(clock, ranks, len(colls), messages, trace.duration())


@dataclass(frozen=True)
class CallLine:
    """One line of the program that communicated, as a trace saw it.

    Attributes:
        site: the file's name and line (``'train.py:12'``); ``call_site`` the full ``path:line``.
        ops: the operations called there (``'recv'``, ``'all_reduce'``, ...), sorted.
        ranks: the ranks that called them there, sorted.
        calls: how many calls (a collective counts once per rank).
        seconds: the time the calls took from start to end, summed over ranks (virtual or real, as the trace's).
    """

    site: str
    call_site: str
    ops: tuple[str, ...]
    ranks: tuple[int, ...]
    calls: int
    seconds: float


CALL_KINDS = ("collective", "send", "recv")
"""The kinds of events that are a rank's own calls (a message is the traffic of one)."""


def call_lines(trace: Trace) -> list[CallLine]:
    """The program's lines that called communication in ``trace``, the ones that took longest first.

    Each send, receive and collective a rank called is counted at its call site, the user's line
    (a script's own lines for ``simdist run --backend sim --trace``).

    Args:
        trace: a ``simdist.Trace``.

    Returns:
        One :class:`CallLine` per call site; calls without a site are left out.

    Example:
        >>> from simdist.visualize import call_lines, collective_run
        >>> line = call_lines(collective_run("all_reduce", "ring", 4, 64).trace)[0]
        >>> line.ops, line.ranks, line.calls
        (('all_reduce',), (0, 1, 2, 3), 4)
    """
    found: dict[str, dict[str, Any]] = {}
    for e in trace.events:
        if e.kind not in CALL_KINDS or not e.call_site:
            continue
        line = found.setdefault(e.call_site, {"ops": set(), "ranks": set(), "calls": 0, "seconds": 0.0})
        line["ops"].add(e.op)
        line["ranks"].add(e.rank)
        line["calls"] += 1
        line["seconds"] += max(e.t_end - e.t_start, 0.0)
    lines = [
        CallLine(_short(site), site, tuple(sorted(v["ops"])), tuple(sorted(v["ranks"])), v["calls"], v["seconds"])
        for site, v in found.items()
    ]
    return sorted(lines, key=lambda c: (-c.seconds, c.call_site))


def _short(call_site: str) -> str:
    """``'train.py:12'`` of ``'/any/folder/train.py:12'``."""
    path, _, line = call_site.rpartition(":")
    return f"{path.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line}"


@dataclass(frozen=True)
class LoadedTraces:
    """Uploaded files read as one trace: ``trace`` joins the good ones (``None`` if none was);
    ``problems`` holds ``(file name, why it was left out)`` for the others."""

    trace: Trace | None
    names: tuple[str, ...]
    problems: tuple[tuple[str, str], ...]


def _read(data: bytes | str) -> Trace:
    """One file's trace; ``ValueError`` saying why it is not one."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise ValueError(f"it is not text (UTF-8): {exc}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"it is not JSON: {exc}") from None
    if isinstance(raw, dict) and "traceEvents" in raw:
        raise ValueError("it is a Chrome/Perfetto trace (open it at ui.perfetto.dev); upload the simdist JSON")
    if not isinstance(raw, dict) or raw.get("format") != "simdist-trace-1":
        raise ValueError('it is JSON but not a simdist trace (no "format": "simdist-trace-1")')
    try:
        return Trace.from_json(text)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"its events do not match its fields: {type(exc).__name__}: {exc}") from None


def load_traces(files: Sequence[tuple[str, bytes | str]]) -> LoadedTraces:
    """The traces of ``files`` (``(name, content)`` pairs) joined by :meth:`Trace.merge`, and the files left out.

    A file is left out, with the reason, when it is not a simdist trace, when it records
    a rank another file already holds (the same file twice, or two runs), or when its clock
    differs from the first good file's (a simulated and a real run cannot share a timeline).

    Args:
        files: ``(file name, content)`` pairs; content as bytes or text (``Trace.to_json``).

    Returns:
        A ``LoadedTraces``: ``trace`` (``None`` if no file was good), ``names`` (the files
        joined), ``problems`` (``(file name, why it was left out)``).

    Example:
        >>> from simdist.visualize import collective_run, load_traces
        >>> text = collective_run("all_reduce", "ring", 4, 64).trace.to_json()
        >>> loaded = load_traces([("run.json", text), ("notes.txt", "hello")])
        >>> loaded.names, [name for name, why in loaded.problems]
        (('run.json',), ['notes.txt'])
    """
    good: list[tuple[str, Trace]] = []
    problems: list[tuple[str, str]] = []
    ranks: dict[int, str] = {}
    for name, data in files:
        try:
            trace = _read(data)
        except ValueError as exc:
            problems.append((name, str(exc)))
            continue
        if good and trace_clock(trace) != trace_clock(good[0][1]):
            why = (
                f"its clock is {trace_clock(trace)} but {good[0][0]}'s is {trace_clock(good[0][1])}: "
                "they are traces of different runs"
            )
            problems.append((name, why))
            continue
        mine = {e.rank for e in trace.events}
        twice = sorted(r for r in mine if r in ranks)
        if twice:
            problems.append((name, f"rank {twice[0]} is already in {ranks[twice[0]]}"))
            continue
        ranks.update(dict.fromkeys(mine, name))
        good.append((name, trace))
    merged = Trace.merge([t for _, t in good]) if good else None
    return LoadedTraces(merged, tuple(n for n, _ in good), tuple(problems))


def trace_figure(trace: Trace) -> Any:
    """The timeline figure of ``trace`` (:func:`timeline_figure`) titled by :meth:`TraceSummary.describe`,
    its axis saying which clock: virtual µs for a simulated run, real (wall-clock) ms for a real one.

    Args:
        trace: a ``simdist.Trace``, simulated or real.

    Returns:
        A ``plotly.graph_objects.Figure``.

    Example:
        >>> from simdist.visualize import collective_run, trace_figure
        >>> trace_figure(collective_run("all_reduce", "ring", 4, 64).trace).layout.title.text
        'simulated run (virtual time): 4 ranks, 1 collective, 24 messages'
    """
    summary = summarize(trace)
    fig = timeline_figure(timeline(trace))
    if summary.clock == "real":
        for tr in fig.data:  # µs -> ms: a real run lasts milliseconds to minutes
            if tr.type == "bar":
                tr.base = [b / 1e3 for b in tr.base]
            if tr.x is not None:
                tr.x = [None if x is None else x / 1e3 for x in tr.x]
        fig.update_xaxes(title="real time since rank 0 joined the job (ms, wall clock)")
    else:
        fig.update_xaxes(title="virtual time (µs, simulated)")
    fig.update_layout(title=dict(text=summary.describe(), font=dict(size=18)), font=dict(size=15))
    fig.update_xaxes(tickfont=dict(size=15), title_font=dict(size=16))  # the app's theme sets smaller ones
    fig.update_yaxes(tickfont=dict(size=16))
    return fig
