"""The deterministic in-process simulator (``backend="sim"``).

Code outside this package uses only the names in ``__all__``: the world and group, ``simulate``,
the scheduling strategies, the replay-token functions (``encode_choices``/``decode_choices`` for a
choice list, ``make_token``/``split_token`` for the ``@world``/``@script``/``@test`` suffixes, ``make_strategy``,
``check_token``), ``next_schedule`` (depth-first enumeration), ``RankPool`` and ``held`` (a series of
runs sharing rank threads and the process-wide stand-ins).
"""

from simdist.core import skip_directory

skip_directory(__file__)

from ._group import SimGroup as SimGroup  # noqa: E402
from ._group import SimWorld as SimWorld  # noqa: E402
from ._isolation import held as held  # noqa: E402
from ._options import DETAILS as DETAILS  # noqa: E402
from ._options import SimOptions as SimOptions  # noqa: E402
from ._runner import SimResult as SimResult  # noqa: E402
from ._runner import simulate as simulate  # noqa: E402
from ._strategies import PCTStrategy as PCTStrategy  # noqa: E402
from ._strategies import RandomStrategy as RandomStrategy  # noqa: E402
from ._strategies import ReplayStrategy as ReplayStrategy  # noqa: E402
from ._strategies import RoundRobinStrategy as RoundRobinStrategy  # noqa: E402
from ._strategies import Strategy as Strategy  # noqa: E402
from ._strategies import TokenParts as TokenParts  # noqa: E402
from ._strategies import check_token as check_token  # noqa: E402
from ._strategies import decode_choices as decode_choices  # noqa: E402
from ._strategies import encode_choices as encode_choices  # noqa: E402
from ._strategies import make_strategy as make_strategy  # noqa: E402
from ._strategies import make_token as make_token  # noqa: E402
from ._strategies import next_schedule as next_schedule  # noqa: E402
from ._strategies import split_token as split_token  # noqa: E402
from ._threads import RankPool as RankPool  # noqa: E402

__all__ = [
    "SimGroup",
    "SimWorld",
    "SimResult",
    "simulate",
    "SimOptions",
    "DETAILS",
    "Strategy",
    "RandomStrategy",
    "RoundRobinStrategy",
    "PCTStrategy",
    "ReplayStrategy",
    "make_strategy",
    "check_token",
    "TokenParts",
    "encode_choices",
    "decode_choices",
    "make_token",
    "split_token",
    "next_schedule",
    "RankPool",
    "held",
]
