"""``simdist run``: the torchrun-style launcher, on real processes and on the simulator.

Launches that need no torch in the ranks run ``simdist.run.main`` in this process (fast);
the command-line entry points (``python -m simdist.run``, the ``simdist`` console script)
run as subprocesses.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from simdist.backends.socket._auth import new_secret
from simdist.core import free_port

from simdist.launch import run

ALL_REDUCE = """\
import sys
import torch
import simdist as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank={rank} world={world} sum={int(t.item())} argv={sys.argv[1:]}")
dist.destroy_process_group()
"""

# Every rank but 1 records its pid and the pid of a child it started, then sleeps;
# rank 1 waits for those records and then fails (exit code 3 or SIGKILL).
FAILING = """\
import os, signal, subprocess, sys, time

rank, folder, how = int(os.environ["RANK"]), sys.argv[1], sys.argv[2]
world = int(os.environ["WORLD_SIZE"])
if rank == 1:
    others = [r for r in range(world) if r != 1]
    deadline = time.monotonic() + 20
    while not all(os.path.exists(os.path.join(folder, f"pids{r}")) for r in others):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    print("rank 1 gives up", flush=True)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(3)
child = subprocess.Popen(["sleep", "60"])
with open(os.path.join(folder, f"tmp{rank}"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
os.rename(os.path.join(folder, f"tmp{rank}"), os.path.join(folder, f"pids{rank}"))
time.sleep(60)
"""

DEADLOCK = """\
import torch
import simdist as dist

dist.init_process_group("gloo")
t = torch.zeros(1)
dist.recv(t, src=1 - dist.get_rank())   # both ranks receive first: a cycle
"""

ENV = """\
import os, sys
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "SIMDIST_BACKEND")
print(" ".join(f"{k}={os.environ.get(k)}" for k in keys), "argv=" + ",".join(sys.argv[1:]))
print("to stderr", file=sys.stderr)
"""


def _script(tmp_path: Path, text: str, name: str = "script.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _ranks(out: str) -> set[int]:
    return {int(r) for r in re.findall(r"^\[rank (\d+)\] ", out, re.MULTILINE)}


def _check_all_reduce(out: str, world: int) -> None:
    expected = world * (world + 1) // 2
    for r in range(world):
        assert f"[rank {r}] rank={r} world={world} sum={expected} argv=['--flag', 'x']" in out, out
    assert _ranks(out) == set(range(world))


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for init to reap it counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.timeout(40)
def test_python_m_runs_three_processes(tmp_path: Path) -> None:
    script = _script(tmp_path, ALL_REDUCE)
    proc = subprocess.run(
        [sys.executable, "-m", "simdist.run", "--nproc-per-node", "3", script, "--flag", "x"],
        capture_output=True,
        text=True,
        timeout=35,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    _check_all_reduce(proc.stdout, 3)


@pytest.mark.timeout(40)
def test_console_script(tmp_path: Path) -> None:
    exe = _console_script()
    script = _script(tmp_path, ALL_REDUCE)
    proc = subprocess.run(
        [exe, "run", "--nproc_per_node", "2", script, "--flag", "x"],
        capture_output=True,
        text=True,
        timeout=35,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    _check_all_reduce(proc.stdout, 2)
    bad = subprocess.run([exe, "walk"], capture_output=True, text=True, timeout=35, check=False)
    assert bad.returncode == 2 and "unknown command 'walk'; expected one of: run" in bad.stderr


def _console_script() -> str:
    """The ``simdist`` console script of the environment running the tests (its bin/ may not be on PATH)."""
    here = Path(sys.executable).parent / ("simdist.exe" if os.name == "nt" else "simdist")
    exe = str(here) if here.exists() else shutil.which("simdist")
    if exe is None:
        pytest.skip("the simdist console script is not installed (pip install -e .)")
    return exe


@pytest.mark.timeout(60)
def test_version_and_help_list_the_commands() -> None:
    import simdist.run

    exe = _console_script()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=50, check=False)
    assert version.returncode == 0 and version.stdout == f"simdist {simdist.__version__}\n", version
    helped = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=50, check=False)
    assert helped.returncode == 0, helped.stderr
    listed = re.findall(r"^  (\w+)  +(\S.*)$", helped.stdout.split("commands:\n")[1].split("\n\n")[0], re.MULTILINE)
    assert dict(listed) == simdist.run.COMMANDS and all(len(summary) < 100 for _, summary in listed), helped.stdout
    bare = subprocess.run([exe], capture_output=True, text=True, timeout=50, check=False)
    assert bare.returncode == 2 and "a command is required" in bare.stderr


@pytest.mark.timeout(60)
def test_run_without_a_script_says_only_the_script_is_required() -> None:
    proc = subprocess.run(
        [_console_script(), "run", "--nproc-per-node", "2"], capture_output=True, text=True, timeout=50, check=False
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "simdist run: error: the following argument is required: script (the Python script to run)"
    )
    assert "script_args" not in proc.stderr


def test_help_of_simulate_shows_its_real_signature() -> None:
    import pydoc

    import simdist

    import simdist.sim

    text = pydoc.render_doc(simdist.simulate, renderer=pydoc.plaintext)
    assert "**options" not in text
    for option in ("seed", "strategy", "schedule", "detail", "topology", "eager_limit", "timeout", "leaks"):
        assert re.search(rf"simulate\(fn.*\b{option}: ", text), option  # in the signature line
        assert re.search(rf"^\s+{option}: ", text, re.MULTILINE), option  # and described under Args
    assert simdist.simulate is simdist.sim.simulate


@pytest.mark.timeout(20)
def test_sim_backend_runs_the_same_script(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    script = _script(tmp_path, ALL_REDUCE)
    main_before, argv_before, environ_before = sys.modules["__main__"], sys.argv, os.environ
    assert run.main(["--backend", "sim", "--nproc-per-node", "3", script, "--flag", "x"]) == 0
    _check_all_reduce(capfd.readouterr().out, 3)
    assert sys.modules["__main__"] is main_before and sys.argv is argv_before and os.environ is environ_before
    assert "RANK" not in os.environ


@pytest.mark.timeout(20)
def test_sim_ranks_see_their_own_environment(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    script = _script(
        tmp_path, "import os\nos.environ['MINE'] = os.environ['RANK']\n" + ENV.replace('"SIMDIST_BACKEND")', '"MINE")')
    )
    assert run.main(["--backend", "sim", "--nproc-per-node", "2", "--nnodes", "2", script, "a"]) == 0
    out = capfd.readouterr().out
    for r in range(4):
        assert (
            f"[rank {r}] RANK={r} LOCAL_RANK={r % 2} WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 "
            f"MASTER_ADDR=127.0.0.1 MINE={r} argv=a" in out
        ), out
    assert "MINE" not in os.environ


@pytest.mark.timeout(20)
def test_sim_deadlock_is_reported(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    script = _script(tmp_path, DEADLOCK)
    assert run.main(["--backend", "sim", "--nproc-per-node", "2", script]) != 0
    err = capfd.readouterr().err
    assert "DeadlockError" in err and "wait-for cycle: 0 -> 1 -> 0" in err, err
    assert "script.py:6" in err  # the call site of each blocked rank


@pytest.mark.timeout(20)
def test_sim_script_exception_and_exit_code(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    boom = _script(tmp_path, "import os\nif os.environ['RANK'] == '1':\n    raise KeyError('boom')\n", "boom.py")
    assert run.main(["--backend", "sim", "--nproc-per-node", "2", boom]) == 1
    err = capfd.readouterr().err
    assert "KeyError: 'boom'" in err and "rank 1" in err
    exits = _script(tmp_path, "import sys, os\nsys.exit(int(os.environ['RANK']) * 4)\n", "exits.py")
    assert run.main(["--backend", "sim", "--nproc-per-node", "2", exits]) == 4


@pytest.mark.timeout(20)
def test_environment_args_and_prefixes(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    script = _script(tmp_path, ENV)
    assert run.main(["--nproc-per-node", "2", script, "--nproc-per-node", "7", "b"]) == 0
    out, err = capfd.readouterr()
    for r in range(2):
        assert (
            f"[rank {r}] RANK={r} LOCAL_RANK={r} WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "
            f"SIMDIST_BACKEND=socket argv=--nproc-per-node,7,b" in out
        ), out
        assert f"[rank {r}] to stderr" in err
    assert run.main(["--nproc-per-node", "2", "--no-prefix", script]) == 0
    out = capfd.readouterr().out
    assert "[rank" not in out and len(re.findall(r"^RANK=", out, re.MULTILINE)) == 2, out


@pytest.mark.timeout(20)
def test_log_dir_writes_one_file_per_rank(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    script = _script(tmp_path, ENV)
    logs = tmp_path / "logs"
    assert run.main(["--nproc-per-node", "2", "--log_dir", str(logs), script]) == 0
    assert "RANK=" not in capfd.readouterr().out
    assert sorted(os.listdir(logs)) == ["rank_0.log", "rank_1.log", "store_load.jsonl"]  # and the store's load
    for r in range(2):
        text = (logs / f"rank_{r}.log").read_text()
        assert f"RANK={r} LOCAL_RANK={r} WORLD_SIZE=2" in text and "to stderr" in text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["exit", "kill"])
def test_failing_rank_stops_the_others(tmp_path: Path, capfd: pytest.CaptureFixture, how: str) -> None:
    script = _script(tmp_path, FAILING)
    start = time.monotonic()
    status = run.main(["--nproc-per-node", "3", script, str(tmp_path), how])
    assert time.monotonic() - start < 20  # the sleepers were stopped, not waited for
    out, err = capfd.readouterr()
    assert "[rank 1] rank 1 gives up" in out, (status, out, err)
    if how == "exit":
        assert status == 3 and "rank 1 (local rank 1, pid" in err and "failed with exit code 3" in err, err
    else:
        assert status == 128 + 9 and "rank 1 (local rank 1, pid" in err and "killed by SIGKILL" in err, err
    assert "stopped rank(s) 0, 2" in err
    pids = [int(p) for r in (0, 2) for p in (tmp_path / f"pids{r}").read_text().split()]
    deadline = time.monotonic() + 30  # a killed grandchild may stay a zombie until init reaps it
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], "ranks or their children outlived the launcher"


@pytest.mark.timeout(45)
def test_two_nodes_form_one_job(tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two launchers (run in threads of this process) with the same secret make one world of 4."""
    script = _script(tmp_path, ALL_REDUCE)
    monkeypatch.setenv("SIMDIST_SECRET", new_secret())
    port, store_port = free_port(), free_port()  # the store's own: MASTER_PORT + 1 may be another's
    statuses: dict[int, int] = {}

    def node(k: int) -> None:
        statuses[k] = run.main(
            [
                "--nnodes",
                "2",
                "--node-rank",
                str(k),
                "--master-port",
                str(port),
                "--store-port",
                str(store_port),
                "--nproc-per-node",
                "2",
                "--timeout",
                "30",
                script,
                "--flag",
                "x",
            ]
        )

    threads = [threading.Thread(target=node, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert statuses == {0: 0, 1: 0}, capfd.readouterr().err
    _check_all_reduce(capfd.readouterr().out, 4)


@pytest.mark.timeout(20)
def test_several_nodes_need_a_shared_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script(tmp_path, ENV)
    monkeypatch.delenv("SIMDIST_SECRET", raising=False)
    with pytest.raises(SystemExit, match="needs the same SIMDIST_SECRET on every node"):
        run.main(["--nnodes", "2", "--nproc-per-node", "1", script])


@pytest.mark.timeout(20)
def test_help_and_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--nproc-per-node",
        "--nnodes",
        "--node-rank",
        "--master-addr",
        "--master-port",
        "--backend",
        "--log-dir",
        "--no-prefix",
        "--timeout",
    ):
        assert flag in text
    script = _script(tmp_path, ENV)
    for bad in (
        ["--nproc-per-node", "0", script],
        ["--nnodes", "2", "--node-rank", "2", script],
        ["missing.py"],
        ["--backend", "sim", "--log-dir", "x", script],
    ):
        with pytest.raises(SystemExit) as exit_info:
            run.main(bad)
        assert exit_info.value.code == 2


@pytest.mark.timeout(40)
def test_sigterm_to_the_launcher_stops_every_rank(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """\
        import os, sys, time
        path = os.path.join(sys.argv[1], f"pid{os.environ['RANK']}")
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(path + ".tmp", path)
        time.sleep(60)
        """,
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "simdist.run", "--nproc-per-node", "2", script, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"pid{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and launcher.poll() is None, launcher.communicate()
            time.sleep(0.05)
        launcher.terminate()
        _, err = launcher.communicate(timeout=15)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + 15 and "got SIGTERM; stopping every rank" in err, err
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
    assert not [p for p in pids if _alive(p)]
