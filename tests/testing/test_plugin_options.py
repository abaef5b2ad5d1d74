"""The pytest plugin's options (pytest_simdist.py): a bad value ends pytest with a usage error naming the option."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pytest_simdist

pytest_plugins = ["pytester"]

USAGE_ERROR = 4  # pytest.ExitCode.USAGE_ERROR


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "args, words",
    [
        (["--simdist-max-schedules", "-1"], "argument --simdist-max-schedules: '-1' is not a number of schedules"),
        (["--simdist-max-schedules=0"], "argument --simdist-max-schedules: '0' is not a number of schedules"),
        (["--simdist-max-schedules", "abc"], "argument --simdist-max-schedules: 'abc' is not a number of schedules"),
        (["--simdist-replay", "bogus"], "argument --simdist-replay: 'bogus' is not a replay token"),
        (["--simdist-replay", "pct:1:2@world=0"], "argument --simdist-replay: 'pct:1:2@world=0' is not a replay"),
    ],
)
def test_a_bad_option_value_is_a_usage_error(pytester, args, words):
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    err = result.stderr.str()
    assert result.ret == USAGE_ERROR, (result.ret, err)
    assert words in err and "expected" in err, err
    assert "INTERNALERROR" not in err + result.stdout.str() and "Traceback" not in err


@pytest.mark.timeout(120)
def test_good_option_values_reach_the_options(pytester):
    pytester.makepyfile(
        "import pytest_simdist\n"
        "def test_options():\n"
        "    assert pytest_simdist.OPTIONS['max_schedules'] == 7\n"
        "    assert pytest_simdist.OPTIONS['replay'] == 'choices:0,1@world=3'\n"
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--simdist-max-schedules", "7", "--simdist-replay", "choices:0,1@world=3"
    )
    assert result.ret == 0, result.stdout.str() + result.stderr.str()


def test_the_tokens_simdist_makes_have_a_replay_tokens_shape():
    from simdist.backends.sim._strategies import (
        PCTStrategy,
        RandomStrategy,
        RoundRobinStrategy,
        encode_choices,
        make_token,
    )

    schedules = [RandomStrategy(3).token(), RoundRobinStrategy().token(), PCTStrategy(5, 2, 40).token()]
    schedules += [encode_choices([0, 1, 2]), encode_choices(list(range(200)) * 3), encode_choices([])]
    for schedule in schedules:
        for token in (
            schedule,
            make_token(schedule, 4),
            make_token(schedule, 2, "tests/test_x.py::test_y[a@b]"),
            make_token(schedule, 4, None, "train.py"),
            make_token(schedule, 3, "tests/test_x.py::test_y[a@b]", "my@train%.py"),
        ):
            assert pytest_simdist._replay(token) == token


def test_loading_the_plugin_imports_nothing_of_simdist():
    code = "import sys, pytest_simdist; print(sorted(m for m in sys.modules if m.startswith(('simdist', 'torch'))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
