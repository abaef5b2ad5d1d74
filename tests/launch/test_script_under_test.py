"""A training script under test from the command line: ``simdist run --backend sim`` with seeds, replay tokens and
traces, and ``simdist test`` exploring its schedules.

The scripts are plain ``torch.distributed`` programs, run as a user types the commands (the console script in a
subprocess where the whole command matters, ``simdist.launch.run.main`` in this process where it is faster).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from scripts_under_test import FIXED, RACE
from test_run_cli import _console_script

import simdist
from simdist.launch import run
from simdist.launch._test_command import main as simdist_test


# Each rank saves a checkpoint in the working directory and refuses to start where one is left: a run that sees
# another run's files fails.
CHECKPOINTS = """\
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
assert not os.path.exists(f"ckpt{r}.pt"), f"rank {r} found a checkpoint of another run"
t = torch.tensor([float(r)])
dist.all_reduce(t)
torch.save(t, f"ckpt{r}.pt")
dist.destroy_process_group()
"""

# The same race in a script that starts its own ranks, as the "Writing distributed applications" lesson does.
SPAWN_RACE = """\
import torch, torch.distributed as dist, torch.multiprocessing as mp

def worker(rank, world):
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method="tcp://127.0.0.1:29511")
    if rank == 0:
        got = []
        for _ in range(world - 1):
            t = torch.zeros(1); dist.recv(t); got.append(int(t.item()))
        assert got == sorted(got), f"arrival order {got}"
        print("order ok", got)
    else:
        dist.send(torch.tensor([float(rank)]), dst=0)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(3,), nprocs=3)
    print("parent done")
"""


def _script(folder: Path, text: str, name: str) -> str:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return name


def _token(err: str) -> str:
    return re.findall(r"replay token: (\S+)", err)[-1]


@pytest.mark.timeout(180)
def test_simdist_test_finds_the_race_and_the_command_it_prints_reproduces_it_in_both_isolations(tmp_path):
    """The whole command as a user types it, ranks as processes (the default for scripts)."""
    _script(tmp_path, RACE, "race.py")
    exe = _console_script()
    found = subprocess.run(
        [exe, "test", "--nproc-per-node", "4", "--schedules", "200", "race.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert found.returncode == 1, found.stdout + found.stderr
    report = found.stderr
    failure = re.search(r"AssertionError: (arrival order \[[\d, ]+\])", report)
    assert failure is not None and 'race.py", line 8' in report, report  # the user's line in the traceback
    assert "schedule shrunk from" in report and "race.py:7" in report  # the decision at the receive's line
    (command,) = [line.removeprefix("replay it: ") for line in report.splitlines() if line.startswith("replay it: ")]
    words = shlex.split(command)
    assert words[:6] == ["simdist", "run", "--backend", "sim", "--nproc-per-node", "4"] and words[-1] == "race.py"
    token = words[words.index("--replay") + 1]
    assert token.endswith("@world=4@script=race.py") and f"replay token: {token}" in report
    for isolation in ("processes", "threads"):
        replayed = subprocess.run(
            [exe, *words[1:-1], "--isolation", isolation, "race.py"],
            cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert replayed.returncode == 1, (isolation, replayed.stderr)
        assert f"AssertionError: {failure[1]}" in replayed.stderr and f"replay token: {token}" in replayed.stderr
    assert sorted(os.listdir(tmp_path)) == ["race.py"]  # the exploration's runs wrote nothing here


@pytest.mark.timeout(120)
def test_the_fixed_script_passes_200_schedules(tmp_path, monkeypatch, capfd):
    _script(tmp_path, FIXED, "fixed.py")
    monkeypatch.chdir(tmp_path)
    assert simdist_test(["--nproc-per-node", "4", "--schedules", "200", "--isolation", "threads", "fixed.py"]) == 0
    out = capfd.readouterr().out
    assert re.fullmatch(r"simdist test: 200 runs \(pct\), \d+ distinct interleavings, no failure \([\d.]+ s\)\n", out)
    assert int(re.search(r"(\d+) distinct", out)[1]) > 20  # the schedules differ: the search did search
    # the same script with the race, same flags: found
    _script(tmp_path, RACE, "race.py")
    assert simdist_test(["--nproc-per-node", "4", "--schedules", "200", "--isolation", "threads", "race.py"]) == 1
    assert "arrival order" in capfd.readouterr().err


@pytest.mark.timeout(120)
def test_seeds_give_different_outcomes_and_a_token_replays_the_same_failure_output_and_trace(
    tmp_path, monkeypatch, capfd
):
    monkeypatch.chdir(tmp_path)
    _script(tmp_path, RACE, "race.py")
    outcomes = {}
    for seed in range(8):
        status = run.main(
            ["--backend", "sim", "--nproc-per-node", "4", "--isolation", "threads", "--seed", str(seed), "race.py"]
        )
        out, err = capfd.readouterr()
        assert f"replay token: random:{seed}@world=4@script=race.py" in err
        outcomes[seed] = (status, re.findall(r"arrival order \[[\d, ]+\]|order ok \[[\d, ]+\]", out + err)[0])
    assert {status for status, _ in outcomes.values()} == {0, 1}, outcomes  # some seeds pass, some fail
    assert len({what for _, what in outcomes.values()}) >= 3, outcomes  # several arrival orders
    failing = next(seed for seed, (status, _) in outcomes.items() if status == 1)
    run.main(["--backend", "sim", "--nproc-per-node", "4", "--seed", str(failing), "race.py"])
    token = _token(capfd.readouterr().err)
    seen = []
    for i, isolation in enumerate(["processes", "processes", "threads"]):
        trace = tmp_path / f"run{i}.json"
        args = ["--backend", "sim", "--nproc-per-node", "4", "--isolation", isolation]
        assert run.main([*args, "--replay", token, "--trace", str(trace), "race.py"]) == 1
        out, err = capfd.readouterr()
        rows = json.loads(trace.read_text())
        seen.append((out, err.replace(str(trace), "TRACE"), rows["events"], rows["meta"]["schedule"]))
    assert seen[0] == seen[1] == seen[2], "a token replays the same output lines, failure and trace rows"
    assert outcomes[failing][1] in seen[0][1] and seen[0][3] == token
    assert len(seen[0][2]) > 0


@pytest.mark.timeout(60)
def test_a_scripts_trace_loads_with_the_scripts_own_call_sites_and_its_virtual_time_is_printed(
    tmp_path, monkeypatch, capfd
):
    from simdist.visualize import load_traces, summarize

    monkeypatch.chdir(tmp_path)
    _script(tmp_path, FIXED, "fixed.py")
    args = ["--backend", "sim", "--nproc-per-node", "3", "--seed", "4", "--topology", "ring", "--detail", "collectives"]
    assert run.main([*args, "--trace", "run.json", "fixed.py"]) == 0
    err = capfd.readouterr().err
    said = re.search(r"3 ranks finished in ([\d.]+) (s|ms|µs|ns) of virtual time; replay token: (\S+)", err)
    assert said is not None and said[3] == "random:4@world=3@script=fixed.py", err
    trace = simdist.Trace.load(tmp_path / "run.json")
    scale = {"s": 1, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}[said[2]]
    assert trace.duration() == pytest.approx(float(said[1]) * scale, rel=1e-3)
    sites = {e.call_site for e in trace.events if e.call_site}
    assert sites and all(site.startswith(str(tmp_path / "fixed.py") + ":") for site in sites), sites
    assert {e.kind for e in trace.events} >= {"send", "recv"} and {e.rank for e in trace.events} == {0, 1, 2}
    loaded = load_traces([("run.json", (tmp_path / "run.json").read_bytes())])  # as the app's Traces page reads it
    assert not loaded.problems and summarize(loaded.trace).ranks == 3
    assert run.main([*args, "--trace", "run.perfetto.json", "--trace-format", "perfetto", "fixed.py"]) == 0
    chrome = json.loads((tmp_path / "run.perfetto.json").read_text())
    assert {e["tid"] for e in chrome["traceEvents"]} == {0, 1, 2} and "Perfetto" in capfd.readouterr().err


@pytest.mark.timeout(60)
def test_bad_flags_are_usage_errors_naming_the_value(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _script(tmp_path, FIXED, "fixed.py")
    _script(tmp_path, FIXED, "other.py")
    token = "choices:0,1@world=4@script=fixed.py"
    sim = ["--backend", "sim", "--nproc-per-node", "4"]
    cases = [
        (run.main, [*sim, "--replay", "choices:zz!", "fixed.py"], "--replay 'choices:zz!' is not a replay token"),
        (run.main, [*sim, "--replay", "random:1@world=x", "fixed.py"], "is not a replay token"),
        (run.main, ["--backend", "sim", "--nproc-per-node", "3", "--replay", token, "fixed.py"], "made for a job of 4 ranks, and this one has 3"),
        (run.main, [*sim, "--replay", token, "other.py"], "made for the script 'fixed.py', not for 'other.py'"),
        (run.main, [*sim, "--replay", token, "--seed", "3", "fixed.py"], "cannot be combined with --seed"),
        (run.main, [*sim, "--seed", "-1", "fixed.py"], "'-1' is not a seed"),
        (run.main, [*sim, "--strategy", "exhaustive", "fixed.py"], "invalid choice: 'exhaustive'"),
        (run.main, [*sim, "--topology", "nowhere.json", "fixed.py"], "--topology 'nowhere.json' is neither"),
        (run.main, [*sim, "--trace", str(tmp_path), "fixed.py"], "is a folder"),
        (run.main, [*sim, "--trace-format", "perfetto", "fixed.py"], "give --trace FILE"),
        (run.main, ["--nproc-per-node", "2", "--seed", "3", "fixed.py"], "--seed is supported with --backend sim only"),
        (run.main, ["--nproc-per-node", "2", "--replay", token, "fixed.py"], "--replay is supported with --backend sim only"),
        (simdist_test, ["--schedules", "0", "fixed.py"], "'0' is not a number of schedules"),
        (simdist_test, ["--strategy", "round_robin", "fixed.py"], "invalid choice: 'round_robin'"),
        (simdist_test, ["--backend", "gloo", "fixed.py"], "leave out --backend gloo"),
        (simdist_test, ["--workdir", "nowhere", "fixed.py"], "--workdir 'nowhere' is not a folder"),
        (simdist_test, ["--max-restarts", "1", "fixed.py"], "--max-restarts 1: simdist test reports"),
        (simdist_test, ["missing.py"], "script 'missing.py' does not exist"),
    ]  # fmt: skip
    for main, argv, said in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and said in err, (argv, err)


@pytest.mark.timeout(120)
def test_each_run_starts_from_the_same_files_and_the_folder_is_left_as_it_was(tmp_path, monkeypatch, capfd):
    """Checkpoints of one schedule do not leak into the next; --check runs where the job's files are."""
    monkeypatch.chdir(tmp_path)
    _script(tmp_path, CHECKPOINTS, "ckpt.py")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "input.txt").write_text("kept")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    check = f"{shlex.quote(sys.executable)} -c \"import os; assert sorted(os.listdir()) == ['ckpt.py', 'ckpt0.pt', 'ckpt1.pt', 'data']\""
    argv = ["--nproc-per-node", "2", "--schedules", "30", "--isolation", "threads", "--check", check, "ckpt.py"]
    assert simdist_test(argv) == 0, capfd.readouterr().err
    assert "30 runs" in capfd.readouterr().out
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    failing = ["--nproc-per-node", "2", "--schedules", "5", "--isolation", "threads", "--check", "exit 3", "ckpt.py"]
    assert simdist_test(failing) == 1
    err = capfd.readouterr().err
    assert "CheckError" in err and "--check 'exit 3'" in err and "exited with status 3" in err, err
    assert "then, in the job's working directory: exit 3" in err
    # the same script run twice in the folder itself (as torchrun would): the second run sees the first's files
    assert run.main(["--backend", "sim", "--nproc-per-node", "2", "--isolation", "threads", "ckpt.py"]) == 0
    assert run.main(["--backend", "sim", "--nproc-per-node", "2", "--isolation", "threads", "ckpt.py"]) == 1
    assert "found a checkpoint of another run" in capfd.readouterr().err


@pytest.mark.timeout(180)
@pytest.mark.parametrize("isolation", ["threads", "processes"])
def test_a_script_that_starts_its_own_ranks_is_seeded_replayed_and_explored(tmp_path, monkeypatch, capfd, isolation):
    monkeypatch.chdir(tmp_path)
    _script(tmp_path, SPAWN_RACE, "lesson.py")
    sim = ["--backend", "sim", "--nproc-per-node", "3", "--isolation", isolation]
    statuses = {}
    for seed in range(6):
        statuses[seed] = run.main([*sim, "--seed", str(seed), "lesson.py"])
        out, err = capfd.readouterr()
        assert f"random:{seed}@world=3@script=lesson.py" in err
        assert ("parent done" in out) == (statuses[seed] == 0)
    assert set(statuses.values()) == {0, 1}, statuses
    assert simdist_test(["--nproc-per-node", "3", "--schedules", "60", "--isolation", isolation, "lesson.py"]) == 1
    err = capfd.readouterr().err
    token = _token(err)
    assert "arrival order" in err and token.startswith("choices:") and token.endswith("@script=lesson.py")
    for _ in range(2):
        assert run.main([*sim, "--replay", token, "--trace", "spawned.json", "lesson.py"]) == 1
        assert "arrival order" in capfd.readouterr().err
    trace = simdist.Trace.load(tmp_path / "spawned.json")
    assert {e.rank for e in trace.events} == {0, 1, 2} and trace.meta["schedule"] == token


@pytest.mark.timeout(120)
def test_simdist_test_draws_a_progress_line_on_a_terminal_and_none_in_a_pipe(tmp_path):
    import pty

    _script(tmp_path, FIXED, "fixed.py")
    argv = [
        _console_script(),
        "test",
        "--nproc-per-node",
        "2",
        "--schedules",
        "20",
        "--isolation",
        "threads",
        "fixed.py",
    ]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the terminal
        os.chdir(tmp_path)
        os.execv(argv[0], argv)
    said = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the terminal closed with the child
            break
        if not chunk:
            break
        said += chunk
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    text = said.decode()
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert "\rsimdist explore: 20/20 runs" in text and "simdist test: 20 runs (pct)" in text, text
    piped = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert piped.returncode == 0 and "\r" not in piped.stdout + piped.stderr


@pytest.mark.timeout(120)
def test_a_failure_that_does_not_replay_is_reported_as_such(tmp_path, monkeypatch, capfd):
    """The script fails on its first run only, keeping count in a file outside the folder the runs start in."""
    count = tmp_path / "outside" / "runs"
    count.parent.mkdir()
    job = tmp_path / "job"
    job.mkdir()
    _script(job, FIRST_RUN_FAILS.replace("COUNT", repr(str(count))), "once.py")
    monkeypatch.chdir(job)
    assert simdist_test(["--nproc-per-node", "2", "--isolation", "threads", "once.py"]) == 1
    err = capfd.readouterr().err
    assert "a run failed, and its replay did not fail the same way" in err and "depends on state outside" in err, err
    assert "replay it:" not in err


FIRST_RUN_FAILS = """\
import os, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    runs = int(open(COUNT).read()) if os.path.exists(COUNT) else 0
    open(COUNT, "w").write(str(runs + 1))
    assert runs > 0, "the first run fails"
dist.destroy_process_group()
"""
