"""The daemon as a user of its own, as the shipped unit runs it (uid 65534
here, through ``setpriv``), and a caller of another uid in its socket
group: a refusal to read the caller's private model names both who may
lack the right (the caller, or the daemon's own user) and the ways out.
Without root the daemon cannot take on a caller's rights; until callers
pass descriptors (#41) it reads with its own as well.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from e2e.harness import bin_dir
from test_request_bounds import model_with

DAEMON_UID, CALLER_UID = 65534, 12345
START_TIMEOUT_S = 30


def setpriv(uid: int, *groups: int) -> list[str]:
    extra = [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", *extra]


@pytest.fixture
def root_dir():
    """A folder both uids can reach (pytest's own tmp folders are root's)."""
    d = Path(tempfile.mkdtemp(prefix="ctc-user-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def as_its_own_user(root_dir):
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.fail("this test runs as root with setpriv (util-linux), as tests/run.sh does")
    tmp_path = root_dir
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, DAEMON_UID, DAEMON_UID)
    os.chown(run, DAEMON_UID, DAEMON_UID)
    config = tmp_path / "ctcached.toml"
    config.write_text("")
    socket = run / "s.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTCACHE_")}
    env.update(CTCACHE_SOCKET_GROUP=str(CALLER_UID), HOME=str(tmp_path), XDG_CACHE_HOME=str(cache))
    log = open(tmp_path / "ctcached.log", "wb")
    p = subprocess.Popen([*setpriv(DAEMON_UID, CALLER_UID), str(bin_dir() / "ctcached"), "--config", str(config),
                          "--cache-dir", str(cache), "--socket", str(socket)],
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not socket.exists():
        assert p.poll() is None, (tmp_path / "ctcached.log").read_text()
        assert time.monotonic() < deadline, (tmp_path / "ctcached.log").read_text()
        time.sleep(0.05)
    try:
        yield socket
    finally:
        p.terminate()
        p.wait(timeout=30)
        log.close()


def test_a_refusal_names_the_daemons_user_as_well_as_the_caller(as_its_own_user, root_dir):
    home = root_dir / "home"
    home.mkdir(mode=0o700)
    model = model_with(home / "m.onnx", [])
    for p in (home, model):
        os.chown(p, CALLER_UID, CALLER_UID)
    env = dict(os.environ, HOME=str(home))
    r = subprocess.run([*setpriv(CALLER_UID), str(bin_dir() / "ctcachectl"), "--socket", str(as_its_own_user),
                        "resolve", str(model)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode != 0, r.stdout
    assert f"not readable by uid {CALLER_UID}" in r.stderr, r.stderr
    assert f"or by ctcached itself, uid {DAEMON_UID}" in r.stderr and "ctcachectl --local" in r.stderr, r.stderr
