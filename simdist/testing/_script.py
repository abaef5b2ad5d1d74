"""A script as a program under test: ``run_script`` and ``explore_script``, and what ``simdist run --backend sim`` and
``simdist test`` run.

A :class:`Script` is what torchrun is given: a file (or a module), its arguments, ranks per node and nodes. A
:class:`ScriptProgram` is the :class:`~simdist.testing._program.Program` that runs it on simulated ranks, so the
explorer, the shrinker, replays and ``explain`` take a script as they take a function:

- *torchrun's way* (``launch='torchrun'``): every rank runs the script as ``__main__`` with torchrun's environment;
  a run is one simulation of ``world`` ranks.
- *its own ranks* (``launch='spawn'``): the script runs once, as ``python script.py`` would, on a node of
  simulated GPUs, and each ``torch.multiprocessing.spawn`` (or ``start_processes``, or ``multiprocessing.Process``
  ranks) it makes runs on simulated ranks. A run of the script is all of them in order, under one strategy: one
  seed, one choice list and one replay token cover every start.

A run's values are its ranks' :class:`ScriptRank`\\ s (exit status, what each printed); with a :class:`Scratch`
every run starts in a copy of the working directory as it was (:mod:`._workdir`).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from simdist.core._errors import DistError

from . import _script_ranks
from ._program import Program
from ._workdir import Scratch

__all__ = [
    "LAUNCHES",
    "Script",
    "ScriptError",
    "ScriptProgram",
    "ScriptRank",
    "default_isolation",
    "module_file",
    "script_defaults",
    "spawn_line",
]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's

LAUNCHES = ("auto", "torchrun", "spawn")
SPAWNS = ("spawn", "start_processes")  # the functions of torch.multiprocessing that start ranks
DEFAULT_MASTER = ("127.0.0.1", 29500)


class ScriptError(DistError):
    """The process of a script that starts its own ranks (the parent) raised, or exited with a status other than 0,
    outside its ranks; the exception (``SystemExit`` for an exit) is ``__cause__``."""

    def __init__(self, script: str, cause: BaseException):
        if isinstance(cause, SystemExit):
            super().__init__(f"{script} exited with status {cause.code!r}")
        else:
            super().__init__(f"{script} raised {type(cause).__name__}: {cause}")
        self.__cause__ = cause


@dataclass(frozen=True)
class ScriptRank:
    """What one rank of a script's run left: its exit status and the lines it printed (a run's ``values``).

    ``stdout`` and ``stderr`` hold the lines the rank wrote to ``sys.stdout`` and ``sys.stderr``, without their
    line ends (empty where the run printed them instead of keeping them). For a script that starts its own
    ranks, ``rank`` is the rank within its start.
    """

    rank: int
    exit_code: int
    stdout: tuple[str, ...] = ()
    stderr: tuple[str, ...] = ()


def spawn_line(path: str) -> int | None:
    """The line of the script's first start of ranks of its own, read, not run; ``None`` when there is none.

    A start is a call of torch.multiprocessing's ``spawn`` or ``start_processes``, or of a
    ``Process`` of ``multiprocessing`` or ``torch.multiprocessing`` (a context's too), through the
    usual imports: ``import torch.multiprocessing as mp`` then ``mp.spawn``/``mp.Process``,
    ``torch.multiprocessing.spawn``, ``from torch import multiprocessing``, ``from
    torch.multiprocessing import spawn``, ``import multiprocessing``, ``from multiprocessing import
    Process``, ``mp.get_context("spawn").Process``. ``None`` too when the file does not parse.
    """
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    modules: dict[str, tuple[str, ...]] = {}  # a name bound to a module of processes -> the starters it has
    functions: set[str] = set()
    torches: set[str] = set()
    contexts: set[str] = set()  # names bound to mp.get_context(...)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in _STARTERS and (alias.asname or "." not in alias.name):
                    modules[alias.asname or alias.name] = _STARTERS[alias.name]
                elif alias.name == "torch" or (alias.name.startswith("torch.") and not alias.asname):
                    torches.add(alias.asname or "torch")
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                if node.module == "torch" and alias.name == "multiprocessing":
                    modules[alias.asname or alias.name] = _STARTERS["torch.multiprocessing"]
                elif node.module in _STARTERS and alias.name in _STARTERS[node.module]:
                    functions.add(alias.asname or alias.name)
                elif node.module == "torch.multiprocessing.spawn" and alias.name in SPAWNS:
                    functions.add(alias.asname or alias.name)
        elif isinstance(node, ast.Assign) and _is_get_context(node.value, modules):
            contexts.update(t.id for t in node.targets if isinstance(t, ast.Name))
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in functions:
            lines.append(node.lineno)
        elif isinstance(func, ast.Attribute):
            owner = func.value
            if isinstance(owner, ast.Name) and func.attr in modules.get(owner.id, ()):
                lines.append(node.lineno)
            elif func.attr == "Process" and (
                (isinstance(owner, ast.Name) and owner.id in contexts) or _is_get_context(owner, modules)
            ):
                lines.append(node.lineno)
            elif (
                func.attr in _STARTERS["torch.multiprocessing"]
                and isinstance(owner, ast.Attribute)
                and owner.attr == "multiprocessing"
                and isinstance(owner.value, ast.Name)
                and owner.value.id in torches
            ):
                lines.append(node.lineno)
    return min(lines) if lines else None


_STARTERS = {"torch.multiprocessing": (*SPAWNS, "Process"), "multiprocessing": ("Process",)}
"""The modules whose functions (or classes) start a script's own ranks, and their names."""


def _is_get_context(node: ast.AST, modules: dict[str, tuple[str, ...]]) -> bool:
    """Whether ``node`` is ``mp.get_context(...)`` for a module of processes ``mp``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get_context"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in modules
    )


def _reimports(fn: Any, start_method: str) -> bool:
    """Whether ranks of a spawn import the script again: torch's 'spawn'/'forkserver', for a function of the script."""
    if start_method == "fork" or getattr(fn, "__module__", None) != "__main__":
        return False
    if "<" in getattr(fn, "__qualname__", "<"):  # a lambda, or a function defined in a function
        raise ValueError(
            f"simdist: torch.multiprocessing.spawn got {fn!r}, which torch's '{start_method}' start method cannot "
            "send to a child process (it is pickled by name): define it at module level, or use "
            "start_method='fork' with torch.multiprocessing.start_processes"
        )
    return True


def default_isolation(requested: str | None, say: Callable[[str], Any] | None = None) -> str:
    """The isolation of a script's ranks: ``requested``, or processes (each rank's own modules, ``sys.argv``,
    ``atexit``, as under torchrun) where this system has them, else threads, after ``say`` gave one line on
    what differs."""
    if requested is not None:
        return requested
    if hasattr(os, "pidfd_open"):
        return "processes"
    if say is not None:
        say(
            "simdist: ranks as processes need Linux (pidfd); the script's ranks run as threads of one process, "
            "sharing its modules, sys.argv, atexit and signal handlers (the same schedules, values and tokens)"
        )
    return "threads"


def script_defaults(isolation: str | None) -> dict[str, Any]:
    """The options a script's runs have in ``simdist.testing`` unless told: buffer races checked, each rank's output
    kept as its values, and ranks as processes where they can be (:func:`default_isolation`; ``isolation``: what
    was asked for, as an option or by ``pytest --simdist-isolation``)."""
    say = lambda line: print(line, file=sys.stderr)  # noqa: E731
    return {"check_buffers": True, "capture_output": True, "isolation": default_isolation(isolation, say)}


@dataclass(frozen=True)
class Script:
    """A script as torchrun is given it: ``target`` (a file, or with ``module`` a module's name) and its ``args``, on
    ``per_node`` ranks on each of ``nnodes`` nodes, started as ``launch`` says (``'torchrun'`` or ``'spawn'``).

    Make one with :meth:`of`, which checks the arguments and decides ``launch='auto'``.
    """

    target: str  # the script's absolute path, or the module's name
    path: str  # the file that runs (a module's too)
    args: tuple[str, ...] = ()
    per_node: int = 1
    nnodes: int = 1
    module: bool = False
    launch: str = "torchrun"
    master: tuple[str, int] = DEFAULT_MASTER  # MASTER_ADDR and MASTER_PORT
    env: Mapping[str, str] = field(default_factory=dict)  # what the launcher adds to the ranks' environment

    @classmethod
    def of(
        cls,
        script: str | os.PathLike,
        per_node: int,
        args: Any = (),
        *,
        nnodes: int = 1,
        module: bool = False,
        launch: str = "auto",
        master: tuple[str, int] = DEFAULT_MASTER,
        env: Mapping[str, str] | None = None,
    ) -> Script:
        """The script ``script`` checked: its file found, ``launch='auto'`` decided (``'spawn'`` when its source
        starts ranks of its own, else ``'torchrun'``).

        Raises:
            ValueError, TypeError: a bad argument, named with its value and what was expected.
        """
        for name, value in (("nprocs", per_node), ("nnodes", nnodes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if launch not in LAUNCHES:
            raise ValueError(f"launch={launch!r}: expected one of {LAUNCHES}")
        if isinstance(args, (str, bytes)) or not all(isinstance(a, str) for a in args):
            raise TypeError(f"args={args!r:.80} must be a sequence of str (the script's sys.argv[1:])")
        if module:
            path = module_file(os.fspath(script))
            target = os.fspath(script)
        else:
            target = path = os.path.abspath(os.fspath(script))
            if not os.path.isfile(path):
                raise ValueError(f"script {os.fspath(script)!r} does not exist (looked for {path})")
        if launch == "auto":
            launch = "spawn" if spawn_line(path) is not None else "torchrun"
        if launch == "spawn" and nnodes > 1:
            raise ValueError(
                f"{os.path.basename(path)} starts its own ranks with torch.multiprocessing.spawn, so it runs once, as "
                f"the parent on one node; --nnodes={nnodes} is not supported for it. Use --nnodes 1 (the node's GPUs "
                "are --nproc-per-node), or --launch torchrun to run the script on every rank"
            )
        return cls(target, path, tuple(args), per_node, nnodes, module, launch, master, dict(env or {}))

    @property
    def name(self) -> str:
        """How replay tokens name the script (``@script=NAME``): its file name, or the module's name."""
        return self.target if self.module else os.path.basename(self.path)

    @property
    def world(self) -> int:
        """The job's ranks: ``per_node * nnodes`` (for a script that starts its own ranks, its node's GPUs)."""
        return self.per_node * self.nnodes

    @contextlib.contextmanager
    def running(self, cwd: str | None = None) -> Iterator[None]:
        """Within the block this process is set up as ``python script.py args`` under torchrun would be: ``sys.argv``,
        the script's folder first on ``sys.path``, the launcher's environment, and ``cwd`` (if given) as the working
        directory; afterwards each is as it was. (``runpy`` swaps ``sys.modules['__main__']`` and ``sys.argv[0]`` in
        and out; with ranks interleaved the swaps do not nest, so the process's own are put back here too.)"""
        saved = (sys.argv, sys.modules.get("__main__"), list(sys.path), dict(os.environ), os.getcwd())
        sys.argv = [self.path, *self.args]
        sys.path.insert(0, (cwd or os.getcwd()) if self.module else os.path.dirname(self.path))
        os.environ.update(self.env)
        if cwd is not None:
            os.chdir(cwd)
        try:
            yield
        finally:
            sys.argv, main_module, sys.path[:], environ, folder = saved
            if main_module is not None:
                sys.modules["__main__"] = main_module
            for key in [k for k in os.environ if k not in environ]:
                del os.environ[key]
            os.environ.update(environ)
            os.chdir(folder)
            sys.stdout.flush()


def module_file(name: str) -> str:
    """The file ``python -m name`` runs (the working folder first on ``sys.path``); ``ValueError`` when there is none."""
    import importlib.util

    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:  # a package: its __main__
            spec = importlib.util.find_spec(f"{name}.__main__")
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path.remove(os.getcwd())
    if spec is None or not spec.origin:
        raise ValueError(f"-m {name}: no module named {name!r} (looked up as python -m does)")
    return spec.origin


@dataclass(frozen=True)
class ScriptProgram(Program):
    """A :class:`Script` on simulated ranks: each run a simulation of the job (or of each start of ranks of a script
    that starts its own), in ``files``' copy of the working directory when given (else where the process is).

    ``options`` are :func:`simdist.simulate`'s; the run's values are each rank's :class:`ScriptRank`.
    """

    script: Script | None = None
    files: Scratch | None = None

    @classmethod
    def of(
        cls, script: Script, options: Mapping[str, Any], check: Callable | None = None, files: Scratch | None = None
    ) -> ScriptProgram:
        """The program of ``script``: its ranks run ``script_rank`` (torchrun's way) with the script's name in
        ``options`` (its replay tokens say ``@script=NAME``) and each node's GPUs ``script.per_node``."""
        options = {**options, "script": script.name}
        if options.get("gpus_per_node") is None:
            options["gpus_per_node"] = script.per_node
        args = (script.target, script.per_node, script.world, script.master, script.module)
        return cls(_script_ranks.script_rank, script.world, args, options, check, script, files)

    def simulate(self, **how: Any) -> Any:
        """One run of the script under ``how``, from the start of its files: a ``SimResult`` whose values are its
        ranks' :class:`ScriptRank`\\ s, or the run's error."""
        script = self.script
        assert script is not None, "a ScriptProgram is made by ScriptProgram.of"
        if self.files is not None:
            self.files.reset()
        with script.running(None if self.files is None else self.files.path):
            if script.launch == "spawn":
                return self._parent(how)
            res = super().simulate(**how)
        output = res.output or [("", "")] * len(res.values)
        values = [ScriptRank(r, code or 0, *map(_lines, output[r])) for r, code in enumerate(res.values)]
        return dataclasses.replace(res, values=values)

    @contextlib.contextmanager
    def at_files(self) -> Iterator[None]:
        """The block runs in the folder the last run's files are in (its copy of the working directory)."""
        if self.files is None:
            yield
            return
        before = os.getcwd()
        os.chdir(self.files.path)
        try:
            yield
        finally:
            os.chdir(before)

    def _parent(self, how: dict) -> Any:
        """A run of a script that starts its own ranks: the script once, here, each start of ranks a simulation, all
        under one strategy; the ``SimResult`` of them all (or the first failure, with the whole run's token)."""
        import torch

        from simdist import torch_bridge
        from simdist.backends.sim import check_token, make_strategy, simulate

        script = self.script
        assert script is not None
        how = dict(how)
        schedule, seed, strategy = how.pop("schedule", None), how.pop("seed", None), how.pop("strategy", None)
        check_token(schedule, script.world, script.name)
        shared = make_strategy(strategy, seed, schedule)
        options = {**self.options, **how}
        processes = options.get("isolation", "threads") == "processes"
        cuda_as_cpu = options.get("cuda_as_cpu")
        if cuda_as_cpu is None:
            cuda_as_cpu = not torch.cuda.is_available()
        starts: list[Any] = []

        def run(fn: Callable, nprocs: int, args: tuple, start_method: str) -> None:
            one = {**options, "isolation": "processes" if processes and start_method != "fork" else "threads"}
            if starts and one.get("trace_file") is not None:  # the k-th start's trace: NAME.k.json
                stem, dot, suffix = os.fspath(one["trace_file"]).rpartition(".")
                one["trace_file"] = f"{stem}.{len(starts) + 1}.{suffix}" if dot else f"{suffix}.{len(starts) + 1}"
            try:
                starts.append(simulate(fn, nprocs, args, strategy=shared, **one))
            except DistError as err:
                raise self._whole(err, starts, shared) from err.__cause__

        def start(fn: Callable, args: tuple, nprocs: int, start_method: str) -> None:
            own = processes and start_method != "fork"
            main = script.path if _reimports(fn, start_method) and not own else None
            run(_script_ranks.spawned, nprocs, (main, fn, *args), start_method)

        def start_processes(calls: list, start_method: str) -> None:
            own = processes and start_method != "fork"
            mains = [script.path if _reimports(target, start_method) and not own else None for target, _, _ in calls]
            run(_script_ranks.started, len(calls), (mains, calls), start_method)

        gpus = torch_bridge.cuda.simulated_gpus(script.per_node) if cuda_as_cpu else contextlib.nullcontext()
        try:
            with gpus, torch_bridge.spawn.starting_ranks(start, start_processes):
                _script_ranks.run_main(script.target, script.module, "__main__")
        except DistError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the parent's own failure, as a failure of the run
            if isinstance(exc, KeyboardInterrupt):
                raise
            err = ScriptError(script.name, exc)
            err.choices = [c for res in starts for c in res.choices]
            raise err._with_schedule(self._token(shared, err.choices)) from exc
        return self._combined(starts, shared)

    def _token(self, strategy: Any, choices: list[int]) -> str:
        """The replay token of a whole run of a script that starts its own ranks."""
        from simdist.backends.sim import encode_choices, make_token

        script = self.script
        assert script is not None
        schedule = strategy.token() or encode_choices(choices)
        return make_token(schedule, script.world, self.options.get("test"), script.name)

    def _whole(self, err: DistError, starts: list, strategy: Any) -> DistError:
        """``err`` of one start of ranks as the failure of the whole run: the choices and token of every start."""
        if err.choices is not None:
            err.choices = [c for res in starts for c in res.choices] + list(err.choices)
            err.schedule = None
            err._with_schedule(self._token(strategy, err.choices))
        return err

    def _combined(self, starts: list, strategy: Any) -> Any:
        """One ``SimResult`` of the starts of ranks of a run, in order: each one's trace after the one before."""
        from simdist.backends.sim import SimResult
        from simdist.core import Trace

        events, offset = [], 0.0
        for res in starts:
            events += [dataclasses.replace(e, t_start=e.t_start + offset, t_end=e.t_end + offset) for e in res.trace]
            offset += res.time
        meta = dict(starts[-1].trace.meta) if starts else {}
        choices = [c for res in starts for c in res.choices]
        meta["schedule"] = token = self._token(strategy, choices)
        values = [
            ScriptRank(r, 0, *map(_lines, (res.output or [("", "")] * len(res.values))[r]))
            for res in starts
            for r in range(len(res.values))
        ]
        return SimResult(
            values,
            Trace(events, meta),
            token,
            choices,
            [leak for res in starts for leak in res.leaks],
            sum(res.points for res in starts),
            [n for res in starts for n in res.option_counts],
            [out for res in starts for out in (res.output or [])] or None,
        )


def _lines(text: str) -> tuple[str, ...]:
    return tuple(text.splitlines())
