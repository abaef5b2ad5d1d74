"""A torchrun script as a program of ``simdist.testing``: ``run_script`` and ``explore_script``, their values, their
copies of the working directory, the pytest plugin's options, and the isolation scripts get."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from scripts_under_test import FIXED, RACE

import simdist
import simdist.testing as sdt
from simdist.testing._workdir import Scratch

pytest_plugins = ["pytester"]

# Each rank says who it is, in which process, and what it wrote; rank 1 ends with sys.exit(0), as scripts do.
WHO = """\
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} argv {sys.argv[1:]} pid {os.getpid()} sum {t.item()}")
print("to stderr", file=sys.stderr)
rank = dist.get_rank()
with open(f"out{rank}.txt", "w") as f:
    f.write(str(t.item()))
dist.destroy_process_group()
if rank == 1:
    sys.exit(0)
"""


def _write(folder: Path, name: str, text: str) -> str:
    (folder / name).write_text(textwrap.dedent(text))
    return name


@pytest.mark.timeout(120)
def test_run_script_gives_each_ranks_exit_status_and_lines_with_ranks_as_processes_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "who.py", WHO)
    seen = {}

    def check(values):  # runs where the run's files are
        seen["files"] = sorted(os.listdir())
        return True

    res = sdt.run_script("who.py", 3, ["--steps", "2"], seed=5, check=check)
    assert [(v.rank, v.exit_code, v.stderr) for v in res.values] == [(r, 0, ("to stderr",)) for r in range(3)]
    pids = set()
    for r, value in enumerate(res.values):
        (line,) = value.stdout
        words = line.split()
        assert words[:5] == ["rank", str(r), "of", "3", "argv"] and line.endswith("sum 3.0"), line
        assert "['--steps', '2']" in line
        pids.add(int(words[words.index("pid") + 1]))
    assert len(pids) == 3 and os.getpid() not in pids  # a process of its own for each rank
    assert res.schedule.startswith("random:5@world=3@script=who.py@test=") and res.time > 0
    assert seen["files"] == ["out0.txt", "out1.txt", "out2.txt", "who.py"]
    assert sorted(os.listdir(tmp_path)) == ["who.py"]  # the run happened in a copy of the folder
    threads = sdt.run_script("who.py", 3, ["--steps", "2"], seed=5, isolation="threads")
    assert {int(v.stdout[0].split("pid ")[1].split()[0]) for v in threads.values} == {os.getpid()}
    strip = lambda values: [re.sub(r"pid \d+", "pid", v.stdout[0]) for v in values]  # noqa: E731 - the pids differ
    assert strip(threads.values) == strip(res.values) and threads.schedule == res.schedule


@pytest.mark.timeout(120)
def test_explore_script_finds_the_race_and_run_script_replays_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "race.py", RACE)
    _write(tmp_path, "fixed.py", FIXED)
    with pytest.raises(simdist.RankError, match=r"arrival order") as found:
        sdt.explore_script("race.py", 4, max_runs=200, isolation="threads")
    token = found.value.schedule
    assert token.startswith("choices:") and "@world=4@script=race.py@test=tests/testing/test_scripts.py::" in token
    assert isinstance(found.value.__cause__, AssertionError)
    assert any("race.py:7" in note for note in found.value.__notes__)  # explained at the user's lines
    for isolation in ("threads", "processes"):
        with pytest.raises(simdist.RankError) as again:
            sdt.run_script("race.py", 4, schedule=token, isolation=isolation)
        assert str(again.value.__cause__) == str(found.value.__cause__)
    summary = sdt.explore_script("fixed.py", 4, max_runs=200, isolation="threads")
    assert summary.runs == 200 and summary.interleavings > 20
    with pytest.raises(ValueError, match=r"made for the script 'race.py'"):
        sdt.run_script("fixed.py", 4, schedule=token, isolation="threads")
    with pytest.raises(ValueError, match=r"made for the script 'race.py', and this run is of a function"):
        simdist.simulate(lambda rank: None, 4, schedule=token)


@pytest.mark.timeout(60)
def test_bad_arguments_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "fixed.py", FIXED)
    for call, message in [
        (lambda: sdt.run_script("missing.py", 2), r"script 'missing.py' does not exist"),
        (lambda: sdt.run_script("fixed.py", 0), r"nprocs=0 must be a positive int"),
        (lambda: sdt.run_script("fixed.py", 2, "--flag"), r"args='--flag' must be a sequence of str"),
        (lambda: sdt.run_script("fixed.py", 2, launch="mpirun"), r"launch='mpirun': expected one of"),
        (lambda: sdt.run_script("fixed.py", 2, workdir="nowhere"), r"workdir=.*nowhere' is not a folder"),
        (lambda: sdt.run_script("fixed.py", 2, module=True), r"-m fixed.py: no module named"),
        (lambda: sdt.explore_script("fixed.py", 2, max_runs=0), r"max_runs=0 must be a positive int"),
        (lambda: sdt.explore_script("fixed.py", 2, strategy="bfs"), r"strategy='bfs'"),
    ]:
        with pytest.raises((ValueError, TypeError), match=message):
            call()


def test_a_scratch_copy_is_put_back_as_it_was_before_each_run(tmp_path, monkeypatch):
    source = tmp_path / "job"
    (source / "data").mkdir(parents=True)
    (source / "data" / "x.txt").write_text("x")
    (source / "keep.txt").write_text("keep")
    (source / "link").symlink_to("data/x.txt")
    os.mkfifo(source / "pipe")  # not copied (reading it would block)
    (source / ".git" / "objects").mkdir(parents=True)  # linked, not copied: a run reads it, does not write it
    (source / "venv").mkdir()
    (source / "venv" / "pyvenv.cfg").write_text("home = /usr/bin")
    for i in range(5):
        (source / ".git" / "objects" / f"o{i}").write_text("o")
    with Scratch(source) as scratch:
        copy = Path(scratch.path)
        assert copy.name == "job" and sorted(os.listdir(copy)) == [".git", "data", "keep.txt", "link", "venv"]
        assert os.readlink(copy / ".git") == str(source / ".git") and (copy / "venv").is_symlink()
        (copy / "keep.txt").write_text("changed")
        (copy / "data" / "x.txt").unlink()
        (copy / "ckpt").mkdir()
        (copy / "ckpt" / "step1.pt").write_text("new")
        (copy / "new.txt").write_text("new")
        os.unlink(copy / "link")
        os.symlink("keep.txt", copy / "link")
        scratch.reset()
        assert sorted(os.listdir(copy)) == [".git", "data", "keep.txt", "link", "venv"]
        assert (copy / "keep.txt").read_text() == "keep" and (copy / "data" / "x.txt").read_text() == "x"
        assert os.readlink(copy / "link") == "data/x.txt"
        same = (copy / "keep.txt").stat().st_ino
        scratch.reset()  # nothing changed: nothing copied again
        assert (copy / "keep.txt").stat().st_ino == same
    assert not copy.exists() and (source / "keep.txt").read_text() == "keep"
    monkeypatch.setattr("simdist.testing._workdir.MAX_FILES", 6)  # the 7 entries of .git are not counted
    Scratch(source).close()
    monkeypatch.setattr("simdist.testing._workdir.MAX_FILES", 3)
    with pytest.raises(ValueError, match=r"workdir=.*job' holds more than 3 entries"):
        Scratch(source)


@pytest.mark.timeout(120)
def test_ranks_run_as_threads_with_a_notice_where_processes_cannot_be_had(tmp_path):
    """As on macOS (no pidfd): a student's first command runs, saying what differs, instead of failing."""
    _write(tmp_path, "who.py", WHO)
    code = (
        "import os, sys; del os.pidfd_open\n"
        "from simdist.launch.run import main\n"
        "sys.exit(main(['--backend', 'sim', '--nproc-per-node', '2', 'who.py']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    notices = [line for line in done.stderr.splitlines() if "need Linux" in line]
    assert len(notices) == 1 and "run as threads of one process" in notices[0], done.stderr
    assert {line.split("pid ")[1].split()[0] for line in done.stdout.splitlines() if "pid" in line} == {
        str(int(done.stdout.split("pid ")[1].split()[0]))
    }  # one process: the ranks are threads
    refused = subprocess.run(
        [sys.executable, "-c", code.replace("'2', ", "'2', '--isolation', 'processes', ")],
        cwd=tmp_path, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert refused.returncode == 2 and "--isolation processes needs Linux (pidfd)" in refused.stderr


SCRIPT_TESTS = """
import simdist.testing as sdt

def test_race():
    sdt.explore_script("race.py", 3, isolation="threads")

def test_fixed():
    summary = sdt.explore_script("fixed.py", 3, isolation="threads")
    print("RUNS", summary.runs)

def test_once():
    res = sdt.run_script("fixed.py", 3, isolation="threads")
    print("VALUES", [v.stdout for v in res.values], res.schedule)
"""


@pytest.mark.timeout(180)
def test_a_script_is_tested_in_a_few_lines_of_pytest_and_the_plugins_options_apply(pytester):
    pytester.makefile(".py", race=RACE, fixed=FIXED)
    pytester.makepyfile(test_scripts=SCRIPT_TESTS)
    first = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "0", "-s", "--simdist-max-schedules", "7")
    out = first.stdout.str()
    assert "RUNS 7" in out and "1 failed, 2 passed" in out, out
    token = next(
        line.split("replay token: ")[1].strip() for line in out.splitlines() if "replay token: choices" in line
    )
    assert token.endswith("@world=3@script=race.py@test=test_scripts.py::test_race"), token
    again = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "0", "-s", "test_scripts.py::test_race", "--simdist-replay", token
    )
    assert again.ret == 1 and "arrival order [2, 1]" in again.stdout.str() and token in again.stdout.str()
    elsewhere = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "0", "-s", "test_scripts.py::test_once", "--simdist-replay", token
    )
    assert elsewhere.ret == 1 and "was made for the test test_scripts.py::test_race" in elsewhere.stdout.str()
