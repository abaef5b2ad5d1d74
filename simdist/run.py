"""``simdist run`` and ``python3 -m simdist.run``: the command's entry (its code is :mod:`simdist.launch.run`).

simdist run --nproc-per-node 4 train.py            # or: python3 -m simdist.run --nproc-per-node 4 train.py
"""

from __future__ import annotations

from .launch.run import COMMANDS, ENGINES, cli, main

__all__ = ["COMMANDS", "ENGINES", "cli", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
