"""The shipped shape, end to end: the ``ctcache`` user made by ``systemd-sysusers`` from the repository's
``systemd/sysusers.d``, the daemon run as that user with the unit's environment and umask (through ``setpriv``;
no systemd as PID 1), a user in group ``ctcache`` running the README walkthrough in its own private folders (every
materialize target, ``inference_session``, embed, gc, and the admin's verify), and a user outside the group refused
once, naming the group, while ``--local`` works for it.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import real_models
from e2e.harness import bin_dir
from test_python_client import installed  # noqa: F401 (a fixture)
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
MEMBER_UID, OUTSIDER_UID = 23456, 34567
START_TIMEOUT_S = 30


def unit_environment() -> dict:
    """The ``Environment=`` lines of ``systemd/ctcached.service``."""
    env = {}
    for line in (REPO / "systemd" / "ctcached.service").read_text().splitlines():
        m = re.match(r"Environment=(\w+)=(.*)$", line.strip())
        if m:
            env[m.group(1)] = m.group(2)
    return env


@pytest.fixture(scope="module")
def shipped():
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("systemd-sysusers"):
        pytest.fail("this test runs as root with setpriv and systemd-sysusers, as tests/run.sh installs them")
    subprocess.run(["systemd-sysusers", str(REPO / "systemd" / "sysusers.d" / "ctcache.conf")], check=True)
    user = pwd.getpwnam("ctcache")
    gid = grp.getgrnam("ctcache").gr_gid
    top = Path(tempfile.mkdtemp(prefix="ctc-shipped-"))
    os.chmod(top, 0o755)
    # What CacheDirectory= and RuntimeDirectory= make: the daemon's, 0750.
    cache, run = top / "cache", top / "run"
    for d in (cache, run):
        d.mkdir(mode=0o750)
        os.chown(d, user.pw_uid, gid)
    env = {"PATH": "/usr/bin:/bin", "HOME": user.pw_dir, "LANG": "C.UTF-8", **unit_environment()}
    # The unit's paths, moved into this test's folder; the socket bound by the daemon (no activation) for
    # group ctcache, as ctcached.socket's SocketGroup= would.
    assert env["CTCACHE_CACHE_DIR"] == "/var/cache/ctcache" and env["CTCACHE_SOCKET"].startswith("/run/ctcache/")
    env.update(CTCACHE_CACHE_DIR=str(cache), CTCACHE_SOCKET=str(run / "ctcached.sock"), CTCACHE_SOCKET_GROUP="ctcache")
    log = open(top / "ctcached.log", "wb")
    daemon = subprocess.Popen(
        ["setpriv", f"--reuid={user.pw_uid}", f"--regid={gid}", "--init-groups", str(bin_dir() / "ctcached")],
        env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        preexec_fn=lambda: os.umask(0o027))  # the unit's UMask=
    socket = run / "ctcached.sock"

    def listening() -> bool:
        assert daemon.poll() is None, (top / "ctcached.log").read_text()
        return socket.exists()

    try:
        wait_until(listening, START_TIMEOUT_S, f"ctcached creating {socket}",
                   detail=lambda: (top / "ctcached.log").read_text())
        yield {"top": top, "socket": socket, "gid": gid, "pid": daemon.pid, "log": top / "ctcached.log"}
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        log.close()
        shutil.rmtree(top, ignore_errors=True)


def home_of(shipped, uid: int) -> Path:
    home = shipped["top"] / f"home-{uid}"
    home.mkdir(mode=0o700, exist_ok=True)
    os.chown(home, uid, uid)
    return home


def as_user(shipped, uid: int, *args: str, groups: tuple[int, ...] = (), env: dict | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
    who = ["setpriv", f"--reuid={uid}", f"--regid={uid}",
           f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"]
    base = {"PATH": f"{bin_dir()}:/usr/bin:/bin", "HOME": str(home_of(shipped, uid)),
            "CTCACHE_SOCKET": str(shipped["socket"]), **(env or {})}
    r = subprocess.run([*who, *args], capture_output=True, text=True, timeout=600, env=base)
    if check:
        assert r.returncode == 0, f"{args}: {r.stderr}"
    return r


def test_a_group_member_runs_the_walkthrough_in_its_own_folders(shipped, installed):  # noqa: F811
    member = lambda *a, **k: as_user(shipped, MEMBER_UID, *a, groups=(shipped["gid"],), **k)  # noqa: E731
    home = home_of(shipped, MEMBER_UID)
    models = home / "models"
    models.mkdir(mode=0o700)
    model = models / "model.onnx"
    shutil.copyfile(real_models.fetch(real_models.by_name("minilm-l3")), model)
    os.chmod(model, 0o600)
    for p in (models, model):
        os.chown(p, MEMBER_UID, MEMBER_UID)
    member("ctcachectl", "status")
    member("ctcachectl", "resolve", str(model))
    outs = {"int4": home / "int4" / "model.int4.onnx", "int8": home / "int8" / "model.onnx",
            "fp16": home / "fp16" / "model.onnx"}
    member("ctcachectl", "materialize", str(model), "-o", str(outs["int4"]))
    member("ctcachectl", "materialize", str(model), "-o", str(outs["int8"]), "--target", "onnxruntime-int8",
           "--per-channel")
    member("ctcachectl", "materialize", str(model), "-o", str(outs["fp16"]), "--target", "onnxruntime-fp16")
    embedded = home / "compiled" / "model.compiled.onnx"
    member("ctcachectl", "embed", str(model), "-o", str(embedded), "--format", "ort.matmul_nbits")
    member("ctcachectl", "gc", "--max-size", "10GiB", "--dry-run")
    # inference_session, from the member's own copy of the client package.
    shutil.copytree(installed / "ctcache", home / "py" / "ctcache")
    subprocess.run(["chown", "-R", f"{MEMBER_UID}:{MEMBER_UID}", str(home / "py")], check=True)
    script = ("import sys, ctcache.ort\n"
              "s = ctcache.ort.inference_session(sys.argv[1])\n"
              "print('SESSION', [i.name for i in s.get_inputs()])\n")
    said = member(sys.executable, "-c", script, str(model), env={"PYTHONPATH": str(home / "py")}).stdout
    assert "SESSION" in said, said
    ort = pytest.importorskip("onnxruntime")
    for written in (*outs.values(), embedded):
        for p in (written.parent, written):
            assert os.lstat(p).st_uid == MEMBER_UID, f"{p} is not the member's"
        ort.InferenceSession(str(written), providers=["CPUExecutionProvider"])
    # The admin's verify finds the store sound; the daemon stayed within the unit's MemoryMax= (no cgroup here).
    r = subprocess.run([str(bin_dir() / "ctcachectl"), "--socket", str(shipped["socket"]), "verify"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    status = Path(f"/proc/{shipped['pid']}/status").read_text()
    hwm_kib = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))
    assert hwm_kib < 6 * 1024 * 1024, f"VmHWM {hwm_kib} KiB, over the unit's MemoryMax=6G"
    log = shipped["log"].read_text()
    assert not re.search(r"^error:|\serror: ", log, re.M), log


def test_a_user_outside_the_group_is_refused_once_and_local_works(shipped, tmp_path):
    r = as_user(shipped, OUTSIDER_UID, "ctcachectl", "status", check=False)
    assert r.returncode == 3, r.stderr
    assert "group" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    home = home_of(shipped, OUTSIDER_UID)
    model = home / "model.onnx"
    shutil.copyfile(real_models.fetch(real_models.by_name("minilm-l3")), model)
    os.chown(model, OUTSIDER_UID, OUTSIDER_UID)
    as_user(shipped, OUTSIDER_UID, "ctcachectl", "materialize", "--local", str(model), "-o",
            str(home / "int4" / "model.onnx"))
    assert (home / "int4" / "model.onnx").stat().st_uid == OUTSIDER_UID
