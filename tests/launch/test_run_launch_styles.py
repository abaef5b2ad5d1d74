"""``simdist run --backend sim`` for both launch styles: torchrun scripts and scripts that start their own ranks.

A script whose source calls ``torch.multiprocessing.spawn`` (or starts ``multiprocessing.Process``
ranks) runs once, as ``python script.py`` would, on a node of ``--nproc-per-node`` simulated GPUs,
and each spawn (or the processes it starts) becomes simulated ranks; any other script runs on
every rank (torchrun style). Runs go through subprocesses, as a user
would start them; argument errors are checked in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from simdist.launch import run
from simdist.testing._script import spawn_line

pytestmark = [pytest.mark.timeout(300), pytest.mark.torch_release]  # CI: lowest priority, beside the main suite

SPAWN_STYLE = """\
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

seen = []  # a module global: each spawned rank imports this file again and has its own


def train(rank, world_size, tag):
    seen.append(rank)
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "29533"
    torch.cuda.set_device(rank)
    init_process_group("nccl", rank=rank, world_size=world_size)
    model = DDP(torch.nn.Linear(2, 1).to(rank), device_ids=[rank])
    model(torch.ones(3, 2).to(rank)).sum().backward()
    total = torch.tensor([rank + 1.0]).cuda()
    dist.all_reduce(total)
    print(f"{tag} rank={rank} gpu={torch.cuda.current_device()}/{torch.cuda.device_count()} "
          f"sum={total.item():g} seen={seen} omp={os.environ.get('OMP_NUM_THREADS')} "
          f"inherited={os.environ.get('FROM_PARENT')} RANK={os.environ.get('RANK')}")
    destroy_process_group()


if __name__ == "__main__":
    n_gpus = torch.cuda.device_count()
    print(f"parent: {n_gpus} GPUs available={torch.cuda.is_available()} "
          f"omp={os.environ.get('OMP_NUM_THREADS')} argv={sys.argv[1:]}")
    os.environ["FROM_PARENT"] = "yes"
    mp.spawn(train, args=(n_gpus, "all"), nprocs=n_gpus, join=True)
    mp.spawn(train, args=(n_gpus // 2, "half"), nprocs=n_gpus // 2)
    print(f"parent: done, MASTER_PORT={os.environ.get('MASTER_PORT')}")
"""

TORCHRUN_STYLE = """\
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp  # imported, never called: still a torchrun script

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
rank = dist.get_rank()
path = os.path.join(os.environ["CKPT_DIR"], "snapshot.pt")
if rank == 0:
    torch.save({"w": torch.full((2,), 3.0).cuda()}, path)
dist.barrier()
w = torch.load(path, map_location=f"cuda:{local}")["w"]
print(f"rank={rank} local={local} gpu={torch.cuda.current_device()}/{torch.cuda.device_count()} "
      f"w={w.tolist()} omp={os.environ.get('OMP_NUM_THREADS')}")
dist.destroy_process_group()
"""


def _script(tmp_path: Path, text: str, name: str = "script.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _simdist_run(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT")}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "simdist.run", "--backend", "sim", "--cuda-as-cpu", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=full,
        cwd=cwd,
    )


def test_a_spawn_script_runs_once_as_the_parent_and_its_spawns_become_ranks(tmp_path: Path) -> None:
    proc = _simdist_run("--nproc-per-node", "4", _script(tmp_path, SPAWN_STYLE), "--flag")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0] == "parent: 4 GPUs available=True omp=1 argv=['--flag']"
    assert out[-1] == "parent: done, MASTER_PORT=None"  # the ranks' environments are their own
    for rank in range(4):
        assert (
            f"[rank {rank}] all rank={rank} gpu={rank}/4 sum=10 seen=[{rank}] omp=1 inherited=yes RANK=None" in out
        ), out
    for rank in range(2):  # the node keeps its 4 GPUs when a spawn starts 2 ranks
        assert f"[rank {rank}] half rank={rank} gpu={rank}/4 sum=3 seen=[{rank}] omp=1 inherited=yes RANK=None" in out
    assert len(out) == 2 + 4 + 2


def test_a_torchrun_script_runs_on_every_rank_of_every_node(tmp_path: Path) -> None:
    proc = _simdist_run(
        "--nnodes", "2", "--nproc-per-node", "2", _script(tmp_path, TORCHRUN_STYLE), env={"CKPT_DIR": str(tmp_path)}
    )
    assert proc.returncode == 0, proc.stderr
    for rank in range(4):
        local = rank % 2
        assert f"[rank {rank}] rank={rank} local={local} gpu={local}/2 w=[3.0, 3.0] omp=1" in proc.stdout, proc.stdout


def test_a_spawn_reached_on_a_rank_says_what_to_do(tmp_path: Path) -> None:
    proc = _simdist_run("--launch", "torchrun", "--nproc-per-node", "2", _script(tmp_path, SPAWN_STYLE))
    assert proc.returncode == 1
    assert "simdist: torch.multiprocessing.spawn was called on simulated rank" in proc.stderr, proc.stderr
    assert "--launch spawn" in proc.stderr

    lambdas = _script(
        tmp_path,
        """\
        import torch.multiprocessing as mp
        if __name__ == "__main__":
            mp.spawn(lambda rank: None, nprocs=2)
        """,
        "lambdas.py",
    )
    proc = _simdist_run(lambdas)
    assert proc.returncode == 1 and "simdist: torch.multiprocessing.spawn got <function <lambda>" in proc.stderr
    assert "define it at module level" in proc.stderr, proc.stderr

    unjoined = _script(
        tmp_path,
        """\
        from torch.multiprocessing import start_processes
        def work(rank):
            pass
        if __name__ == "__main__":
            start_processes(work, nprocs=2, join=False)
        """,
        "unjoined.py",
    )
    proc = _simdist_run(unjoined)
    assert proc.returncode == 1
    assert "simdist: torch.multiprocessing.start_processes(join=False) cannot be simulated" in proc.stderr


def test_a_failing_spawned_rank_fails_the_run(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """\
        import sys
        import torch.multiprocessing as mp
        def work(rank):
            if rank == 1:
                raise KeyError("lost")
            print("rank", rank, "fine")
        if __name__ == "__main__":
            mp.spawn(work, nprocs=2)
            print("not reached")
        """,
    )
    proc = _simdist_run(script)
    assert proc.returncode == 1 and "not reached" not in proc.stdout
    assert "KeyError: 'lost'" in proc.stderr and "rank 1" in proc.stderr, proc.stderr


def test_the_fork_start_method_calls_the_parents_function(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """\
        import torch
        from torch.multiprocessing import start_processes
        def work(rank, word):
            print(word, rank, SET_BY_THE_PARENT, torch.cuda.device_count())  # fork: the parent's globals
        if __name__ == "__main__":
            SET_BY_THE_PARENT = "parent's"
            start_processes(work, args=("forked",), nprocs=3, start_method="fork")
        """,
    )
    proc = _simdist_run("--nproc-per-node", "3", "--no-prefix", script)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [f"forked {r} parent's 3" for r in range(3)]


# "Writing distributed applications" style: the ranks are multiprocessing.Process objects the script starts.
PROCESS_STYLE = """\
import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, size):
    t = torch.tensor([float(rank + 1)])
    if {deadlock}:
        dist.recv(t, src=(rank + 1) % size)  # every rank receives first: a cycle
    dist.all_reduce(t)
    print(f"rank={{rank}} sum={{t.item():g}} engine={{type(dist.group.WORLD).__name__}}", flush=True)


def init_process(rank, size, fn, backend="gloo"):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = os.environ.get("PORT_FOR_TEST", "29500")
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    size = 3
    processes = []
    mp.set_start_method("spawn")
    for rank in range(size):
        p = mp.Process(target=init_process, args=(rank, size, run))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    print("parent: exit codes", [p.exitcode for p in processes], "start method", mp.get_start_method())
"""


def test_a_script_that_starts_process_ranks_runs_them_as_simulated_ranks(tmp_path: Path) -> None:
    proc = _simdist_run(_script(tmp_path, PROCESS_STYLE.format(deadlock=False)))
    assert proc.returncode == 0, proc.stderr
    for rank in range(3):
        assert f"[rank {rank}] rank={rank} sum=6 engine=BridgeGroup" in proc.stdout, proc.stdout
    assert "parent: exit codes [0, 0, 0] start method spawn" in proc.stdout
    assert os.environ.get("MASTER_PORT") is None


def test_a_deadlock_among_process_ranks_is_reported_with_its_lines(tmp_path: Path) -> None:
    proc = _simdist_run(_script(tmp_path, PROCESS_STYLE.format(deadlock=True), "ring.py"))
    assert proc.returncode == 1
    assert "DeadlockError" in proc.stderr and "ring.py:10" in proc.stderr, proc.stderr
    assert "parent: exit codes" not in proc.stdout


@pytest.mark.timeout(330)
def test_process_ranks_of_a_script_get_the_bridge_on_real_processes(tmp_path: Path) -> None:
    """On the socket backend the Process ranks are real processes; their torch groups are the bridge's."""
    from simdist.core import free_port

    script = _script(tmp_path, PROCESS_STYLE.format(deadlock=False))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env["PORT_FOR_TEST"] = str(free_port())
    proc = subprocess.run(
        [sys.executable, "-m", "simdist.run", "--backend", "socket", script],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in range(3):
        assert f"rank={rank} sum=6 engine=BridgeGroup" in proc.stdout, proc.stdout + proc.stderr
    assert "parent: exit codes [0, 0, 0] start method spawn" in proc.stdout


def test_launch_arguments_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in (
        "--launch {auto,torchrun,spawn}",
        "--cuda-as-cpu",
        "runs once, as 'python script.py' would",
        "torch.multiprocessing.spawn",
    ):
        assert words in text, words
    spawner = _script(tmp_path, SPAWN_STYLE)
    for bad, words in (
        (["--launch", "spawn", spawner], "--launch spawn is supported with --backend sim only"),
        (["--cuda-as-cpu", spawner], "--cuda-as-cpu is supported with --backend sim only"),
        (["--launch", "elsewhere", spawner], "invalid choice: 'elsewhere'"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            run.main(bad)
        assert exit_info.value.code == 2 and words in capsys.readouterr().err
    assert run.main(["--backend", "sim", "--nnodes", "2", spawner]) == 2
    assert "--nnodes=2 is not supported for it" in capsys.readouterr().err


@pytest.mark.parametrize(("n", "preset", "expected"), [(2, None, "1"), (2, "3", "3"), (1, None, "None")])
def test_omp_num_threads_as_torchrun_sets_it(
    tmp_path: Path,
    capfd: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    n: int,
    preset: str | None,
    expected: str,
) -> None:
    script = _script(tmp_path, "import os\nprint('omp', os.environ.get('OMP_NUM_THREADS'))\n")
    if preset is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", preset)
    for backend in ("socket", "sim"):
        assert run.main(["--backend", backend, "--nproc-per-node", str(n), script]) == 0
        out = capfd.readouterr().out
        assert out.count(f"omp {expected}") == n, (backend, out)
    assert os.environ.get("OMP_NUM_THREADS") == preset


SPAWN_CALLS = [
    ("import torch.multiprocessing as mp\nmp.spawn(f, nprocs=2)\n", 2),
    ("import torch.multiprocessing\n\ntorch.multiprocessing.spawn(f)\n", 3),
    ("import torch\ndef main():\n    torch.multiprocessing.start_processes(f)\n", 3),
    ("from torch import multiprocessing as tmp\ntmp.spawn(f)\n", 2),
    ("from torch.multiprocessing import spawn as go\ngo(f)\n", 2),
    ("import torch.multiprocessing as mp\nimport multiprocessing\nmultiprocessing.Process()\n", 3),
    ("import torch.multiprocessing as mp\n\nmp.Process(target=f).start()\n", 3),
    ("from multiprocessing import Process\nProcess(target=f)\n", 2),
    ("import multiprocessing as m\nctx = m.get_context('spawn')\nctx.Process(target=f)\n", 3),
    ("import torch.multiprocessing as mp\nmp.get_context('spawn').Process(target=f)\n", 2),
    ("import os\nos.Process()\n", None),
    ("import multiprocessing as mp\nmp.spawn(f)\n", None),
    ("import torch.multiprocessing as mp\n", None),
    ("def broken(:\n", None),
]


@pytest.mark.parametrize(("source", "line"), SPAWN_CALLS)
def test_the_spawn_call_is_found_by_reading_the_script(tmp_path: Path, source: str, line: int | None) -> None:
    assert spawn_line(_script(tmp_path, source)) == line


FOUR_GPU_SCRIPT = """
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
t = torch.ones(2, device=f"cuda:{rank}") * (rank + 1)
dist.all_reduce(t)
print(f"rank={rank} gpu={torch.cuda.current_device()}/{torch.cuda.device_count()} t={t.tolist()}")
dist.destroy_process_group()
"""

WITH_GPUS = (
    "import sys, torch\n"
    "torch.cuda.is_available = lambda: True\n"
    "gpus = int(sys.argv[1])\n"
    "torch.cuda.device_count = lambda: gpus\n"
    "from simdist.launch.run import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)
"""``simdist run`` on a machine whose torch reports CUDA with ``argv[1]`` GPUs."""


def _run_with_gpus(gpus: int, script: str, *flags: str) -> subprocess.CompletedProcess:
    """``simdist run --backend sim --nproc-per-node 4 script`` where the launcher's torch reports ``gpus`` CUDA devices."""
    argv = [sys.executable, "-c", WITH_GPUS, str(gpus), "--backend", "sim", "--nproc-per-node", "4", *flags, script]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.timeout(300)
def test_more_ranks_than_real_gpus_get_simulated_gpus_and_say_so_once(tmp_path: Path) -> None:
    script = _script(tmp_path, FOUR_GPU_SCRIPT)
    proc = _run_with_gpus(1, script)
    for rank in range(4):
        assert f"rank={rank} gpu={rank}/4 t=[10.0, 10.0]" in proc.stdout, proc.stdout
    notice = "--nproc-per-node 4 asks for 4 GPUs per node and this machine has 1: the ranks get simulated GPUs"
    assert proc.stderr.count(notice) == 1, proc.stderr
    assert "give --nproc-per-node 1 or fewer" in proc.stderr, proc.stderr


@pytest.mark.timeout(300)
def test_enough_real_gpus_are_the_ranks_own(tmp_path: Path) -> None:
    script = _script(tmp_path, "import torch\nprint('gpus', torch.cuda.device_count())\n")
    proc = _run_with_gpus(8, script, "--isolation", "threads")
    assert proc.stdout.count("gpus 8") == 4, proc.stdout  # the machine's (stubbed) 8, not a simulated node of 4
    assert "simulated GPUs" not in proc.stderr, proc.stderr
    # rank processes have the machine's own torch.cuda (the stub is the launcher's alone): not a simulated node
    real = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                          capture_output=True, text=True, timeout=120).stdout.strip()  # fmt: skip
    proc = _run_with_gpus(8, script)
    assert proc.stdout.count(f"gpus {real}") == 4, proc.stdout
    assert "simulated GPUs" not in proc.stderr, proc.stderr
