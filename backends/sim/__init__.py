"""The deterministic in-process simulator (``backend="sim"``)."""

from simdist._callsite import skip_directory

skip_directory(__file__)

from ._group import SimGroup as SimGroup  # noqa: E402
from ._group import SimWorld as SimWorld  # noqa: E402
from ._runner import DETAILS as DETAILS  # noqa: E402
from ._runner import SimResult as SimResult  # noqa: E402
from ._runner import simulate as simulate  # noqa: E402
from ._strategies import PCTStrategy as PCTStrategy  # noqa: E402
from ._strategies import RandomStrategy as RandomStrategy  # noqa: E402
from ._strategies import ReplayStrategy as ReplayStrategy  # noqa: E402
from ._strategies import RoundRobinStrategy as RoundRobinStrategy  # noqa: E402
from ._strategies import Strategy as Strategy  # noqa: E402
from ._threads import RankPool as RankPool  # noqa: E402

__all__ = [
    "SimGroup",
    "SimWorld",
    "SimResult",
    "simulate",
    "DETAILS",
    "Strategy",
    "RandomStrategy",
    "RoundRobinStrategy",
    "PCTStrategy",
    "ReplayStrategy",
    "RankPool",
]
