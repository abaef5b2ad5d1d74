"""Views of a ``simdist.Trace`` (installed as ``simdist.visualize``): pure functions, no Streamlit.

It reads traces only; it never imports a backend.
"""

from ._timeline import lanes as lanes
from ._timeline import messages_by_step as messages_by_step

__all__ = ["lanes", "messages_by_step"]
