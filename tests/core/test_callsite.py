"""The one notion of "the user's code": files, warning stack levels and call sites."""

import os
import warnings

import pytest
import torch

import simdist as dist
from simdist.core import _callsite

pytestmark = pytest.mark.timeout(60)


def test_is_user_file_sorts_files_by_where_they_lie():
    assert _callsite.is_user_file(__file__)
    assert not _callsite.is_user_file(_callsite.__file__)  # simdist itself
    assert not _callsite.is_user_file(os.__file__)  # Python's own library
    assert not _callsite.is_user_file(pytest.__file__)  # an installed package
    assert not _callsite.is_user_file("<frozen importlib._bootstrap>")
    assert not _callsite.is_user_file(__file__, skip=(os.path.dirname(__file__) + os.sep,))


def test_user_stacklevel_points_a_library_warning_at_the_users_line():
    def fn(rank):
        dist.init_process_group()
        g = dist.new_group([0])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            line = _line() + 1
            dist.broadcast(torch.zeros(1), src=0, group=g)
        dist.destroy_process_group()
        return line, [(w.filename, w.lineno) for w in caught if "does not belong" in str(w.message)]

    line, sites = dist.simulate(fn, 2).values[1]
    assert sites == [(__file__, line)]


def _line() -> int:
    import sys

    return sys._getframe(1).f_lineno


def test_two_copies_of_one_script_in_two_folders_report_their_own_lines(tmp_path):
    """Code objects compare equal across files (their file name is not compared): the call sites of a copy of a
    script are the copy's, not those of the copy that ran first."""
    source = "import simdist\n\ndef where():\n    return simdist.core.user_call_site()\n"
    sites = []
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "same.py").write_text(source)
        namespace: dict = {}
        exec(compile(source, str(folder / "same.py"), "exec"), namespace)
        sites.append(namespace["where"]())
    assert sites == [f"{tmp_path / 'a' / 'same.py'}:4", f"{tmp_path / 'b' / 'same.py'}:4"]
