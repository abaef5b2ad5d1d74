"""Scheduling strategies and replay tokens.

At every scheduling point with more than one runnable rank, the strategy picks an
index into the *options*: the current rank first (if it can run), then the other
runnable ranks in ascending order. Index 0 therefore means "keep running the current
rank, or the lowest one", so short lists of small choices are simple schedules. An
any-source receive with several pending senders is a choice too (index into the
senders in ascending rank order).

A run records every choice it made. Its *replay token* is a short string:

- ``random:SEED``, ``round_robin``, ``pct:SEED:DEPTH:STEPS`` for the seeded strategies,
  which are deterministic and replay exactly;
- ``choices:BASE64`` for an explicit choice list (a replay or a Hypothesis schedule).
  Choices past the end of the list are 0, and a choice larger than the number of
  options wraps around, so every list of non-negative integers is a valid schedule.
"""

from __future__ import annotations

import base64
import random
import zlib
from typing import Sequence

__all__ = [
    "Strategy",
    "RandomStrategy",
    "RoundRobinStrategy",
    "PCTStrategy",
    "ReplayStrategy",
    "make_strategy",
    "encode_choices",
    "decode_choices",
    "next_schedule",
]


class Strategy:
    """Picks among runnable ranks; subclasses override :meth:`pick`."""

    name = "strategy"

    def pick(self, n: int, options: Sequence[int], current: int | None) -> int:
        """Return an index in ``range(n)`` into ``options`` (``n >= 2``)."""
        raise NotImplementedError

    def pick_match(self, n: int) -> int:
        """Which of ``n >= 2`` pending senders an any-source receive matches."""
        return self.pick(n, range(n), None)

    def token(self) -> str | None:
        """A token that replays this strategy exactly, or ``None`` to use the recorded choices."""
        return None

    def observe(self, ran: int | None, footprint: set, runnable: Sequence[int]) -> None:
        """Called before every selection: rank ``ran`` (``None`` at the start) ran up to here.

        ``footprint`` holds what it touched meanwhile (``(ctx, dst, tag)`` of each message
        posted or matched, ``("group", id)`` of each collective joined, ``("time",)`` for a
        timed wait); ``runnable`` the ranks that can run now, ascending. Search strategies
        use it to tell independent steps apart; the others ignore it.
        """


class RandomStrategy(Strategy):
    """Uniformly random among the options, from one seeded ``random.Random``."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = int(seed)
        self.rng = random.Random(self.seed)

    def pick(self, n, options, current):
        return self.rng.randrange(n)

    def token(self):
        return f"random:{self.seed}"


class RoundRobinStrategy(Strategy):
    """The next runnable rank after the current one, cyclically."""

    name = "round_robin"

    def pick(self, n, options, current):
        if current is None:
            return 0
        later = [i for i, r in enumerate(options) if r > current]
        return later[0] if later else min(range(n), key=lambda i: options[i])

    def pick_match(self, n):
        return 0

    def token(self):
        return "round_robin"


class PCTStrategy(Strategy):
    """Probabilistic concurrency testing (Burckhardt et al., 2010) with bug depth ``depth``.

    Ranks get distinct random priorities; the highest-priority runnable rank runs. At
    ``depth - 1`` random points among the first ``steps`` scheduling points the running
    rank's priority drops below all others.
    """

    name = "pct"

    def __init__(self, seed: int = 0, depth: int = 3, steps: int = 1000):
        if depth < 1:
            raise ValueError(f"depth={depth!r} must be at least 1")
        self.seed, self.depth, self.steps = int(seed), int(depth), int(steps)
        self.rng = random.Random(self.seed)
        self.priority: dict[int, float] = {}
        self.change_points = set(self.rng.sample(range(1, max(self.steps, depth) + 1), depth - 1))
        self.count = 0
        self.low = 0.0

    def _prio(self, rank: int) -> float:
        if rank not in self.priority:
            self.priority[rank] = 1.0 + self.rng.random()
        return self.priority[rank]

    def pick(self, n, options, current):
        self.count += 1
        if self.count in self.change_points and current is not None:
            self.low -= 1.0
            self.priority[current] = self.low
        best = max(range(n), key=lambda i: self._prio(options[i]))
        return best

    def pick_match(self, n):
        return self.rng.randrange(n)

    def token(self):
        return f"pct:{self.seed}:{self.depth}:{self.steps}"


class ReplayStrategy(Strategy):
    """Replays a list of choices; past its end, choice 0."""

    name = "replay"

    def __init__(self, choices: Sequence[int]):
        bad = [c for c in choices if isinstance(c, bool) or not isinstance(c, int) or c < 0]
        if bad:
            raise ValueError(f"schedule={list(choices)!r} has {bad[0]!r}; a schedule's choices are non-negative ints")
        self.choices = list(choices)
        self.pos = 0

    def pick(self, n, options, current):
        if self.pos < len(self.choices):
            c = self.choices[self.pos]
            self.pos += 1
            return c % n
        self.pos += 1
        return 0

    def pick_match(self, n):
        return self.pick(n, (), None)


def _varints(values: Sequence[int]) -> bytes:
    out = bytearray()
    for v in values:
        while True:
            b = v & 0x7F
            v >>= 7
            out.append(b | (0x80 if v else 0))
            if not v:
                break
    return bytes(out)


def encode_choices(choices: Sequence[int]) -> str:
    """The ``choices:...`` token of a choice list (trailing zeros dropped: they are implied)."""
    trimmed = list(choices)
    while trimmed and trimmed[-1] == 0:
        trimmed.pop()
    data = _varints(trimmed)
    packed = zlib.compress(data, 9)
    if len(packed) < len(data):
        data = b"z" + packed
    else:
        data = b"v" + data
    return "choices:" + base64.urlsafe_b64encode(data).decode().rstrip("=")


def decode_choices(text: str) -> list[int]:
    """The choice list of a ``choices:...`` token."""
    raw = text.removeprefix("choices:")
    try:
        data = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
        kind, body = data[:1], data[1:]
        if kind == b"z":
            body = zlib.decompress(body)
        elif kind != b"v":
            raise ValueError("unknown encoding")
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a bad token
        raise ValueError(f"schedule={text!r} is not a valid replay token") from exc
    out, v, shift = [], 0, 0
    for b in body:
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            out.append(v)
            v, shift = 0, 0
    return out


def next_schedule(choices: Sequence[int], widths: Sequence[int]) -> list[int] | None:
    """The schedule after ``choices`` in depth-first order: the last choice that has options left, bumped.

    ``widths[i]`` is how many options choice ``i`` had; ``None`` once every schedule has been tried.
    """
    i = len(choices) - 1
    while i >= 0 and choices[i] + 1 >= widths[i]:
        i -= 1
    return None if i < 0 else list(choices[:i]) + [choices[i] + 1]


def make_strategy(strategy: object = None, seed: int | None = None, schedule: object = None) -> Strategy:
    """The strategy for a run.

    ``schedule`` (a token or a list of choices) wins; then ``strategy`` (a Strategy, or
    one of ``'random'``, ``'round_robin'``, ``'pct'``); the default is ``'random'``
    with ``seed`` (``None`` means 0, so plain runs are deterministic).
    """
    if schedule is not None:
        if isinstance(schedule, str):
            return parse_token(schedule)
        if isinstance(schedule, (list, tuple)):
            return ReplayStrategy(schedule)
        raise TypeError(f"schedule must be a replay token (str) or a list of ints, got {type(schedule).__name__}")
    if isinstance(strategy, Strategy):
        return strategy
    seed = 0 if seed is None else seed
    if strategy in (None, "random"):
        return RandomStrategy(seed)
    if strategy == "round_robin":
        return RoundRobinStrategy()
    if strategy == "pct":
        return PCTStrategy(seed)
    raise ValueError(f"strategy={strategy!r} is not a strategy; expected 'random', 'round_robin', 'pct' or a Strategy")


def parse_token(token: str) -> Strategy:
    """The strategy that a replay token stands for."""
    head, _, rest = token.partition(":")
    try:
        if head == "choices":
            return ReplayStrategy(decode_choices(token))
        if head == "random":
            return RandomStrategy(int(rest))
        if head == "round_robin" and not rest:
            return RoundRobinStrategy()
        if head == "pct":
            seed, depth, steps = (int(x) for x in rest.split(":"))
            return PCTStrategy(seed, depth, steps)
    except ValueError as exc:
        raise ValueError(f"schedule={token!r} is not a valid replay token: {exc}") from None
    raise ValueError(
        f"schedule={token!r} is not a valid replay token; expected 'random:SEED', 'round_robin', "
        "'pct:SEED:DEPTH:STEPS' or 'choices:...'"
    )
