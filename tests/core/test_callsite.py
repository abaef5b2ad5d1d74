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
