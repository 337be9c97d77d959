"""Uploads to a slow S3 server (moto behind a proxy that takes request
bodies at a few MiB a second).

* A payload in parts, each part longer on the wire than ``timeout_ms``,
  goes up whole: a request sending bytes is waited for the timeout and its
  bytes at ``min_upload_bytes_per_s`` (default 1 MiB/s), not the timeout alone, so
  a slow server is not taken for a stalled one. The bucket holds the
  host's exact bytes, and nothing is counted as an error.
* With ``min_upload_bytes_per_s`` above what the server takes, the same
  upload fails within its deadline (twice: a request not answered in time
  is sent once more), counted once, and nothing is on the bucket (no
  manifest: the entry does not exist there).
* A payload's request the server holds past its deadline once is sent
  again, and the entry goes up whole, no error counted.

(A server that never answers still costs a fetch one timeout: test_fleet's
hung server.)

Skips when moto is not installed.
"""

from __future__ import annotations

import threading
import time

import pytest

from s3_proxy import S3Proxy, payload_object
from test_fleet import (BUCKET, chain_model, fleet_daemon, keygen, objects, payloads,  # noqa: F401
                        remote_status, root, s3)
from waiting import wait_until

pytest.importorskip("moto")

# Each 16 MiB part takes about eight seconds through the proxy, more than
# twice the timeout (which a small request, answered at once, never nears).
BODY_BYTES_PER_S = 2 << 20
TIMEOUT_MS = 3000


class SlowBodies(S3Proxy):
    """Reads each request body at most ``rate`` bytes a second, and counts
    the bodies above a MiB it slowed."""

    def __init__(self, upstream: str, rate: int):
        self.rate = rate
        self.slowed = 0
        super().__init__(upstream)

    def body(self, rfile, length: int) -> bytes:
        if length > 1 << 20:
            with self.lock:
                self.slowed += 1
        chunks, started, got = [], time.monotonic(), 0
        while got < length:
            c = rfile.read(min(length - got, 64 << 10))
            if not c:
                break
            chunks.append(c)
            got += len(c)
            ahead = got / self.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
        return b"".join(chunks)


def _upload_through_slow_server(root, s3, extra: list[str]):
    """Host A packs a 68 MiB payload (4224 x 4224 FLOAT, five parts of 16
    MiB, the fifth waiting for one of the four under way to end) and
    uploads it through the slow proxy; its remote status once the upload
    settled, and its payloads."""
    model = chain_model(root / "big.onnx", 1, size=4224)
    keygen("a", root)
    proxy = SlowBodies(s3.endpoint, BODY_BYTES_PER_S)
    a = fleet_daemon(root, "a", proxy, sign="a", timeout_ms=TIMEOUT_MS, extra=extra,
                     policy='[[policy]]\nformat = "identity"\n')
    try:
        r = a.ctl("resolve", str(model), "--on-miss", "wait", timeout=300)
        assert r.returncode == 0, r.describe() + a.log_text()
        st = wait_until(lambda: (lambda st: st if st["uploads"] + st["errors"] else None)(remote_status(a)),
                        240, "the upload settled", interval=0.2, detail=a.log_text)
        return st, payloads(a), proxy.slowed
    finally:
        a.stop()
        proxy.close()


def test_a_large_payload_goes_up_to_a_slow_server_in_parts(root, s3):
    st, packed, slowed = _upload_through_slow_server(root, s3, [])
    assert (st["uploads"], st["errors"]) == (1, 0), st
    assert slowed >= 5, slowed
    (data,) = packed.values()
    assert len(data) > 64 << 20
    uploaded, = objects(s3, "fleet", "payload")
    assert s3.client().get_object(Bucket=BUCKET, Key=uploaded)["Body"].read() == data


def test_an_upload_slower_than_min_upload_bytes_per_s_fails(root, s3):
    # 64 MiB/s: the wait for a part's place is given 4 s (3 s, and four
    # parts under way at 64 MiB/s); a part takes 8 s through the proxy.
    st, _, _ = _upload_through_slow_server(root, s3, [f"min_upload_bytes_per_s = {64 << 20}"])
    assert (st["uploads"], st["errors"]) == (0, 1), st
    assert "did not answer within" in st["last_error"], st
    assert objects(s3, "fleet", "manifest") == [], "no entry exists on the bucket"


class FirstPayloadHeld(S3Proxy):
    """Holds the first payload PUT until ``release`` is set, then answers it
    500 unforwarded (its sender gave up on it by then)."""

    def __init__(self, upstream: str):
        self.release = threading.Event()
        self.held = threading.Event()
        self.puts = 0
        super().__init__(upstream)

    def before(self, method: str, path: str) -> tuple[int, bytes] | None:
        if method != "PUT" or not payload_object(path):
            return None
        with self.lock:
            self.puts += 1
            if self.puts > 1:
                return None
        self.held.set()
        self.release.wait(120)
        return 500, b"<Error><Code>InternalError</Code><Message>held by the test</Message></Error>"

    def close(self):
        self.release.set()
        super().close()


def test_an_upload_the_server_stalls_once_is_sent_again(root, s3):
    model = chain_model(root / "chain.onnx", 1)
    keygen("a", root)
    proxy = FirstPayloadHeld(s3.endpoint)
    a = fleet_daemon(root, "a", proxy, sign="a", timeout_ms=1000)
    try:
        r = a.ctl("resolve", str(model), "--on-miss", "wait", timeout=120)
        assert r.returncode == 0, r.describe() + a.log_text()
        assert proxy.held.wait(60), a.log_text()
        st = wait_until(lambda: (lambda st: st if st["uploads"] + st["errors"] else None)(remote_status(a)),
                        60, "the upload settled", interval=0.2, detail=a.log_text)
        assert (st["uploads"], st["errors"]) == (1, 0), st
        assert "sending it again" in a.log_text()
        assert proxy.puts == 2
        (data,) = payloads(a).values()
        (uploaded,) = objects(s3, "fleet", "payload")
        assert s3.client().get_object(Bucket=BUCKET, Key=uploaded)["Body"].read() == data
        assert len(objects(s3, "fleet", "manifest")) == 1
    finally:
        a.stop()
        proxy.close()
