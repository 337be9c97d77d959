"""Runs the `pack_raw` example of the ctcache-kernels crate.

The binary is the environment variable CTCACHE_PACK_RAW when set (used as
is). Otherwise the tests run `cargo build -p ctcache-kernels --example
pack_raw` once (a no-op when up to date, so a stale binary is never tested)
and use $CARGO_TARGET_DIR/debug/examples/pack_raw (CARGO_TARGET_DIR
defaulting to <repo>/target).

Run: CARGO_TARGET_DIR=... python -m pytest tests/python/kernels
(needs numpy, onnx, onnxruntime, gguf, ml_dtypes).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]


@lru_cache(maxsize=1)
def binary() -> str:
    explicit = os.environ.get("CTCACHE_PACK_RAW")
    if explicit:
        return explicit
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    path = target / "debug" / "examples" / "pack_raw"
    subprocess.run(
        ["cargo", "build", "-q", "-p", "ctcache-kernels", "--example", "pack_raw"],
        cwd=REPO,
        check=True,
    )
    assert path.exists(), f"pack_raw not found at {path}"
    return str(path)


@lru_cache(maxsize=1)
def isas() -> tuple[str, ...]:
    out = subprocess.run([binary(), "--list-isa"], check=True, capture_output=True, text=True)
    return tuple(out.stdout.strip().split(","))


ONNX_NAMES = {np.dtype(np.float32): "FLOAT", np.dtype(np.float16): "FLOAT16"}


def pack(fmt: str, arr: np.ndarray, isa: str, **params) -> tuple[bytes, dict[str, str]]:
    """Packs `arr` (its raw little-endian bytes) and returns (payload, info)."""
    payload, info, _ = pack_full(fmt, arr, isa, **params)
    return payload, info


def pack_full(fmt: str, arr: np.ndarray, isa: str, **params) -> tuple[bytes, dict[str, str], bytes]:
    """Like `pack`, also returning the decoder FunctionProto (binary)."""
    arr = np.asarray(arr, order="C")
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "in.raw"
        dst = Path(d) / "out.bin"
        src.write_bytes(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
        kv = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in params.items()]
        dec = Path(d) / "decoder.pb"
        cmd = [binary(), fmt, ONNX_NAMES[arr.dtype], ",".join(map(str, arr.shape)), str(src), str(dst)]
        cmd += ["--isa", isa, "--decoder", str(dec), *kv]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, f"{cmd}: {res.stderr}"
        info = dict(line.split("=", 1) for line in res.stdout.splitlines())
        payload = dst.read_bytes()
        decoder = dec.read_bytes()
    assert int(info["payload_len"]) == len(payload)
    return payload, info, decoder


def pack_error(fmt: str, arr: np.ndarray, **params) -> str:
    """Runs pack_raw expecting a refusal; returns its message."""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "in.raw"
        src.write_bytes(np.asarray(arr, order="C").tobytes())
        kv = [f"{k}={v}" for k, v in params.items()]
        cmd = [binary(), fmt, ONNX_NAMES[arr.dtype], ",".join(map(str, arr.shape)), str(src), str(Path(d) / "o"), *kv]
        res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode != 0, f"{cmd} unexpectedly succeeded"
    return res.stderr


def first_difference(a: bytes, b: bytes) -> str:
    if len(a) != len(b):
        return f"lengths differ: {len(a)} != {len(b)}"
    x = np.frombuffer(a, np.uint8)
    y = np.frombuffer(b, np.uint8)
    idx = np.flatnonzero(x != y)
    if idx.size == 0:
        return "identical"
    i = int(idx[0])
    return f"{idx.size} bytes differ, first at {i}: {x[i]:#04x} != {y[i]:#04x}"
