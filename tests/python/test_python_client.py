"""The Python client package (client/python) against a real ctcached.

A session fixture installs the package with pip (no build isolation, no
index, into a temporary --target folder) from a copy of client/python placed
next to a copy of proto/, so the build hook's ../../proto discovery and stub
generation are exercised without touching the source tree or the venv. Each
daemon runs on temporary folders (--cache-dir, --socket, --watch). Tests skip
when the binaries are not built.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket as socketlib
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from waiting import WaitTimeout, now_ms, wait_until

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30


def bin_dir() -> Path:
    if os.environ.get("CTCACHE_BIN_DIR"):
        return Path(os.environ["CTCACHE_BIN_DIR"])
    return Path(os.environ.get("CARGO_TARGET_DIR") or "/var/tmp/ctcache-target") / "debug"


def binary(name: str) -> str:
    p = bin_dir() / name
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.skip(f"{name} not built ({p}); build it or set CTCACHE_BIN_DIR")
    return str(p)


# ---- the package ----


@pytest.fixture(scope="session")
def installed(tmp_path_factory) -> Path:
    """pip-installs client/python into a temporary target; returns that folder (on sys.path)."""
    root = tmp_path_factory.mktemp("pkg")
    shutil.copytree(REPO / "proto", root / "repo" / "proto", ignore=shutil.ignore_patterns("src", "*.rs", "*.toml"))
    shutil.copytree(REPO / "client" / "python", root / "repo" / "client" / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*_pb2*.py*"))
    target = root / "site"
    env = {k: v for k, v in os.environ.items() if k != "CTCACHE_PROTO_DIR"}
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
         "--disable-pip-version-check", "--target", str(target), str(root / "repo" / "client" / "python")],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert r.returncode == 0, f"pip install failed\n{r.stdout}\n{r.stderr}"
    gen = target / "ctcache" / "_pb"
    for m in ("onnx_pb2.py", "ctcache_v1_pb2.py", "ctcache_v1_pb2_grpc.py", "wire_schema.py"):
        assert (gen / m).is_file(), f"build hook did not generate {m}: {sorted(os.listdir(gen))}"
    assert not list((REPO / "client" / "python" / "ctcache" / "_pb").glob("*_pb2*.py")), "generated code in the source tree"
    sys.path.insert(0, str(target))
    for mod in [m for m in sys.modules if m == "ctcache" or m.startswith("ctcache.")]:
        del sys.modules[mod]
    return target


@pytest.fixture(scope="session")
def ctcache(installed):
    import ctcache as mod

    assert Path(mod.__file__).resolve().is_relative_to(installed.resolve()), mod.__file__
    return mod


@pytest.mark.parametrize("order", ["onnx,ctcache", "ctcache,onnx"])
def test_imports_coexist_with_onnx(installed, order, tmp_path):
    """ctcache's onnx messages live in package ctcache_onnx: no descriptor-pool clash with `onnx`."""
    model = tmp_path / "m.onnx"
    make_matmul(model, 64, 32)
    first, second = order.split(",")
    code = f"""
import {first}, {second}
import onnx, ctcache
m = onnx.load({str(model)!r})
assert onnx.ModelProto.DESCRIPTOR.full_name == "onnx.ModelProto"
assert ctcache.onnx_pb.ModelProto.DESCRIPTOR.full_name == "ctcache_onnx.ModelProto"
# The superset parses the same bytes.
ours = ctcache.onnx_pb.ModelProto.FromString(m.SerializeToString())
assert ours.graph.initializer[0].name == m.graph.initializer[0].name == "W"
assert list(ours.graph.initializer[0].dims) == [64, 32]
d = ctcache.onnx_pb.DeviceProto(type="cpu")
assert ctcache.pb.Entry(device=d).device.type == "cpu"
onnx.checker.check_model(m)
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=str(installed))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_ort_imports_neither_grpc_nor_protobuf(installed):
    """`import ctcache.ort` costs Python and the package's errors only; the
    client's grpc and protobuf load when a call needs the daemon."""
    code = (
        "import sys, ctcache.ort\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'grpc' or m.startswith('google.protobuf'))\n"
        "assert not heavy, heavy\n"
        "import ctcache\n"
        "assert ctcache.connect and ctcache.pb.Entry and ctcache.client.PLACE_METHODS\n"
        "assert 'grpc' in sys.modules\n"
    )
    env = dict(os.environ, PYTHONPATH=str(installed))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr


def test_source_checkout_generates_stubs_lazily(tmp_path):
    """From a checkout (client/python on sys.path, no install) the stubs are generated once into
    $XDG_CACHE_HOME/ctcache/python-stubs/KEY, never into the source tree."""
    pytest.importorskip("grpc_tools")
    code = "import ctcache, onnx; print(ctcache.pb.__file__)"
    env = dict(os.environ, PYTHONPATH=str(REPO / "client" / "python"), XDG_CACHE_HOME=str(tmp_path))
    env.pop("CTCACHE_PROTO_DIR", None)
    for _ in range(2):  # the second import reuses the cache
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert Path(r.stdout.strip()).parent.parent == tmp_path / "ctcache" / "python-stubs"
    assert len(list((tmp_path / "ctcache" / "python-stubs").iterdir())) == 1
    assert not list((REPO / "client" / "python" / "ctcache" / "_pb").glob("*_pb2*.py"))


def test_default_socket(ctcache):
    ds = ctcache.default_socket
    assert ds({"CTCACHE_SOCKET": "/x.sock", "XDG_RUNTIME_DIR": "/run/user/1"}) == "/x.sock"
    assert ds({"XDG_RUNTIME_DIR": "/run/user/1", "HOME": "/h"}) == "/run/user/1/ctcache/ctcached.sock"
    assert ds({"XDG_RUNTIME_DIR": "", "XDG_CACHE_HOME": "/c", "HOME": "/h"}) == "/c/ctcache/ctcached.sock"
    assert ds({"HOME": "/h"}) == "/h/.cache/ctcache/ctcached.sock"


def test_daemon_not_running_is_explained(ctcache, tmp_path):
    missing = tmp_path / "none.sock"
    with pytest.raises(ctcache.DaemonNotRunning) as e:
        ctcache.connect(missing)
    assert str(missing) in str(e.value) and "ctcached --socket" in str(e.value)
    # A stale socket: the file exists, nobody listens.
    stale = Path(tempfile.mkdtemp(prefix="ctc-")) / "s.sock"
    s = socketlib.socket(socketlib.AF_UNIX)
    s.bind(str(stale))
    s.close()
    try:
        with pytest.raises(ctcache.DaemonNotRunning) as e:
            ctcache.connect(stale, timeout=0.5)
        assert str(stale) in str(e.value)
    finally:
        shutil.rmtree(stale.parent, ignore_errors=True)


class _Status(Exception):
    """A grpc error as the channel hands it over: a code, details and the
    daemon's trailer (absent when nobody answered)."""

    def __init__(self, code, kind):
        self._code, self._kind = code, kind

    def code(self):
        return self._code

    def details(self):
        return "what the daemon said"

    def trailing_metadata(self):
        return (("ctcache-error-kind", self._kind),) if self._kind else ()


def test_every_status_maps_to_its_own_exception(ctcache):
    import types

    import grpc

    codes = grpc.StatusCode
    client = types.SimpleNamespace(socket="/run/ctcache/ctcached.sock")

    def raised(code, kind="x"):
        return type(ctcache.Client._error(client, "Method", _Status(code, kind)))

    # UNAVAILABLE without the daemon's trailer: the channel's own (nobody
    # answered); with it: the daemon's passing fault (a source that changed).
    assert raised(codes.UNAVAILABLE, None) is ctcache.DaemonNotRunning
    assert raised(codes.UNAVAILABLE, "unavailable") is ctcache.Unavailable
    assert raised(codes.FAILED_PRECONDITION, "nothing-to-rewrite") is ctcache.NothingToRewrite
    assert issubclass(ctcache.NothingToRewrite, ctcache.FailedPrecondition)
    for code, cls in [(codes.NOT_FOUND, ctcache.NotFound), (codes.INVALID_ARGUMENT, ctcache.InvalidArgument),
                      (codes.PERMISSION_DENIED, ctcache.PermissionDenied),
                      (codes.FAILED_PRECONDITION, ctcache.FailedPrecondition),
                      (codes.RESOURCE_EXHAUSTED, ctcache.ResourceExhausted), (codes.OUT_OF_RANGE, ctcache.OutOfRange),
                      (codes.DATA_LOSS, ctcache.DataLoss), (codes.ABORTED, ctcache.Aborted),
                      (codes.INTERNAL, ctcache.Internal), (codes.CANCELLED, ctcache.Cancelled),
                      (codes.DEADLINE_EXCEEDED, ctcache.DeadlineExceeded),
                      (codes.ALREADY_EXISTS, ctcache.AlreadyExists), (codes.UNIMPLEMENTED, ctcache.Unimplemented),
                      (codes.UNAUTHENTICATED, ctcache.Unauthenticated), (codes.UNKNOWN, ctcache.Unknown)]:
        assert raised(code) is cls, code
        assert issubclass(cls, ctcache.RequestFailed)
    # Every status but OK has an exception of its own.
    named = {codes.UNAVAILABLE, codes.FAILED_PRECONDITION}
    for code in codes:
        if code is not codes.OK and code not in named:
            assert raised(code) is not ctcache.RequestFailed, code


# ---- the daemon ----


def make_matmul(path, k=512, n=256, seed=3) -> np.ndarray:
    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "mm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, n])],
        [numpy_helper.from_array(w, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    save(m, str(path))
    return w


# The Rust test daemons' policy: the default plus the host's SGEMM panels.
TEST_POLICY = (Path(__file__).resolve().parents[2] / "testkit" / "test_policy.toml").read_text()


class Daemon:
    def __init__(self, root: Path):
        self.root = root
        self.cache = root / "cache"
        self.models = root / "models"
        self.models.mkdir()
        self.socket = root / "ctcached.sock"
        self.log = root / "ctcached.log"
        self.start()

    def start(self) -> None:
        """Starts ctcached on this root (again, after a stop: as systemd restarts it)."""
        # The policy these tests are written for: the host's SGEMM panels
        # (a format a client reads itself) beside onnxruntime's 4-bit one.
        config = self.root / "ctcached.toml"
        config.write_text(TEST_POLICY)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [binary("ctcached"), "--config", str(config), "--cache-dir", str(self.cache),
                 "--socket", str(self.socket), "--watch", str(self.models), "--log-format", "human"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        def created() -> bool:
            if self.socket.exists():
                return True
            if self.proc.poll() is not None:
                raise WaitTimeout(f"ctcached exited with {self.proc.returncode} before creating its socket")
            return False

        try:
            wait_until(created, START_TIMEOUT_S, "ctcached creating its socket")
        except WaitTimeout as e:
            self.stop()
            pytest.fail(f"{e}\n{self.log.read_text(errors='replace')}")

    def stop(self, sig=signal.SIGTERM, timeout=40) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def daemon(ctcache):
    # Socket paths are limited to ~100 bytes: a short folder under the temp dir.
    root = Path(tempfile.mkdtemp(prefix="ctc-"))
    d = Daemon(root)
    yield d
    d.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def client(ctcache, daemon):
    with ctcache.connect(daemon.socket, timeout=10) as c:
        yield c


def ctcachectl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary("ctcachectl"), *args], capture_output=True, text=True, timeout=120)


def ctcachectl_has_gc() -> bool:
    """Whether this build has `ctcachectl --socket S gc --max-size N` (else tests use Client.gc)."""
    top = ctcachectl("--help").stdout
    if "\n  gc " not in top:
        return False
    gc = ctcachectl("gc", "--help").stdout
    return "--max-size" in gc and "--socket" in top + gc


def test_status_health_devices(client, daemon):
    st = client.status()
    assert st.pid == daemon.proc.pid
    assert Path(st.cache_dir) == daemon.cache and Path(st.socket) == daemon.socket
    assert [Path(w) for w in st.watches] == [daemon.models]
    assert client.host_devices() and client.host_devices()[0].type == "cpu"
    assert {"ort.matmul_nbits", "gemm.pack_b.f32"} <= {f.id for f in client.formats()}
    assert client.health() == "SERVING"
    assert client.health("ctcache.v1.CompiledTensorCache") == "SERVING"


def test_health_with_grpc_health_stub(daemon):
    """The plain grpc_health.v1 client, as a load balancer or probe would use it."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    ch = grpc.insecure_channel("unix:" + str(daemon.socket), options=[("grpc.default_authority", "localhost")])
    try:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert r.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        ch.close()


def test_resolve_prepack_and_payload_bytes(ctcache, client, daemon):
    model = daemon.root / "mm.onnx"  # outside the watched folder: nothing packs it behind our back
    make_matmul(model)
    r = client.resolve_model(model)
    assert [t.name for t in r.tensors] == ["W"]
    t = r.tensors[0]
    assert list(t.dims) == [512, 256] and t.data_type == TensorProto.FLOAT
    assert sorted(t.wanted_formats) == ["gemm.pack_b.f32", "ort.matmul_nbits"]
    assert not t.entries and {m.reason for m in t.misses} == {"no_entry"}
    assert r.jobs_started == 0

    progress = client.prepack(model, wait=True)
    assert sorted((p.initializer, p.format) for p in progress) == [("W", "gemm.pack_b.f32"), ("W", "ort.matmul_nbits")]
    assert all(ctcache.state_name(p) in ("done", "cached") and p.entry.key for p in progress)

    r = client.resolve_model(model)
    t = r.tensors[0]
    assert not t.misses
    by_format = {ctcache.entry_format(e): e for e in t.entries}
    assert set(by_format) == {"gemm.pack_b.f32", "ort.matmul_nbits"}
    for fmt, e in by_format.items():
        out = daemon.root / f"{fmt}.bin"
        c = ctcachectl("pack", str(model), "--initializer", "W", "--format", fmt, "-o", str(out))
        assert c.returncode == 0, c.stderr
        expected = out.read_bytes()
        with client.open_payload(e) as p:
            assert p.source == "mmap"
            assert len(p) == e.payload_len == len(expected)
            assert p.memoryview.readonly
            assert p.memoryview.tobytes() == expected, f"{fmt}: daemon payload differs from ctcachectl pack"
            raw = p.numpy(np.uint8)
            assert raw.dtype == np.uint8 and raw.shape == (len(expected),) and not raw.flags.writeable
            arr = p.numpy()  # the entry's own dtype and shape where the format has one
            assert not arr.flags.writeable and arr.tobytes() == expected
            if fmt == "gemm.pack_b.f32":  # one field: float32 panels [ceil(N / NR), K, NR]
                nr = arr.shape[2]
                assert arr.dtype == np.float32 and arr.shape == (-(-256 // nr), 512, nr), arr.shape
                w = make_matmul(daemon.root / "again.onnx")  # the same weight (same seed)
                assert np.array_equal(arr[0, :, :nr], w[:, :nr])
            else:  # ort.matmul_nbits: B, scales (no zero points: symmetric) -> no single dtype
                assert arr.dtype == np.uint8 and arr.shape == (len(expected),)
                fields = {f.name: f for f in p.fields()}
                assert list(fields) == ["B", "scales"], list(fields)
                b, scales = p.numpy(field="B"), p.numpy(field="scales")
                assert b.dtype == np.uint8 and b.shape == (256, 512 // 32, 16)
                assert scales.dtype == np.float32 and scales.shape == (256, 512 // 32)
                assert b.tobytes() + scales.tobytes() == expected
                with pytest.raises(KeyError, match="zero_points"):
                    p.numpy(field="zero_points")
            assert p.verify()
            del arr, raw
        assert p.closed
        # The ReadPayload fallback gives the same bytes.
        with client.open_payload(e, mmap=False) as p:
            assert p.source == "stream" and p.tobytes() == expected
        # A range read returns that range, from offset 0 too.
        assert client.read_payload(e.key, 0, 4096) == expected[:4096]
        assert client.read_payload(e.key, 100, 50) == expected[100:150]
        assert client.read_payload(e.key, len(expected) - 10, 4096) == expected[-10:]
        assert client.read_payload(e.key) == expected
        with pytest.raises(ctcache.RequestFailed, match="past the payload"):
            client.read_payload(e.key, len(expected) + 1, 1)
    # Lookup by digest finds the same entries.
    look = client.lookup(t.source_digest)
    assert {e.key for e in look.entries} == {e.key for e in t.entries}
    assert all(e.HasField("struct_type") and e.HasField("device") for e in look.entries)
    # Brief entries: no bulky fields, same keys, and they still open.
    brief = client.lookup(t.source_digest, brief=True)
    assert [e.key for e in brief.entries] == [e.key for e in look.entries]
    assert not any(e.HasField("struct_type") or e.HasField("device") for e in brief.entries)
    assert [e.payload_blake3 for e in brief.entries] == [e.payload_blake3 for e in look.entries]
    with client.open_payload(brief.entries[0]) as p:
        assert p.verify()
    assert client.lookup(bytes(32)).miss.reason


def test_resolve_on_miss_wait_packs(ctcache, client, daemon):
    model = daemon.root / "wait.onnx"
    make_matmul(model, k=1024, seed=11)
    r = client.resolve_model(str(model), on_miss="wait")
    assert r.jobs_started == 2
    t = r.tensors[0]
    assert not t.misses and {ctcache.entry_format(e) for e in t.entries} == {"gemm.pack_b.f32", "ort.matmul_nbits"}
    r2 = client.resolve_model(model, on_miss="wait")
    assert r2.jobs_started == 0 and len(r2.tensors[0].entries) == 2
    with pytest.raises(ValueError):
        client.resolve_model(model, on_miss="later")
    # background: answers at once, packs behind; a non-waiting prepack streams progress.
    bg = daemon.root / "bg.onnx"
    make_matmul(bg, seed=12)
    r = client.resolve_model(bg, on_miss="background")
    assert r.jobs_started == 2
    states = [(p.format, ctcache.state_name(p)) for p in client.prepack(bg, formats="ort.matmul_nbits", wait=False)]
    assert states[-1][0] == "ort.matmul_nbits" and states[-1][1] in ("done", "cached"), states
    with pytest.raises(ctcache.InvalidArgument):
        client.prepack(bg, formats={"no.such.format": {}})
    # A model this process cannot open is its own error: nothing is handed over.
    with pytest.raises(FileNotFoundError):
        client.resolve_model(daemon.root / "missing.onnx")


def test_watched_folder_is_packed(ctcache, client, daemon):
    model = daemon.models / "watched.onnx"
    tmp = daemon.root / "watched.tmp"
    make_matmul(tmp, seed=5)
    os.rename(tmp, model)
    entries = []

    def both_packed() -> bool:
        entries[:] = client.list(model_path=str(model))
        return len(entries) == 2

    with contextlib.suppress(WaitTimeout):  # the assertion below says what is there
        wait_until(both_packed, 60, f"two entries for {model}", interval=0.2)
    assert {ctcache.entry_format(e) for e in entries} == {"gemm.pack_b.f32", "ort.matmul_nbits"}


def test_checked_reads_refuse_bytes_changed_on_disk(ctcache, client, daemon):
    """Payload.checked hashes the groups a read touches, every read: a byte
    changed on disk under a live mapping is an error for its group, never
    returned, while the other groups still read."""
    from ctcache.payload import GROUP

    model = daemon.root / "checked.onnx"
    make_matmul(model, k=1024, seed=11)
    client.prepack(model, wait=True)
    [e] = [e for e in client.resolve_model(model).tensors[0].entries
           if ctcache.entry_format(e) == "gemm.pack_b.f32"]
    assert e.payload_len > 2 * GROUP
    with client.open_payload(e) as p:
        whole = p.tobytes()
        assert p.checked().tobytes() == whole
        assert p.checked(GROUP + 5, 10).tobytes() == whole[GROUP + 5:GROUP + 15]
        with pytest.raises(ValueError):
            p.checked(len(whole) - 1, 2)
        fd = os.open(e.payload_path, os.O_WRONLY)
        try:
            os.pwrite(fd, bytes([whole[GROUP + 100] ^ 1]), GROUP + 100)
            with pytest.raises(ctcache.PayloadMismatch, match=f"bytes {GROUP}..{2 * GROUP} changed"):
                p.checked(GROUP + 90, 20)
            assert p.checked(0, GROUP).tobytes() == whole[:GROUP]
            assert not p.verify()
        finally:
            os.pwrite(fd, whole[GROUP + 100:GROUP + 101], GROUP + 100)
            os.close(fd)
        assert p.checked(GROUP + 90, 20).tobytes() == whole[GROUP + 90:GROUP + 110]


def test_lease_keeps_payload_through_gc(ctcache, client, daemon):
    model = daemon.root / "lease.onnx"
    make_matmul(model, seed=7)
    client.prepack(model)
    entries = client.resolve_model(model).tensors[0].entries
    assert len(entries) == 2
    kept, other = entries
    with open(kept.payload_path, "rb") as f:
        expected = f.read()
    p = client.open_payload(kept, ttl_s=0.6)  # renewed every 0.2 s
    expiry_ms = now_ms() + 600  # at the latest, the lease as granted ends then
    try:
        # Past that expiry (on the clock the daemon states it in): only renewal keeps the lease.
        wait_until(lambda: now_ms() > expiry_ms and p.renewals >= 2, 10,
                   "the lease's first expiry to pass, renewed twice", interval=0.01)
        assert p.renewals >= 2 and p.lease_error is None
        assert {e.key: e.leased for e in client.list()} == {kept.key: True, other.key: False}
        if ctcachectl_has_gc():
            c = ctcachectl("--socket", str(daemon.socket), "gc", "--all", "--yes")
            assert c.returncode == 0, c.stderr
        else:
            g = client.gc(max_bytes=0)
            assert g.skipped_leased == 1
            assert [i.key for i in g.removed] == [other.key]
        assert [e.key for e in client.list()] == [kept.key]
        assert os.path.exists(kept.payload_path)
        assert p.tobytes() == expected and p.verify()
    finally:
        p.close()
    g = client.gc(max_bytes=0)
    assert [i.key for i in g.removed] == [kept.key] and g.skipped_leased == 0
    assert client.list() == []
    assert not os.path.exists(kept.payload_path)
    with pytest.raises(ctcache.NotFound):
        client.open_payload(kept)


def test_embed_and_import(ctcache, client, daemon):
    model = daemon.root / "e.onnx"
    make_matmul(model, seed=9)
    out = daemon.root / "e.ct.onnx"
    r = client.embed(model, out)
    assert r.entries == 2 and out.is_file()
    client.gc(max_bytes=0)
    assert client.list() == []
    imp = client.import_model(out)
    assert imp.imported + imp.already_present == 2, imp
    assert len(client.list()) == 2


def test_package_declares_its_dependencies_and_types(installed):
    """What the README's `pip install ./client/python` brings: numpy and blake3 (Payload.numpy /
    verify), and the PEP 561 marker."""
    from importlib.metadata import PathDistribution

    [info] = installed.glob("ctcache-*.dist-info")
    requires = {re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in PathDistribution(info).requires or []
                if "extra ==" not in r}
    assert {"grpcio", "protobuf", "numpy", "blake3"} <= requires, requires
    # The no-daemon fallback's reference tools: the MatMulNBits quantizer imports onnx_ir.
    ort_extra = {re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in PathDistribution(info).requires or []
                 if 'extra == "ort"' in r}
    assert {"onnxruntime", "onnx", "onnx-ir"} <= ort_extra, ort_extra
    assert (installed / "ctcache" / "py.typed").is_file()


def readme_python_snippet() -> str:
    text = (REPO / "README.md").read_text()
    blocks = text.split("```python\n")
    assert len(blocks) == 2, "README.md should have exactly one python block"
    return blocks[1].split("```", 1)[0]


def test_readme_python_snippet_runs_as_written(installed, tmp_path):
    """README.md's Python block, run unchanged on a fresh cache: the daemon of the walkthrough
    (default socket under HOME) and ~/models/model.onnx as the walkthrough leaves it."""
    home = Path(tempfile.mkdtemp(prefix="ctc-h-"))  # short: the default socket lives under it
    try:
        (home / "models").mkdir()
        w = make_matmul(home / "models" / "model.onnx", seed=21)
        # A second, small initializer first: not packed, so the snippet must skip it.
        _add_small_first_initializer(home / "models" / "model.onnx")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CTCACHE_", "XDG_"))}
        env.update(HOME=str(home), PYTHONPATH=str(installed))
        socket = home / ".cache" / "ctcache" / "ctcached.sock"
        log = open(home / "ctcached.log", "wb")
        proc = subprocess.Popen([binary("ctcached"), "--watch", str(home / "models")], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            def listening() -> bool:
                assert proc.poll() is None, (home / "ctcached.log").read_text()
                return socket.exists()

            wait_until(listening, START_TIMEOUT_S, f"ctcached creating {socket}",
                       detail=lambda: (home / "ctcached.log").read_text())
            r = subprocess.run([sys.executable, "-c", readme_python_snippet()], capture_output=True, text=True,
                               timeout=300, env=env, cwd=tmp_path)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=40)
            log.close()
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{(home / 'ctcached.log').read_text()}"
        lines = sorted(r.stdout.splitlines())
        assert len(lines) == 1 and lines[0].startswith("W "), r.stdout
        assert lines[0].endswith(" True"), "Payload.verify() failed"
        assert w.shape == (512, 256)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _add_small_first_initializer(path: Path) -> None:
    """Puts a small Add bias (nothing packs it) before W in the initializer list."""
    import onnx

    m = onnx.load(str(path))
    bias = numpy_helper.from_array(np.zeros(256, np.float32), "bias")
    m.graph.initializer.insert(0, bias)
    y = m.graph.node[0].output[0]
    m.graph.node[0].output[0] = "mm"
    m.graph.node.append(helper.make_node("Add", ["mm", "bias"], [y]))
    onnx.checker.check_model(m)
    save(m, str(path))


def test_events_returns_once_the_daemon_follows_its_feed(ctcache, client, daemon):
    """events() waits for the call's headers, which the daemon sends once its
    handler has subscribed: an event made on another connection right after
    it returns is seen, with no step to sync on."""
    answered = []
    real = client._stub.Events

    class Watched:
        def __init__(self, call):
            self.call = call

        def initial_metadata(self):
            got = self.call.initial_metadata()
            answered.append(got is not None)
            return got

        def __iter__(self):
            return iter(self.call)

        def cancel(self):
            return self.call.cancel()

    client._stub.Events = lambda req, timeout=None: Watched(real(req, timeout=timeout))
    stream = client.events()
    assert answered == [True]
    folder = daemon.root / "watched-now"
    folder.mkdir()
    seen = threading.Event()

    def follow():
        for e in stream:
            if e.kind == "watcher" and e.model_path == str(folder.resolve()) and "added" in e.detail:
                seen.set()
                return

    threading.Thread(target=follow, daemon=True).start()
    with ctcache.connect(daemon.socket, timeout=10) as other:
        other.add_watch(folder)
    assert seen.wait(30), "the watch added after events() returned is seen"
    stream.close()


def test_events_gives_up_on_a_server_that_never_sends_its_headers(ctcache):
    """A server that takes the Events call and never answers it: events()
    raises DeadlineExceeded after its timeout rather than waiting on."""
    from concurrent import futures

    import grpc
    from ctcache._pb import ctcache_v1_pb2_grpc as pb_grpc

    release = threading.Event()

    class Mute(pb_grpc.CompiledTensorCacheServicer):
        def Events(self, request, context):
            release.wait(60)
            yield from ()

    folder = Path(tempfile.mkdtemp(prefix="ctc-"))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_CompiledTensorCacheServicer_to_server(Mute(), server)
    server.add_insecure_port(f"unix:{folder / 's.sock'}")
    server.start()
    try:
        with ctcache.connect(folder / "s.sock", timeout=10) as c:
            with pytest.raises(ctcache.DeadlineExceeded):
                c.events(timeout=0.5)
    finally:
        release.set()
        server.stop(None)
        shutil.rmtree(folder, ignore_errors=True)


def test_client_survives_a_daemon_restart(ctcache, daemon):
    """SIGKILL and a restart on the same folders (systemd's Restart=): calls that
    are safe to repeat wait for the new daemon, the others fail at once."""
    model = daemon.root / "mm.onnx"
    make_matmul(model)
    with ctcache.connect(daemon.socket, timeout=10) as c, \
            ctcache.connect(daemon.socket, timeout=10, retry_for=0) as impatient:
        first = c.status().pid
        c.prepack(model, wait=True)
        assert daemon.stop(signal.SIGKILL) != 0
        for call in (lambda: c.gc(dry_run=True), impatient.status):
            t = time.monotonic()
            with pytest.raises(ctcache.DaemonNotRunning):
                call()
            assert time.monotonic() - t < 2
        restart = threading.Timer(0.5, daemon.start)
        restart.start()
        try:
            st = c.status()
        finally:
            restart.join()
        assert st.pid == daemon.proc.pid != first
        # The same client goes on; the acknowledged entries are there.
        t = c.resolve_model(model).tensors[0]
        assert t.entries and not t.misses
        assert impatient.status().pid == st.pid


def test_sigterm_exits_zero(ctcache, daemon):
    with ctcache.connect(daemon.socket, timeout=10) as c:
        assert c.status().pid == daemon.proc.pid
    assert daemon.stop(signal.SIGTERM) == 0, daemon.log.read_text(errors="replace")
    assert not daemon.socket.exists()
    with pytest.raises(ctcache.DaemonNotRunning):
        ctcache.connect(daemon.socket, timeout=1)
