"""The socket backend (``backend="socket"``): real processes over TCP, one machine or many.

Its modules: the rendezvous store with HMAC-authenticated connections (``_store``, its wire
format ``_store_wire``, ``_auth``), the framed peer transport (``_frames``, ``_peers``, with
``_links``, ``_sending``, ``_receiving`` and ``_matching``), the world (``_world``) and the
launch of local processes (``_spawn``). Code outside this package uses only ``__all__``: the
world and ``spawn``, and what a launcher such as ``simdist run`` needs.
"""

from simdist.core import skip_directory

skip_directory(__file__)

from ._auth import SECRET_ENV as SECRET_ENV  # noqa: E402
from ._auth import new_secret as new_secret  # noqa: E402
from ._checked import CHECK_ENV as CHECK_ENV  # noqa: E402
from ._failures import FirstFailure as FirstFailure  # noqa: E402
from ._failures import launcher_saw as launcher_saw  # noqa: E402
from ._spawn import spawn as spawn  # noqa: E402
from ._store import StoreServer as StoreServer  # noqa: E402
from ._world import SocketWorld as SocketWorld  # noqa: E402
from ._world import is_loopback as is_loopback  # noqa: E402

__all__ = [
    "SocketWorld",
    "spawn",
    # What a launcher (``simdist run``) uses: the job's secret, the store it serves, and how it learns which
    # rank failed first (the job's store address and a free port are the core's: STORE_ENV, free_port).
    "SECRET_ENV",
    "CHECK_ENV",
    "new_secret",
    "is_loopback",
    "StoreServer",
    "FirstFailure",
    "launcher_saw",
]
