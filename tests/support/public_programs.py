"""Public torch.distributed programs, unchanged, on every launch path: the pinned list and the harness.

None of these programs is in this repository. They are read from a folder fetched elsewhere, named
by ``$SIMDIST_PUBLIC_PROGRAMS`` and laid out as ``OWNER/REPO/PATH`` (the file at ``PATH`` of
``github.com/OWNER/REPO`` at the pinned commit; ``benchmarks/public_programs.py extract`` fills it
from a git clone). Each file is checked against its pinned sha256 before it runs.

- **pytorch/examples** and **karpathy/nanoGPT** files run as they are. nanoGPT's ``train.py`` reads a config
  file and a dataset from its working folder: ``prepare`` writes there a small config (the only file added,
  :data:`NANOGPT_CONFIG`), seeded random tokens for a dataset, and its own ``configurator.py``.
- **pytorch/tutorials** keeps its programs in ``.rst`` pages. A program is assembled at run time
  from a pinned recipe: line ranges of the page's code blocks, in order, each line losing the
  block's 4-space indent, written to a scratch folder outside the repository. Where the page gives
  a function but no caller, the recipe adds ``glue``: a few lines written for this harness (named
  as such in the report). Nothing of the tutorials is stored here but line numbers.

A program runs on each path of ``tests/support/launch_paths.py`` that starts its launch style, in a fresh
working folder (``TMPDIR`` too), once per entry of ``launches`` (the second launch of a
checkpointing program finds the first one's checkpoint). Its result per launch: the printed lines
that ``compare`` selects (launcher prefixes and pids removed, sorted) and a digest of the checkpoint
files it writes. Results are compared with the first path that ran; ``same_as`` compares the
model saved by the first launch with another program's. A program that needs CUDA runs only on the
simulator here (simulated GPUs); elsewhere it is skipped with the reason.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from launch_paths import PATHS, SIM_PATHS, Launched, applies, start

__all__ = ["ENV", "PROGRAMS", "Outcome", "Program", "Source", "folder", "known_failure", "reference_path", "run"]

ENV = "SIMDIST_PUBLIC_PROGRAMS"
"""The environment variable naming the folder of fetched programs."""


@dataclass(frozen=True)
class Source:
    """A file of a public repository at a pinned commit, and its sha256 there."""

    repo: str
    commit: str
    path: str
    sha256: str

    def local(self, root: Path) -> Path:
        return root / self.repo / self.path

    def problem(self, root: Path) -> str | None:
        """Why the folder's copy cannot be used (absent, or not the pinned file), or ``None``."""
        local = self.local(root)
        if not local.is_file():
            return f"{local} is absent (fetch {self.repo} at {self.commit[:12]})"
        if hashlib.sha256(local.read_bytes()).hexdigest() != self.sha256:
            return f"{local} is not the file of {self.repo} at {self.commit[:12]} (sha256 differs)"
        return None


@dataclass(frozen=True)
class Program:
    """A public program, how it starts its ranks and what of its results is compared across launch paths."""

    name: str
    source: Source
    style: str  # torchrun, spawn or process (tests/support/launch_paths.py)
    world: int  # ranks (for spawn and process styles, the GPUs of the simulated node)
    compare: tuple[str, ...]  # regexes: the printed lines compared (after prefixes and pids are removed)
    launches: tuple[tuple[str, ...], ...] = ((),)  # the script's arguments, one tuple per launch
    needs_cuda: str = ""  # why it cannot run without CUDA (empty: it can)
    files: tuple[str, ...] = ()  # checkpoints it writes in its working folder, compared by content
    model: str = ""  # the key of the model's state in the first of ``files`` ("": the whole file)
    beside: tuple[Source, ...] = ()  # files the program imports from its folder
    recipe: tuple[tuple[int, int] | str, ...] = ()  # for an .rst source: code line ranges in order ("glue": glue)
    glue: str = ""  # lines written for the harness, where the recipe says "glue" (the page gives no caller)
    spawn: tuple[str, tuple] | None = None  # (function, args) for the simdist.spawn paths
    same_as: str = ""  # another program whose first-launch model this one's must equal
    unrunnable: str = ""  # why the published code cannot run at all (it is then listed, not run)
    known: tuple[tuple[str, str], ...] = ()  # (path, why it fails there): failures that are not simdist's
    prepare: Callable[[Path, Path], None] | None = None  # (work, root): what the program reads from its working folder
    logs_to_stderr: bool = False  # its lines compared are log records (stderr), not prints
    timeout: float = 0.0  # seconds a launch may take, where more than the harness's default


EXAMPLES = "77f55b912142e11fcfdf5b530231fb9c52f181e8"  # pytorch/examples main, 2025-08-25
DDP_TUTORIAL = "1a68b577065d93d673208e061db221c62885e75d"  # pytorch/tutorials: intermediate_source/ddp_tutorial.rst
DIST_TUTO = "9e3b07937d1cc1e492f2c04172a254d8cd96358d"  # pytorch/tutorials: intermediate_source/dist_tuto.rst

_SERIES = "distributed/ddp-tutorial-series/"
_DATAUTILS = Source(
    "pytorch/examples",
    EXAMPLES,
    _SERIES + "datautils.py",
    "6af257501c49d1373b9b57f47e54ec9260eef7d97ad46b59cd0280cbbd6cc779",
)
_SERIES_LINES = (r"^\[GPU\d+\] Epoch \d+ \| Batchsize: \d+ \| Steps: \d+$", r"^Epoch \d+ \| Training \w+ saved at \S+$")
_SERIES_LINES += (r"^Loading snapshot$", r"^Resuming training from snapshot at Epoch \d+$")
_SERIES_CUDA = "torch.cuda.set_device(LOCAL_RANK) and init_process_group('nccl')"
_TUTO = Source(
    "pytorch/tutorials",
    DIST_TUTO,
    "intermediate_source/dist_tuto.rst",
    "aa623cc6750fd1e5a0a711ce78acbf9f23b823110a5483f41b8648a0ee59f3e9",
)
_TUTO_LINES = (r"^Rank\s+\d+\s+has data\s+tensor\(.*\)$",)
_TEMPLATE = ((47, 53), (58, 65))  # run.py: the imports and init_process (not its placeholder run)
_TEMPLATE_MAIN = ((66, 76),)  # run.py's __main__: two multiprocessing.Process ranks, MASTER_PORT 29500
_AGENT_STORE = (
    "torchrun",
    "hangs: torchrun gives its workers TORCHELASTIC_USE_AGENT_STORE=True, which the script's own processes inherit, "
    "so init_process_group makes every rank, rank 0 too, a client of a TCPStore at the script's MASTER_PORT=29500 "
    "that nobody serves (torchrun's store is at its own port)",
)


def _tuto(name: str, *blocks: tuple[int, int] | str, compare: tuple[str, ...] = _TUTO_LINES, glue: str = "") -> Program:
    """A program of "Writing Distributed Applications": run.py's template around ``blocks`` (its ``run``)."""
    recipe = _TEMPLATE + blocks + _TEMPLATE_MAIN
    return Program(
        f"tutorials/dist_tuto {name}", _TUTO, "process", 2, compare, recipe=recipe, glue=glue, known=(_AGENT_STORE,)
    )


NANOGPT = "3adf61e154c3fe3fca428ad6bc3818b27a3b8291"  # karpathy/nanoGPT master, 2025-11-12
_NANOGPT_TRAIN = Source(
    "karpathy/nanoGPT", NANOGPT, "train.py", "413bd97b40bb400a2a0d01230e2946f056c263ebac1b7281c2367d964a123085"
)
_NANOGPT_MODEL = Source(
    "karpathy/nanoGPT", NANOGPT, "model.py", "7c01703240dbec5d554527dc666e35b3df8391d0b117fddc07afcf325a21d11c"
)
_NANOGPT_CONFIGURATOR = Source(
    "karpathy/nanoGPT", NANOGPT, "configurator.py", "5cc23aca26b4ab3c0d9e5f82740f4781f9444f42718c15abcee70d93c5aabe8f"
)
NANOGPT_CONFIG = """\
# written for simdist's harness: a small model, a few iterations, no torch.compile (nanoGPT's GPU defaults
# otherwise: backend nccl, device cuda, dtype bfloat16, fused AdamW)
out_dir = 'out-simdist'
dataset = 'simdist'
eval_interval = 5
eval_iters = 2
log_interval = 1
always_save_checkpoint = True
gradient_accumulation_steps = 2
batch_size = 4
block_size = 32
n_layer = 2
n_head = 2
n_embd = 32
dropout = 0.0
learning_rate = 1e-3
max_iters = 10
lr_decay_iters = 14
warmup_iters = 2
compile = False
"""
"""The config file nanoGPT's train.py reads (``config/simdist_small.py``): the only file added to the program."""


def _nanogpt_folder(work: Path, root: Path) -> None:
    """nanoGPT reads ``configurator.py``, its config and ``data/<dataset>/{train,val}.bin`` (uint16 tokens, and
    ``meta.pkl`` with the vocabulary's size) from the working folder: its own configurator, the config above, and
    seeded random tokens of a 256-word vocabulary stand for a dataset."""
    import pickle

    import numpy as np

    (work / "configurator.py").write_bytes(_NANOGPT_CONFIGURATOR.local(root).read_bytes())
    (work / "config").mkdir(exist_ok=True)
    (work / "config" / "simdist_small.py").write_text(NANOGPT_CONFIG)
    data = work / "data" / "simdist"
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rng.integers(0, 256, 20000, dtype=np.uint16).tofile(data / "train.bin")
    rng.integers(0, 256, 4000, dtype=np.uint16).tofile(data / "val.bin")
    (data / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 256}))


def _examples(path: str, sha256: str) -> Source:
    return Source("pytorch/examples", EXAMPLES, path, sha256)


_FSDP2_BESIDE = (
    _examples("distributed/FSDP2/model.py", "0217ad585158062fc6f61ada9dbe1493bf70d4fd9be94b48aad82d255634186d"),
    _examples("distributed/FSDP2/checkpoint.py", "1853b455639d6b761a695ca2140f104602b1a61d1a96afce2ae3959b20058ad6"),
    _examples("distributed/FSDP2/utils.py", "d6b548bdf0285d2a20d8a149ebbe57fa09f178b469b70880db69e4ffab14c93d"),
)
_TP = "distributed/tensor_parallelism/"
_TP_LOG = _examples(_TP + "log_utils.py", "57ab033bd4c0d67fd55e8ffc23164ccafe87034aea82f4ca8f1a994ef01adb04")
_TP_CUDA = "a GPU per rank: it exits when torch.accelerator has too few, and its device mesh is the accelerator's"


def _tensor_parallelism(name: str, sha256: str, label: str) -> Program:
    """One of the 1-D examples of distributed/tensor_parallelism, on 4 ranks: its "<label> iter n completed" logs."""
    return Program(
        f"tensor_parallelism/{name}",
        _examples(f"{_TP}{name}.py", sha256),
        "torchrun",
        4,
        (rf"{label} iter \d+ completed$", rf"{label} training completed!$"),
        needs_cuda=_TP_CUDA,
        beside=(_TP_LOG,),
        logs_to_stderr=True,
    )


PROGRAMS = (
    Program(
        "ddp-series/multigpu_torchrun",
        Source(
            "pytorch/examples",
            EXAMPLES,
            _SERIES + "multigpu_torchrun.py",
            "6b0a1568337fe206fa74e971cfeec42317f40b82122475327d50f0a0d37e1ba7",
        ),
        "torchrun",
        2,
        _SERIES_LINES,
        launches=(("2", "1"), ("3", "1")),  # 2 epochs saving each; then resumed from snapshot.pt up to epoch 3
        needs_cuda=_SERIES_CUDA,
        files=("snapshot.pt",),
        model="MODEL_STATE",
        beside=(_DATAUTILS,),
    ),
    Program(
        "ddp-series/multinode",
        Source(
            "pytorch/examples",
            EXAMPLES,
            _SERIES + "multinode.py",
            "28e52a2615675a4e4fba78aac60f4f2ca9c589a13f434811db2b2a408a56489c",
        ),
        "torchrun",
        2,
        _SERIES_LINES,
        launches=(("2", "1"), ("3", "1")),
        needs_cuda=_SERIES_CUDA,
        files=("snapshot.pt",),
        model="MODEL_STATE",
        beside=(_DATAUTILS,),
        same_as="ddp-series/multigpu_torchrun",
    ),
    Program(
        "ddp-series/multigpu",
        Source(
            "pytorch/examples",
            EXAMPLES,
            _SERIES + "multigpu.py",
            "121d43aa786cb390872179f6004d507a91ee95da2f9c6cc178df3fcaf01aa2c4",
        ),
        "spawn",
        2,
        _SERIES_LINES,
        launches=(("2", "1"),),
        needs_cuda="torch.cuda.device_count() ranks, each torch.cuda.set_device(rank) and init_process_group('nccl')",
        files=("checkpoint.pt",),
        beside=(_DATAUTILS,),
        spawn=("main", (2, 1, 2, 32)),  # main(rank, world_size, save_every, total_epochs, batch_size)
        same_as="ddp-series/multigpu_torchrun",
    ),
    Program(
        "ddp/example",
        Source(
            "pytorch/examples",
            EXAMPLES,
            "distributed/ddp/example.py",
            "a261723f015d6bce1247450c5a8732a8702f3158a89a7a0032c6a120f7065c86",
        ),
        "torchrun",
        2,
        (r"^\[pid\]: world_size = \d+, rank = \d+, backend=\w+$", r"^\[pid\] rank = \d+, world_size = \d+$")
        + (r"^training completed in rank \d+!$",),
        needs_cuda="at least 2 accelerators (torch.accelerator), else it prints that it cannot find them and exits 0",
    ),
    Program(
        "tutorials/ddp_tutorial",
        Source(
            "pytorch/tutorials",
            DDP_TUTORIAL,
            "intermediate_source/ddp_tutorial.rst",
            "89be60d055c524933249b67f02a3389e9372755557ea34e2e43bd73c7e7112d6",
        ),
        "spawn",
        8,
        (r"^Running .* example on rank \d+\.$",),
        needs_cuda="8 GPUs (demo_basic, demo_checkpoint on 8 ranks, demo_model_parallel on 4 ranks of 2 GPUs), "
        "else it prints 'Requires at least 8 GPUs' and exits 0",
        recipe=((72, 103), (112, 147), (193, 232), (242, 255), (263, 293)),  # every block: the whole program
    ),
    _tuto("p2p blocking", (110, 121)),
    _tuto("p2p non-blocking", (136, 151), compare=_TUTO_LINES + (r"^Rank \d started \w+$",)),
    _tuto("all_reduce", (211, 217)),
    _tuto(
        "ring all-reduce",
        (403, 426),
        "glue",
        glue="def run(rank, size):\n"
        "    send, recv = torch.full((4,), float(rank + 1)), torch.zeros(4)\n"
        "    allreduce(send, recv)\n"
        "    print('Rank ', rank, ' has data ', recv)\n",
    ),
    Program(
        "nanoGPT/train",
        _NANOGPT_TRAIN,
        "torchrun",
        2,
        (r"^step \d+: train loss [\d.]+, val loss [\d.]+$", r"^saving checkpoint to \S+$"),
        launches=(("config/simdist_small.py",), ("config/simdist_small.py", "--init_from=resume", "--max_iters=14")),
        needs_cuda="a DDP run puts rank r on cuda:LOCAL_RANK with init_process_group('nccl'), bfloat16 autocast",
        files=("out-simdist/ckpt.pt",),
        model="model",
        beside=(_NANOGPT_MODEL, _NANOGPT_CONFIGURATOR),
        prepare=_nanogpt_folder,
    ),
    Program(
        "FSDP2/example",
        _examples("distributed/FSDP2/example.py", "f84fb0503517ee5c6a6100c69bd0ccc55431e141643a32de88fadfb3407ecc6c"),
        "torchrun",
        2,
        (r"^Running on rank \d+ on device \S+$",),
        launches=((), ("--mixed-precision",), ("--explicit-prefetching", "--dcp-api")),  # the 2nd resumes the 1st
        needs_cuda="at least 2 accelerators (torch.accelerator), else it prints that it cannot find them and exits 0",
        beside=_FSDP2_BESIDE,
    ),
    _tensor_parallelism(
        "tensor_parallel_example", "bec82850ab873b31a79814fb71ce74852d28e1d5a3a9d21bffcdd7e6d4d4bce0", "Tensor Parallel"
    ),
    _tensor_parallelism(
        "sequence_parallel_example",
        "dc8a1d6aecac3b7cae9c734013f5ff36252fabc2bb7a9cb6925b35013e07d3c2",
        "Sequence Parallel",
    ),
    Program(
        "tensor_parallelism/fsdp_tp_example",
        _examples(_TP + "fsdp_tp_example.py", "4194b28d33a35bb9d6c6026f58ab4a4e87ab2e259caa1c500c30c6b806dede66"),
        "torchrun",
        4,
        (r"2D iter \d+ complete$", r"2D training successfully completed!$"),
        needs_cuda=_TP_CUDA,
        logs_to_stderr=True,
        timeout=600.0,  # ten steps of a 16M-parameter model on four CPU ranks: about 90 s on 2 cores
        beside=(
            _TP_LOG,
            _examples(_TP + "llama2_model.py", "f95b5fcc592e181153872a9175676fbcb5f37697f64264ffe91ed802e9494eac"),
        ),
    ),
    Program(
        "tutorials/dist_tuto synchronous SGD",
        _TUTO,
        "process",
        2,
        (),
        recipe=_TEMPLATE + ((283, 315), (322, 337), (350, 370), (378, 383)) + _TEMPLATE_MAIN,
        unrunnable="the page's blocks use Net, Random, ceil, F, optim, datasets and transforms without defining or "
        "importing them, download MNIST (torchvision), and pass batch_size=128/float(size), a float, to DataLoader "
        "(ValueError: batch_size should be a positive integer value)",
    ),
)
"""The pinned list: every public program the harness runs."""


def folder() -> Path | None:
    """The folder of fetched programs (``$SIMDIST_PUBLIC_PROGRAMS``), or ``None`` where it is unset or absent."""
    value = os.environ.get(ENV)
    return Path(value) if value and Path(value).is_dir() else None


def by_name(name: str) -> Program:
    return next(p for p in PROGRAMS if p.name == name)


def assemble(program: Program, root: Path) -> str:
    """The program's source: the file itself, or the recipe's lines of the page (then ``glue``), dedented."""
    text = program.source.local(root).read_text(encoding="utf-8")
    if not program.recipe:
        return text
    lines = text.split("\n")
    parts = []
    for part in program.recipe:
        if isinstance(part, str):
            parts.append(program.glue.rstrip("\n"))
            continue
        first, last = part
        parts.append(
            "\n".join(line[4:] if line.startswith("    ") else line.strip() for line in lines[first - 1 : last])
        )
    return "\n\n".join(parts) + "\n"


def skip_reason(program: Program, path: str, root: Path | None, try_cuda: bool = False) -> str | None:
    """Why ``program`` is not run on ``path`` here (``None``: it runs)."""
    if root is None:
        return f"${ENV} does not name a folder of fetched programs"
    if not applies(path, program.style):
        return f"{path} does not start {program.style}-style scripts"
    if path.startswith("simdist.spawn") and program.spawn is None:
        return "the script has no single function to spawn"
    for source in (program.source, *program.beside):
        problem = source.problem(root)
        if problem:
            return problem
    if program.unrunnable:
        return f"not runnable as published: {program.unrunnable}"
    if program.needs_cuda and path not in SIM_PATHS and not try_cuda:
        return f"needs CUDA: {program.needs_cuda} (this machine has none; simulated GPUs exist only on the simulator)"
    return None


@dataclass
class Outcome:
    """One program on one path: how it went, and its result per launch."""

    program: str
    path: str
    status: str  # ran, failed, skipped
    reason: str = ""  # for failed and skipped: the error or the reason
    results: list[dict[str, Any]] = field(default_factory=list)  # per launch: {"lines": [...], "files": {...}}
    model: str = ""  # digest of the model saved by the first launch
    seconds: float = 0.0
    engine_note: str = ""  # where the run did not use the engine the path names
    launched: list[Launched] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        keep = ("program", "path", "status", "reason", "results", "model", "seconds", "engine_note")
        return {k: getattr(self, k) for k in keep}


_PIDS = re.compile(r"\[\d+\]")
_PREFIX = re.compile(r"^\[rank \d+\] ")


def lines(program: Program, stdout: str) -> list[str]:
    """The printed lines compared for ``program``: launcher prefixes and pids removed, selected, sorted."""
    keep = [re.compile(p) for p in program.compare]
    found = []
    for raw in stdout.splitlines():
        line = _PIDS.sub("[pid]", _PREFIX.sub("", raw)).rstrip()
        match = next((m for m in (k.search(line) for k in keep) if m), None)
        if match:
            found.append(match.group(0))  # what the regex selects: not a log line's time stamp
    return sorted(found)


def digest(value: Any) -> str:
    """sha256 of a loaded checkpoint: its structure, and every tensor's dtype, shape and bytes."""
    import torch

    h = hashlib.sha256()

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            h.update(f"tensor:{t.dtype}:{tuple(t.shape)}:".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(v, dict):
            h.update(b"{")
            for k in sorted(v, key=str):
                h.update(f"{k!r}:".encode())
                walk(v[k])
            h.update(b"}")
        elif isinstance(v, (list, tuple)):
            h.update(b"[")
            for x in v:
                walk(x)
            h.update(b"]")
        else:
            h.update(f"{type(v).__name__}:{v!r};".encode())

    walk(value)
    return h.hexdigest()


def _engine_note(program: Program, path: str, launched: Launched) -> str:
    """Where a run shows it did not use the engine the path names: on the simulator, no simulated rank's prefix."""
    if path == "simdist run --backend sim" and program.style != "torchrun":  # simdist run prefixes a rank's lines
        if not any(_PREFIX.match(line) for line in launched.stdout.splitlines()):
            return "none of its lines carries a simulated rank's '[rank N] ' prefix: it did not run on simulated ranks"
    return ""


def known_failure(program: Program, path: str) -> str | None:
    """Why ``program`` is known to fail on ``path`` for a reason outside simdist, or ``None``."""
    return dict(program.known).get(path)


KNOWN_TIMEOUT = 30.0
"""Seconds a launch known to hang is given (the programs that hang finish in about 10 s where they run)."""


def run(
    program: Program, path: str, root: Path | None, work: Path, timeout: float = 180.0, try_cuda: bool = False
) -> Outcome:
    """Run ``program`` on ``path`` in the fresh folder ``work``; its :class:`Outcome`."""
    import torch

    reason = skip_reason(program, path, root, try_cuda)
    if reason is not None:
        return Outcome(program.name, path, "skipped", reason)
    assert root is not None
    timeout = max(timeout, program.timeout)
    if known_failure(program, path):
        timeout = min(timeout, KNOWN_TIMEOUT)
    work.mkdir(parents=True, exist_ok=True)
    if program.recipe:
        script = work / "program" / (re.sub(r"\W+", "_", program.name.split("/")[-1]) + ".py")
        script.parent.mkdir(exist_ok=True)
        script.write_text(assemble(program, root), encoding="utf-8")
    else:
        script = program.source.local(root)
    if program.prepare is not None:
        program.prepare(work, root)
    outcome = Outcome(program.name, path, "ran")
    for args in program.launches:
        launched = start(
            path, script, program.style, program.world, args, cwd=work, timeout=timeout, spawn=program.spawn,
            env={"TMPDIR": str(work)},
        )  # fmt: skip
        outcome.launched.append(launched)
        outcome.seconds += launched.seconds
        if not launched.ok:
            outcome.status, outcome.reason = "failed", launched.error()
            return outcome
        files = {}
        for name in program.files:
            saved = work / name
            files[name] = digest(torch.load(saved, map_location="cpu")) if saved.is_file() else "absent"
        printed = launched.stdout + ("\n" + launched.stderr if program.logs_to_stderr else "")
        outcome.results.append({"lines": lines(program, printed), "files": files})
        if not outcome.model and program.files and (work / program.files[0]).is_file():
            saved = torch.load(work / program.files[0], map_location="cpu")
            outcome.model = digest(saved[program.model] if program.model else saved)
        outcome.engine_note = outcome.engine_note or _engine_note(program, path, launched)
    if not any(r["lines"] for r in outcome.results):
        said = [line.strip() for line in outcome.launched[-1].stdout.splitlines() if line.strip()]
        outcome.status = "failed"
        outcome.reason = "exit status 0 without the lines it prints when it works; " + (
            f"its last line: {said[-1]!r}" if said else "it printed nothing"
        )
    return outcome


def difference(a: Outcome, b: Outcome) -> str | None:
    """How ``b``'s results differ from ``a``'s (``None``: the same)."""
    for i, (x, y) in enumerate(zip(a.results, b.results)):
        if x["lines"] != y["lines"]:
            only_a = sorted(set(x["lines"]) - set(y["lines"]))[:3]
            only_b = sorted(set(y["lines"]) - set(x["lines"]))[:3]
            return f"launch {i + 1}: printed lines differ ({a.path} only: {only_a}; {b.path} only: {only_b})"
        for name in x["files"]:
            if x["files"][name] != y["files"].get(name):
                return f"launch {i + 1}: {name} differs"
    if len(a.results) != len(b.results):
        return f"{len(a.results)} launches against {len(b.results)}"
    return None


def reference_path(program: Program, root: Path | None, try_cuda: bool = False) -> str | None:
    """The first path (in ``PATHS`` order) that runs ``program`` here and is not known to fail: what the other
    paths are compared with."""
    return next(
        (p for p in PATHS if skip_reason(program, p, root, try_cuda) is None and not known_failure(program, p)), None
    )
