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
- ``choices:0,2,1`` for an explicit choice list (a replay or a Hypothesis schedule), in
  plain decimals while that stays short (at most ``READABLE_CHARS`` characters), else
  ``choices:BASE64`` (varints, zlib-compressed when that is shorter). Choices past the
  end of the list are 0 (``choices:0`` is the empty list), and a choice larger than the
  number of options wraps around, so every list of non-negative integers is a valid schedule.

Then what the run was: ``@world=N`` (its world size), for a run of a script ``@script=NAME`` (the
script's file name, or the module's name for ``-m``; an ``@`` or ``%`` in it written ``%40``, ``%25``),
and for a run inside a pytest test ``@test=NODEID`` (the test's node id, last: it may hold any
character)::

    choices:0,2@world=4@test=tests/test_ring.py::test_sum[3]
    random:7@world=4@script=train.py

Tokens made by hand may leave them out; tokens of older versions (``choices:dgAC``) still replay.
"""

from __future__ import annotations

import base64
import random
import re
import zlib
from typing import NamedTuple, Sequence

__all__ = [
    "Strategy",
    "Hooks",
    "RandomStrategy",
    "RoundRobinStrategy",
    "PCTStrategy",
    "ReplayStrategy",
    "make_strategy",
    "encode_choices",
    "decode_choices",
    "make_token",
    "split_token",
    "TokenParts",
    "check_token",
    "parse_token",
    "next_schedule",
    "READABLE_CHARS",
]

READABLE_CHARS = 100  # the longest choice list written in plain decimals
_TOKEN = re.compile(
    r"(?P<schedule>[^@]*)(?:@world=(?P<world>[^@]*))?(?:@script=(?P<script>[^@]*))?(?:@test=(?P<test>.+))?", re.DOTALL
)


class Strategy:
    """Picks among runnable ranks; subclasses override :meth:`pick`."""

    name = "strategy"

    def pick(self, n: int, options: Sequence[int], current: int | None) -> int:
        """Return an index in ``range(n)`` into ``options`` (``n >= 2``)."""
        raise NotImplementedError

    def pick_match(self, n: int) -> int:
        """Which of ``n >= 2`` pending senders an any-source receive matches."""
        return self.pick(n, range(n), None)

    def chose(self, engine: object, kind: str, options: Sequence[int], index: int, subject: object) -> None:
        """Called after each choice: ``kind`` ``'run'`` (``subject``: the rank state that was running,
        or ``None``) or ``'match'`` (``subject``: the any-source receive; ``options``: its senders)."""

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


class Hooks:
    """The methods of ``strategy`` that the engine calls at every selection; ``None`` for a hook left as
    :class:`Strategy`'s no-op (the engine then skips it and what it would be given)."""

    __slots__ = ("chose", "observe", "pick")

    def __init__(self, strategy: Strategy):
        self.pick = strategy.pick
        self.observe = _overridden(strategy.observe, Strategy.observe)
        self.chose = _overridden(strategy.chose, Strategy.chose)


def _overridden(method, base):
    return None if getattr(method, "__func__", None) is base else method


class RandomStrategy(Strategy):
    """Uniformly random among the options, from one seeded ``random.Random``."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = int(seed)
        self.rng = random.Random(self.seed)
        self._below = self.rng._randbelow  # what randrange(n) returns for an int n > 0, without its checks

    def pick(self, n, options, current):
        return self._below(n)

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
        priority, best, top = self.priority, 0, None
        for i in range(n):  # in order: a rank seen for the first time draws its priority here (as _prio does)
            p = priority.get(options[i])
            if p is None:
                p = self._prio(options[i])
            if top is None or p > top:  # (the first of equal ones, as max() keeps)
                best, top = i, p
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
    """The ``choices:...`` token of a choice list: decimals when short (trailing zeros dropped: they are implied)."""
    trimmed = list(choices)
    while trimmed and trimmed[-1] == 0:
        trimmed.pop()
    readable = ",".join(str(c) for c in trimmed) or "0"
    if len(readable) <= READABLE_CHARS:
        return "choices:" + readable
    data = _varints(trimmed)
    packed = zlib.compress(data, 9)
    if len(packed) < len(data):
        data = b"z" + packed
    else:
        data = b"v" + data
    return "choices:" + base64.urlsafe_b64encode(data).decode().rstrip("=")


def decode_choices(text: str) -> list[int]:
    """The choice list of a ``choices:...`` token (with or without ``@world``/``@test``), trailing zeros dropped."""
    raw = split_token(text)[0].removeprefix("choices:")
    if re.fullmatch(r"\d+(,\d+)*", raw):
        out = [int(c) for c in raw.split(",")]
    else:
        out = _decode_base64(raw, text)
    while out and out[-1] == 0:
        out.pop()
    return out


def _decode_base64(raw: str, text: str) -> list[int]:
    """The choices of the compact form of a token (varints in base64, ``v`` plain or ``z`` compressed)."""
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


def make_token(schedule: str, world: int | None = None, test: str | None = None, script: str | None = None) -> str:
    """``schedule`` (a strategy's token or ``choices:...``) with the run's ``@world=N``, ``@script=NAME`` and
    ``@test=NODEID``."""
    token = schedule
    if world is not None:
        token += f"@world={world}"
    if script:
        token += "@script=" + script.replace("%", "%25").replace("@", "%40")
    if test:
        token += f"@test={test}"
    return token


class TokenParts(NamedTuple):
    """The parts of a replay token; ``world``, ``script`` and ``test`` are ``None`` where it leaves them out."""

    schedule: str  # the strategy's token or ``choices:...``
    world: int | None  # the world size it was made for
    test: str | None  # the pytest node id of the test it was made in
    script: str | None  # the file name of the script it was made for (the module's name for ``-m``)


def split_token(token: str) -> TokenParts:
    """The parts of a replay token (``schedule, world, test, script``)."""
    if not isinstance(token, str):
        raise TypeError(f"token must be a replay token (str), got {type(token).__name__} ({token!r:.60})")
    m = _TOKEN.fullmatch(token)
    world = m["world"] if m else None
    if m is None or (world is not None and not (world.isdigit() and int(world) >= 1)) or m["script"] == "":
        raise ValueError(
            f"schedule={token!r} is not a valid replay token; expected SCHEDULE[@world=N][@script=NAME][@test=NODEID] "
            "with N a positive int"
        )
    script = None if m["script"] is None else m["script"].replace("%40", "@").replace("%25", "%")
    return TokenParts(m["schedule"], None if world is None else int(world), m["test"], script)


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


def check_token(schedule: object, nprocs: int, script: str | None = None) -> None:
    """Raise ``ValueError`` if ``schedule`` is a token made for another world size than ``nprocs``, or for another
    script than ``script`` (a token of a script replays only that script; one that names none replays anywhere)."""
    if not isinstance(schedule, str):
        return
    parts = split_token(schedule)
    if parts.world is not None and parts.world != nprocs:
        raise ValueError(
            f"schedule={schedule!r} was made for world size {parts.world}, not nprocs={nprocs}; "
            f"replay it with {parts.world} ranks"
        )
    if parts.script is not None and parts.script != script:
        this = "a function, not a script" if script is None else f"the script {script!r}"
        raise ValueError(
            f"schedule={schedule!r} was made for the script {parts.script!r}, and this run is of {this}; "
            f"replay it with {parts.script}"
        )


def parse_token(token: str) -> Strategy:
    """The strategy that a replay token stands for (its ``@world``/``@test`` are checked by the caller)."""
    head, _, rest = split_token(token)[0].partition(":")
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
