"""The fleet tier against a local S3 server (moto, started here on 127.0.0.1).

* Two daemons with separate caches share a bucket: A packs a model and uploads
  it; B resolves it with zero local packs (its metrics show remote hits and no
  pack job) and its payload bytes equal A's.
* A corrupted payload object, a manifest signed by an untrusted key and an
  unsigned one are all rejected (counted by reason) and B packs locally, with
  the same bytes.
* With the server stopped, B's resolve with ``--on-miss wait`` finishes within
  the remote deadline plus the time a host without a remote takes to pack.
* With a server that never answers and a one-place upload queue, uploads are
  dropped and counted and every request still succeeds. (That memory stays
  flat is by construction, a queue of metadata and mappings; not measured.)

Skips when the binaries are not built or moto is not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from e2e.harness import Daemon, ctl
from garage_cluster import free_port, remote_section
from test_first_run import make_model  # a 512 x 256 FLOAT MatMul weight
from waiting import wait_until

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

BUCKET = "ctc-fleet"
TIMEOUT_MS = 1500
FORMATS = 1  # the default policy: ort.matmul_nbits


class S3Server:
    """``moto_server`` on a free loopback port."""

    def __init__(self, root: Path):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = root / "moto.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "S3Server":
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        def listening() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(f"moto did not start: {self.log.read_text(errors='replace')[-3000:]}")
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True

        wait_until(listening, 30, f"moto listening on port {self.port}", interval=0.1, ignore=(OSError,),
                   detail=lambda: f"moto did not start: {self.log.read_text(errors='replace')[-3000:]}")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self):
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="test", aws_secret_access_key="test")


@pytest.fixture
def root():
    r = Path(tempfile.mkdtemp(prefix="ctc-fleet-"))  # short: sockets live under it
    yield r
    shutil.rmtree(r, ignore_errors=True)


def aws_env(monkeypatch, key_id: str = "test", secret: str = "test", region: str = "us-east-1") -> None:
    """The daemons' credentials (the standard AWS environment), nothing else of AWS."""
    for k, v in {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret,
                 "AWS_REGION": region}.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def s3(root, monkeypatch):
    aws_env(monkeypatch)
    server = S3Server(root).start()
    server.client().create_bucket(Bucket=BUCKET)
    yield server
    server.stop()


def keygen(name: str, dir_: Path) -> str:
    """A key pair in ``dir_``; returns the public key line."""
    r = ctl("remote", "keygen", name, "--dir", str(dir_))
    assert r.returncode == 0, r.describe()
    return (dir_ / f"{name}.pub").read_text().strip()


def fleet_daemon(root: Path, name: str, s3: S3Server, *, prefix: str = "fleet", sign: str | None = None,
                 trust: list[str] = (), write: bool = True, metrics: bool = True, fetch: str = "always",
                 workers: int = 0, extra: list[str] = (), policy: str = "", args: list[str] = (),
                 timeout_ms: int = TIMEOUT_MS, settings: list[str] = ()) -> Daemon:
    d = Daemon(root / name, args=list(args))
    remote = remote_section(f"s3://{BUCKET}/{prefix}", s3.endpoint, fetch=fetch, write=write,
                            signing_key=root / (sign + ".secret") if sign else None, trusted=trust,
                            extra=[f"timeout_ms = {timeout_ms}", *extra])
    top = [f"workers = {workers}", *settings]
    if metrics:
        d.metrics = f"127.0.0.1:{free_port()}"
        top.append(f'metrics_addr = "{d.metrics}"')
    (d.root / "ctcached.toml").write_text("\n".join([*top, remote, policy]) + "\n")
    return d.start()


def start_writing(d: Daemon) -> Daemon:
    """Starts the stopped daemon ``d`` again with uploads on (``write = true``)."""
    config = d.root / "ctcached.toml"
    config.write_text(config.read_text().replace("write = false", "write = true"))
    return d.start()


def plain_daemon(root: Path, name: str) -> Daemon:
    return Daemon(root / name).start()


def remote_status(d: Daemon) -> dict:
    return d.json("remote", "status")


def wait_uploads(d: Daemon, n: int, timeout: float = 60) -> dict:
    def done() -> dict | None:
        st = remote_status(d)
        return st if st["uploads"] >= n else None

    return wait_until(done, timeout, f"{n} uploads done", interval=0.1,
                      detail=lambda: f"{remote_status(d)}\n{d.log_text()}")


def scrape(d: Daemon) -> str:
    with urllib.request.urlopen(f"http://{d.metrics}/metrics", timeout=10) as r:
        return r.read().decode()


def metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+([0-9.eE+-]+)$", line)
        if m:
            total += float(m.group(2))
    return total


def resolve_wait(d: Daemon, model: Path) -> float:
    t0 = time.monotonic()
    r = d.ctl("resolve", str(model), "--on-miss", "wait", timeout=300)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.describe() + d.log_text()
    return took


def payloads(d: Daemon) -> dict[str, bytes]:
    """{entry key: payload bytes} of a daemon's store."""
    return {k: Path(e["payload_path"]).read_bytes() for k, e in d.entries().items()}


@pytest.fixture
def shared(root, s3):
    """A packed and uploaded the model; returns (A's payloads, model, trusted line)."""
    model = make_model(root / "model.onnx")
    pub_a = keygen("a", root)
    a = fleet_daemon(root, "a", s3, sign="a")
    try:
        resolve_wait(a, model)
        wait_uploads(a, FORMATS)
        packed = payloads(a)
        assert len(packed) == FORMATS
        assert metric_sum(scrape(a), "ctcache_pack_jobs_total") == FORMATS
        # The cost rule measured each format on the backend that packed it.
        rates = remote_status(a)["pack_bytes_per_s"]
        assert sorted(rates) == ["ort.matmul_nbits/cpu"], rates
    finally:
        a.stop()
    return packed, model, pub_a


def fetches_everything(root: Path, server, model: Path, pub_a: str, packed: dict[str, bytes], policy: str = "",
                       timeout_ms: int = TIMEOUT_MS):
    """Host B (empty cache, trusting A; ``policy`` as A's) resolves
    ``model``: every entry from ``server``, A's exact bytes, no local pack.
    Returns B's remote status and metrics."""
    b = fleet_daemon(root, "b", server, trust=[pub_a], write=False, policy=policy, timeout_ms=timeout_ms)
    try:
        resolve_wait(b, model)
        assert payloads(b) == packed
        st = remote_status(b)
        assert (st["hits"], st["rejected"], st["errors"]) == (len(packed), 0, 0), st
        assert (st["reachable"], st["probe_error"]) == (True, ""), st
        m = scrape(b)
        assert metric_sum(m, "ctcache_pack_jobs_total") == 0, "B packed locally"
        return st, m
    finally:
        b.stop()


def test_a_second_host_fetches_what_the_first_packed(root, s3, shared):
    packed, model, pub_a = shared
    st, m = fetches_everything(root, s3, model, pub_a, packed)
    assert st["bytes_in"] == sum(len(v) for v in packed.values())
    assert metric_sum(m, "ctcache_remote_hits_total") == FORMATS


def objects(s3: S3Server, prefix: str, leaf: str) -> list[str]:
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")
            .get("Contents", [])]
    return sorted(k for k in keys if k.endswith("/" + leaf))


def unsigned(manifest: bytes) -> bytes:
    """The manifest with its signature field (2) removed: field 1 re-encoded alone."""
    return pb_encode([f for f in pb_fields(manifest) if f[0] == 1])


def corrupt_payloads(s3: S3Server):
    c = s3.client()
    for k in objects(s3, "fleet", "payload"):
        body = bytearray(c.get_object(Bucket=BUCKET, Key=k)["Body"].read())
        body[len(body) // 2] ^= 0xFF
        c.put_object(Bucket=BUCKET, Key=k, Body=bytes(body))


def strip_signatures(s3: S3Server):
    c = s3.client()
    for k in objects(s3, "fleet", "manifest"):
        body = c.get_object(Bucket=BUCKET, Key=k)["Body"].read()
        c.put_object(Bucket=BUCKET, Key=k, Body=unsigned(body))


@pytest.mark.parametrize("damage, reason", [
    ("corrupt_payload", "bad_checksum"),
    ("untrusted_key", "untrusted_key"),
    ("unsigned", "unsigned"),
])
def test_entries_that_fail_the_checks_are_rejected_and_packed_locally(root, s3, shared, damage, reason):
    packed, model, pub_a = shared
    if damage == "corrupt_payload":
        corrupt_payloads(s3)
    elif damage == "unsigned":
        strip_signatures(s3)
    else:
        # Host C signs with a key B does not trust; its manifests replace A's.
        keygen("c", root)
        c = fleet_daemon(root, "c", s3, prefix="other", sign="c", metrics=False)
        try:
            resolve_wait(c, model)
            wait_uploads(c, FORMATS)
        finally:
            c.stop()
        cl = s3.client()
        for k in objects(s3, "other", "manifest"):
            cl.copy_object(Bucket=BUCKET, Key="fleet/" + k[len("other/"):],
                           CopySource={"Bucket": BUCKET, "Key": k})
    b = fleet_daemon(root, "b", s3, trust=[pub_a], write=False)
    try:
        resolve_wait(b, model)
        assert payloads(b) == packed, "B's local packs equal A's"
        st = remote_status(b)
        assert (st["hits"], st["rejected"]) == (0, FORMATS), st
        m = scrape(b)
        assert metric_sum(m, "ctcache_pack_jobs_total") == FORMATS
        assert re.search(rf'ctcache_remote_rejected_total\{{reason="{reason}"\}} {FORMATS}', m), m
        # Nothing of the rejected bytes stayed behind in B's store.
        blobs = [p for p in (b.cache / "blobs").rglob("*") if p.is_file()]
        assert len(blobs) == FORMATS
    finally:
        b.stop()


def test_a_stopped_server_costs_at_most_the_deadline(root, s3):
    model = make_model(root / "model.onnx")
    local = plain_daemon(root, "local")
    try:
        pack_s = resolve_wait(local, model)
        packed = payloads(local)
    finally:
        local.stop()
    s3.stop()
    b = fleet_daemon(root, "b", s3, write=False)
    try:
        took = resolve_wait(b, model)
        assert payloads(b) == packed
        st = remote_status(b)
        assert st["hits"] == 0 and st["errors"] + st["skipped"] >= 1, st
        assert st["reachable"] is False and st["probe_error"], st
        # One retry at most within the deadline, per entry; slack for a busy CI host.
        bound = pack_s + FORMATS * 2 * TIMEOUT_MS / 1000 + 5
        assert took <= bound, f"resolve took {took:.1f} s with the remote down (bound {bound:.1f} s)"
    finally:
        b.stop()


class Blackhole:
    """A TCP server that accepts connections and never answers: a hung remote."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self):
        self.sock.close()


def chain_model(path: Path, n: int, size: int = 256) -> Path:
    """``n`` MatMuls in a row, each with its own ``size`` x ``size`` FLOAT weight."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper, save
    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(rng.standard_normal((size, size)).astype(np.float32), f"W{i}")
             for i in range(n)]
    nodes = [helper.make_node("MatMul", ["X" if i == 0 else f"H{i}", f"W{i}"], [f"H{i + 1}"], name=f"mm{i}")
             for i in range(n)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, size])],
                          [helper.make_tensor_value_info(f"H{n}", TensorProto.FLOAT, [1, size])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    save(m, str(path))
    return path


def test_auto_fetches_first_then_packs_each_format_once_to_learn_its_rate(root, s3):
    """fetch = auto on a fresh host: the first miss asks the remote (which
    measures it), then each format's first miss packs (which measures
    packing); the rest take the path measured faster. Every entry has A's
    bytes either way."""
    weights = 4
    model = chain_model(root / "chain.onnx", weights)
    pub_a = keygen("a", root)
    a = fleet_daemon(root, "a", s3, sign="a")
    try:
        resolve_wait(a, model)
        wait_uploads(a, weights * FORMATS)
        packed = payloads(a)
    finally:
        a.stop()
    # One worker: each miss is decided with the rates of the ones before it.
    b = fleet_daemon(root, "b", s3, trust=[pub_a], write=False, fetch="auto", workers=1)
    try:
        resolve_wait(b, model)
        assert payloads(b) == packed
        st = remote_status(b)
        assert st["chose_fetch"] + st["chose_pack"] == weights * FORMATS, st
        assert st["hits"] == st["chose_fetch"] >= 1 and st["remote_bytes_per_s"] > 0, st
        assert sorted(st["pack_bytes_per_s"]) == ["ort.matmul_nbits/cpu"], st
        assert metric_sum(scrape(b), "ctcache_pack_jobs_total") == st["chose_pack"]
    finally:
        b.stop()


def test_a_full_upload_queue_drops_and_counts_without_failing_requests(root, monkeypatch):
    aws_env(monkeypatch)
    hole = Blackhole()
    weights = 8
    model = chain_model(root / "chain.onnx", weights)
    keygen("a", root)
    d = Daemon(root / "a")
    (d.root / "ctcached.toml").write_text(remote_section(
        f"s3://{BUCKET}/fleet", hole.endpoint, fetch="never", signing_key=root / "a.secret",
        extra=[f"timeout_ms = {TIMEOUT_MS}", "upload_queue = 1"]) + "\n")
    d.start()
    try:
        resolve_wait(d, model)
        assert len(d.entries()) == weights * FORMATS
        st = remote_status(d)
        # Each entry was dropped, failed on the hung server, is queued, or is
        # the one upload in flight; with one place in the queue most are dropped.
        total = weights * FORMATS
        settled = st["upload_drops"] + st["errors"] + st["queue_depth"]
        assert total - 1 <= settled <= total, st
        assert st["upload_drops"] >= 1, st
        assert st["uploads"] == 0 and st["queue_capacity"] == 1, st
        assert st["chose_pack"] == weights * FORMATS and st["hits"] == 0, st
    finally:
        d.stop()
        hole.close()


def fill(folder: Path) -> Path:
    """Fills the file system of ``folder`` to the last byte; returns the ballast file."""
    ballast = folder / "ballast"
    with open(ballast, "wb", buffering=0) as f:
        for size in (1 << 16, 512):
            try:
                while True:
                    f.write(b"\1" * size)
            except OSError:
                pass
    return ballast


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root only)")
def test_a_full_cache_disk_is_resource_exhausted_for_a_pull_and_serves_again(root, s3, shared):
    """A fetch whose local store is full answers RESOURCE_EXHAUSTED (exit 4),
    not "missing": packing instead would fill the disk the same way."""
    packed, model, pub_a = shared
    cache = root / "b" / "cache"
    cache.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(cache)], check=True)
    try:
        b = fleet_daemon(root, "b", s3, trust=[pub_a], write=False)
        try:
            ballast = fill(cache)
            r = b.ctl("remote", "pull", str(model))
            assert r.returncode == 4, r.describe()
            assert "RESOURCE_EXHAUSTED" in r.stderr or "space" in r.stderr, r.describe()
            ballast.unlink()
            pulled = b.json("remote", "pull", str(model))
            assert (pulled["done"], pulled["missing"]) == (FORMATS, 0), pulled
            assert payloads(b) == packed
        finally:
            b.stop()
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)


def test_push_then_pull(root, s3):
    """``remote push`` uploads what A packed with uploads off; ``remote pull`` fetches it into B without packing."""
    model = make_model(root / "model.onnx")
    pub_a = keygen("a", root)
    a = fleet_daemon(root, "a", s3, sign="a", write=False)
    try:
        resolve_wait(a, model)
        assert remote_status(a)["uploads"] == 0
        # write = false: push refuses, naming why.
        r = a.ctl("remote", "push", "--model", str(model), "--json")
        assert r.returncode == 1 and "write = false" in r.stderr, r.describe()
    finally:
        a.stop()
    start_writing(a)
    try:
        pushed = a.json("remote", "push", "--model", str(model))
        assert (pushed["done"], pushed["present"], pushed["failed"]) == (FORMATS, 0, 0), pushed
        again = a.json("remote", "push")
        assert (again["done"], again["present"]) == (0, FORMATS), again
        packed = payloads(a)
    finally:
        a.stop()
    b = fleet_daemon(root, "b", s3, trust=[pub_a], write=False)
    try:
        pulled = b.json("remote", "pull", str(model))
        assert (pulled["done"], pulled["missing"]) == (FORMATS, 0), pulled
        assert pulled["bytes"] == sum(len(v) for v in packed.values())
        assert payloads(b) == packed
        assert b.json("remote", "pull", str(model))["present"] == FORMATS
        assert metric_sum(scrape(b), "ctcache_pack_jobs_total") == 0
    finally:
        b.stop()


# ---- audit_rate: a trusted signer's entry whose bytes the packer does not produce ----

def pb_fields(buf: bytes) -> list[tuple[int, int, bytes | int]]:
    """A protobuf message as (field, wire type, value): enough for the manifest."""
    def varint(i: int) -> tuple[int, int]:
        n, shift = 0, 0
        while True:
            b = buf[i]
            n |= (b & 0x7F) << shift
            i += 1
            shift += 7
            if b < 0x80:
                return n, i
    out, i = [], 0
    while i < len(buf):
        tag, i = varint(i)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            v, i = varint(i)
        elif wire == 2:
            n, i = varint(i)
            v, i = buf[i:i + n], i + n
        else:
            raise AssertionError(f"wire type {wire} in a manifest")
        out.append((field, wire, v))
    return out


def pb_encode(fields: list[tuple[int, int, bytes | int]]) -> bytes:
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            b = n & 0x7F
            n >>= 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)
    out = bytearray()
    for field, wire, v in fields:
        out += varint(field << 3 | wire)
        out += varint(v) if wire == 0 else varint(len(v)) + v
    return bytes(out)


def forge_with_trusted_key(s3: S3Server, secret_file: Path, under: str = "fleet") -> int:
    """Changes one byte of every payload under ``under`` and re-signs its
    manifest with the trusted key, blake3 and length consistent: only an
    audit can tell."""
    import blake3
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    import base64
    name, seed = secret_file.read_text().strip().split(":", 1)
    key = Ed25519PrivateKey.from_private_bytes(base64.b64decode(seed))
    c = s3.client()
    forged = 0
    for k in objects(s3, under, "manifest"):
        payload_key = k[:-len("manifest")] + "payload"
        body = bytearray(c.get_object(Bucket=BUCKET, Key=payload_key)["Body"].read())
        body[len(body) // 2] ^= 0x01
        manifest = pb_fields(c.get_object(Bucket=BUCKET, Key=k)["Body"].read())
        entry = dict((f, v) for f, _, v in manifest)[1]
        fields = [(f, w, blake3.blake3(bytes(body)).digest() if f == 8 else v)
                  for f, w, v in pb_fields(entry)]
        entry = pb_encode(fields)
        sig = key.sign(b"ctcache-manifest-v1\0" + entry)
        old_sig = dict((f, v) for f, _, v in pb_fields(dict((f, v) for f, _, v in manifest)[2]))
        signature = pb_encode([(1, 2, name.encode()), (2, 2, old_sig[2]), (3, 2, sig)])
        c.put_object(Bucket=BUCKET, Key=payload_key, Body=bytes(body))
        c.put_object(Bucket=BUCKET, Key=k, Body=pb_encode([(1, 2, entry), (2, 2, signature)]))
        forged += 1
    return forged


@pytest.mark.parametrize("audit_rate", [0, 1])
def test_an_audit_catches_bytes_a_trusted_key_signed_that_the_packer_does_not_produce(
        root, s3, shared, audit_rate):
    packed, model, pub_a = shared
    assert forge_with_trusted_key(s3, root / "a.secret") == FORMATS
    b = fleet_daemon(root, "b", s3, trust=[pub_a], write=False, extra=[f"audit_rate = {audit_rate}"])
    try:
        resolve_wait(b, model)
        st = remote_status(b)
        m = scrape(b)
        if audit_rate == 0:
            # The forgery passes every other check: without an audit it is served.
            assert st["hits"] == FORMATS and st["audits"] == 0, st
            assert payloads(b) != packed
            return
        assert payloads(b) == packed, "B packed the right bytes itself"
        assert (st["hits"], st["audits"], st["audit_mismatches"]) == (0, FORMATS, FORMATS), st
        assert st["rejected"] == FORMATS, st
        assert metric_sum(m, "ctcache_pack_jobs_total") == FORMATS
        assert re.search(rf'ctcache_remote_rejected_total\{{reason="audit_mismatch"\}} {FORMATS}', m), m
        assert re.search(rf'ctcache_remote_audit_mismatches_total\{{signer="a"\}} {FORMATS}', m), m
        log = b.log_text()
        assert "failed its audit" in log and 'trusted key "a"' in log, log
        # Nothing of the forged bytes stayed behind in B's store.
        blobs = [p for p in (b.cache / "blobs").rglob("*") if p.is_file()]
        assert len(blobs) == FORMATS
    finally:
        b.stop()


def test_an_honest_entry_passes_its_audit(root, s3, shared):
    packed, model, pub_a = shared
    b = fleet_daemon(root, "b", s3, trust=[pub_a], write=False, extra=["audit_rate = 1.0"])
    try:
        resolve_wait(b, model)
        assert payloads(b) == packed
        st = remote_status(b)
        assert (st["hits"], st["audits"], st["audit_mismatches"]) == (FORMATS, FORMATS, 0), st
        # The audit packs beside the fetch, not as a pack job.
        assert metric_sum(scrape(b), "ctcache_pack_jobs_total") == 0
    finally:
        b.stop()


# ---- multipart: a payload above the 32 MiB multipart threshold ----

def test_a_large_payload_goes_up_in_parts_and_comes_back_equal(root, s3):
    model = chain_model(root / "big.onnx", 1, size=3072)  # 36 MiB of FLOAT
    pub_a = keygen("a", root)
    # The host's SGEMM panels: a payload as large as the weight.
    panels = '[[policy]]\nformat = "gemm.pack_b.f32"\n'
    a = fleet_daemon(root, "a", s3, sign="a", policy=panels)
    try:
        resolve_wait(a, model)
        wait_uploads(a, FORMATS, timeout=180)
        packed = payloads(a)
    finally:
        a.stop()
    big = [k for k, v in packed.items() if len(v) > 32 << 20]
    assert big, {k: len(v) for k, v in packed.items()}
    # S3 gives a multipart object an ETag "<md5 of the parts' md5s>-<parts>".
    c = s3.client()
    etags = {k: c.head_object(Bucket=BUCKET, Key=k)["ETag"].strip('"') for k in objects(s3, "fleet", "payload")}
    assert sum(1 for e in etags.values() if re.search(r"-\d+$", e)) == len(big), etags
    fetches_everything(root, s3, model, pub_a, packed, policy=panels)
