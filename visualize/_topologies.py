"""Which topologies the app offers: the named ones, then the topology files of the working directory."""

from __future__ import annotations

from pathlib import Path

from simdist.core._topology import TOPOLOGIES
from simdist.core._topology_file import read_topology_file

__all__ = ["topology_choices"]


def topology_choices(directory: str | Path = ".") -> list[str]:
    """``'switch'``, the other named topologies sorted, then the ``*.json`` topology files in ``directory``.

    A file is offered by its path (``simulate(topology=path)`` loads it), e.g. the
    ``simdist-topology.json`` that ``simdist calibrate`` writes; JSON files that are not
    topology files are left out.

    Args:
        directory: where to look for topology files.

    Returns:
        The names and paths, ``'switch'`` first.

    Example:
        >>> from simdist.visualize import topology_choices
        >>> topology_choices("/nonexistent")[0]
        'switch'
    """
    names = sorted(TOPOLOGIES, key=lambda n: (n != "switch", n))
    files = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            read_topology_file(path)
        except ValueError:
            continue
        files.append(str(path))
    return names + files
