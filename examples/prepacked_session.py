#!/usr/bin/env python3
"""Ask ctcache for a model's prepacked weights before creating an onnxruntime session.

    python examples/prepacked_session.py [--socket PATH] [--model PATH] [--ctcached BIN]

  --socket PATH   the daemon's socket (default: $CTCACHE_SOCKET, else the D8 default
                  $XDG_RUNTIME_DIR/ctcache/ctcached.sock or ~/.cache/ctcache/ctcached.sock).
                  When nothing answers there, the script starts its own daemon:
                    ctcached --cache-dir TMP/cache --socket TMP/ctcached.sock --watch TMP/models
                  and stops it (SIGTERM) at the end.
  --ctcached BIN  the daemon binary for that case (default: $CTCACHED, else
                  ${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}/debug/ctcached, else ctcached on PATH).
  --model PATH    a model whose MatMul weights to use (default: a demo MatMul with a fresh
                  random 1024x1024 FLOAT weight, so the first resolve is a real miss).
  Needs: pip install ./client/python numpy onnx onnxruntime

What the timings are:
  miss  resolve_model(on_miss="wait") with nothing cached: the daemon packs every weight its
        policy selects (by default gemm.pack_b.f32 and ort.matmul_nbits 4-bit/32) and answers
        when done. If the cache already had them, the line says so.
  hit   a second resolve_model (entries found, nothing packed) plus leasing and mmapping every
        payload.
  Then each MatMul whose weight has an ort.matmul_nbits entry becomes a com.microsoft
  MatMulNBits node fed straight from the mmapped payload (SessionOptions.add_external_initializers,
  no quantization in this process), the session is created and its output is checked
  against the dequantized payload. Not measured away: onnxruntime still does its own MLAS
  repacking of B while creating the session; ctcache saves the quantization pass, not that.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import ctcache


def demo_model(path: str, k: int = 1024, n: int = 1024) -> None:
    w = np.random.default_rng().standard_normal((k, n)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "demo",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, n])],
        [numpy_helper.from_array(w, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, path)


def start_daemon(binary: str, tmp: str) -> tuple[subprocess.Popen, str]:
    sock = os.path.join(tmp, "ctcached.sock")
    os.makedirs(os.path.join(tmp, "models"), exist_ok=True)
    proc = subprocess.Popen([binary, "--cache-dir", os.path.join(tmp, "cache"), "--socket", sock,
                             "--watch", os.path.join(tmp, "models")],
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "ctcached.log"), "wb"))
    for _ in range(200):
        if os.path.exists(sock) or proc.poll() is not None:
            break
        time.sleep(0.05)
    return proc, sock


def nbits_graph(model: onnx.ModelProto, packed: dict) -> tuple[onnx.ModelProto, dict]:
    """MatMul(A, W) -> MatMulNBits(A, W_q, W_scales) where W has an ort.matmul_nbits payload.

    Returns the model and {initializer name: numpy view into the payload}."""
    feeds = {}
    inits = {i.name: i for i in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        name = node.input[1] if node.op_type == "MatMul" and len(node.input) == 2 else None
        if name not in packed or name not in inits:
            nodes.append(node)
            continue
        entry, payload = packed[name]
        bits, bs = (int(x) for x in re.match(r"ort\.matmul_nbits\.b(\d+)\.bs(\d+)\.sym$", entry.physical_type).groups())
        n, k_blocks = entry.dims
        k = inits[name].dims[0]
        blob = bs * bits // 8
        data = payload.numpy()
        b_len = n * k_blocks * blob
        feeds[name + "_q"] = data[:b_len].reshape(n, k_blocks, blob)
        feeds[name + "_scales"] = data[b_len:b_len + n * k_blocks * 4].view(np.float32)
        nodes.append(helper.make_node("MatMulNBits", [node.input[0], name + "_q", name + "_scales"], list(node.output),
                                      domain="com.microsoft", K=k, N=n, bits=bits, block_size=bs))
    # Placeholders marked as external data; the session gets the payload views for them
    # through SessionOptions.add_external_initializers (no file is read, no copy on our side).
    placeholders = []
    for f, a in feeds.items():
        t = TensorProto(name=f, dims=a.shape, data_type=TensorProto.UINT8 if f.endswith("_q") else TensorProto.FLOAT)
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value="ctcache-payload")
        placeholders.append(t)
    g = helper.make_graph(nodes, model.graph.name, model.graph.input, model.graph.output,
                          [i for i in model.graph.initializer if i.name + "_q" not in feeds] + placeholders)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = model.ir_version
    return m, feeds


def dequantized(feeds: dict, name: str, k: int) -> np.ndarray:
    q, s = feeds[name + "_q"], feeds[name + "_scales"]
    codes = np.stack([q & 0x0F, q >> 4], axis=-1).reshape(q.shape[0], -1).astype(np.float32)  # [N, k_blocks*bs]
    w = (codes - 8) * np.repeat(s.reshape(q.shape[0], -1), codes.shape[1] // q.shape[1], axis=1)
    return w[:, :k].T  # [K, N]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket")
    ap.add_argument("--model")
    ap.add_argument("--ctcached")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ctcache-example-")
    proc = None
    try:
        model_path = args.model or os.path.join(tmp, "demo.onnx")
        if not args.model:
            demo_model(model_path)
        try:
            client = ctcache.connect(args.socket, timeout=2)
            print(f"using the running daemon on {client.socket}")
        except ctcache.DaemonNotRunning as e:
            target = os.environ.get("CARGO_TARGET_DIR") or "/var/tmp/ctcache-target"
            binary = args.ctcached or os.environ.get("CTCACHED") or (
                os.path.join(target, "debug", "ctcached") if os.path.exists(os.path.join(target, "debug", "ctcached"))
                else shutil.which("ctcached"))
            if not binary:
                print(e, file=sys.stderr)
                return 1
            proc, sock = start_daemon(binary, tmp)
            client = ctcache.connect(sock, timeout=10)
            print(f"started {binary} on {sock} (cache {tmp}/cache)")

        with client:
            t0 = time.perf_counter()
            r = client.resolve_model(model_path, on_miss="wait")
            miss_s = time.perf_counter() - t0
            pack_ms = sum(e.pack_duration_us for t in r.tensors for e in t.entries) / 1e3
            print(f"miss: resolve(on_miss=wait) {miss_s * 1e3:8.1f} ms  ({r.jobs_started} pack jobs; "
                  f"packer time of the entries {pack_ms:.1f} ms)"
                  + ("" if r.jobs_started else "  -- already cached: this was a hit"))

            t0 = time.perf_counter()
            r = client.resolve_model(model_path)
            t1 = time.perf_counter()
            payloads = [(t.name, e, client.open_payload(e)) for t in r.tensors for e in t.entries]
            t2 = time.perf_counter()
            total = sum(len(p) for _, _, p in payloads)
            print(f"hit:  resolve {(t1 - t0) * 1e3:8.1f} ms + open {len(payloads)} payloads ({total / 2**20:.1f} MiB, "
                  f"{'/'.join(sorted({p.source for _, _, p in payloads}))}) {(t2 - t1) * 1e3:.1f} ms")
            misses = [f"{t.name}: {m.detail}" for t in r.tensors for m in t.misses]
            if misses:
                print("still missing:", "; ".join(misses))

            try:
                model = onnx.load(model_path)
                packed = {n: (e, p) for n, e, p in payloads if ctcache.entry_format(e) == "ort.matmul_nbits"
                          and e.physical_type.endswith(".sym")}
                nb_model, feeds = nbits_graph(model, packed)
                if not feeds:
                    print("no MatMul weight with a symmetric ort.matmul_nbits entry; nothing to run")
                    return 0
                so = ort.SessionOptions()
                t0 = time.perf_counter()
                base = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
                t1 = time.perf_counter()
                names = list(feeds)
                so.add_external_initializers(names, [ort.OrtValue.ortvalue_from_numpy(feeds[n]) for n in names])
                sess = ort.InferenceSession(nb_model.SerializeToString(), so, providers=["CPUExecutionProvider"])
                t2 = time.perf_counter()
                print(f"session: float model {(t1 - t0) * 1e3:.1f} ms, MatMulNBits from payloads {(t2 - t1) * 1e3:.1f} ms "
                      f"({len(feeds) // 2} weight(s) replaced)")
                inp = base.get_inputs()[0]
                x = np.random.default_rng(1).standard_normal([d if isinstance(d, int) else 1 for d in inp.shape]).astype(np.float32)
                y_float = base.run(None, {inp.name: x})[0]
                y_nbits = sess.run(None, {inp.name: x})[0]
                if len(model.graph.node) == 1:  # the demo: Y = X @ W, checkable exactly
                    w_name = model.graph.node[0].input[1]
                    ref = x @ dequantized(feeds, w_name, model.graph.initializer[0].dims[0])
                    print(f"check: |nbits - X@dequant(payload)| max {np.abs(y_nbits - ref).max():.2e}; "
                          f"|nbits - float| / |float| = {np.linalg.norm(y_nbits - y_float) / np.linalg.norm(y_float):.3f} (4-bit error)")
                del sess, so, feeds
            finally:
                for _, _, p in payloads:
                    p.close()
        return 0
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
