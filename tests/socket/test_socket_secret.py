"""The per-user secret of socket ranks started by hand on loopback without ``SIMDIST_SECRET``.

Real processes on 127.0.0.1; "another user" is a process whose HOME and XDG directories
point at another temporary directory, so it holds another user's secret file.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from simdist.backends.socket._secret import user_secret, user_secret_path
from simdist.core import free_port
from simdist.backends.socket._world import shared_secret

RANK_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import simdist as dist

    rank, port = int(sys.argv[1]), int(sys.argv[2])
    try:
        dist.init_process_group("socket", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=120)
    except Exception as exc:
        print(f"refused {type(exc).__name__}: {exc}", flush=True)
        sys.exit(3)
    x = np.array([rank + 1.0, 10.0 * (rank + 1)])
    dist.all_reduce(x)
    print("result", x.tolist(), flush=True)
    dist.destroy_process_group()
    """
)
ENV_DROPPED = (
    "SIMDIST_SECRET",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "SIMDIST_BACKEND",
)
EXPECTED = "result [3.0, 30.0]"  # [1 + 2, 10 + 20], summed another way than all_reduce does


def _user_env(home: Path) -> dict[str, str]:
    """The environment of a user whose home is ``home``, with no secret and no XDG directories set."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROPPED}
    env["HOME"] = str(home)
    return env


def _start(script: Path, rank: int, port: int, home: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(script), str(rank), str(port)],
        env=_user_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=200)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "rank.py"
    path.write_text(RANK_SCRIPT)
    return path


@pytest.fixture
def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process as a user with an empty home, no secret and no XDG directories."""
    home = tmp_path / "home"
    home.mkdir()
    for name in ENV_DROPPED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    return home


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.timeout(300)
def test_ranks_of_one_user_started_by_hand_share_the_per_user_secret(tmp_path, script):
    home = tmp_path / "alice"
    home.mkdir()
    port = free_port()
    procs = [_start(script, rank, port, home) for rank in (0, 1)]  # both may create the file at once
    outs = [_finish(p) for p in procs]
    for rc, out in outs:
        assert rc == 0 and out.strip().splitlines()[-1] == EXPECTED, out
        assert "Warning" not in out, out
    secret = home / ".config" / "simdist" / "secret"
    assert _mode(secret) == 0o600 and _mode(secret.parent) == 0o700
    assert len(secret.read_text().strip()) == 64
    assert [p.name for p in secret.parent.iterdir()] == ["secret"]  # no temporary file left behind


@pytest.mark.timeout(400)
def test_another_users_process_is_refused_and_the_job_finishes(tmp_path, script):
    alice, mallory = tmp_path / "alice", tmp_path / "mallory"
    alice.mkdir()
    mallory.mkdir()
    port = free_port()
    rank0 = _start(script, 0, port, alice)
    try:
        # rank 0 serves the store and waits for rank 1; the intruder claims rank 1 first
        intruder_rc, intruder_out = _finish(_start(script, 1, port, mallory))
        rank1 = _start(script, 1, port, alice)
    except BaseException:
        rank0.kill()
        raise
    outs = [_finish(rank0), _finish(rank1)]
    assert intruder_rc == 3 and intruder_out.startswith("refused AuthenticationError"), intruder_out
    for rc, out in outs:
        assert rc == 0 and out.strip().splitlines()[-1] == EXPECTED, out
    secrets_ = [(h / ".config" / "simdist" / "secret").read_text() for h in (alice, mallory)]
    assert secrets_[0] != secrets_[1]


@pytest.mark.timeout(30)
def test_a_secret_readable_by_others_is_refused(user_home):
    secret = user_secret_path()
    assert secret == user_home / ".config" / "simdist" / "secret"
    secret.parent.mkdir(parents=True, mode=0o700)
    secret.write_text("a secret others can read\n")
    os.chmod(secret, 0o644)
    with pytest.raises(PermissionError) as err:
        shared_secret("127.0.0.1")
    message = str(err.value)
    assert str(secret) in message and "0644" in message
    assert f"chmod 600 {secret}" in message and "SIMDIST_SECRET" in message
    os.chmod(secret, 0o600)
    assert shared_secret("127.0.0.1") == b"a secret others can read"


@pytest.mark.timeout(30)
def test_a_directory_others_can_write_to_is_refused(user_home):
    directory = user_home / ".config" / "simdist"
    directory.mkdir(parents=True)
    os.chmod(directory, 0o777)
    with pytest.raises(PermissionError, match=f"{directory}.*0777.*chmod 700.*SIMDIST_SECRET"):
        user_secret()


@pytest.mark.timeout(30)
@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to give a file away")
def test_a_secret_owned_by_another_user_is_refused(user_home):
    secret = user_secret_path()
    secret.parent.mkdir(parents=True, mode=0o700)
    secret.write_text("planted\n")
    os.chmod(secret, 0o600)
    os.chown(secret, 65534, 65534)
    with pytest.raises(PermissionError, match="owned by uid 65534.*SIMDIST_SECRET"):
        user_secret()


@pytest.mark.timeout(30)
def test_an_empty_home_gets_a_fresh_random_secret_per_user(tmp_path, user_home, monkeypatch):
    first = user_secret_path()
    assert not first.exists()
    mine = shared_secret("127.0.0.1")
    assert first.read_bytes().strip() == mine and _mode(first) == 0o600
    assert shared_secret("localhost") == mine  # created once, then read
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv("HOME", str(other))
    theirs = shared_secret("127.0.0.1")
    assert theirs != mine
    for s in (mine, theirs):
        assert len(s) == 64 and int(s, 16) >= 0


@pytest.mark.timeout(60)
def test_ranks_creating_the_secret_at_once_all_read_one(user_home):
    got: list[bytes] = []
    threads = [threading.Thread(target=lambda: got.append(user_secret())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len(set(got)) == 1
    assert got[0] == user_secret_path().read_bytes().strip()


@pytest.mark.timeout(30)
def test_the_runtime_directory_is_used_when_it_is_this_users(tmp_path, user_home, monkeypatch):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert user_secret_path() == runtime / "simdist" / "secret"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert user_secret_path() == tmp_path / "config" / "simdist" / "secret"
    secret = user_secret()
    assert (tmp_path / "config" / "simdist" / "secret").read_bytes().strip() == secret


@pytest.mark.timeout(30)
def test_across_hosts_the_secret_is_still_required(user_home):
    with pytest.raises(ValueError, match="not a loopback address.*SIMDIST_SECRET"):
        shared_secret("10.1.2.3")
    assert not user_secret_path().exists()
