"""The shared argument checks: what they accept and the errors that name the argument."""

import numpy as np
import pytest

from simdist._checks import check_int

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("value", "bounds", "expected"),
    [(3, {}, 3), (-7, {}, -7), (np.int64(5), {"minimum": 0}, 5), (0, {"minimum": 0, "maximum": 0}, 0),
     (2**64 - 1, {"minimum": 0, "maximum": 2**64 - 1}, 2**64 - 1)],
)
def test_check_int_returns_a_plain_int(value, bounds, expected) -> None:
    got = check_int(value, "n", **bounds)
    assert got == expected and type(got) is int


@pytest.mark.parametrize(
    ("value", "bounds", "exc", "message"),
    [
        (True, {}, TypeError, "n must be an int, got bool (True)"),
        (1.5, {}, TypeError, "n must be an int, got float (1.5)"),
        ("3", {}, TypeError, "n must be an int, got str ('3')"),
        (np.float32(2.0), {}, TypeError, "n must be an int, got float32 (np.float32(2.0))"),
        (-1, {"minimum": 0}, ValueError, "n=-1 must be at least 0"),
        (9, {"maximum": 8}, ValueError, "n=9 must be at most 8"),
        (2**32, {"minimum": 0, "maximum": 2**32 - 1}, ValueError,
         f"n={2**32} is out of range; expected an int in 0..{2**32 - 1}"),
        (np.int8(-2), {"minimum": 0, "maximum": 3}, ValueError, "n=-2 is out of range; expected an int in 0..3"),
    ],
)
def test_check_int_names_the_argument_the_value_and_what_was_expected(value, bounds, exc, message) -> None:
    with pytest.raises(exc) as info:
        check_int(value, "n", **bounds)
    assert str(info.value) == message
