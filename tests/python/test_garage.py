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
from pathlib import Path

import pytest

from garage_cluster import REGION, Cluster
from test_fleet import (BUCKET, FORMATS, aws_env, chain_model, fetches_everything, fleet_daemon, keygen, objects,
                        payloads, remote_status, resolve_wait, wait_uploads)
from test_fleet import root  # noqa: F401 (the fixture: a short temp folder, sockets live under it)
from waiting import wait_until

boto3 = pytest.importorskip("boto3")
GARAGE = os.environ.get("CTCACHE_GARAGE", "")
pytestmark = pytest.mark.skipif(not (GARAGE and Path(GARAGE).is_file()),
                                reason="CTCACHE_GARAGE does not name a garage binary (tests/garage_e2e.sh)")

WEIGHTS = 8
# A request under way when a node dies can wait on it until Garage tells it
# gone (CI once saw one upload of eight over 1.5 s): the test is of the
# cluster's quorum, not of the client's timeout.
NODE_LOSS_TIMEOUT_MS = 10_000


@pytest.fixture
def garage(tmp_path_factory, monkeypatch):
    root = Path(tmp_path_factory.mktemp("garage"))
    c = Cluster(GARAGE, root, BUCKET)
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
    a = fleet_daemon(root, "a", garage, sign="a", timeout_ms=NODE_LOSS_TIMEOUT_MS)
    try:
        resolve_wait(a, model)
        # Node 3 dies once the uploads have started.
        wait_until(lambda: remote_status(a)["uploads"] >= 1, 120, "the first upload", interval=0.02,
                   detail=lambda: str(remote_status(a)))
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
    fetches_everything(root, garage, model, pub_a, packed, timeout_ms=NODE_LOSS_TIMEOUT_MS)
