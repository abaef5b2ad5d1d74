"""The socket backend (``backend="socket"``): real processes over TCP, one machine or many.

Pieces so far: the rendezvous store with HMAC-authenticated connections (``_store``,
``_auth``) and the framed peer transport (``_frames``, ``_peers``, with ``_links``, ``_sending``,
``_receiving`` and ``_matching``).
"""

from simdist._callsite import skip_directory

skip_directory(__file__)

from ._spawn import spawn as spawn  # noqa: E402
from ._world import SocketWorld as SocketWorld  # noqa: E402

__all__ = ["SocketWorld", "spawn"]
