"""The fleet tier on a real distributed engine: Garage 2.5, three nodes on
loopback, replication factor 3.

Host A packs a model of eight weights and uploads it through node 1; once its
first upload is done, node 3 is killed. Every upload still succeeds (a write
quorum is two of three), every object is still readable through node 1, and
host B, with an empty cache, resolves the model with zero local packs and A's
exact bytes.

Runs only with ``CTCACHE_GARAGE`` naming a garage binary (tests/garage_e2e.sh
sets it, building garage once if needed) and the ctcache binaries built.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from test_fleet import (BUCKET, FORMATS, aws_env, chain_model, fetches_everything, fleet_daemon, free_port,
                        keygen, objects, payloads, remote_status, resolve_wait, wait_uploads)
from test_fleet import root  # noqa: F401 (the fixture: a short temp folder, sockets live under it)

boto3 = pytest.importorskip("boto3")
GARAGE = os.environ.get("CTCACHE_GARAGE", "")
pytestmark = pytest.mark.skipif(not (GARAGE and Path(GARAGE).is_file()),
                                reason="CTCACHE_GARAGE does not name a garage binary (tests/garage_e2e.sh)")

REGION = "garage"
WEIGHTS = 8


class Node:
    def __init__(self, root: Path, i: int, secret: str):
        self.dir = root / f"node{i}"
        self.dir.mkdir()
        self.rpc = free_port()
        self.s3 = free_port()
        self.admin = free_port()
        self.config = self.dir / "garage.toml"
        self.config.write_text(f"""metadata_dir = "{self.dir / 'meta'}"
data_dir = "{self.dir / 'data'}"
db_engine = "sqlite"
replication_factor = 3
rpc_bind_addr = "127.0.0.1:{self.rpc}"
rpc_public_addr = "127.0.0.1:{self.rpc}"
rpc_secret = "{secret}"

[s3_api]
s3_region = "{REGION}"
api_bind_addr = "127.0.0.1:{self.s3}"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:{self.admin}"
""")
        self.endpoint = f"http://127.0.0.1:{self.s3}"
        self.log = self.dir / "garage.log"
        self.proc: subprocess.Popen | None = None

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([GARAGE, "-c", str(self.config), *args], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "RUST_LOG": "warn"})

    def garage(self, *args: str) -> str:
        r = self.run(*args)
        if r.returncode != 0:
            pytest.fail(f"garage {' '.join(args)}: {r.stdout}\n{r.stderr}")
        return r.stdout

    def start(self) -> None:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([GARAGE, "-c", str(self.config), "server"], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, "RUST_LOG": "garage=info"})

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def node_id(self) -> str:
        deadline = time.monotonic() + 30
        while True:
            r = self.run("node", "id", "-q").stdout.strip()
            if "@" in r:
                return r
            if time.monotonic() > deadline:
                pytest.fail(f"node {self.dir} has no id: {self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)


class Cluster:
    """Three garage nodes, one layout, a key and a bucket; node 1 is the endpoint."""

    def __init__(self, root: Path):
        secret = secrets.token_hex(32)
        self.nodes = [Node(root, i, secret) for i in (1, 2, 3)]
        self.key_id = self.secret = ""

    @property
    def endpoint(self) -> str:
        return self.nodes[0].endpoint

    def start(self) -> "Cluster":
        for n in self.nodes:
            n.start()
        ids = [n.node_id() for n in self.nodes]
        first = self.nodes[0]
        for other in ids[1:]:
            first.garage("node", "connect", other)
        for i in ids:
            first.garage("layout", "assign", "-z", "dc1", "-c", "1G", i.split("@")[0])
        first.garage("layout", "apply", "--version", "1")
        # The first write that needs a quorum succeeds once the nodes agree
        # on the layout.
        deadline = time.monotonic() + 60
        while (r := first.run("key", "create", "ctcache")).returncode != 0:
            if time.monotonic() > deadline:
                pytest.fail(f"cluster not ready: {r.stderr}\n{first.run('status').stdout}")
            time.sleep(0.5)
        self.key_id = re.search(r"Key ID:\s*(\S+)", r.stdout).group(1)
        info = first.garage("key", "info", self.key_id, "--show-secret")
        self.secret = re.search(r"Secret key:\s*(\S+)", info).group(1)
        first.garage("bucket", "create", BUCKET)
        first.garage("bucket", "allow", "--read", "--write", "--owner", BUCKET, "--key", self.key_id)
        return self

    def stop(self) -> None:
        for n in self.nodes:
            n.kill()

    def client(self):
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.key_id, aws_secret_access_key=self.secret)


@pytest.fixture
def garage(tmp_path_factory, monkeypatch):
    root = Path(tmp_path_factory.mktemp("garage"))
    c = Cluster(root)
    try:
        c.start()
        aws_env(monkeypatch, c.key_id, c.secret, REGION)
        yield c
    finally:
        c.stop()


def test_two_hosts_share_a_model_through_three_nodes_while_one_dies(root, garage):
    model = chain_model(root / "chain.onnx", WEIGHTS, size=1024)
    total = WEIGHTS * FORMATS
    pub_a = keygen("a", root)
    a = fleet_daemon(root, "a", garage, sign="a")
    try:
        resolve_wait(a, model)
        # Node 3 dies once the uploads have started.
        deadline = time.monotonic() + 120
        while remote_status(a)["uploads"] < 1:
            assert time.monotonic() < deadline, remote_status(a)
            time.sleep(0.02)
        at_kill = remote_status(a)["uploads"]
        garage.nodes[2].kill()
        st = wait_uploads(a, total, timeout=180)
        assert (st["errors"], st["upload_drops"]) == (0, 0), st
        packed = payloads(a)
        print(f"node 3 killed after {at_kill} of {total} uploads")
    finally:
        a.stop()
    # No entry lost: every manifest and payload reads back through node 1.
    c = garage.client()
    for leaf in ("manifest", "payload"):
        keys = objects(garage, "fleet", leaf)
        assert len(keys) == total, keys
        for k in keys:
            c.get_object(Bucket=BUCKET, Key=k)["Body"].read()
    fetches_everything(root, garage, model, pub_a, packed)
