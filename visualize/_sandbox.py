"""Running pasted code: in a separate, contained process, never in the caller's.

``run_code(source, world)`` executes ``source`` in a fresh ``python3`` process that
defines ``main(rank)``, runs it on ``world`` simulated ranks, and sends back the trace as
JSON. The child is contained as far as the platform allows:

- a minimal environment (``PATH``, ``LANG``, ``HOME``/``TMPDIR`` set to its private
  directory, one thread for OpenMP), none of the app's variables or secrets;
- a private, empty working directory, removed afterwards;
- its own session and process group, killed when the run ends (also on success), and a
  supervisor process (a child subreaper, ``PR_SET_CHILD_SUBREAPER``) that runs the code in
  its child and, when that ends or the run times out, kills every process descended from
  it, also those that left the group with ``setsid()``; so grandchildren the code started
  do not outlive it. Its output goes to files, so a grandchild that holds stdout cannot
  keep the run waiting;
- limits on address space, CPU seconds, file size, open files and processes. Linux
  counts ``RLIMIT_NPROC`` over all processes (threads) of a user, so the child's limit is
  the number its user already has plus ``world`` plus a margin of 64; when the app runs
  as root (which the kernel exempts from that limit) the child drops to ``nobody``;
- no network, via a new network namespace (``unshare(CLONE_NEWNET)``, as root, or with a
  new user namespace otherwise). Where neither is permitted the run says so:
  ``CodeResult.network_isolated`` is ``False`` and the code can use the network.

Where bubblewrap is installed (:func:`bubblewrap`), the child runs in its sandbox as well: new
namespaces of every kind (no network; its own processes, all gone when it ends), the user
``nobody``, and of the file system only the system's libraries, the Python installation and
simdist (read-only) and an empty home and /tmp of its own. There the task limit is a pids cgroup
when the app runs as root (root outside the sandbox's user namespace is exempt from
``RLIMIT_NPROC``), else ``RLIMIT_NPROC`` from the user's task count on the host. Root without a
writable pids controller (a container that delegates none) has no task limit in the sandbox: the
time limit and the sandbox's end still stop every process it started.

Without bubblewrap, pasted code can still read what its user may read (with the capability kept,
any file), and where the app does not run as root, code that kills its own supervisor can leave a
process behind. The app then offers this only when started with ``SIMDIST_ALLOW_CODE=1``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

__all__ = ["ALLOW_ENV", "CodeResult", "GradeResult", "bubblewrap", "code_allowed", "grade_code", "run_code"]

ALLOW_ENV = "SIMDIST_ALLOW_CODE"
_NET = "@@SIMDIST-NET@@"
_MARK = "@@SIMDIST@@"
_WALLED_HOME = "/home/student"  # the home (and working directory) of code in bubblewrap
_CLEANUP_S = 10.0  # how long the supervisor may take to kill what the code started, after a timeout

_WORKER = r"""
import ctypes, json, os, resource, sys
payload = json.loads(sys.stdin.read())
sys.stdin.close()
source, exercise = payload["source"], payload.get("exercise")
memory_mb, world, cpu_s, fsize_mb, nofile, walled, host_tasks = (int(a) for a in sys.argv[1:8])  # world: the tasks
libc = ctypes.CDLL(None, use_errno=True)
NEWUSER, NEWNET = 0x10000000, 0x40000000
def descendants(root):
    children = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                state, ppid = f.read().rpartition(")")[2].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(name))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found
def supervise(child):
    import signal, time
    class Stop(Exception):
        pass
    def stop(*_):
        raise Stop
    signal.signal(signal.SIGTERM, stop)
    status = None
    try:
        status = os.waitpid(child, 0)[1]
    except Stop:
        pass
    for _ in range(2000):  # kill what is left, until nothing is: orphans come back to us, the subreaper
        found = descendants(os.getpid())
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        time.sleep(0.005)
    if status is None or os.WIFSIGNALED(status):
        sig = signal.SIGKILL if status is None else os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status))
libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: descendants orphaned by a setsid() come back here
child = os.fork()
if child:
    supervise(child)
def threads():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])
isolated = walled or (os.geteuid() == 0 and libc.unshare(NEWNET) == 0)  # walled: bubblewrap cut the network
if os.geteuid() == 0:  # become nobody, keeping only the capability to read (the stdlib may be under /root)
    libc.prctl(8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    read = 1 << 2  # CAP_DAC_READ_SEARCH
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)(read, read, read, 0, 0, 0)
    if libc.capset(header, data) != 0 or libc.prctl(47, 2, 2, 0, 0) != 0:  # PR_CAP_AMBIENT_RAISE
        raise SystemExit("could not keep the capability to read files as nobody")
if not isolated:
    isolated = libc.unshare(NEWUSER | NEWNET) == 0
print("@@SIMDIST-NET@@" + ("1" if isolated else "0"), flush=True)
limit = memory_mb << 20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import simdist
import sysconfig
if all(os.access(d, os.R_OK | os.X_OK) for d in [sysconfig.get_paths()["stdlib"], *filter(os.path.isdir, sys.path)]):
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL: nobody reads the installation, keep no capability
    libc.capset((ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)())
nproc = host_tasks + threads() + world + 64  # host_tasks: the app counted them (a user namespace hides the
# real uid, bubblewrap's /proc the host's tasks)
resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
for what, value in ((resource.RLIMIT_FSIZE, fsize_mb << 20), (resource.RLIMIT_NOFILE, nofile),
                    (resource.RLIMIT_NPROC, nproc)):
    resource.setrlimit(what, (value, value))
if exercise is not None:  # grade the code as a submission to the exercise (simdist.exercises)
    import dataclasses
    from simdist.exercises import grade, parse
    verdict = grade(parse(exercise["text"], exercise["name"]), source, payload.get("isolation", "threads"))
    print("\n@@SIMDIST@@" + json.dumps({"ok": True, "verdict": dataclasses.asdict(verdict)}), flush=True)
    raise SystemExit(0)
isolation = payload.get("isolation", "threads")
if isolation == "processes":  # the rank processes import the code: a module of the private folder
    from simdist.launch._scripts import importable
    main = getattr(importable([(source, "<pasted code>")], os.getcwd(), "pasted"), "main", None)
else:
    namespace = {"__name__": "pasted"}
    exec(compile(source, "<pasted code>", "exec"), namespace)
    main = namespace.get("main")
if not callable(main):
    raise SystemExit("the pasted code must define main(rank)")
try:
    res = simdist.simulate(main, payload["world"], seed=0, leaks="ignore", check_buffers=True, isolation=isolation)
    out = {"ok": True, "trace": res.trace.to_json(), "values": [repr(v)[:200] for v in res.values]}
except simdist.DistError as err:
    out = {"ok": False, "error": f"{type(err).__name__}: {err}"}
print("\n@@SIMDIST@@" + json.dumps(out), flush=True)
"""


@dataclass(frozen=True)
class CodeResult:
    """What a run of pasted code gave: a trace (JSON) and values, or an error text.

    ``network_isolated`` tells whether the child ran without network access (a new
    network namespace); ``False`` where the platform did not permit one.
    """

    ok: bool
    trace_json: str | None = None
    values: tuple = ()
    error: str | None = None
    network_isolated: bool = False
    bubblewrap: bool = False  # it ran in bubblewrap's sandbox (see :func:`bubblewrap`)


def code_allowed() -> bool:
    """Whether this process was started with ``SIMDIST_ALLOW_CODE=1``.

    The app runs pasted code (:func:`run_code`) only when this is ``True``.

    Returns:
        ``True`` if the environment variable ``SIMDIST_ALLOW_CODE`` is ``"1"``.

    Example:
        >>> import os
        >>> from simdist.visualize import code_allowed
        >>> code_allowed() == (os.environ.get("SIMDIST_ALLOW_CODE") == "1")
        True
    """
    return os.environ.get(ALLOW_ENV) == "1"


def _check_isolation(isolation: object) -> None:
    if isolation not in ("threads", "processes"):
        raise ValueError(f"isolation={isolation!r} is not a kind of rank; expected 'threads' or 'processes'")


def _tasks(world: int, isolation: str) -> int:
    """The tasks a run of ``world`` ranks needs beyond the spare ones: a thread each, or with ranks as processes, a
    fork server and a template, and each rank's process, its thread in the child and the next run's process."""
    return world if isolation == "threads" else 4 * world + 16


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}={value!r} must be a positive number")


def _child_env(home: str) -> dict:
    return {
        "PATH": os.defpath,
        "LANG": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_code(
    source: str,
    world: int,
    *,
    timeout: float = 20.0,
    memory_mb: int = 2048,
    cpu_seconds: int | None = None,
    file_mb: int = 64,
    open_files: int = 256,
    isolation: str = "threads",
) -> CodeResult:
    """Run ``main(rank)`` from ``source`` on ``world`` simulated ranks in a contained child process.

    Returns its trace and values, or the error text. ``timeout`` bounds wall time;
    ``cpu_seconds`` (default twice ``timeout``, at least 10) CPU time; ``memory_mb`` the
    address space; ``file_mb`` the size of any file written; ``open_files`` the
    descriptors. Raises ``TypeError``/``ValueError`` for a bad argument.

    Args:
        source: Python source that defines ``main(rank)``.
        world: the number of ranks, 1 to 64.
        timeout: wall-clock seconds (positive).
        memory_mb: the child's address space in MiB.
        cpu_seconds: the child's CPU seconds; default twice ``timeout``, at least 10.
        file_mb: the largest file the child may write, in MiB.
        open_files: the most file descriptors the child may hold.
        isolation: ``'threads'`` or ``'processes'``: each rank a thread of the child, or a process of its own
            (``simdist.simulate(isolation=...)``; the child's task limit grows by four per rank).

    Returns:
        A ``CodeResult``: ``ok``; ``values`` (each rank's return value as its ``repr``) and
        ``trace_json``, or ``error`` (the text of what went wrong); ``network_isolated``; ``bubblewrap``
        (it ran in bubblewrap's sandbox, which it does wherever :func:`bubblewrap` finds it).

    Raises:
        TypeError: ``source`` is not a str.
        ValueError: ``world`` is not an int from 1 to 64, a limit is not positive, or ``isolation`` is neither kind.

    Example:
        >>> from simdist.visualize import run_code
        >>> res = run_code("def main(rank): return rank * 10", 2)
        >>> res.ok, res.values
        (True, ('0', '10'))
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__}")
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= 64:
        raise ValueError(f"world={world!r} must be an int from 1 to 64")
    for name, value in (
        ("timeout", timeout),
        ("memory_mb", memory_mb),
        ("file_mb", file_mb),
        ("open_files", open_files),
    ):
        _positive(name, value)
    cpu = max(10, int(2 * timeout)) if cpu_seconds is None else cpu_seconds
    _positive("cpu_seconds", cpu)
    _check_isolation(isolation)
    walled = bubblewrap() is not None
    code, stdout, stderr = _contained(
        {"source": source, "world": world, "isolation": isolation},
        _tasks(world, isolation),
        timeout=timeout,
        memory_mb=memory_mb,
        cpu=cpu,
        file_mb=file_mb,
        open_files=open_files,
        walled=walled,
    )
    return _result(code, stdout, stderr, timeout, cpu, walled)


def bubblewrap() -> str | None:
    """The path of bubblewrap (``bwrap``) where it is installed and can make a sandbox here, else ``None``.

    Looked up once per process (a probe sandbox runs ``true``): install bubblewrap, then restart the app.

    Returns:
        The path of ``bwrap``, or ``None``.

    Example:
        >>> from simdist.visualize import bubblewrap
        >>> bubblewrap() is None or bubblewrap().endswith("bwrap")
        True
    """
    return _bubblewrap()


@functools.cache
def _bubblewrap() -> str | None:
    path = shutil.which("bwrap")
    if path is None:
        return None
    try:
        probe = subprocess.run([path, *_walls(), "true"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return path if probe.returncode == 0 else None


def _walls(file_mb: int = 64) -> list[str]:
    """bubblewrap's arguments: every namespace new (no network, its own processes), the user ``nobody``, and of the
    file system only the system's libraries, the Python installation and simdist's modules (read-only), an empty
    /tmp and home of ``file_mb`` MiB each, /proc and a minimal /dev."""
    import importlib.util
    import site
    import sysconfig

    size = str(int(file_mb) << 20)
    walls = ["--unshare-all", "--die-with-parent", "--new-session", "--uid", "65534", "--gid", "65534"]
    # the empty file systems first: a bind made after them may lie inside (a venv under /tmp), one before would be hidden
    walls += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        size,
        "--tmpfs",
        "/tmp",
        "--size",
        size,
        "--tmpfs",
        _WALLED_HOME,
    ]
    walls += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64"):
        path = "/" + name
        if os.path.islink(path):
            walls += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            walls += ["--ro-bind", path, path]
    walls += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    # the installation, not this process's sys.path (it starts with the app's own folder)
    python = {sys.base_prefix, sys.prefix, *site.getsitepackages()}
    python |= {p for p in sysconfig.get_paths().values() if os.path.isdir(p)}
    for package in ("simdist", "simdist.backends", "simdist.visualize"):
        spec = importlib.util.find_spec(package)
        python |= set(spec.submodule_search_locations or []) if spec is not None else set()
    plugin = importlib.util.find_spec("pytest_simdist")  # simdist.testing reads its options
    if plugin is not None and plugin.origin:
        python.add(plugin.origin)
    for path in sorted({os.path.realpath(p) for p in python}):
        walls += ["--ro-bind", path, path]
    walls += ["--chdir", _WALLED_HOME]
    return walls


def _contained(
    payload: dict,
    world: int,
    *,
    timeout: float,
    memory_mb: int,
    cpu: int,
    file_mb: int,
    open_files: int,
    walled: bool = False,
) -> tuple[int | None, str, str]:
    """Run the worker on ``payload`` in the contained child: its exit code (``None``: stopped at ``timeout``),
    stdout and stderr. ``walled``: inside bubblewrap (:func:`bubblewrap` must have found it)."""
    outdir = tempfile.mkdtemp(prefix="simdist-out-")
    home = tempfile.mkdtemp(prefix="simdist-code-")
    if os.geteuid() == 0:
        os.chown(home, 65534, 65534)
    worker = [
        sys.executable,
        "-I",
        "-c",
        _WORKER,
        str(int(memory_mb)),
        str(world),
        str(int(cpu)),
        str(int(file_mb)),
        str(int(open_files)),
        "1" if walled else "0",
        str(_tasks_of(65534 if os.geteuid() == 0 else os.getuid())),  # the user the code runs as (root: nobody)
    ]
    command = [_bubblewrap() or "bwrap", *_walls(file_mb), *worker] if walled else worker
    cgroup = _pids_cgroup(world + _SPARE_TASKS) if walled and os.geteuid() == 0 else None
    if cgroup is not None:  # the shell joins it, then becomes bubblewrap: every task of the run is counted
        command = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, *command]
    env = _child_env(_WALLED_HOME if walled else home)
    if walled:
        env["TMPDIR"] = "/tmp"
    try:
        with open(os.path.join(outdir, "out"), "w+") as out, open(os.path.join(outdir, "err"), "w+") as err:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                text=True,
                cwd=home,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
            try:
                proc.stdin.write(json.dumps(payload))
                proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
                proc.terminate()  # the supervisor kills the code and everything it started
                try:
                    proc.wait(timeout=_CLEANUP_S)
                except subprocess.TimeoutExpired:
                    pass
            finally:
                _kill_group(proc)
                proc.wait()
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
        if cgroup is not None:
            _remove_cgroup(cgroup)
    return code, stdout, stderr


_SPARE_TASKS = 64  # the tasks a run may have beyond one thread per rank (as the worker's RLIMIT_NPROC margin)
_PIDS_HIERARCHIES = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")  # cgroup v1's pids hierarchy, cgroup v2's


def _tasks_of(uid: int) -> int:
    """The number of tasks (threads) of user ``uid`` on this host, as ``RLIMIT_NPROC`` counts them."""
    n = 0
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            if int(status["Uid"].split()[0]) == uid:
                n += int(status["Threads"])
        except (OSError, KeyError, ValueError):
            pass
    return n


def _pids_cgroup(limit: int) -> str | None:
    """A new cgroup whose tasks (processes and threads) may number at most ``limit``, as its directory;
    ``None`` where none can be made here (not root, no writable pids controller).

    Code that runs as root in bubblewrap runs as root outside its user namespace, which ``RLIMIT_NPROC``
    exempts: this limit holds for root too.
    """
    for hierarchy in _PIDS_HIERARCHIES:
        try:
            path = tempfile.mkdtemp(prefix="simdist-code-", dir=hierarchy)
        except OSError:
            continue
        try:  # no O_CREAT: only a cgroup with the pids controller has the file
            fd = os.open(os.path.join(path, "pids.max"), os.O_WRONLY)
            try:
                os.write(fd, str(int(limit)).encode())
            finally:
                os.close(fd)
            return path
        except OSError:  # a plain directory, or cgroup v2 without the pids controller enabled for its children
            _remove_cgroup(path)
    return None


def _remove_cgroup(path: str) -> None:
    """Remove the (emptied) cgroup ``path``; its last tasks may take a moment to be reaped."""
    for _ in range(100):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if not os.path.exists(os.path.join(path, "cgroup.procs")):  # a plain directory
                shutil.rmtree(path, ignore_errors=True)
                return
            time.sleep(0.02)


def _parsed(code: int | None, stdout: str, stderr: str, timeout: float, cpu: int) -> tuple[dict | str, bool]:
    """``(what the worker sent back, or the text of what went wrong; whether it ran without network)``."""
    isolated = stdout.startswith(_NET + "1")
    if code is None:
        return f"the code did not finish within {timeout:g} s (it was stopped)", isolated
    if code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):  # bubblewrap exits 128 + the signal that killed its child
        return f"the code used more than {cpu} s of CPU time (it was stopped)", isolated
    _, sep, tail = stdout.rpartition(_MARK)
    if not sep:
        lines = (stderr or stdout).strip().splitlines()
        return "\n".join(lines[-15:]) or f"the child process exited with {code}", isolated
    out = json.loads(tail)
    return (out if out["ok"] else out["error"]), isolated


def _result(code: int | None, stdout: str, stderr: str, timeout: float, cpu: int, walled: bool) -> CodeResult:
    out, isolated = _parsed(code, stdout, stderr, timeout, cpu)
    if isinstance(out, str):
        return CodeResult(False, error=out, network_isolated=isolated, bubblewrap=walled)
    values = tuple(out["values"])
    return CodeResult(True, trace_json=out["trace"], values=values, network_isolated=isolated, bubblewrap=walled)


@dataclass(frozen=True)
class GradeResult:
    """What grading a submission in the contained child gave: the verdict (``simdist.exercises.Verdict``'s
    fields as a dict), or the text of what stopped it; ``network_isolated`` as for :class:`CodeResult`."""

    ok: bool
    verdict: dict | None = None
    error: str | None = None
    network_isolated: bool = False
    bubblewrap: bool = False  # it ran in bubblewrap's sandbox (see :func:`bubblewrap`)


def grade_code(
    exercise_text: str,
    name: str,
    source: str,
    *,
    timeout: float = 120.0,
    memory_mb: int = 2048,
    isolation: str = "threads",
) -> GradeResult:
    """Grade ``source`` as a submission to the exercise whose TOML text is ``exercise_text``, in a contained child.

    The child is the one :func:`run_code` starts (no environment, a private empty directory, limits,
    no network where permitted, every process it started killed at the end); it runs
    ``simdist.exercises.grade`` and sends the verdict back.

    Args:
        exercise_text: the exercise's TOML file, as text.
        name: the exercise's name (its file's stem).
        source: the student's code.
        timeout: wall-clock seconds for the whole grading.
        memory_mb: the child's address space in MiB.
        isolation: ``'threads'`` or ``'processes'`` (``simdist.exercises.grade``'s).

    Returns:
        A :class:`GradeResult`.

    Raises:
        TypeError: ``exercise_text``, ``name`` or ``source`` is not a str.
        ValueError: a limit is not positive.

    Example:
        >>> from simdist.exercises import load_all
        >>> from simdist.visualize import grade_code
        >>> server = {e.name: e for e in load_all()}["05_parameter_server"]
        >>> res = grade_code(server.path.read_text(), server.name, server.solution)
        >>> res.ok, res.verdict["kind"]
        (True, 'passed')
    """
    for what, value in (("exercise_text", exercise_text), ("name", name), ("source", source)):
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    _positive("timeout", timeout)
    _positive("memory_mb", memory_mb)
    cpu = max(10, int(2 * timeout))
    _check_isolation(isolation)
    payload = {"source": source, "exercise": {"text": exercise_text, "name": name}, "isolation": isolation}
    walled = bubblewrap() is not None
    code, stdout, stderr = _contained(
        payload,
        _tasks(16, isolation),
        timeout=timeout,
        memory_mb=memory_mb,
        cpu=cpu,
        file_mb=64,
        open_files=256,
        walled=walled,
    )
    out, isolated = _parsed(code, stdout, stderr, timeout, cpu)
    if isinstance(out, str):
        return GradeResult(False, error=out, network_isolated=isolated, bubblewrap=walled)
    return GradeResult(True, verdict=out["verdict"], network_isolated=isolated, bubblewrap=walled)
