"""Imports ``simdist.backends`` and ``simdist.visualize`` from a source checkout as installed.

In a wheel the two packages sit inside ``simdist/``; in the checkout they are the top-level
folders ``backends/`` and ``visualize/`` (the ``package-dir`` mapping of ``pyproject.toml``).
When ``simdist`` itself is imported from a checkout (pytest or ``python -c`` started at the
repository root puts it first on ``sys.path``, ahead of an installed copy), a small finder maps
the two names onto those folders (on import of this module, which ``simdist/__init__`` imports
first), so the checkout imports the same way after a plain
``pip install .`` as after ``pip install -e .``: every module from the same tree.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

MAPPED = {"simdist.backends": "backends", "simdist.visualize": "visualize"}


class SourceTreeFinder(importlib.abc.MetaPathFinder):
    """Finds ``simdist.backends`` and ``simdist.visualize`` (and only them) in the checkout at ``root``."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, name, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        folder = MAPPED.get(name)
        if folder is None:
            return None
        location = os.path.join(self.root, folder)
        return importlib.util.spec_from_file_location(
            name, os.path.join(location, "__init__.py"), submodule_search_locations=[location]
        )

    def __repr__(self) -> str:
        return f"SourceTreeFinder({self.root!r})"


def map_source_tree(package_dir: str) -> None:
    """Install the finder when ``package_dir`` is the checkout's ``simdist/`` (no-op for an installed wheel)."""
    if os.path.isdir(os.path.join(package_dir, "backends")):
        return  # the installed layout: the subpackages are in the package itself
    root = os.path.dirname(os.path.abspath(package_dir))
    if not all(os.path.isfile(os.path.join(root, folder, "__init__.py")) for folder in MAPPED.values()):
        return
    if any(isinstance(finder, SourceTreeFinder) and finder.root == root for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, SourceTreeFinder(root))


map_source_tree(os.path.dirname(os.path.abspath(__file__)))
