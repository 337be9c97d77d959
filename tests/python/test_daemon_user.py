"""The daemon as a user of its own, as the shipped unit runs it (uid 65534
here, through ``setpriv``), and a caller of another uid in its socket
group: the caller's private model (0600 in a 0700 folder) is read through
the descriptors its client hands over, so ``ctcachectl`` and the Python
client work on it though the daemon could not open its path; a model the
caller may not open itself is asked for by path and refused for it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from e2e.harness import bin_dir
from test_python_client import installed  # noqa: F401 (a fixture)
from test_request_bounds import model_with
from waiting import wait_until
from worker_daemons import openvino_library, ort_library

DAEMON_UID, CALLER_UID = 65534, 12345
START_TIMEOUT_S = 30
#: The daemon as root and as its own user: each attack is tried on both.
DAEMON_UIDS, DAEMON_IDS = [0, DAEMON_UID], ["daemon as root", "daemon as its own user"]
BOTH_DAEMONS = dict(params=DAEMON_UIDS, ids=DAEMON_IDS)


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


def daemon_as_uid(root_dir: Path, uid: int, args: tuple = (), config: str = ""):
    """ctcached as ``uid`` (setpriv unless root) on a store in ``root_dir``, its socket for group CALLER_UID,
    with ``args`` added to its command line and ``config`` as its config file."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.fail("this test runs as root with setpriv (util-linux), as tests/run.sh does")
    tmp_path = root_dir
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, uid, uid)
    os.chown(run, uid, uid)
    config_file = tmp_path / "ctcached.toml"
    config_file.write_text(config)
    socket = run / "s.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTCACHE_")}
    # mesa's shader cache where the daemon's user may write, outside the store.
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    os.chown(xdg, uid, uid)
    env.update(CTCACHE_SOCKET_GROUP=str(CALLER_UID), HOME=str(tmp_path), XDG_CACHE_HOME=str(xdg))
    log = open(tmp_path / "ctcached.log", "wb")
    as_uid = setpriv(uid, CALLER_UID) if uid else []
    p = subprocess.Popen([*as_uid, str(bin_dir() / "ctcached"), "--config", str(config_file),
                          "--cache-dir", str(cache), "--socket", str(socket), *args],
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    def listening() -> bool:
        assert p.poll() is None, (tmp_path / "ctcached.log").read_text()
        return socket.exists()

    try:
        wait_until(listening, START_TIMEOUT_S, f"ctcached creating {socket}",
                   detail=lambda: (tmp_path / "ctcached.log").read_text())
        yield socket
    finally:
        p.terminate()
        p.wait(timeout=30)
        log.close()


@pytest.fixture
def as_its_own_user(root_dir):
    yield from daemon_as_uid(root_dir, DAEMON_UID)


@pytest.fixture(**BOTH_DAEMONS)
def any_daemon(root_dir, request):
    yield from daemon_as_uid(root_dir, request.param)


@pytest.fixture(**BOTH_DAEMONS)
def compiling(root_dir, request):
    """The daemon (as root, then as its own user) with the onnxruntime library its worker loads."""
    yield from daemon_as_uid(root_dir, request.param, ("--ort-library", ort_library()))


@pytest.fixture(**BOTH_DAEMONS)
def compiling_openvino(root_dir, request):
    """The daemon (as root, then as its own user) with the OpenVINO library its worker loads."""
    yield from daemon_as_uid(root_dir, request.param, ("--openvino-library", openvino_library()))


def private_model(root_dir: Path) -> Path:
    """The caller's model, in a folder only the caller may enter."""
    home = root_dir / "home"
    home.mkdir(mode=0o700)
    model = model_with(home / "m.onnx", [])
    os.chmod(model, 0o600)
    for p in (home, model):
        os.chown(p, CALLER_UID, CALLER_UID)
    return model


def test_a_user_works_on_its_private_model_through_handed_descriptors(as_its_own_user, root_dir, installed):  # noqa: F811
    model = private_model(root_dir)
    env = _caller_env(root_dir, model.parent, installed)
    said = _as_caller(env, str(bin_dir() / "ctcachectl"), "--socket", str(as_its_own_user), "resolve", str(model))
    assert f"{model}: nothing wanted" in said, said  # read: its one initializer judged
    # The Python client too: an in-memory materialize (what inference_session asks).
    script = ("import sys, ctcache\n"
              "with ctcache.connect(sys.argv[1]) as c:\n"
              "    r = c.materialize(sys.argv[2], None, in_memory=True)\n"
              "print('MATERIALIZED', r.nodes_rewritten, len(r.model) > 0)\n")
    said = _as_caller(env, sys.executable, "-c", script, str(as_its_own_user), str(model))
    assert "MATERIALIZED 1 True" in said, said


def test_a_model_the_caller_may_not_read_is_refused_for_it(as_its_own_user, root_dir):
    model = private_model(root_dir)
    other = 23456
    r = subprocess.run([*setpriv(other, CALLER_UID), str(bin_dir() / "ctcachectl"), "--socket", str(as_its_own_user),
                        "resolve", str(model)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, HOME=str(root_dir)))
    assert r.returncode != 0, r.stdout
    # Its own open is refused: the client has nothing to hand over, and the daemon opens no path for it.
    assert f"{model}: Permission denied" in r.stderr, r.stderr


def another_user_gets_no_form(socket: Path, root_dir: Path, model: Path, runtime: str) -> None:
    """A uid of the socket's group that cannot open `model` asks for its form: its own open is refused."""
    other = 23456
    r = subprocess.run([*setpriv(other, CALLER_UID), str(bin_dir() / "ctcachectl"), "--socket", str(socket),
                        "compile", str(model), "--runtime", runtime], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, HOME=str(root_dir)))
    assert r.returncode != 0 and f"{model}: Permission denied" in r.stderr, r.stderr


def test_a_user_gets_a_form_of_its_private_model_and_another_user_none(compiling, root_dir,
                                                                       installed):  # noqa: F811
    """A runtime form of the caller's private model: compiled from the
    descriptor it handed over, its session opened from bytes sent over the
    socket (the store's files are not the caller's to read). Another user,
    who cannot open the model, gets no form of it."""
    socket = compiling
    model = private_model(root_dir)
    env = _caller_env(root_dir, model.parent, installed)
    script = ("import sys, ctcache.ort\n"
              "s = ctcache.ort.inference_session(sys.argv[2], target=None, optimize='extended', socket=sys.argv[1])\n"
              "print('SESSION', s.ctcache_report.source, s.get_session_options().graph_optimization_level)\n")
    said = _as_caller(env, sys.executable, "-c", script, str(socket), str(model))
    assert "SESSION daemon GraphOptimizationLevel.ORT_DISABLE_ALL" in said, said
    another_user_gets_no_form(socket, root_dir, model, "onnxruntime")


def test_a_user_gets_an_openvino_form_of_its_private_model_and_another_user_none(
        compiling_openvino, root_dir, installed):  # noqa: F811
    """OpenVINO's form of the caller's private model, compiled from the
    descriptor it handed over and imported from bytes sent over the socket
    (the store's files are not the caller's to read); another user, who
    cannot open the model, gets none."""
    socket = compiling_openvino
    model = private_model(root_dir)
    env = _caller_env(root_dir, model.parent, installed)
    script = ("import sys, ctcache.openvino\n"
              "c = ctcache.openvino.compile_model(sys.argv[2], socket=sys.argv[1])\n"
              "print('COMPILED', c.ctcache_report.source, type(c).__name__)\n")
    said = _as_caller(env, sys.executable, "-c", script, str(socket), str(model))
    assert "COMPILED daemon CompiledModel" in said, said
    another_user_gets_no_form(socket, root_dir, model, "openvino")


NEVER_ENDS = """#!{python}
import json, sys, time
if sys.argv[1] == "identify":
    print(json.dumps({"runtime": "onnxruntime", "version": "1.99.0", "build": "a stand-in"}))
    sys.exit(0)
time.sleep(120)
"""


@pytest.mark.parametrize("daemon_uid", DAEMON_UIDS, ids=DAEMON_IDS)
def test_a_user_waits_for_two_compiles_at_most(root_dir, monkeypatch, daemon_uid):
    """Each compile holds the one compile slot for up to 600 s: an untrusted
    uid's third compile waiting at once is RESOURCE_EXHAUSTED (exit 4), not
    a place in line ahead of every other user."""
    import re
    bindir = root_dir / "bin"
    bindir.mkdir()
    for exe in ("ctcached", "ctcachectl"):
        shutil.copy(bin_dir() / exe, bindir / exe)
    worker = bindir / "ctcache-onnxruntime-worker"
    # A system interpreter where there is one: this one may sit where only root reaches.
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    worker.write_text(NEVER_ENDS.replace("{python}", python))
    worker.chmod(0o755)
    monkeypatch.setenv("CTCACHE_BIN_DIR", str(bindir))
    models = []
    for i in range(3):
        m = model_with(root_dir / f"m{i}.onnx", [])
        # A field of its own (number 18, one byte): another model content.
        m.write_bytes(m.read_bytes() + bytes([0x92, 0x01, 0x01, 0x30 + i]))
        os.chmod(m, 0o644)
        models.append(m)
    daemon = daemon_as_uid(root_dir, daemon_uid, ("--ort-library", "/etc/hostname"))
    socket = next(daemon)
    log = root_dir / "ctcached.log"
    waiting = []
    try:
        ask = [*setpriv(CALLER_UID), str(bindir / "ctcachectl"), "--socket", str(socket), "compile"]
        env = dict(os.environ, HOME=str(root_dir))
        waiting = [subprocess.Popen([*ask, str(m)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
                   for m in models[:2]]
        wait_until(lambda: len(re.findall("compile queued", log.read_text())) == 2, 60,
                   "two compiles of the user waiting", detail=log.read_text)
        third = subprocess.run([*ask, str(models[2])], capture_output=True, text=True, timeout=60, env=env)
        assert third.returncode == 4 and "waits for 2 compiles already" in third.stderr, third.stderr
    finally:
        for p in waiting:
            p.kill()
            p.wait()
        next(daemon, None)


def _as_caller(env: dict, *args: str) -> str:
    """Runs ``args`` as the caller; its stdout, once it succeeded."""
    r = subprocess.run([*setpriv(CALLER_UID), *args], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _caller_env(root_dir: Path, home: Path, installed: Path) -> dict:  # noqa: F811
    """The caller's environment, the client package where it can read it (pytest's folders are root's)."""
    shutil.copytree(installed / "ctcache", root_dir / "py" / "ctcache")
    return dict(os.environ, HOME=str(home), PYTHONPATH=str(root_dir / "py"))


def test_a_user_gets_outputs_in_its_own_folders(as_its_own_user, root_dir, installed):  # noqa: F811
    """The daemon writes no file for a caller: ctcachectl and the Python client write the materialized model
    and its weights with the caller's own rights, into folders only the caller may enter (made when missing)."""
    model = private_model(root_dir)
    home = model.parent
    env = _caller_env(root_dir, home, installed)
    out = home / "out" / "cli" / "m.int4.onnx"
    _as_caller(env, str(bin_dir() / "ctcachectl"), "--socket", str(as_its_own_user), "materialize", str(model),
               "-o", str(out), "--link", "hard")
    script = ("import sys, ctcache\n"
              "with ctcache.connect(sys.argv[1]) as c:\n"
              "    r = c.materialize(sys.argv[2], sys.argv[3])\n"
              "print('WROTE', r.output_path, r.files_copied)\n")
    py_out = home / "out" / "py" / "m.int4.onnx"
    said = _as_caller(env, sys.executable, "-c", script, str(as_its_own_user), str(model), str(py_out))
    assert f"WROTE {py_out} 1" in said, said
    for written in (out, py_out):
        weights = list(Path(f"{written}.weights").iterdir())
        assert len(weights) == 1, weights
        for p in (written.parent, written, *weights):
            st = os.lstat(p)
            assert st.st_uid == CALLER_UID, f"{p} belongs to uid {st.st_uid}"
        # The kernel refuses the caller a hard link of the store's file: a copy of its own.
        assert os.lstat(weights[0]).st_nlink == 1
        ort = pytest.importorskip("onnxruntime")
        ort.InferenceSession(str(written), providers=["CPUExecutionProvider"])


def test_a_user_gets_embedded_models_in_its_own_folders(as_its_own_user, root_dir, installed):  # noqa: F811
    """Embed writes into the files the caller's client made in the caller's folder (the daemon opens no output
    path), which the client then puts in place: the caller's own files, the sidecar beside the model."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    home = private_model(root_dir).parent
    env = _caller_env(root_dir, home, installed)
    # A weight the policy packs (at least 65536 elements).
    w = np.random.default_rng(1).standard_normal((512, 256)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 512])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 256])],
                          [numpy_helper.from_array(w, "W")])
    model = home / "big.onnx"
    model.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    os.chmod(model, 0o600)
    os.chown(model, CALLER_UID, CALLER_UID)
    embedded = home / "out" / "emb" / "m.ct.onnx"
    _as_caller(env, str(bin_dir() / "ctcachectl"), "--socket", str(as_its_own_user), "embed", str(model),
               "-o", str(embedded), "--format", "ort.matmul_nbits", "--sidecar")
    script = ("import sys, ctcache\n"
              "with ctcache.connect(sys.argv[1]) as c:\n"
              "    r = c.embed(sys.argv[2], sys.argv[3], ['ort.matmul_nbits'])\n"
              "print('EMBEDDED', r.entries)\n")
    py_embedded = home / "out" / "emb-py" / "m.ct.onnx"
    said = _as_caller(env, sys.executable, "-c", script, str(as_its_own_user), str(model), str(py_embedded))
    assert "EMBEDDED 1" in said, said
    for p in (embedded, Path(f"{embedded}.ctdata"), py_embedded):
        assert os.lstat(p).st_uid == CALLER_UID and os.lstat(p).st_size > 0, p
    assert sorted(os.listdir(embedded.parent)) == ["m.ct.onnx", "m.ct.onnx.ctdata"]
    assert sorted(os.listdir(py_embedded.parent)) == ["m.ct.onnx"]


# Run as the attacker: every folder of the store but its root unlistable, every file unreadable but the harmless
# layout marks, a payload file found by no name but the one the daemon hands out (not by its digest).
_PROBE = """
import json, os, sys
seen = json.load(open(sys.argv[1]))
for d in seen["dirs"]:
    try:
        os.listdir(d)
        sys.exit(f"listed {d}")
    except PermissionError:
        pass
payloads = {named for named, _ in seen["payloads"]}
for f in seen["files"]:
    if f in payloads:
        continue
    try:
        os.stat(f)
        open(f, "rb").close()
        if os.path.basename(f) not in ("LAYOUT", "LOCK", "CLEAN"):
            sys.exit(f"read {f}")
    except PermissionError:
        pass
for named, by_digest in seen["payloads"]:
    try:
        open(by_digest, "rb").close()
        sys.exit(f"read {by_digest} by its digest")
    except (FileNotFoundError, PermissionError):
        pass
    open(named, "rb").close()  # the name a lease hands out: readable, as designed
print("NOTHING-READ", len(seen["dirs"]), len(seen["files"]), len(seen["payloads"]))
"""


def test_no_file_of_the_store_is_read_by_another_socket_user(any_daemon, root_dir, installed):  # noqa: F811
    """Another user of the socket group (and of the cache folder's group, as the unit's shape gives it) stats and
    reads every file of the store after a user packed its private model: it lists no folder and reads no index,
    record, key or temp file, and finds no payload by its digest."""
    model = private_model(root_dir)
    cache = root_dir / "cache"
    os.chown(cache, os.stat(cache).st_uid, CALLER_UID)
    os.chmod(cache, 0o750)
    r = subprocess.run([*setpriv(CALLER_UID), str(bin_dir() / "ctcachectl"), "--socket", str(any_daemon),
                        "materialize", str(model), "-o", str(model.parent / "q" / "m.onnx")],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, HOME=str(model.parent)))
    assert r.returncode == 0, r.stderr
    seen = {"dirs": [], "files": [], "payloads": []}
    for dirpath, dirs, files in os.walk(cache):
        seen["dirs"] += [os.path.join(dirpath, d) for d in dirs]
        for f in files:
            path = os.path.join(dirpath, f)
            seen["files"].append(path)
            if os.path.basename(dirpath) != "blobs" and "blobs" in dirpath and "." in f:
                seen["payloads"].append((path, os.path.join(dirpath, f.split(".")[0])))
    assert seen["payloads"], seen
    listing = root_dir / "seen.json"
    listing.write_text(json.dumps(seen))
    os.chmod(listing, 0o644)
    attacker = 23456
    r = subprocess.run([*setpriv(attacker, CALLER_UID), sys.executable, "-c", _PROBE, str(listing)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "NOTHING-READ" in r.stdout, r.stdout + r.stderr
