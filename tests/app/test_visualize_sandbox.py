"""The containment of pasted code: each limit checked on a real child process."""

import ast
import os
import socket
import time

import pytest
from simdist.visualize._sandbox import run_code

pytestmark = pytest.mark.timeout(180)

NOOP = "def main(rank):\n    return 0\n"
LOADED = 90.0  # s of wall time for code that is not about the time limit: a child importing torch on a loaded machine


@pytest.fixture(autouse=True, params=["process", "bubblewrap"])
def containment(request, monkeypatch):
    """Each test on each containment ``run_code`` may use: the contained process alone (as where bubblewrap is
    not installed), and inside bubblewrap's sandbox where it is installed here."""
    from simdist.visualize import _sandbox, bubblewrap

    if request.param == "process":
        monkeypatch.setattr(_sandbox, "_bubblewrap", lambda: None)
    elif bubblewrap() is None:
        pytest.skip("bubblewrap is not installed here (apt-get install bubblewrap)")
    return request.param


def _values(res):
    assert res.ok, res.error
    return [ast.literal_eval(v) for v in res.values]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_child_does_not_see_the_parents_environment(monkeypatch):
    monkeypatch.setenv("SIMDIST_TEST_SECRET", "hunter2")
    res = run_code("import os\nENV = dict(os.environ)\ndef main(rank):\n    return ENV\n", 1, timeout=LOADED)
    env = _values(res)[0]
    assert "SIMDIST_TEST_SECRET" not in env and "hunter2" not in repr(env)
    assert set(env) <= {
        "PATH",
        "LANG",
        "HOME",
        "TMPDIR",
        "OMP_NUM_THREADS",
        "PYTHONDONTWRITEBYTECODE",
        "LC_CTYPE",
        "PWD",
    }


def test_the_working_directory_is_fresh_empty_and_removed_afterwards():
    res = run_code(
        "import os\nCWD, FILES = os.getcwd(), os.listdir('.')\nopen('x.txt', 'w').write('hi')\n"
        "def main(rank):\n    return [CWD, FILES, os.environ['HOME']]\n",
        1,
        timeout=LOADED,
    )
    cwd, files, home = _values(res)[0]
    assert files == [] and home == cwd
    assert not os.path.exists(cwd)


def test_file_writes_are_limited_in_size():
    res = run_code(
        "open('big', 'wb').write(bytes(8 << 20))\ndef main(rank):\n    return 0\n", 1, file_mb=1, timeout=LOADED
    )
    assert not res.ok and "File too large" in res.error
    res = run_code(
        "open('small', 'wb').write(bytes(1 << 19))\ndef main(rank):\n    return 0\n", 1, file_mb=1, timeout=LOADED
    )
    assert res.ok, res.error


def test_a_fork_bomb_is_stopped_by_the_process_limit(monkeypatch):
    from simdist.visualize import _sandbox

    made = []  # in bubblewrap as root, the limit is a pids cgroup of the run's own
    make = _sandbox._pids_cgroup

    def noted(limit):
        made.append(make(limit))
        return made[-1]

    monkeypatch.setattr(_sandbox, "_pids_cgroup", noted)
    src = (
        "import os, signal, time\npids, err = [], None\n"
        "try:\n    for _ in range(5000):\n        pid = os.fork()\n        if pid == 0:\n            time.sleep(600)\n"
        "            os._exit(0)\n        pids.append(pid)\nexcept OSError as e:\n    err = e.errno\n"
        "forked = len(pids)\nfor pid in pids:\n    os.kill(pid, signal.SIGKILL)\n    os.waitpid(pid, 0)\n"
        "def main(rank):\n    return [forked, err]\n"
    )
    forked, err = _values(run_code(src, 1, timeout=120))[0]
    assert err == 11 and 0 < forked < 5000  # EAGAIN well before the loop ran out
    assert [path for path in made if path is not None and os.path.exists(path)] == []  # the cgroup is gone


@pytest.mark.parametrize("how", ["subprocess", "fork"])
def test_a_sleeping_grandchild_is_killed_when_the_run_ends(how):
    token = f"simdist-grandchild-{os.getpid()}-{how}"  # found by its command line: bubblewrap's pids are its own
    start = (
        "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', TOKEN],"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        if how == "subprocess"
        else "import os, sys\nif os.fork() == 0:\n"
        "    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', TOKEN])\n"
    )
    src = f"TOKEN = {token!r}\n" + start + "import time\ntime.sleep(1)\ndef main(rank):\n    return rank\n"
    try:
        assert _values(run_code(src, 1, timeout=60)) == [0]
        deadline = time.monotonic() + 30
        while _with_token(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _with_token(token) == []
    finally:
        for pid in _with_token(token):
            os.kill(pid, 9)


def _with_token(token):
    """The pids of live processes whose command line holds ``token`` (read from /proc)."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if token.encode() in f.read() and _alive(int(name)):
                    found.append(int(name))
        except OSError:
            pass
    return found


_ESCAPES = {
    "setsid": "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', TOKEN],"
    " start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n",
    "daemon": "import os, sys\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
    "        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', TOKEN])\n"
    "    os._exit(0)\nos.wait()\n",
}


@pytest.mark.parametrize("ending", ["success", "timeout"])
@pytest.mark.parametrize("escape", sorted(_ESCAPES))
def test_a_grandchild_that_left_the_session_is_killed_too(escape, ending):
    token = f"simdist-escape-{os.getpid()}-{escape}-{ending}"
    body = "    return rank\n" if ending == "success" else "    import time\n    time.sleep(600)\n"
    src = f"TOKEN = {token!r}\n" + _ESCAPES[escape] + "def main(rank):\n" + body
    try:
        res = run_code(src, 1, timeout=20 if ending == "timeout" else 60)
        assert res.ok == (ending == "success"), res.error
        assert _with_token(token) == []
    finally:
        for pid in _with_token(token):
            os.kill(pid, 9)


def test_the_child_keeps_a_capability_only_where_nobody_could_not_read_python(containment):
    """In bubblewrap the child holds no capability at all (the sandbox binds what it must read)."""
    import sysconfig

    def nobody_reads(path):  # from the mode bits of the path and each directory above it
        parts = os.path.abspath(path).split(os.sep)
        dirs = [os.sep.join(parts[:i]) or os.sep for i in range(1, len(parts))]
        return all(os.stat(d).st_mode & 0o001 for d in dirs) and os.stat(path).st_mode & 0o005 == 0o005

    src = (
        "with open('/proc/self/status') as f:\n"
        "    CAPS = next(line for line in f if line.startswith('CapEff:')).split()[1]\n"
        "def main(rank):\n    return int(CAPS, 16)\n"
    )
    caps = _values(run_code(src, 1, timeout=LOADED))[0]
    needed = containment == "process" and os.geteuid() == 0 and not nobody_reads(sysconfig.get_paths()["stdlib"])
    assert caps == (1 << 2 if needed else 0)  # CAP_DAC_READ_SEARCH, or nothing


def test_a_grandchild_holding_stdout_does_not_turn_success_into_a_timeout():
    src = (
        "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "def main(rank):\n    return rank\n"
    )
    t0 = time.monotonic()
    res = run_code(src, 2, timeout=90)
    assert _values(res) == [0, 1]
    assert time.monotonic() - t0 < 90


def test_a_cpu_bound_loop_is_stopped_by_the_cpu_limit():
    res = run_code("while True:\n    pass\n", 1, timeout=150, cpu_seconds=4)
    assert not res.ok and "more than 4 s of CPU time" in res.error


def test_too_many_open_files_are_refused():
    src = (
        "import errno\nfiles, err = [], None\ntry:\n    for _ in range(200):\n"
        "        files.append(open('/dev/null'))\nexcept OSError as e:\n    err = e.errno\n"
        "opened = len(files)\nfor f in files:\n    f.close()\n"
        "def main(rank):\n    return [opened, err]\n"
    )
    opened, err = _values(run_code(src, 1, open_files=64, timeout=LOADED))[0]
    assert err == 24 and opened < 64  # EMFILE


def test_no_network_where_isolation_is_reported(record_property):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        src = (
            f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=10).close()\n"
            "    GOT = 'connected'\nexcept OSError as e:\n    GOT = type(e).__name__\n"
            "def main(rank):\n    return GOT\n"
        )
        res = run_code(src, 1, timeout=60)
    got = _values(res)[0]
    record_property("network_isolated", res.network_isolated)
    print(f"network_isolated={res.network_isolated}, connect gave {got}")
    if res.network_isolated:
        assert got != "connected"
    else:
        assert got == "connected"


def test_grading_runs_in_the_same_contained_child():
    """A submission to an exercise is graded in the contained child: the model solution passes there, code that
    opens a socket finds no network, one that reads the parent's environment finds nothing, one that runs
    forever is stopped, and no process of it is left."""
    from simdist.exercises import load_all
    from simdist.visualize import grade_code

    server = {e.name: e for e in load_all()}["05_parameter_server"]
    text = server.path.read_text(encoding="utf-8")
    passed = grade_code(text, server.name, server.solution)
    assert passed.ok and passed.verdict["kind"] == "passed" and passed.verdict["complete"], passed
    net = grade_code(text, server.name, "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n")
    if net.network_isolated:
        assert net.verdict["kind"] == "exception" and "OSError" in net.verdict["summary"], net
    os.environ["SIMDIST_GRADING_SECRET"] = "s3cret"
    try:
        leak = grade_code(text, server.name, "import os\nassert 'SIMDIST_GRADING_SECRET' not in os.environ\n")
    finally:
        del os.environ["SIMDIST_GRADING_SECRET"]
    assert leak.ok and leak.verdict["kind"] == "missing function", leak  # the assertion held: nothing inherited
    before = _pids()
    forever = grade_code(text, server.name, "def collect(world_size):\n    while True:\n        pass\n", timeout=8)
    assert not forever.ok and "did not finish within 8 s" in forever.error
    time.sleep(0.5)
    left = _left_behind(before)
    assert not left, left


def _pids() -> set[int]:
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


def _stat(pid: int) -> tuple[int, bytes]:
    """``pid``'s parent and command line (``(0, b"")`` once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return parent, f.read()
    except (OSError, IndexError, ValueError):
        return 0, b""


def _left_behind(before: set[int]) -> list[int]:
    """The contained processes started since ``before`` that are still alive and are this test's: below this
    process, or orphans (a daemon that left its session is re-parented to init). Those of other tests
    running at the same time (pytest-xdist's other workers, the app servers they start) are not counted."""
    left = []
    for pid in _pids() - before:
        parent, cmdline = _stat(pid)
        if b"@@SIMDIST" not in cmdline:
            continue
        while parent > 1 and parent != os.getpid():  # up through the sandbox (bubblewrap's command line holds it)
            above, held = _stat(parent)
            if b"@@SIMDIST" not in held:
                break
            parent = above
        if parent in (0, 1, os.getpid()) and _alive(pid):
            left.append(pid)
    return left


@pytest.fixture
def walled():
    """The exercise and its TOML text, where bubblewrap can make a sandbox here (else the test skips)."""
    from simdist.exercises import load_all
    from simdist.visualize import bubblewrap

    if bubblewrap() is None:
        pytest.skip("bubblewrap is not installed here (apt-get install bubblewrap)")
    server = {e.name: e for e in load_all()}["05_parameter_server"]
    return server, server.path.read_text(encoding="utf-8")


def _graded(walled, body: str, **limits):
    """The verdict on a submission to the parameter server whose ``collect`` runs ``body``."""
    from simdist.visualize import grade_code

    server, text = walled
    source = "import os, socket, subprocess, sys, time\n\ndef collect(world_size):\n" + "".join(
        f"    {line}\n" for line in body.strip().splitlines()
    )
    res = grade_code(text, server.name, source, **limits)
    assert res.bubblewrap and res.network_isolated, res
    return res


def test_in_bubblewrap_a_submission_cannot_read_the_apps_files_or_the_users_home(walled, tmp_path):
    secret = tmp_path / "secrets.toml"
    secret.write_text("password = 'hunter2'\n")
    app = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "app.py")
    for path in (str(secret), app, os.path.expanduser("~/.bashrc"), "/etc/hostname"):
        res = _graded(walled, f"return open({path!r}).read()")
        assert res.verdict["kind"] == "exception" and "FileNotFoundError" in res.verdict["summary"], (path, res)
    home = _graded(walled, "raise RuntimeError(repr((os.getcwd(), os.listdir('.'), os.getuid())))")
    assert "('/home/student', [], 65534)" in home.verdict["summary"], home


def test_in_bubblewrap_a_submission_has_no_network(walled):
    """A server on this machine's loopback is out of reach (the sandbox's loopback is its own), and so is the
    outside world."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.5)
        port = server.getsockname()[1]
        res = _graded(walled, f"socket.create_connection(('127.0.0.1', {port}), timeout=2)")
        assert res.verdict["kind"] == "exception" and "ConnectionRefusedError" in res.verdict["summary"], res
        with pytest.raises(TimeoutError):
            server.accept()  # nothing came
    res = _graded(walled, "socket.create_connection(('1.1.1.1', 53), timeout=2)")
    assert res.verdict["kind"] == "exception" and "Network is unreachable" in res.verdict["summary"], res


def test_in_bubblewrap_a_daemon_the_submission_forks_does_not_outlive_it(walled, tmp_path):
    before = _pids()
    res = _graded(
        walled,
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(120)\n    os._exit(0)\n"
        "raise RuntimeError('forked')",
    )
    assert res.verdict["kind"] == "exception" and "forked" in res.verdict["summary"], res
    time.sleep(1.0)
    left = _left_behind(before)
    assert not left, left


def test_in_bubblewrap_filling_the_disk_stops_at_its_own_small_file_system(walled):
    res = _graded(
        walled,
        "for i in range(400):\n    with open(f'fill{i}', 'wb') as f:\n        f.write(b'x' * (1 << 20))\n"
        "raise RuntimeError('the disk took it all')",
    )
    assert res.verdict["kind"] == "exception" and "No space left on device" in res.verdict["summary"], res


def test_in_bubblewrap_code_that_runs_forever_is_stopped(walled):
    from simdist.visualize import grade_code

    server, text = walled
    res = grade_code(text, server.name, "def collect(world_size):\n    while True:\n        pass\n", timeout=8)
    assert not res.ok and "did not finish within 8 s" in res.error and res.bubblewrap
