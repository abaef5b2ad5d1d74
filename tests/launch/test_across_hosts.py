"""Jobs across hosts: ``simdist run --nnodes N --node-rank i --master-addr HOST0`` on each of N hosts made as
network namespaces (tests/support/netns_hosts.py), as a class runs a job on several lab PCs.

simdist-API and unmodified ``torch.distributed`` scripts on the socket backend (TCP between the hosts,
shared memory only between the ranks of one host) and on torch's gloo give the one-host results; across
hosts the job needs the one ``SIMDIST_SECRET``, and a node with another secret is refused.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from netns_hosts import Host, testbed
from simdist.backends.socket import new_secret
from test_run_torch_scripts import TORCH_SCRIPT, _check_torch_script

__all__ = ["testbed"]  # the fixture, used below

pytestmark = pytest.mark.timeout(180)

MASTER_PORT = 29640

# simdist's API: a small and a 1 MiB all_reduce (large enough for shared memory), and which peers shared memory
SIMDIST_SCRIPT = """\
import socket
import torch
import simdist as dist
from simdist.core._world import current_world
from simdist.backends.socket._shm import Ring

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
big = torch.full((1 << 18,), float(rank + 1))
dist.all_reduce(big)
ok = bool((big == world * (world + 1) / 2).all())
huge = torch.arange(1 << 22, dtype=torch.float32) % 7 + rank  # 16 MiB: the hierarchical all_reduce in 2 pieces
dist.all_reduce(huge)
ok = ok and bool((huge == world * (torch.arange(1 << 22, dtype=torch.float32) % 7) + world * (world - 1) / 2).all())
world_ = current_world()
shm = sorted(p.rank for p in getattr(world_.network, "_peers", []) if isinstance(p.ring, Ring))
from simdist.core._group import Options
picked = world_.default_group._pick("all_reduce", Options(), big.nbytes)  # the automatic choice for 1 MiB
print(f"rank={rank} world={world} sum={t.item()} big_ok={ok} shm={shm} engine={type(world_).__name__} picked={picked}")
dist.destroy_process_group()
"""


def _job(
    bed, tmp_path: Path, script: str, args: list[str], env: dict[str, str], per_node: int = 2, script_args: tuple = ()
) -> list:
    """Run ``script`` (its text) with ``simdist run`` on every host of ``bed`` (node rank = host index), from
    ``tmp_path``; each node's (exit status, stdout, stderr)."""
    path = tmp_path / "script.py"
    path.write_text(script)
    nodes = []
    for host in bed.hosts:
        argv = [sys.executable, "-m", "simdist.run", *args, "--nnodes", str(len(bed)), "--node-rank", str(host.index)]
        argv += ["--master-addr", bed[0].address, "--master-port", str(MASTER_PORT)]
        argv += ["--nproc-per-node", str(per_node), str(path), *script_args]
        full = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "SIMDIST_SECRET")}
        full.update(env)
        nodes.append(
            host.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=full)
        )
    results = []
    for proc in nodes:
        out, err = proc.communicate(timeout=150)
        results.append((proc.returncode, out, err))
    return results


def _ok(results: list) -> str:
    assert all(code == 0 for code, _, _ in results), "\n".join(
        f"node {k}: {r[0]}\n{r[2][-3000:]}" for k, r in enumerate(results)
    )
    return "".join(out for _, out, _ in results)


def test_namespaces_are_different_hosts_to_the_socket_backend(testbed) -> None:
    """Shared memory only within a host: the socket backend's host identity differs across namespaces."""
    bed = testbed(2)
    code = (  # the digest of this process and of a child it forks (two processes of one host)
        "import os\nfrom simdist.backends.socket._shm import host_digest\n"
        "if os.fork() == 0:\n    print(host_digest().hex(), flush=True)\n    os._exit(0)\n"
        "os.wait()\nprint(host_digest().hex())\n"
    )
    same_host = bed[0].python(code).stdout.split()
    other_host = bed[1].python(code).stdout.split()
    here = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.split()
    assert len(same_host) == 2 and same_host[0] == same_host[1], same_host
    assert len({same_host[0], other_host[0], here[0]}) == 3, (same_host, other_host, here)


def test_a_simdist_job_across_hosts_on_the_socket_backend(testbed, tmp_path: Path) -> None:
    hosts = 3
    bed = testbed(hosts)
    env = {"SIMDIST_SECRET": new_secret()}
    out = _ok(_job(bed, tmp_path, SIMDIST_SCRIPT, ["--backend", "socket"], env))
    world = 2 * hosts
    lines = dict(re.findall(r"^\[rank (\d+)\] (rank=.*)$", out, re.MULTILINE))
    assert sorted(map(int, lines)) == list(range(world)), out
    shared = 0
    for r, line in lines.items():
        r = int(r)
        assert f"world={world} sum={world * (world + 1) / 2} big_ok=True" in line and "engine=SocketWorld" in line, line
        assert "picked=hierarchical" in line, line  # 2 ranks a machine: within each, then across the machines
        peers = eval(re.search(r"shm=(\[[\d, ]*\])", line).group(1))
        neighbour = r + 1 if r % 2 == 0 else r - 1  # the other rank of its host: shared memory, TCP to the rest
        assert set(peers) <= {neighbour}, f"rank {r} shared memory with ranks of another host: {line}"
        shared += len(peers)
    assert shared, f"no rank shared memory with the other rank of its host:\n{out}"


@pytest.mark.torch_release
def test_an_unmodified_torch_script_across_hosts_on_the_socket_backend(testbed, tmp_path: Path) -> None:
    bed = testbed(2)
    out = _ok(_job(bed, tmp_path, TORCH_SCRIPT, ["--backend", "socket"], {"SIMDIST_SECRET": new_secret()}))
    _check_torch_script(out, 4, "BridgeGroup")


def test_the_launch_corpus_training_across_hosts_equals_the_one_host_run(testbed, tmp_path: Path) -> None:
    """tests/programs/train_torchrun.py (DDP, all_reduce, all_gather, broadcast, isend/recv; unmodified), one rank on
    each of 2 hosts, on torch's gloo and on the socket backend: the per-step results, final parameters and
    checkpoint of torchrun on one host, exactly (tests/launch/test_launch_paths.py). gloo picks its interface by the host
    name, which every namespace shares: as under torchrun, GLOO_SOCKET_IFNAME names the hosts' interface."""
    from launch_paths import checkpoint_difference, result_lines, start

    programs = Path(__file__).resolve().parents[1] / "programs"

    def reference_run():
        return start("torchrun", programs / "train_torchrun.py", "torchrun", 2, ("--steps", "4", "--out", "."),
                     cwd=tmp_path, timeout=90)  # fmt: skip

    reference = reference_run()
    if reference.died_in_torchs_teardown(
        2
    ):  # torch's gloo alone, no simdist: once more (tests/support/launch_paths.py)
        reference = reference_run()
    assert reference.ok, reference.describe()
    expected = sorted(sorted((k, v) for k, v in r.items() if k != "engine") for r in result_lines(reference.stdout))
    bed = testbed(2)
    for backend, engine in ((None, "ProcessGroupGloo"), ("socket", "BridgeGroup")):
        run = tmp_path / (backend or "gloo")
        run.mkdir()
        (run / "toy_training.py").write_text((programs / "toy_training.py").read_text())
        env = {"SIMDIST_SECRET": new_secret(), "GLOO_SOCKET_IFNAME": "eth0"}
        args = ["--backend", backend] if backend else []
        out = _ok(
            _job(bed, run, (programs / "train_torchrun.py").read_text(), args, env, 1, ("--steps", "4", "--out", "."))
        )
        results = [dict(r) for r in result_lines(out)]
        engines = {r.pop("engine") for r in results if "engine" in r}
        assert engines == {engine}, engines
        assert sorted(map(sorted, (r.items() for r in results))) == expected, out
        difference = checkpoint_difference(torch.load(run / "ckpt.pt"), torch.load(tmp_path / "ckpt.pt"))
        assert difference is None, difference


def test_a_node_without_the_jobs_secret_is_refused(testbed, tmp_path: Path) -> None:
    bed = testbed(2)
    path = tmp_path / "script.py"
    path.write_text(SIMDIST_SCRIPT)
    common = ["--backend", "socket", "--nnodes", "2", "--master-addr", bed[0].address, "--master-port"]
    common += [str(MASTER_PORT), "--nproc-per-node", "1", "--timeout", "5"]

    def node(host: Host, secret: str | None) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k not in ("SIMDIST_SECRET", "MASTER_ADDR", "MASTER_PORT")}
        if secret:
            env["SIMDIST_SECRET"] = secret
        argv = [sys.executable, "-m", "simdist.run", *common, "--node-rank", str(host.index), str(path)]
        return host.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)

    # without any secret, a node of several refuses to start and says how to make one
    alone = node(bed[1], None)
    _, err = alone.communicate(timeout=60)
    assert alone.returncode != 0 and "needs the same SIMDIST_SECRET on every node" in err, err
    # with another secret than node 0's, node 1's ranks are refused by the store: an authentication error
    first, second = node(bed[0], new_secret()), node(bed[1], new_secret())
    _, err1 = second.communicate(timeout=120)
    _, err0 = first.communicate(timeout=120)
    assert second.returncode != 0 and "AuthenticationError" in err1, err1
    assert first.returncode != 0, err0  # node 0's job never completes: its ranks time out, naming what is missing
