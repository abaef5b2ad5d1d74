"""``simdist run`` is torchrun for real processes: unmodified ``torch.distributed`` scripts on every backend here.

Each launch is a fresh ``python -m simdist.run`` (the ranks are fresh interpreters too), so nothing
here depends on what this test process imported. What runs where (``simdist.run.ENGINES``):
without ``--backend``, torch code runs on the torch backend it names, as under torchrun;
``--backend socket`` runs it on simdist's socket backend through the torch bridge, with its
checks; ``--backend gloo`` runs simdist's API on torch's gloo; under ``nccl`` and ``torch-nccl``
torch code runs as it names (gloo here), while simdist's API there needs a GPU
(tests/gpu/test_run_gpu.py runs both kinds of script there).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from simdist.backends.socket import new_secret
from simdist.core import free_port

from simdist.launch import run

pytestmark = pytest.mark.timeout(300)  # CI runs these at the lowest priority beside the main suite
BRIDGE = pytest.mark.torch_release  # runs torch code through the bridge: on every torch release CI tests

# torch.distributed, unchanged: the default group, a subgroup, point to point, and what engine it got.
TORCH_SCRIPT = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
evens = dist.new_group([r for r in range(world) if r % 2 == 0])
e = torch.tensor([float(rank)])
if rank % 2 == 0:
    dist.all_reduce(e, group=evens)
got = torch.zeros(1)
if rank == 0:
    dist.send(torch.tensor([42.0]), dst=world - 1)
elif rank == world - 1:
    dist.recv(got, src=0)
engine = type(dist.group.WORLD).__name__
print(f"rank={rank} world={world} sum={t.item()} evens={e.item()} got={got.item()} "
      f"backend={dist.get_backend()} engine={engine} master_port={os.environ['MASTER_PORT']}")
dist.destroy_process_group()
"""

# A script that makes the job's TCPStore itself at MASTER_ADDR:MASTER_PORT, as torch's own examples do.
OWN_STORE = """\
import os
from datetime import timedelta
import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
                      timeout=timedelta(seconds=30))
store.set(f"hello{rank}", str(rank * 10))
dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
t = torch.tensor([float(store.get(f"hello{world - 1 - rank}"))])
dist.all_reduce(t)
print(f"rank={rank} store_sum={t.item()} engine={type(dist.group.WORLD).__name__}")
dist.destroy_process_group()
"""

SIMDIST_SCRIPT = """\
import torch
import simdist as dist
from simdist.core._world import current_world

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank={rank} world={world} sum={t.item()} engine={type(current_world()).__name__}")
dist.destroy_process_group()
"""

MISMATCH = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dtype = torch.float32 if dist.get_rank() == 0 else torch.int32
t = torch.ones(4, dtype=dtype)
dist.all_reduce(t)
print(f"rank={dist.get_rank()} result={t.tolist()}")
dist.destroy_process_group()
"""

HANG = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.zeros(2)
dist.recv(t, src=1 - dist.get_rank())
"""

SPAWNING = """\
import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    os.write(1, f"child={rank} sum={t.item()} engine={type(dist.group.WORLD).__name__}\\n".encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(3, port), nprocs=3)
"""


def _script(tmp_path: Path, text: str, name: str = "script.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _launch(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "simdist.run", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def _lines(out: str) -> dict[int, str]:
    return {int(r): line for r, line in re.findall(r"^\[rank (\d+)\] (rank=.*)$", out, re.MULTILINE)}


def _check_torch_script(out: str, world: int, engine: str) -> None:
    lines = _lines(out)
    assert sorted(lines) == list(range(world)), out
    evens = float(sum(r for r in range(world) if r % 2 == 0))
    ports = set()
    for r, line in lines.items():
        fields = dict(f.split("=") for f in line.split())
        assert fields["world"] == str(world) and float(fields["sum"]) == world * (world + 1) / 2, line
        assert float(fields["evens"]) == (evens if r % 2 == 0 else float(r)), line
        assert float(fields["got"]) == (42.0 if r == world - 1 else 0.0), line
        assert fields["backend"] == "gloo" and fields["engine"] == engine, line
        ports.add(fields["master_port"])
    assert len(ports) == 1, out


@pytest.mark.parametrize(
    ("backend", "engine"),
    [
        (None, "ProcessGroup"),
        pytest.param("socket", "BridgeGroup", marks=BRIDGE),
        ("gloo", "ProcessGroup"),
        ("nccl", "ProcessGroup"),  # simdist's NCCL serves simdist's API; torch code runs as it names: gloo here
        ("torch-nccl", "ProcessGroup"),
    ],
    ids=["default", "socket", "gloo", "nccl", "torch-nccl"],
)
def test_an_unmodified_torch_script_runs_on_every_cpu_backend(tmp_path: Path, backend, engine) -> None:
    flags = ["--backend", backend] if backend else []
    proc = _launch([*flags, "--nproc-per-node", "3", _script(tmp_path, TORCH_SCRIPT)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_torch_script(proc.stdout, 3, engine)


@pytest.mark.parametrize("backend", [None, "socket"], ids=["default", "socket"])
def test_a_script_that_serves_its_own_tcpstore_at_master_port(tmp_path: Path, backend) -> None:
    flags = ["--backend", backend] if backend else []
    proc = _launch([*flags, "--nproc-per-node", "2", _script(tmp_path, OWN_STORE)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    engine = "BridgeGroup" if backend else "ProcessGroup"
    for r in range(2):  # each rank read the other's key from the script's own store
        assert f"[rank {r}] rank={r} store_sum=10.0 engine={engine}" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("backend", "engine"),
    [(None, "SocketWorld"), ("socket", "SocketWorld"), ("gloo", "GlooWorld")],
    ids=["default", "socket", "gloo"],
)
def test_a_simdist_script_runs_on_every_cpu_backend(tmp_path: Path, backend, engine) -> None:
    flags = ["--backend", backend] if backend else []
    proc = _launch([*flags, "--nproc-per-node", "2", _script(tmp_path, SIMDIST_SCRIPT)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in range(2):
        assert f"[rank {r}] rank={r} world=2 sum=3.0 engine={engine}" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    ("backend", "engine"), [(None, "ProcessGroup"), ("socket", "BridgeGroup"), ("nccl", "ProcessGroup")]
)
def test_two_nodes_run_one_torch_job(tmp_path: Path, backend, engine) -> None:
    """Two launchers, one per node (processes, on loopback), with --nnodes 2 and one secret.

    simdist's API on two nodes: tests/launch/test_run_cli.py::test_two_nodes_form_one_job.
    """
    path = _script(tmp_path, TORCH_SCRIPT)
    master, store = free_port(), free_port()
    flags = ["--backend", backend] if backend else []
    common = [*flags, "--nnodes", "2", "--master-port", str(master), "--store-port", str(store)]
    env = {"SIMDIST_SECRET": new_secret()}
    results: dict[int, subprocess.CompletedProcess] = {}

    def node(k: int) -> None:
        results[k] = _launch([*common, "--node-rank", str(k), "--nproc-per-node", "2", path], tmp_path, env)

    threads = [threading.Thread(target=node, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(110)
    assert all(results[k].returncode == 0 for k in (0, 1)), [results[k].stderr for k in (0, 1)]
    out = results[0].stdout + results[1].stdout
    _check_torch_script(out, 4, engine)
    assert f"master_port={master}" in out  # MASTER_PORT is torch's, on every node


def test_the_store_port_of_several_nodes_defaults_to_the_port_after_the_master_port(tmp_path: Path) -> None:
    script = _script(tmp_path, "import os\nprint('rank=x', os.environ['MASTER_PORT'], os.environ['SIMDIST_STORE'])\n")
    env = {"SIMDIST_SECRET": new_secret()}
    proc = _launch(["--nnodes", "2", "--node-rank", "1", "--master-port", "29517", script], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert "[rank 1] rank=x 29517 127.0.0.1:29518" in proc.stdout, proc.stdout


def test_the_store_port_cannot_be_the_master_port(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        run.main(["--master-port", "29600", "--store-port", "29600", _script(tmp_path, SIMDIST_SCRIPT)])
    assert info.value.code == 2
    assert "--store-port=29600 equals --master-port" in capsys.readouterr().err


@BRIDGE
def test_a_dtype_mismatch_in_a_torch_script_is_reported_with_both_lines_one_flag_away(tmp_path: Path) -> None:
    script = _script(tmp_path, MISMATCH, "mismatch.py")
    plain = _launch(["--nproc-per-node", "2", script], tmp_path)  # as under torchrun: gloo reads the bytes as given
    assert plain.returncode == 0, plain.stderr
    assert "[rank 0] rank=0 result=" in plain.stdout and "[rank 1] rank=1 result=" in plain.stdout
    checked = _launch(["--backend", "socket", "--nproc-per-node", "2", script], tmp_path)
    assert checked.returncode != 0
    first = re.search(r"simdist run: the job's first failure: (.*)", checked.stderr)
    assert first is not None, checked.stderr
    assert "CollectiveMismatchError" in first.group(1)
    assert "rank 0 called all_reduce at " in first.group(1) and "mismatch.py:7" in first.group(1), first.group(1)
    assert "rank 1 called all_reduce at " in first.group(1), first.group(1)
    assert "dtype: 'float32' on rank 0 vs 'int32' on rank 1" in first.group(1)
    assert "result=" not in checked.stdout  # no rank went on with garbage


def test_a_hang_in_a_torch_script_is_reported_not_waited_on(tmp_path: Path) -> None:
    script = _script(tmp_path, HANG, "hang.py")
    proc = _launch(["--backend", "socket", "--timeout", "3", "--nproc-per-node", "2", script], tmp_path, timeout=60)
    assert proc.returncode != 0
    assert "DistTimeoutError" in proc.stderr and "still pending after the timeout of 3 s" in proc.stderr, proc.stderr
    assert re.search(r"recv from rank [01]", proc.stderr), proc.stderr


@BRIDGE
def test_spawned_children_of_a_torch_script_get_the_bridge(tmp_path: Path) -> None:
    script = _script(tmp_path, SPAWNING, "spawning.py")
    plain = _launch(["--nproc-per-node", "1", script], tmp_path)
    checked = _launch(["--backend", "socket", "--nproc-per-node", "1", script], tmp_path)
    for proc, engine in ((plain, "ProcessGroup"), (checked, "BridgeGroup")):
        assert proc.returncode == 0, proc.stdout + proc.stderr
        for r in range(3):
            assert f"[rank 0] child={r} sum=6.0 engine={engine}" in proc.stdout, proc.stdout + proc.stderr


def test_help_states_the_engine_of_every_backend() -> None:
    proc = _launch(["--help"], Path.cwd(), timeout=60)
    text = " ".join(proc.stdout.split())
    assert "--store-port" in text and "as under torchrun" in text
    assert "torch.distributed code too on simdist's socket backend" in text
    assert set(run.ENGINES) == {None, *run.PROCESS_BACKENDS, "sim"}


def test_torchrun_runs_a_simdist_script_on_the_socket_backend(tmp_path: Path) -> None:
    """Under torchrun MASTER_PORT is its agent's TCPStore: simdist's store is published there, not bound there."""
    script = _script(tmp_path, SIMDIST_SCRIPT.replace('init_process_group("gloo")', 'init_process_group("socket")'))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            script,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in range(2):
        assert f"rank={r} world=2 sum=3.0 engine=SocketWorld" in proc.stdout, proc.stdout + proc.stderr
