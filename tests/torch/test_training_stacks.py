"""The stacks people train with, unchanged, on simulated ranks: ``simdist run --backend sim`` against torchrun.

Each rank is a process of its own (the launcher's default), so a library's state kept per
process (accelerate's ``PartialState``, a class-level singleton) is each rank's own. The
programs are the libraries' own: accelerate's test scripts as its wheel ships them, and small
programs of ours on the Hugging Face Trainer, Lightning Fabric and ``torch.compile``; torchrun
on this machine is the truth their results are compared with.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)  # one pytest-xdist worker runs the file (pyproject's --dist loadfile)

LAUNCH_TIMEOUT = 600


def _launch(*argv: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1"}  # each rank's lines reach the pipe as printed  # fmt: skip
    full.pop("SIMDIST_ISOLATION", None)
    return subprocess.run(
        [sys.executable, "-m", *argv], capture_output=True, text=True, timeout=LAUNCH_TIMEOUT,
        env={**full, **(env or {})}, cwd=cwd,
    )  # fmt: skip


def simdist_run(*argv: str, **kw) -> subprocess.CompletedProcess:
    return _launch("simdist.run", "--backend", "sim", *argv, **kw)


def torchrun(*argv: str, **kw) -> subprocess.CompletedProcess:
    """torchrun's run of the program, the truth; again (up to three runs) while one of its ranks is aborted (SIGABRT): torch's gloo
    ranks sometimes abort as they exit on this machine ("terminate called without an active exception"), after
    the program printed its results.

    ``--standalone``: on a free port, not torchrun's default 29500, where the public programs of another worker's
    tests (tests/torch/test_public_programs.py) serve their store as their authors wrote."""
    done = _launch("torch.distributed.run", "--standalone", *argv, **kw)
    for _ in range(4):  # up to five runs: on a loaded machine 2 runs of 6 aborted at exit, 3 in a row were seen
        if done.returncode == 0 or "(SIGABRT)" not in done.stderr:
            break
        done = _launch("torch.distributed.run", "--standalone", *argv, **kw)
    return done


def _script(tmp_path: Path, text: str, name: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


# -- accelerate: its own test scripts --------------------------------------------------------------------------

ACCELERATE_SCRIPTS = ("test_ops.py", "test_sync.py", "test_script.py")


def _accelerate_script(name: str) -> str:
    accelerate = pytest.importorskip("accelerate")
    return str(Path(accelerate.__file__).parent / "test_utils" / "scripts" / name)


@pytest.mark.parametrize("name", ACCELERATE_SCRIPTS)
def test_accelerates_scripts_pass_on_two_simulated_ranks(name):
    """On this machine's CPU, as under torchrun: the ranks see its own torch.cuda (``--no-cuda-as-cpu``)."""
    proc = simdist_run("--nproc-per-node", "2", "--no-cuda-as-cpu", _accelerate_script(name),
                       env={"ACCELERATE_USE_CPU": "true"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("name", ["test_sync.py", "test_script.py"])
def test_accelerates_scripts_take_their_gpu_branch_on_simulated_gpus(name):
    """Without ACCELERATE_USE_CPU the ranks' simulated GPUs are what accelerate sees: its CUDA device, fp16 and bf16
    autocast on "cuda", its GPU branches. (``test_ops.py``'s debug-mode check compares a tensor's device with the
    accelerator's: a simulated GPU's tensors say "cpu", docs/gpu-scripts.md.)"""
    proc = simdist_run("--nproc-per-node", "2", _accelerate_script(name))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    if name == "test_script.py":
        assert "FP16 training check." in proc.stdout and "BF16 training check." in proc.stdout, proc.stdout[-3000:]


@pytest.mark.parametrize("name", ACCELERATE_SCRIPTS)
def test_accelerates_scripts_on_three_simulated_ranks_end_as_under_torchrun(name):
    """At three ranks test_script.py fails under torchrun too (its split of 2 batches over 3 ranks): the same rank,
    the same assertion; the others pass on both."""
    script, env = _accelerate_script(name), {"ACCELERATE_USE_CPU": "true"}
    ours = simdist_run("--nproc-per-node", "3", "--no-cuda-as-cpu", script, env=env)
    theirs = torchrun("--nproc-per-node", "3", script, env=env)
    assert (ours.returncode == 0) == (theirs.returncode == 0), (ours.stderr[-3000:], theirs.stderr[-3000:])
    if theirs.returncode != 0:
        failed = re.findall(r"^\[rank(\d+)\]: (\w+Error: .*)$", theirs.stderr, re.MULTILINE)
        rank, error = next((r, e) for r, e in failed if "Connection closed" not in e)
        assert f"simdist run: rank {rank} raised {error}" in ours.stderr, ours.stderr[-3000:]


# -- the Hugging Face Trainer: a tiny GPT-2 -----------------------------------------------------------------------

TRAINER = """\
import os, torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

class Tokens(Dataset):
    def __init__(self, n=64, length=16, vocab=128):
        self.data = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))
    def __len__(self):
        return len(self.data)
    def __getitem__(self, i):
        return {"input_ids": self.data[i], "labels": self.data[i]}

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2))
args = TrainingArguments(output_dir=os.environ["OUT"], per_device_train_batch_size=4, max_steps=6, logging_steps=1,
                         report_to=[], save_strategy="no", seed=42, disable_tqdm=True, use_cpu=True)
trainer = Trainer(model=model, args=args, train_dataset=Tokens())
trainer.train()
if int(os.environ["RANK"]) == 0:
    print("LOSSES", [round(h["loss"], 6) for h in trainer.state.log_history if "loss" in h])
torch.distributed.destroy_process_group()  # as torch asks: gloo may abort at exit without it (under torchrun too)
"""


def _losses(out: str, tag: str) -> list[float]:
    found = re.findall(rf"{tag} (\[.*\])", out)
    assert found, out[-3000:]
    return eval(found[-1])  # noqa: S307 - the list of floats our own script printed


def test_a_hugging_face_trainer_run_gives_torchruns_losses(tmp_path):
    pytest.importorskip("transformers")
    script = _script(tmp_path, TRAINER, "trainer.py")
    theirs = torchrun("--nproc-per-node", "2", script, env={"OUT": str(tmp_path / "torchrun")})
    ours = simdist_run("--nproc-per-node", "2", script, env={"OUT": str(tmp_path / "simdist")})
    assert theirs.returncode == 0 and ours.returncode == 0, ours.stderr[-3000:] + theirs.stderr[-3000:]
    assert _losses(ours.stdout, "LOSSES") == _losses(theirs.stdout, "LOSSES")


# -- Lightning Fabric ---------------------------------------------------------------------------------------------

FABRIC = """\
import os, torch
from lightning_fabric import Fabric

fabric = Fabric(accelerator="cpu", strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"]))
fabric.launch()
fabric.seed_everything(1)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
g = torch.Generator().manual_seed(0)
x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
losses = []
for step in range(5):
    part = slice(fabric.global_rank, None, fabric.world_size)
    xb, yb = x[part][step * 4:(step + 1) * 4], y[part][step * 4:(step + 1) * 4]
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    opt.zero_grad()
    fabric.backward(loss)
    opt.step()
    losses.append(round(fabric.all_reduce(loss.detach(), reduce_op="mean").item(), 6))
if fabric.global_rank == 0:
    print("FABRIC", losses)
torch.distributed.destroy_process_group()  # as torch asks: gloo may abort at exit without it (under torchrun too)
"""


@pytest.mark.parametrize("isolation", ["processes", "threads"])
def test_lightning_fabric_ddp_gives_torchruns_losses(tmp_path, isolation):
    pytest.importorskip("lightning_fabric")
    script = _script(tmp_path, FABRIC, "fabric.py")
    theirs = torchrun("--nproc-per-node", "2", script)
    ours = simdist_run("--nproc-per-node", "2", "--isolation", isolation, script)
    assert theirs.returncode == 0 and ours.returncode == 0, ours.stderr[-3000:] + theirs.stderr[-3000:]
    assert _losses(ours.stdout, "FABRIC") == _losses(theirs.stdout, "FABRIC")


# -- torch.compile ------------------------------------------------------------------------------------------------

COMPILE = """\
import json, pathlib, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
torch.manual_seed(0)
device, out = sys.argv[1], pathlib.Path(sys.argv[2])
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
compiled = torch.compile(model)
x = torch.randn(5, 8, device=device) + dist.get_rank()
y = compiled(x)
y.sum().backward()
grad = model[0].weight.grad.clone()
dist.all_reduce(grad)
result = [dist.get_rank(), bool(torch.allclose(y, model(x), atol=1e-5)), round(grad.sum().item(), 4)]
(out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
dist.destroy_process_group()
"""


def _compiled_results(run, script: str, out: Path, device: str) -> list:
    """Each rank's [rank, compiled output equals eager, gradient sum], read from the file that rank wrote (a file
    per rank: the ranks' prints share one pipe, where lines of two processes may interleave or go missing)."""
    out.mkdir()
    proc = run("--nproc-per-node", "2", script, device, str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(out.glob("rank*.json"))
    assert len(files) == 2, (files, proc.stdout[-3000:] + proc.stderr[-3000:])
    return [json.loads(path.read_text()) for path in files]


@pytest.mark.torch_release  # CI's job on torch 2.14.1 (a CUDA build, triton installed) runs it again
def test_torch_compile_works_on_simulated_ranks_on_cpu_tensors_and_simulated_gpus(tmp_path):
    script = _script(tmp_path, COMPILE, "compiled.py")
    expected = _compiled_results(torchrun, script, tmp_path / "torchrun", "cpu")
    for device in ("cpu", "cuda"):  # cuda: the ranks' simulated GPUs (this machine has none)
        got = _compiled_results(simdist_run, script, tmp_path / device, device)
        assert got == expected and all(same for _, same, _ in got)


COMPILE_DDP = """\
import json, pathlib, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
device, out = sys.argv[1], pathlib.Path(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to(device)
ddp = torch.compile(DDP(model, device_ids=[rank] if device == "cuda" else None))  # as torch's DDP docs show
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
losses = []
for _ in range(3):
    loss = ddp(torch.randn(4, 8, generator=g).to(device)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(round(loss.item(), 5))
(out / f"rank{rank}.json").write_text(json.dumps([rank, losses, round(sum(p.sum().item() for p in model.parameters()), 5)]))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("isolation", ["processes", "threads"])
def test_compiled_ddp_gives_torchruns_numbers_on_simulated_ranks(tmp_path, isolation):
    """``torch.compile(DDP(model))``: dynamo runs the simulated ranks' process groups as torch's own (not traced),
    on CPU tensors and on simulated GPUs; losses and parameters are torchrun's on gloo."""
    script = _script(tmp_path, COMPILE_DDP, "compiled_ddp.py")
    expected = _compiled_results(torchrun, script, tmp_path / "torchrun", "cpu")
    for device in ("cpu", "cuda"):
        run = lambda *argv: simdist_run("--isolation", isolation, *argv)  # noqa: E731
        assert _compiled_results(run, script, tmp_path / f"{isolation}-{device}", device) == expected, device


# -- DeepSpeed: ZeRO on its CUDA accelerator, on simulated GPUs -------------------------------------------------

DEEPSPEED = """\
import json, os, sys, torch
import deepspeed
from deepspeed.accelerator import get_accelerator
stage, out = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
config = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
          "zero_optimization": {"stage": stage}, "steps_per_print": 100}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
rank = int(os.environ["RANK"])
g = torch.Generator().manual_seed(rank)
losses = []
for _ in range(3):
    loss = engine(torch.randn(4, 8, generator=g).to(engine.device)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    losses.append(round(loss.item(), 5))
with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=stage == 3):
    total = round(sum(p.sum().item() for p in engine.module.parameters()), 5)
with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump([rank, losses, total, get_accelerator().device_name(), torch.cuda.max_memory_allocated() > 0], f)
"""


def _deepspeed_results(run, script: str, out: Path, stage: int, env: dict) -> list:
    out.mkdir()
    proc = run("--nproc-per-node", "2", script, str(stage), str(out), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_zero_on_its_cuda_accelerator_gives_its_cpu_accelerators_numbers(tmp_path, stage):
    """What runs on a GPU machine (DeepSpeed's CUDA accelerator: memory statistics, NVTX ranges, capability checks,
    tensors made on "cuda" inside backward hooks) on simulated GPUs, against its CPU accelerator under torchrun."""
    pytest.importorskip("deepspeed")
    script = _script(tmp_path, DEEPSPEED, "zero.py")
    theirs = _deepspeed_results(torchrun, script, tmp_path / "torchrun", stage, {"DS_ACCELERATOR": "cpu"})
    ours = _deepspeed_results(simdist_run, script, tmp_path / "sim", stage, {"DS_ACCELERATOR": "cuda"})
    assert [r[:3] for r in ours] == [r[:3] for r in theirs] and len(ours) == 2
    assert [r[3:] for r in ours] == [["cuda", True]] * 2 and [r[3] for r in theirs] == ["cpu"] * 2


LIBRARY_WITH_GROUPS = """\
import torch.distributed as dist

_groups = {}

def group_of(ranks):
    # a library's cache of process groups in module state, as DeepSpeed's groups module keeps them
    key = tuple(ranks)
    if key not in _groups:
        _groups[key] = dist.new_group(list(ranks))
    return _groups[key]
"""

USES_THE_LIBRARY = """\
import torch, torch.distributed as dist
import grouplib
dist.init_process_group("gloo")
grouplib.group_of([0, 1])  # made once, kept by the library
dist.barrier()
t = torch.ones(1)
dist.all_reduce(t, group=grouplib.group_of([0, 1]))
print("SUM", t.item())
dist.destroy_process_group()
"""


def test_a_group_kept_in_a_librarys_module_state_says_to_run_ranks_as_processes(tmp_path):
    _script(tmp_path, LIBRARY_WITH_GROUPS, "grouplib.py")
    script = _script(tmp_path, USES_THE_LIBRARY, "uses_grouplib.py")
    threads = simdist_run("--nproc-per-node", "2", "--isolation", "threads", script, cwd=tmp_path)
    assert threads.returncode == 1, threads.stdout[-2000:] + threads.stderr[-2000:]
    assert "of simulated rank" in threads.stderr and "Run with --isolation processes" in threads.stderr, threads.stderr
    processes = simdist_run("--nproc-per-node", "2", script, cwd=tmp_path)
    assert processes.returncode == 0 and processes.stdout.count("SUM 2.0") == 2, processes.stderr[-3000:]
