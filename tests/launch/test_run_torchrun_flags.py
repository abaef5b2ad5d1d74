"""``simdist run`` takes torchrun's flags with torchrun's meaning, and gives the ranks torchrun's variables.

The flag list is compared with ``torchrun --help`` of the installed torch; the programs are
plain ``torch.distributed`` scripts, run on simdist's process backend and on simulated ranks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from simdist.launch import _torchrun, run

pytestmark = pytest.mark.timeout(300)

ELASTIC = """\
import os, sys
import torch.distributed as dist

dist.init_process_group("gloo")
keys = ("ROLE_NAME", "GROUP_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "ROLE_RANK")
print("launched", dist.is_torchelastic_launched(), *(os.environ[k] for k in keys), sys.argv[1:], flush=True)
dist.barrier()  # no rank leaves while another is still connecting (gloo's connectFullMesh fails then, under load)
dist.destroy_process_group()
"""

# Fails on its first attempt, after writing a checkpoint; the next attempt resumes from it.
RESUMES = """\
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, path = dist.get_rank(), os.path.join(sys.argv[1], "ckpt.pt")
step = torch.load(path)["step"] if os.path.exists(path) else 0
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
for step in range(step, 4):
    t = torch.tensor([float(step)])
    dist.all_reduce(t)
    if rank == 0:
        torch.save({"step": step + 1}, path)
    dist.barrier()
    if step == 1 and attempt == 0:
        dist.destroy_process_group()  # torch's gloo may abort a process that exits with its group alive (SIGABRT)
        sys.exit(5)
print(f"rank {rank} done at step {step + 1} on attempt {attempt}", flush=True)
dist.destroy_process_group()
"""


def _run(tmp_path: Path, args: list[str], program: str = ELASTIC) -> subprocess.CompletedProcess:
    script = tmp_path / "prog.py"
    script.write_text(program)
    args = [a if a != "SCRIPT" else str(script) for a in args]
    return subprocess.run(
        [sys.executable, "-m", "simdist.run", *args], capture_output=True, text=True, timeout=240, cwd=tmp_path
    )


def _torchrun_flags() -> set[str]:
    """The long flags of the installed torch's torchrun (its own parser, as ``torchrun --help`` prints it)."""
    from torch.distributed.run import get_args_parser

    flags = {s for a in get_args_parser()._actions for s in a.option_strings if s.startswith("--")}
    return flags - {"--help"}


def test_every_torchrun_flag_is_known_to_simdist_run_with_what_it_does():
    theirs = _torchrun_flags()
    assert "--nproc-per-node" in theirs and "--standalone" in theirs, theirs
    ours = {s for a in run._parser()._actions for s in a.option_strings}
    missing = sorted(f for f in theirs if f not in ours and f.replace("_", "-") not in ours)
    assert not missing, f"torchrun flags simdist run does not accept: {missing}"
    unexplained = sorted(f for f in theirs if "_" not in f and f not in _torchrun.FLAGS)
    assert not unexplained, f"torchrun flags without a stated meaning in simdist.launch._torchrun.FLAGS: {unexplained}"


@pytest.mark.parametrize("backend", [[], ["--backend", "sim"]], ids=["processes", "sim"])
def test_ranks_see_torchruns_variables_so_is_torchelastic_launched(tmp_path, backend):
    res = _run(tmp_path, [*backend, "--standalone", "--nproc-per-node", "2", "--role", "trainer",
                          "--rdzv-id", "job7", "SCRIPT", "a"])  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = sorted(line for line in res.stdout.splitlines() if "launched" in line)
    assert len(lines) == 2, res.stdout
    for rank, line in enumerate(lines):
        assert line.endswith(f"launched True trainer 1 0 job7 {rank} ['a']"), line


@pytest.mark.parametrize("backend", [[], ["--backend", "sim"]], ids=["processes", "sim"])
def test_module_runs_as_python_dash_m(tmp_path, backend):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(ELASTIC)
    res = _run(tmp_path, [*backend, "--nproc-per-node", "2", "-m", "mypkg.train", "z"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("launched True") == 2 and "['z']" in res.stdout, res.stdout


@pytest.mark.parametrize("backend", [[], ["--backend", "sim"]], ids=["processes", "sim"])
def test_max_restarts_restarts_the_job_which_resumes_from_its_checkpoint(tmp_path, backend):
    res = _run(tmp_path, [*backend, "--nproc-per-node", "2", "--max-restarts", "1", "SCRIPT", str(tmp_path)], RESUMES)
    assert res.returncode == 0, res.stderr
    assert "restarting it (1 of --max-restarts 1)" in res.stderr, res.stderr
    for rank in (0, 1):
        assert f"rank {rank} done at step 4 on attempt 1" in res.stdout, res.stdout
    (tmp_path / "new").mkdir()
    again = _run(tmp_path, [*backend, "--nproc-per-node", "2", "SCRIPT", str(tmp_path / "new")], RESUMES)
    assert again.returncode == 5, again.stderr  # without restarts, the failed attempt is the job's end


def test_no_python_runs_an_executable_on_every_rank(tmp_path):
    exe = tmp_path / "show.sh"
    exe.write_text('#!/bin/sh\necho "rank $RANK of $WORLD_SIZE role $ROLE_NAME"\n')
    exe.chmod(0o755)
    res = _run(tmp_path, ["--nproc-per-node", "2", "--no-python", str(exe)])
    assert res.returncode == 0, res.stderr
    assert "rank 0 of 2 role default" in res.stdout and "rank 1 of 2 role default" in res.stdout, res.stdout


def test_redirects_tee_and_the_local_ranks_filter(tmp_path):
    logs = tmp_path / "logs"
    res = _run(tmp_path, ["--nproc-per-node", "2", "--log-dir", str(logs), "--tee", "1", "--redirects", "1:2",
                          "--local-ranks-filter", "1", "SCRIPT"],
               ELASTIC + "print('to stderr', file=sys.stderr)\n")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "[rank 1] launched True" in res.stdout and "[rank 0]" not in res.stdout, res.stdout
    assert "to stderr" not in res.stderr, res.stderr  # rank 1's stderr redirected, rank 0's filtered out
    for rank in (0, 1):
        assert "launched True" in (logs / f"rank_{rank}.stdout.log").read_text()
    assert "to stderr" in (logs / "rank_1.stderr.log").read_text()
    assert not (logs / "rank_0.stderr.log").exists()


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--nnodes", "1:3"], "a range of nodes needs elastic membership"),
        (["--nproc-per-node", "many"], "expected a number or one of auto, cpu, gpu, xpu"),
        (["--nproc-per-node", "0"], "--nproc-per-node=0: expected at least 1"),
        (["--rdzv-backend", "etcd"], "--rdzv-backend='etcd': expected one of static, c10d"),
        (["--rdzv-conf", "timeout"], "'timeout' is not KEY=VALUE"),
        (["--redirects", "7"], "--redirects='7': expected 0 (none)"),
        (["--tee", "3"], "give --log-dir DIR"),
        (["--local-ranks-filter", "4"], "'4' is not a local rank in 0..0"),
        (["--standalone", "--nnodes", "2"], "--standalone runs one node"),
        (["--numa-binding", "node"], "--numa-binding is not supported: simdist run does not bind"),
        (["--signals-to-handle", "SIGNOPE"], "'SIGNOPE' is not a signal name"),
        (["--backend", "sim", "--no-python"], "--no-python is supported with the process backends only"),
        (["-m", "no_such_module_here"], "no module named 'no_such_module_here'"),
    ],
)
def test_bad_torchrun_flag_values_are_usage_errors_naming_flag_and_value(tmp_path, args, expected, capsys):
    script = tmp_path / "prog.py"
    script.write_text("print('never')\n")
    target = [] if "-m" in args else [str(script)]
    with pytest.raises(SystemExit) as exc:
        run.main([*args, *target])
    assert exc.value.code == 2
    assert expected in capsys.readouterr().err


def test_nproc_per_node_cpu_and_auto_count_as_torchrun_does():
    assert _torchrun.nproc_per_node("cpu") == os.cpu_count()
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert _torchrun.nproc_per_node("auto") == (gpus or os.cpu_count())
    assert _torchrun.nproc_per_node("3") == 3
    assert _torchrun.nnodes("2:2") == 2


def test_rdzv_endpoint_is_the_jobs_master_address_and_port(tmp_path):
    port = _free_port()
    res = _run(tmp_path, ["--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                          f"127.0.0.1:{port}", "SCRIPT"],
               ELASTIC + "print('port', os.environ['MASTER_PORT'], os.environ['MASTER_ADDR'])\n")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(f"port {port} 127.0.0.1") == 2, res.stdout


def _free_port() -> int:
    from simdist.core import free_port

    return free_port()


def test_several_nodes_on_torchs_gloo_need_no_simdist_secret(tmp_path):
    """SIMDIST_SECRET guards simdist's own store; a --backend gloo job across nodes never uses it."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(ELASTIC))
    env = {k: v for k, v in os.environ.items() if k != "SIMDIST_SECRET"}
    port = _free_port()
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "simdist.run",
                "--backend",
                "gloo",
                "--nnodes",
                "2",
                "--node-rank",
                str(k),
                "--nproc-per-node",
                "1",
                "--master-port",
                str(port),
                str(script),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )  # fmt: skip
        for k in (0, 1)
    ]
    outs = [p.communicate(timeout=240) for p in nodes]
    for p, (out, err) in zip(nodes, outs):
        assert p.returncode == 0, err
        assert "launched True" in out, out


def test_help_screens_end_with_examples(capsys):
    from simdist.launch._test_command import main as test_main

    for main, command in ((run.main, "run"), (test_main, "test")):
        with pytest.raises(SystemExit):
            main(["--help"])
        lines = capsys.readouterr().out.rstrip().splitlines()
        tail = lines[lines.index("examples:") + 1 :]
        assert len(tail) >= 3 and all(line.startswith(f"  simdist {command} ") for line in tail), tail
    out = subprocess.run([sys.executable, "-c", "import sys; from simdist.run import cli; sys.argv = ['simdist', '--help']; "
                          "sys.exit(cli())"], capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    assert out.rstrip().splitlines()[-5] == "examples:", out


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "command",
    [
        ["simdist.run", "calibrate", "--help"],
        ["simdist.run", "app", "--help"],
        ["simdist.backends.socket._store", "--help"],
    ],
    ids=["calibrate", "app", "store"],
)
def test_every_other_help_screen_ends_with_examples(command):
    """Each command's --help ends with "examples:" and two or three command lines that start as it is typed."""
    module, *args = command
    env = dict(os.environ, SIMDIST_SECRET="x")
    entry = (
        ["-c", "from simdist.run import cli; raise SystemExit(cli())"] if module == "simdist.run" else ["-m", module]
    )
    done = subprocess.run([sys.executable, *entry, *args], capture_output=True, text=True, timeout=100, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line == "examples:")
    examples = lines[start + 1 :]
    typed = "simdist " + args[0] if module == "simdist.run" else "SIMDIST_SECRET="
    assert 2 <= len(examples) <= 3 and all(line.startswith("  " + typed) for line in examples), lines


def test_the_flags_page_lists_every_flag_as_the_code_states_it():
    page = (Path(__file__).resolve().parents[2] / "docs" / "torchrun-flags.md").read_text()
    for flag, text in _torchrun.FLAGS.items():
        assert f"| `{flag}` | {text} |" in page, flag
