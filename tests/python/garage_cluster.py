"""A Garage 2.5 cluster on loopback for the fleet tier's test and bench:
three nodes, replication factor 3, one layout, a key and a bucket, node 1
the S3 endpoint; and the daemon's ``[remote]`` section for such a local
endpoint, which the fleet tests and the bench both write.

Used by tests/python/test_garage.py and bench/fleet_bench.py; standard
library only (boto3 for :meth:`Cluster.client`), no pytest, so a bench can
run it. Failures raise :class:`GarageError` with the node's log tail.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path

from waiting import wait_until

REGION = "garage"


class GarageError(RuntimeError):
    pass


def remote_section(url: str, endpoint: str, *, fetch: str, write: bool = True, signing_key: Path | None = None,
                   trusted: Iterable[str] = (), extra: Iterable[str] = ()) -> str:
    """ctcached.toml's ``[remote]`` table for a local S3 endpoint over plain
    http; ``extra`` lines go into the same table."""
    lines = ["[remote]", f'url = "{url}"', f'endpoint = "{endpoint}"', "allow_http = true",
             f"write = {str(write).lower()}", f'fetch = "{fetch}"',
             "trusted_keys = [" + ", ".join(f'"{t}"' for t in trusted) + "]"]
    if signing_key is not None:
        lines.append(f'signing_key_file = "{signing_key}"')
    return "\n".join([*lines, *extra])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    def __init__(self, garage: str, root: Path, i: int, secret: str):
        self.bin = garage
        self.dir = root / f"node{i}"
        self.dir.mkdir(parents=True)
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
        return subprocess.run([self.bin, "-c", str(self.config), *args], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "RUST_LOG": "warn"})

    def garage(self, *args: str) -> str:
        r = self.run(*args)
        if r.returncode != 0:
            raise GarageError(f"garage {' '.join(args)}: {r.stdout}\n{r.stderr}")
        return r.stdout

    def start(self) -> None:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([self.bin, "-c", str(self.config), "server"], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, "RUST_LOG": "garage=info"})

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def node_id(self) -> str:
        def node_id() -> str | None:
            r = self.run("node", "id", "-q").stdout.strip()
            return r if "@" in r else None

        return wait_until(node_id, 30, f"node {self.dir} having an id", interval=0.2, error=GarageError,
                          detail=lambda: self.log.read_text(errors="replace")[-2000:])


class Cluster:
    """Three garage nodes (binary ``garage``) under ``root``, serving ``bucket``."""

    def __init__(self, garage: str, root: Path, bucket: str):
        secret = secrets.token_hex(32)
        self.bucket = bucket
        self.nodes = [Node(garage, root, i, secret) for i in (1, 2, 3)]
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
        tried: list[subprocess.CompletedProcess] = []

        def key_created() -> subprocess.CompletedProcess | None:
            tried[:] = [first.run("key", "create", "ctcache")]
            return tried[0] if tried[0].returncode == 0 else None

        r = wait_until(key_created, 60, "the cluster ready (a key created)", interval=0.5, error=GarageError,
                       detail=lambda: f"cluster not ready: {tried[0].stderr}\n{first.run('status').stdout}")
        self.key_id = re.search(r"Key ID:\s*(\S+)", r.stdout).group(1)
        info = first.garage("key", "info", self.key_id, "--show-secret")
        self.secret = re.search(r"Secret key:\s*(\S+)", info).group(1)
        first.garage("bucket", "create", self.bucket)
        first.garage("bucket", "allow", "--read", "--write", "--owner", self.bucket, "--key", self.key_id)
        return self

    def stop(self) -> None:
        for n in self.nodes:
            n.kill()

    def client(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.key_id, aws_secret_access_key=self.secret)
