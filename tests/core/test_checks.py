"""The shared argument checks: what they accept and the errors that name the argument."""

import datetime

import numpy as np
import pytest

from simdist.core._checks import check_int, timeout_seconds

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("value", "bounds", "expected"),
    [
        (3, {}, 3),
        (-7, {}, -7),
        (np.int64(5), {"minimum": 0}, 5),
        (0, {"minimum": 0, "maximum": 0}, 0),
        (2**64 - 1, {"minimum": 0, "maximum": 2**64 - 1}, 2**64 - 1),
    ],
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
        (
            2**32,
            {"minimum": 0, "maximum": 2**32 - 1},
            ValueError,
            f"n={2**32} is out of range; expected an int in 0..{2**32 - 1}",
        ),
        (np.int8(-2), {"minimum": 0, "maximum": 3}, ValueError, "n=-2 is out of range; expected an int in 0..3"),
    ],
)
def test_check_int_names_the_argument_the_value_and_what_was_expected(value, bounds, exc, message) -> None:
    with pytest.raises(exc) as info:
        check_int(value, "n", **bounds)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("value", "options", "expected"),
    [
        (2, {}, 2.0),
        (0.25, {}, 0.25),
        (0, {}, 0.0),
        (datetime.timedelta(minutes=1, milliseconds=500), {}, 60.5),
        (None, {"default": 7.0}, 7.0),
        (None, {"default": None}, None),
        (np.float64(1.5), {"positive": True}, 1.5),
    ],
)
def test_timeout_seconds_takes_numbers_and_timedeltas(value, options, expected) -> None:
    assert timeout_seconds(value, "timeout", **options) == expected


@pytest.mark.parametrize(
    ("value", "options", "exc", "message"),
    [
        (None, {}, TypeError, "timeout must be a number of seconds, a datetime.timedelta, got NoneType (None)"),
        (
            "5",
            {"default": None},
            TypeError,
            "timeout must be a number of seconds, a datetime.timedelta or None, got str ('5')",
        ),
        (True, {}, TypeError, "timeout must be a number of seconds, a datetime.timedelta, got bool (True)"),
        (-1, {}, ValueError, "timeout=-1 must be a finite number of seconds >= 0"),
        (float("inf"), {}, ValueError, "timeout=inf must be a finite number of seconds >= 0"),
        (float("nan"), {}, ValueError, "timeout=nan must be a finite number of seconds >= 0"),
        (0, {"positive": True}, ValueError, "timeout=0 must be a finite number of seconds > 0"),
        (
            datetime.timedelta(0),
            {"positive": True},
            ValueError,
            "timeout=datetime.timedelta(0) must be a finite number of seconds > 0",
        ),
    ],
)
def test_timeout_seconds_names_the_argument_the_value_and_what_was_expected(value, options, exc, message) -> None:
    with pytest.raises(exc) as info:
        timeout_seconds(value, "timeout", **options)
    assert str(info.value) == message


def test_world_timeout_falls_back_to_the_environment(monkeypatch) -> None:
    from simdist.core._world import DEFAULT_TIMEOUT, ProcessWorld

    world_timeout = ProcessWorld.timeout_of

    monkeypatch.delenv("SIMDIST_TIMEOUT", raising=False)
    assert world_timeout(None) == DEFAULT_TIMEOUT
    assert world_timeout(datetime.timedelta(seconds=3)) == 3.0
    monkeypatch.setenv("SIMDIST_TIMEOUT", "12.5")
    assert world_timeout(None) == 12.5
    monkeypatch.setenv("SIMDIST_TIMEOUT", "soon")
    with pytest.raises(ValueError, match=r"SIMDIST_TIMEOUT='soon' must be a finite number of seconds > 0"):
        world_timeout(None)
