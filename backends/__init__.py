"""simdist's backends, installed as ``simdist.backends``: ``sim`` (the simulator) and more by name."""
