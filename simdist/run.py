"""The ``simdist`` console script (``simdist run``, ``simdist test``, ``simdist calibrate``, ``simdist app``) and
``python3 -m simdist.run``.

simdist run --nproc-per-node 4 train.py            # or: python3 -m simdist.run --nproc-per-node 4 train.py

Each command's code is in :mod:`simdist.launch` (``run``'s in :mod:`simdist.launch.run`); this module dispatches.
"""

from __future__ import annotations

import sys

from .launch.run import ENGINES, main

__all__ = ["COMMANDS", "ENGINES", "cli", "main"]

COMMANDS = {
    "run": "run a script on several ranks, like torchrun: real processes, or simulated ranks (--backend sim)",
    "test": "explore a script's schedules on simulated ranks; a failure shrunk, with the command that replays it",
    "calibrate": "measure this machine's latency, bandwidth and reduction speed; write a topology file",
    "app": "serve the visualizer (Streamlit; needs the app extra: pip install 'simdist[app]')",
}
"""The subcommands of the ``simdist`` console script, each with its one-line summary."""


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name.ljust(width)}  {summary}" for name, summary in COMMANDS.items()]
    return (
        "usage: simdist <command> [options]\n"
        "       simdist --version\n\n"
        "simdist teaches and tests distributed training code written for torch.distributed.\n\n"
        "commands:\n" + "\n".join(lines) + "\n\n"
        "options:\n"
        "  -h, --help     show this help and exit\n"
        "  -V, --version  show simdist's version and exit\n\n"
        "'simdist <command> --help' describes a command.\n\n"
        "examples:\n"
        "  simdist run --nproc-per-node 4 --backend sim train.py\n"
        "  simdist test --nproc-per-node 4 train.py\n"
        "  simdist calibrate --out my-machine.json\n"
        "  simdist app\n"
    )


def cli() -> int:
    """The ``simdist`` console script: ``simdist run ...``, ``simdist test ...``, ``simdist calibrate ...``,
    ``simdist app ...``, ``--version``, ``--help``."""
    args = sys.argv[1:]
    if args and args[0] == "run":
        return main(args[1:])
    if args and args[0] == "test":
        from .launch._test_command import main as test_main

        return test_main(args[1:])
    if args and args[0] == "calibrate":
        from .launch._calibrate import main as calibrate_main

        return calibrate_main(args[1:])
    if args and args[0] == "app":
        from .launch._app_cli import main as app_main

        return app_main(args[1:])
    if args in (["-h"], ["--help"]):
        sys.stdout.write(_usage())
        return 0
    if args in (["-V"], ["--version"]):
        from . import __version__

        sys.stdout.write(f"simdist {__version__}\n")
        return 0
    problem = f"unknown command {args[0]!r}" if args else "a command is required"
    sys.stderr.write(
        f"usage: simdist <command> [options]  (simdist --help lists the commands)\n"
        f"simdist: error: {problem}; expected one of: {', '.join(COMMANDS)}\n"
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
