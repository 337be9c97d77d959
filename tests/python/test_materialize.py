"""Materialize (``ctcachectl materialize``, ``Client.materialize``, ``ctcache.ort``) against a real ctcached.

The daemon's 4/8-bit model is compared with onnxruntime's own
``MatMulNBitsQuantizer`` (QOperator) run on the same model with the same
settings: same graph (node names, inputs, outputs, attributes), same
initializer names, shapes and dtypes, byte-identical B / scales / zero
points, and bit-identical onnxruntime outputs. Gemm (which the quantizer
leaves alone) is compared with the quantizer run on the equivalent
``MatMul(A, W^T) + Add(C)`` model. The default output (``link="auto"``)
opens in ``onnx.load`` and ``onnx.checker.check_model(path)``: every payload
file has one link, a reflink of the cache's file (on a loop-mounted XFS
image, when the machine allows mounting one) or a copy (ext4, tmpfs).
``link="hard"`` gives hard links into the cache that onnxruntime runs and
onnx (>= 1.21) refuses, and a model that survives a gc of its entries;
``link="reflink"`` fails clearly where reflinks are impossible. Then: bad
input fails cleanly without writing anything, the CLI's output, and
``ctcache.ort.inference_session`` with and without a daemon.

The byte comparisons read models with ``onnx.load(p, load_external_data=False)``
and external bytes by hand, which works whatever the link method.

One daemon (harness.Daemon: empty config, default policy) serves the whole
module; tests skip when the binaries are not built.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

from e2e.harness import Daemon, ctl
from test_python_client import ctcache, installed  # noqa: F401  (session fixtures: pip-installed client)

QUANT_SUFFIXES = ("_Q4", "_Q8", "_scales", "_zero_points")
F32, F16 = np.float32, np.float16


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def daemon():
    created_xdg = None
    if not os.environ.get("XDG_RUNTIME_DIR"):
        created_xdg = tempfile.mkdtemp(prefix="ctcm-xdg-")
        os.chmod(created_xdg, 0o700)
        os.environ["XDG_RUNTIME_DIR"] = created_xdg
    root = Path(tempfile.mkdtemp(prefix="ctcm-"))  # short: socket paths are limited to ~100 bytes
    d = Daemon(root)
    try:
        yield d.start()
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)
        if created_xdg:
            os.environ.pop("XDG_RUNTIME_DIR", None)
            shutil.rmtree(created_xdg, ignore_errors=True)


@pytest.fixture(scope="module")
def client(ctcache, daemon):  # noqa: F811
    with ctcache.connect(daemon.socket, timeout=10) as c:
        yield c


# ---------------------------------------------------------------- models


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _model(nodes, inputs, outputs, inits, opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="ctcache-test")
    m.ir_version = 9
    return m


def transformer(path: Path, hidden: int, *, d_in: int = 200, vocab: int = 50, seq: int = 8, seed: int = 0) -> Path:
    """One transformer-like block, fp32: input projection (K = d_in), q/k/v/o, LayerNorm, SiLU MLP (4x), head.

    MatMul(q, k^T) and MatMul(p, v) have no constant B (left alone); a zero
    column and a zero block exercise zero scales.
    """
    rng = np.random.default_rng(seed)
    h, f = hidden, 4 * hidden

    def w(name, k, n, scale=0.05):
        a = (rng.standard_normal((k, n)) * scale).astype(F32)
        return a

    ws = {
        "embed.in_proj.weight": w("in", d_in, h),
        "layer0.attn.q.weight": w("q", h, h),
        "layer0.attn.k.weight": w("k", h, h),
        "layer0.attn.v.weight": w("v", h, h),
        "layer0.attn.o.weight": w("o", h, h),
        "layer0.mlp.up.weight": w("up", h, f),
        "layer0.mlp.down.weight": w("down", f, h),
        "lm_head.weight": w("head", h, vocab),
    }
    ws["embed.in_proj.weight"][:, 3] = 0.0
    ws["layer0.mlp.up.weight"][:32, 5] = 0.0
    ws["layer0.attn.o.weight"][7, :] *= 40.0  # an outlier row
    inits = [numpy_helper.from_array(a, n) for n, a in ws.items()]
    inits += [
        numpy_helper.from_array(np.array(1.0 / np.sqrt(h), F32), "attn.scale"),
        numpy_helper.from_array(np.ones(h, F32), "ln.gamma"),
        numpy_helper.from_array(np.zeros(h, F32), "ln.beta"),
    ]
    mm = lambda name, a, b, y: helper.make_node("MatMul", [a, b], [y], name=name)  # noqa: E731
    nodes = [
        mm("in_proj", "X", "embed.in_proj.weight", "h"),
        mm("q_proj", "h", "layer0.attn.q.weight", "q"),
        mm("k_proj", "h", "layer0.attn.k.weight", "k"),
        mm("v_proj", "h", "layer0.attn.v.weight", "v"),
        helper.make_node("Transpose", ["k"], ["kT"], name="kT", perm=[0, 2, 1]),
        mm("scores", "q", "kT", "s0"),
        helper.make_node("Mul", ["s0", "attn.scale"], ["s"], name="scale"),
        helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
        mm("attend", "p", "v", "a"),
        mm("o_proj", "a", "layer0.attn.o.weight", "o"),
        helper.make_node("Add", ["h", "o"], ["h2"], name="res1"),
        helper.make_node("LayerNormalization", ["h2", "ln.gamma", "ln.beta"], ["n"], name="ln", axis=-1),
        mm("up_proj", "n", "layer0.mlp.up.weight", "u"),
        helper.make_node("Sigmoid", ["u"], ["sg"], name="sig"),
        helper.make_node("Mul", ["u", "sg"], ["act"], name="silu"),
        mm("down_proj", "act", "layer0.mlp.down.weight", "dn"),
        helper.make_node("Add", ["h2", "dn"], ["y"], name="res2"),
        mm("lm_head", "y", "lm_head.weight", "logits"),
    ]
    m = _model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, seq, d_in])],
               [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, vocab])], inits)
    return _save(m, path)


def mlp16(path: Path, *, d_in: int = 200, hidden: int = 96, out: int = 64, seed: int = 0) -> Path:
    """Two chained MatMuls with FLOAT16 weights (K = 200, not a multiple of the block size)."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((d_in, hidden)) * 0.05).astype(F16)
    w2 = (rng.standard_normal((hidden, out)) * 0.05).astype(F16)
    nodes = [helper.make_node("MatMul", ["X", "fc1.weight"], ["h"], name="fc1"),
             helper.make_node("MatMul", ["h", "fc2.weight"], ["Y"], name="fc2")]
    m = _model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT16, [4, d_in])],
               [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, [4, out])],
               [numpy_helper.from_array(w1, "fc1.weight"), numpy_helper.from_array(w2, "fc2.weight")])
    return _save(m, path)


def gemms(k: int = 100, seed: int = 0):
    """Gemm(transB=1, C), Gemm(transB=0, no C), Gemm(transB=1, C), Gemm(alpha=0.5) (not rewritten)."""
    rng = np.random.default_rng(seed)
    r = lambda *s: (rng.standard_normal(s) * 0.1).astype(F32)  # noqa: E731
    return {"W1": r(48, k), "C1": r(48), "W2": r(48, 40), "W3": r(24, 40), "C3": r(24), "W4": r(24, 16)}, k


def gemm_model(path: Path, seed: int = 0) -> Path:
    p, k = gemms(seed=seed)
    nodes = [
        helper.make_node("Gemm", ["X", "W1", "C1"], ["Y1"], name="g1", transB=1),
        helper.make_node("Gemm", ["Y1", "W2"], ["Y2"], name="g2"),
        helper.make_node("Gemm", ["Y2", "W3", "C3"], ["Y3"], name="g3", transB=1, alpha=1.0, beta=1.0),
        helper.make_node("Gemm", ["Y3", "W4"], ["Y4"], name="g4", alpha=0.5),
    ]
    m = _model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, k])],
               [helper.make_tensor_value_info("Y4", TensorProto.FLOAT, [4, 16])],
               [numpy_helper.from_array(v, n) for n, v in p.items()])
    return _save(m, path)


def gemm_as_matmul_model(seed: int = 0) -> onnx.ModelProto:
    """gemm_model rewritten by hand the way the daemon reads it: MatMul(A, W^T) + Add(C), named alike."""
    p, k = gemms(seed=seed)
    inits = {"W1_T": np.ascontiguousarray(p["W1"].T), "C1": p["C1"], "W2": p["W2"],
             "W3_T": np.ascontiguousarray(p["W3"].T), "C3": p["C3"], "W4": p["W4"]}
    nodes = [
        helper.make_node("MatMul", ["X", "W1_T"], ["Y1_matmulnbits"], name="g1"),
        helper.make_node("Add", ["Y1_matmulnbits", "C1"], ["Y1"], name="g1_bias"),
        helper.make_node("MatMul", ["Y1", "W2"], ["Y2"], name="g2"),
        helper.make_node("MatMul", ["Y2", "W3_T"], ["Y3_matmulnbits"], name="g3"),
        helper.make_node("Add", ["Y3_matmulnbits", "C3"], ["Y3"], name="g3_bias"),
        helper.make_node("Gemm", ["Y3", "W4"], ["Y4"], name="g4", alpha=0.5),
    ]
    return _model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, k])],
                  [helper.make_tensor_value_info("Y4", TensorProto.FLOAT, [4, 16])],
                  [numpy_helper.from_array(v, n) for n, v in inits.items()])


# ---------------------------------------------------------------- helpers


def quantize(model, bits: int, block_size: int, symmetric: bool, accuracy_level: int = 0) -> onnx.ModelProto:
    """onnxruntime's MatMulNBitsQuantizer (default RTN, QOperator) on a path or ModelProto."""
    m = onnx.load(str(model)) if isinstance(model, (str, Path)) else model
    q = MatMulNBitsQuantizer(m, bits=bits, block_size=block_size, is_symmetric=symmetric,
                             accuracy_level=accuracy_level or None)
    q.process()
    return q.model.model


def load_lazy(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path), load_external_data=False)


def tensor_bytes(model_path: Path, t: onnx.TensorProto) -> bytes:
    """An initializer's bytes, external data read by hand (location / offset / length)."""
    if t.data_location == TensorProto.EXTERNAL:
        info = {e.key: e.value for e in t.external_data}
        with open(Path(model_path).parent / info["location"], "rb") as f:
            f.seek(int(info.get("offset", "0")))
            data = f.read(int(info["length"]))
        assert len(data) == int(info["length"]), f"{t.name}: external data truncated"
        return data
    return numpy_helper.to_array(t).tobytes()


def _attrs(n: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


def _node_sig(n: onnx.NodeProto):
    return (n.op_type, n.domain if n.domain != "ai.onnx" else "", n.name, list(n.input), list(n.output), _attrs(n))


def _opsets(m: onnx.ModelProto) -> dict:
    return {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in m.opset_import}


def assert_same_as_quantizer(out: Path, ref: onnx.ModelProto, *, bits: int, block_size: int, symmetric: bool,
                             accuracy_level: int = 0) -> int:
    """The daemon's model vs the quantizer's: graph, initializers (names, dims, dtypes, bytes), opsets.

    Returns the number of MatMulNBits nodes."""
    got = load_lazy(out)
    assert [_node_sig(n) for n in got.graph.node] == [_node_sig(n) for n in ref.graph.node]
    assert _opsets(got) == _opsets(ref)
    assert [i.name for i in got.graph.input] == [i.name for i in ref.graph.input]
    assert [o.name for o in got.graph.output] == [o.name for o in ref.graph.output]

    gi = {t.name: t for t in got.graph.initializer}
    ri = {t.name: t for t in ref.graph.initializer}
    assert sorted(gi) == sorted(ri)
    quantized = [n for n in gi if n.endswith(QUANT_SUFFIXES)]
    assert quantized
    for name, r in ri.items():
        g = gi[name]
        assert list(g.dims) == list(r.dims), name
        assert g.data_type == r.data_type, name
        if name in quantized:
            assert g.data_location == TensorProto.EXTERNAL, f"{name} should be external data"
            loc = {e.key: e.value for e in g.external_data}["location"]
            assert loc.startswith(out.name + ".weights/") and loc.endswith(".bin"), loc
        assert tensor_bytes(out, g) == numpy_helper.to_array(r).tobytes(), f"{name}: bytes differ from the quantizer's"

    nbits = [n for n in got.graph.node if n.op_type == "MatMulNBits"]
    for n in nbits:
        a = _attrs(n)
        assert n.domain == "com.microsoft"
        assert a["bits"] == bits and a["block_size"] == block_size
        assert a.get("accuracy_level", 0) == accuracy_level
        assert ("accuracy_level" in a) == bool(accuracy_level)
        b = gi[n.input[1]]
        k_blocks = -(-a["K"] // block_size)
        assert list(b.dims) == [a["N"], k_blocks, block_size * bits // 8]
        assert list(gi[n.input[2]].dims) == [a["N"], k_blocks]
        assert (len(n.input) == 4) == (not symmetric), "zero points iff asymmetric"
    return len(nbits)


def one_thread() -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return so


def session(model) -> ort.InferenceSession:
    so = one_thread()
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def random_feeds(sess: ort.InferenceSession, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in sess.get_inputs():
        dtype = {"tensor(float)": F32, "tensor(float16)": F16}[i.type]
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        feeds[i.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def assert_same_outputs(a, b, seeds=(1, 2)) -> list:
    sa, sb = session(a), session(b)
    outs = []
    for seed in seeds:
        feeds = random_feeds(sa, seed)
        ya, yb = sa.run(None, feeds), sb.run(None, feeds)
        for x, y in zip(ya, yb):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert np.isfinite(x).all()
            assert np.array_equal(x, y), f"outputs differ: max |diff| {np.max(np.abs(x.astype(F32) - y.astype(F32)))}"
        outs.append(ya)
    return outs


def sha256(p: Path) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def bins(data_dir) -> list[Path]:
    return sorted(Path(data_dir).glob("*.bin"))


def cache_inodes(cache: Path) -> dict:
    out = {}
    for dirpath, _, files in os.walk(cache / "blobs"):
        for f in files:
            st = os.stat(os.path.join(dirpath, f))
            out[(st.st_dev, st.st_ino)] = os.path.join(dirpath, f)
    return out


def api():
    """ctcache.pb, of the pip-installed client the fixtures put on sys.path."""
    import ctcache

    return ctcache.pb


def place_method(m: int) -> str:
    from ctcache.client import PLACE_METHODS

    return PLACE_METHODS[m]


def method_names(r) -> list[str]:
    return [place_method(f.method) for f in r.files]


def assert_files_of_their_own(r, *, allowed=("reflink", "copy")) -> None:
    """Every payload file has one link and a method in ``allowed``; the counters add up."""
    methods = method_names(r)
    assert set(methods) <= set(allowed), methods
    assert {Path(f.path) for f in r.files} >= set(bins(r.data_dir))
    for f in r.files:
        st = os.stat(f.path)
        assert st.st_nlink == 1, f"{f.path}: {st.st_nlink} links"
        assert f.bytes_copied == (st.st_size if place_method(f.method) == "copy" else 0)
    assert r.files_linked == 0
    assert r.files_reflinked == methods.count("reflink") and r.files_copied == methods.count("copy")
    assert r.bytes_copied == sum(f.bytes_copied for f in r.files)


def assert_opens_in_onnx(out: Path, ref: onnx.ModelProto) -> None:
    """onnx.load with its external data and check_model by path (which checks the data files too)."""
    onnx.checker.check_model(str(out))
    full = onnx.load(str(out))
    ri = {t.name: t for t in ref.graph.initializer}
    for t in full.graph.initializer:
        assert numpy_helper.to_array(t).tobytes() == numpy_helper.to_array(ri[t.name]).tobytes(), t.name


# ---------------------------------------------------------------- byte identity with the quantizer

CASES = [
    # id, hidden, bits, block_size, symmetric, accuracy_level
    ("h64-q4-b32-sym", 64, 4, 32, True, 0),
    ("h96-q4-b64-asym", 96, 4, 64, False, 0),
    ("h256-q4-b128-sym", 256, 4, 128, True, 0),
    ("h64-q4-b16-asym", 64, 4, 16, False, 0),
    ("h64-q4-b256-asym", 64, 4, 256, False, 0),
    ("h96-q4-b32-asym-acc4", 96, 4, 32, False, 4),
    ("h96-q8-b32-asym", 96, 8, 32, False, 0),
    ("h64-q8-b128-sym", 64, 8, 128, True, 0),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_transformer_matches_quantizer(client, tmp_path, case):
    name, hidden, bits, block, sym, acc = case
    model = transformer(tmp_path / "m.onnx", hidden, seed=hidden + bits + block)
    before = sha256(model)
    out = tmp_path / "out" / "m.q.onnx"
    out.parent.mkdir()
    r = client.materialize(model, out, bits=bits, block_size=block, symmetric=sym, accuracy_level=acc)
    assert Path(r.output_path) == out and Path(r.data_dir) == out.parent / "m.q.onnx.weights"
    assert (r.bits, r.block_size, r.symmetric, r.accuracy_level) == (bits, block, sym, acc)
    assert r.nodes_rewritten == 8 and r.initializers_removed == 8
    assert r.packed + r.cached == 8
    assert sorted(s.node for s in r.skipped) == ["attend", "scores"]
    assert all(s.op_type == "MatMul" and s.reason == "B is computed, not a weight" and "computed" in s.detail
               for s in r.skipped)
    assert len(r.files) == len(bins(r.data_dir)) == 8 and r.link == api().LINK_MODE_AUTO
    assert_files_of_their_own(r)
    assert r.model_bytes == out.stat().st_size
    assert r.payload_bytes == sum(p.stat().st_size for p in bins(r.data_dir))
    assert sha256(model) == before, "the input model changed"

    ref = quantize(model, bits, block, sym, acc)
    assert assert_same_as_quantizer(out, ref, bits=bits, block_size=block, symmetric=sym, accuracy_level=acc) == 8
    assert_opens_in_onnx(out, ref)
    assert_same_outputs(out, ref)


def test_a_large_kept_table_is_placed_beside_the_model(client, tmp_path):
    """An initializer the rewrite keeps and that holds 1 MiB or more (an
    embedding table) is placed beside the model like the packed weights (its
    cached identity payload, copied or linked) instead of being written into
    the model again: the model file stays small, and onnx, onnxruntime and
    the outputs agree with the quantizer's model, which keeps it inline."""
    rng = np.random.default_rng(7)
    table = rng.standard_normal((4096, 64)).astype(F32)  # 1 MiB
    w = (rng.standard_normal((64, 256)) * 0.05).astype(F32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm"),
         helper.make_node("Gather", ["table", "ids"], ["E"], name="embed")],
        "placed", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 256]),
         helper.make_tensor_value_info("E", TensorProto.FLOAT, [3, 64])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(table, "table"),
         numpy_helper.from_array(np.array([1, 7, 4095], np.int64), "ids")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    model = tmp_path / "placed.onnx"
    onnx.save(m, str(model))
    ref = quantize(model, 4, 32, True)
    for link in ("auto", "hard"):
        out = tmp_path / link / "m.q.onnx"
        out.parent.mkdir()
        r = client.materialize(model, out, bits=4, block_size=32, symmetric=True, link=link)
        assert r.nodes_rewritten == 1 and len(r.files) == 2, r
        assert r.model_bytes == out.stat().st_size < 16 * 1024, r.model_bytes
        placed = {t.name: t for t in load_lazy(out).graph.initializer}["table"]
        assert placed.data_location == TensorProto.EXTERNAL
        if link == "auto":
            assert_files_of_their_own(r)
            assert_opens_in_onnx(out, ref)
        assert_same_outputs(out, ref)


F16_CASES = [("f16-q4-b32-asym", 4, 32, False), ("f16-q4-b64-sym", 4, 64, True), ("f16-q8-b32-sym", 8, 32, True)]


@pytest.mark.parametrize("case", F16_CASES, ids=[c[0] for c in F16_CASES])
def test_float16_weights_match_quantizer(client, tmp_path, case):
    _, bits, block, sym = case
    model = mlp16(tmp_path / "m16.onnx", seed=bits + block)
    out = tmp_path / "m16.q.onnx"
    r = client.materialize(model, out, bits=bits, block_size=block, symmetric=sym)
    assert r.nodes_rewritten == 2
    ref = quantize(model, bits, block, sym)
    assert assert_same_as_quantizer(out, ref, bits=bits, block_size=block, symmetric=sym) == 2
    scales = {t.name: t.data_type for t in load_lazy(out).graph.initializer if t.name.endswith("_scales")}
    assert set(scales.values()) == {TensorProto.FLOAT16}
    assert_same_outputs(out, ref)


@pytest.mark.parametrize("bits,block,sym", [(4, 32, True), (4, 64, False), (8, 16, False)])
def test_gemm_matches_quantizer_on_matmul_form(client, tmp_path, bits, block, sym):
    """Gemm(transB=1) + C -> MatMulNBits on W^T + Add(C); the quantizer skips Gemm, so the reference is the
    quantizer on the hand-written MatMul(A, W^T) + Add(C) model."""
    model = gemm_model(tmp_path / "gemm.onnx", seed=bits * block)
    out = tmp_path / "gemm.q.onnx"
    r = client.materialize(model, out, bits=bits, block_size=block, symmetric=sym)
    assert r.nodes_rewritten == 3 and r.initializers_removed == 3
    assert [(s.node, s.op_type) for s in r.skipped] == [("g4", "Gemm")] and "alpha" in r.skipped[0].reason
    names = {t.name for t in load_lazy(out).graph.initializer}
    assert {f"W1_T_Q{bits}", "W1_T_scales", f"W2_Q{bits}", f"W3_T_Q{bits}"} <= names
    assert not {"W1", "W2", "W3"} & names and "W4" in names

    ref_src = gemm_as_matmul_model(seed=bits * block)
    # the hand-written form computes what the Gemm model does
    y_gemm = session(model).run(None, random_feeds(session(model)))[0]
    y_mm = session(ref_src).run(None, random_feeds(session(ref_src)))[0]
    np.testing.assert_allclose(y_gemm, y_mm, rtol=1e-5, atol=1e-5)

    ref = quantize(ref_src, bits, block, sym)
    assert assert_same_as_quantizer(out, ref, bits=bits, block_size=block, symmetric=sym) == 3
    assert_same_outputs(out, ref)


def if_model(path: Path, k: int = 100, n: int = 48, seed: int = 5) -> Path:
    """An If whose branches hold MatMuls on top-level weights (as merged decoders do)."""
    rng = np.random.default_rng(seed)
    w = {name: (rng.standard_normal(shape) / 8).astype(F32)
         for name, shape in (("W", (k, n)), ("U", (n, n)), ("V", (k, n)))}
    out = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, n])  # noqa: E731
    then_g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="then_mm"),
         helper.make_node("MatMul", ["h", "U"], ["out_t"], name="then_mm2")],
        "then", [], [out("out_t")])
    else_g = helper.make_graph([helper.make_node("MatMul", ["x", "V"], ["out_e"], name="else_mm")],
                               "else", [], [out("out_e")])
    m = _model(
        [helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [out("y")],
        [numpy_helper.from_array(v, name) for name, v in w.items()],
    )
    return _save(m, path)


def test_subgraph_matmuls_match_quantizer(client, tmp_path):
    model = if_model(tmp_path / "if.onnx")
    out = tmp_path / "if.q.onnx"
    r = client.materialize(model, out, bits=4, block_size=32, symmetric=False)
    assert r.nodes_rewritten == 3 and r.initializers_removed == 3 and not r.skipped
    ref = quantize(model, 4, 32, False)
    got = load_lazy(out)
    gi = {t.name: t for t in got.graph.initializer}
    ri = {t.name: t for t in ref.graph.initializer}
    assert sorted(gi) == sorted(ri)
    for name, t in ri.items():
        assert tensor_bytes(out, gi[name]) == numpy_helper.to_array(t).tobytes(), name
    branches = {a.name: [(n.op_type, n.name, list(n.input)) for n in a.g.node] for a in got.graph.node[0].attribute}
    ref_branches = {a.name: [(n.op_type, n.name, list(n.input)) for n in a.g.node]
                    for a in ref.graph.node[0].attribute}
    assert branches == ref_branches
    assert branches["then_branch"][0][:2] == ("MatMulNBits", "then_mm_Q4")
    sa, sb = session(out), session(ref)
    rng = np.random.default_rng(3)
    for cond in (True, False):
        feeds = {"x": rng.standard_normal((2, 100)).astype(F32), "cond": np.array(cond)}
        assert np.array_equal(sa.run(None, feeds)[0], sb.run(None, feeds)[0]), cond


@pytest.mark.parametrize("kind", ["MLPRegressor", "MLPClassifier"])
def test_sklearn_exported_mlp(client, tmp_path, kind):
    """A model from a real exporter (skl2onnx): MatMul + Add with initializer weights, (300, 200) hidden."""
    pytest.importorskip("sklearn")
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    rng = np.random.default_rng(7)
    x = rng.standard_normal((256, 200)).astype(F32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        if kind == "MLPRegressor":
            est = MLPRegressor(hidden_layer_sizes=(300, 200), max_iter=3, random_state=0).fit(x, x[:, 0] - x[:, 1])
            options = None
        else:
            est = MLPClassifier(hidden_layer_sizes=(300, 200), max_iter=3, random_state=0).fit(x, (x[:, 0] > 0) + (x[:, 1] > 0))
            options = {id(est): {"zipmap": False}}
    m = skl2onnx.to_onnx(est, x[:1], target_opset=17, options=options)
    model = tmp_path / "skl.onnx"
    onnx.save(m, str(model))
    weights = [n for n in m.graph.node if n.op_type == "MatMul"]
    assert len(weights) == 3

    out = tmp_path / "skl.q.onnx"
    r = client.materialize(model, out, bits=4, block_size=32, symmetric=False)
    assert r.nodes_rewritten == 3 and not r.skipped
    ref = quantize(model, 4, 32, False)
    assert assert_same_as_quantizer(out, ref, bits=4, block_size=32, symmetric=False) == 3
    assert_same_outputs(out, ref)


# ---------------------------------------------------------------- links, copies, gc


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    return transformer(tmp_path_factory.mktemp("small") / "small.onnx", 64, seed=11)


def test_link_hard_gives_hard_links_that_onnxruntime_runs(client, daemon, small_model, tmp_path):
    out = tmp_path / "linked.onnx"
    r = client.materialize(small_model, out, link="hard")  # the daemon's policy: 4 bits, block 32, symmetric
    assert (r.bits, r.block_size, r.symmetric) == (4, 32, True) and r.link == api().LINK_MODE_HARD
    files = bins(r.data_dir)
    assert r.files_linked == len(files) == 8 and r.files_copied == 0 and r.bytes_copied == 0
    assert method_names(r) == ["hard_link"] * 8
    inodes = cache_inodes(daemon.cache)
    for f in files:
        st = f.stat()
        assert st.st_nlink >= 2, f"{f.name}: not a hard link"
        assert (st.st_dev, st.st_ino) in inodes, f"{f.name}: not the inode of a file under {daemon.cache}/blobs"
        # Payload files are named by their blake3 and the store's tag.
        assert Path(inodes[(st.st_dev, st.st_ino)]).name.split(".")[0] == f.stem

    # Warm: everything cached, nothing packed, no payload byte written.
    out2 = tmp_path / "again" / "linked.onnx"
    out2.parent.mkdir()
    r2 = client.materialize(small_model, out2, link="hard")
    assert r2.packed == 0 and r2.cached == 8
    assert r2.files_linked == 8 and r2.bytes_copied == 0
    assert r2.payload_bytes == r.payload_bytes and r2.model_bytes == out2.stat().st_size
    assert r2.model_bytes + r2.bytes_copied < r2.payload_bytes / 4
    for a, b in zip(bins(r.data_dir), bins(r2.data_dir)):
        assert os.path.samefile(a, b)
    assert out.read_bytes() == out2.read_bytes()  # locations are relative: same model bytes

    ref = quantize(small_model, 4, 32, True)
    assert_same_as_quantizer(out2, ref, bits=4, block_size=32, symmetric=True)
    assert_same_outputs(out2, ref, seeds=(3,))
    # What --link hard's help says: onnx (this one is >= 1.21) refuses such files.
    with pytest.raises(Exception, match="hard link"):
        onnx.load(str(out2))

    # The default over a hard-linked output: files of their own again, which onnx opens.
    r3 = client.materialize(small_model, out2)
    assert_files_of_their_own(r3)
    assert_opens_in_onnx(out2, ref)


def test_copies_on_another_filesystem(client, daemon, small_model):
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    if os.stat(shm).st_dev == os.stat(daemon.cache).st_dev:
        pytest.skip("/dev/shm is on the cache's filesystem")
    folder = Path(tempfile.mkdtemp(prefix="ctcm-", dir=shm))
    try:
        ref = quantize(small_model, 4, 32, True)
        for link in ("auto", "hard"):  # no reflink and no hard link across filesystems: copies
            out = folder / f"shm-{link}.onnx"
            r = client.materialize(small_model, out, link=link)
            files = bins(r.data_dir)
            assert r.files_copied == len(files) == 8 and r.files_linked == 0 and r.files_reflinked == 0
            assert r.bytes_copied == sum(f.stat().st_size for f in files) == r.payload_bytes
            assert_files_of_their_own(r, allowed=("copy",))
            assert_same_as_quantizer(out, ref, bits=4, block_size=32, symmetric=True)
            assert_opens_in_onnx(out, ref)
            assert_same_outputs(out, ref, seeds=(4,))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("how", [{"copy": True}, {"link": "copy"}])
def test_copy_forces_copies(client, daemon, small_model, tmp_path, how):
    out = tmp_path / "copied.onnx"
    r = client.materialize(small_model, out, **how)
    files = bins(r.data_dir)
    assert r.files_copied == len(files) == 8 and r.files_linked == 0 and r.link == api().LINK_MODE_COPY
    assert r.bytes_copied == r.payload_bytes == sum(f.stat().st_size for f in files)
    assert_files_of_their_own(r, allowed=("copy",))
    inodes = cache_inodes(daemon.cache)
    for f in files:
        st = f.stat()
        assert st.st_nlink == 1 and (st.st_dev, st.st_ino) not in inodes
        blob = next(Path(p) for p in inodes.values() if Path(p).name.split(".")[0] == f.stem)
        assert blob.read_bytes() == f.read_bytes()
    ref = quantize(small_model, 4, 32, True)
    assert_same_outputs(out, ref, seeds=(5,))


def _ficlone_works(folder: Path) -> bool:
    """Whether files in ``folder`` can be reflinked (FICLONE)."""
    import fcntl

    src, dst = folder / ".probe-src", folder / ".probe-dst"
    src.write_bytes(b"probe")
    try:
        with open(src, "rb") as a, open(dst, "wb") as b:
            fcntl.ioctl(b.fileno(), 0x40049409, a.fileno())  # FICLONE
        return True
    except OSError:
        return False
    finally:
        src.unlink()
        dst.unlink(missing_ok=True)


def test_link_reflink_fails_clearly_where_impossible(ctcache, client, small_model, tmp_path):  # noqa: F811
    if _ficlone_works(tmp_path):
        pytest.skip(f"{tmp_path} reflinks; test_reflinks_on_xfs covers --link reflink")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    # The client writes the files: its own OSError, naming the way out.
    with pytest.raises(OSError) as e:
        client.materialize(small_model, out_dir / "r.onnx", link="reflink")
    assert "cannot reflink" in str(e.value) and "link='auto'" in str(e.value), e.value
    assert not list(out_dir.iterdir()), "something was written"


def test_link_names_are_checked(ctcache, client, small_model, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match="link must be one of"):
        client.materialize(small_model, tmp_path / "x.onnx", link="symlink")
    with pytest.raises(ValueError, match="contradicts"):
        client.materialize(small_model, tmp_path / "x.onnx", link="hard", copy=True)
    # The daemon writes no file for anyone: a raw request for one is refused.
    pb = api()
    for req in [dict(link=9), dict(link=pb.LINK_MODE_HARD, copy=True), dict(output_path=str(tmp_path / "x.onnx"))]:
        with pytest.raises(ctcache.InvalidArgument, match="writes no file"):
            client._call("Materialize", pb.MaterializeRequest(model_path=str(small_model), **req))
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def xfs(tmp_path_factory):
    """A 300 MiB XFS image mounted on a loop device (skipped where that is impossible)."""
    mkfs = shutil.which("mkfs.xfs") or ("/usr/sbin/mkfs.xfs" if os.access("/usr/sbin/mkfs.xfs", os.X_OK) else None)
    if os.geteuid() != 0:
        pytest.skip("reflink test: needs root to mount a loop-mounted XFS image")
    if mkfs is None:
        pytest.skip("reflink test: no mkfs.xfs (apt-get install xfsprogs; tests/run.sh does)")
    img = tmp_path_factory.mktemp("xfs-img") / "xfs.img"
    with open(img, "wb") as f:
        f.truncate(300 << 20)  # mkfs.xfs's minimum
    mnt = Path(tempfile.mkdtemp(prefix="ctcx-"))
    r = subprocess.run([mkfs, "-q", "-f", str(img)], capture_output=True, text=True)
    if r.returncode == 0:
        r = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        mnt.rmdir()
        img.unlink()
        pytest.skip(f"reflink test: cannot make or mount an XFS image here: {r.stderr.strip()}")
    try:
        if not _ficlone_works(mnt):
            pytest.skip("reflink test: the mounted XFS image does not reflink")
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
        mnt.rmdir()
        img.unlink()


def test_reflinks_on_xfs(ctcache, xfs, small_model):  # noqa: F811
    """Cache and output on XFS: the default reflinks every payload (no byte copied, one link each) and the model
    opens in onnx and runs in onnxruntime like the quantizer's; --link reflink does the same."""
    d = Daemon(xfs / "d")
    try:
        d.start()
        with ctcache.connect(d.socket, timeout=10) as c:
            ref = quantize(small_model, 4, 32, True)
            for link in ("auto", "reflink"):
                out = xfs / f"out-{link}" / "m.onnx"
                out.parent.mkdir()
                r = c.materialize(small_model, out, link=link)
                assert method_names(r) == ["reflink"] * 8, method_names(r)
                assert r.files_reflinked == 8 and r.bytes_copied == 0
                assert_files_of_their_own(r, allowed=("reflink",))
                inodes = cache_inodes(d.cache)
                assert not any((os.stat(f.path).st_dev, os.stat(f.path).st_ino) in inodes for f in r.files)
                assert_same_as_quantizer(out, ref, bits=4, block_size=32, symmetric=True)
                assert_opens_in_onnx(out, ref)
                assert_same_outputs(out, ref, seeds=(7,))
    finally:
        d.stop()


def test_model_survives_gc(client, daemon, tmp_path):
    model = transformer(tmp_path / "gc.onnx", 64, seed=99)
    out = tmp_path / "gc.q.onnx"
    r = client.materialize(model, out, block_size=64, symmetric=False, link="hard")
    files = bins(r.data_dir)
    assert all(f.stat().st_nlink >= 2 for f in files)
    feeds = random_feeds(session(out), seed=6)
    before = session(out).run(None, feeds)

    g = client.gc(max_bytes=0)
    assert len(g.removed) >= 8 and g.skipped_leased == 0
    assert client.list() == [] and client.stats().entries == 0
    inodes = cache_inodes(daemon.cache)
    for f in files:
        st = f.stat()
        assert st.st_nlink == 1 and (st.st_dev, st.st_ino) not in inodes, "the store still holds the payload"
    after = session(out).run(None, feeds)
    for x, y in zip(before, after):
        assert np.array_equal(x, y)
    ref = quantize(model, 4, 64, False)
    assert_same_as_quantizer(out, ref, bits=4, block_size=64, symmetric=False)

    # Materialized again: packed anew (the entries are gone), same bytes.
    out2 = tmp_path / "gc2.q.onnx"
    r2 = client.materialize(model, out2, block_size=64, symmetric=False)
    assert r2.packed == 8 and r2.cached == 0
    assert [f.read_bytes() for f in bins(r2.data_dir)] == [f.read_bytes() for f in files]


# ---------------------------------------------------------------- bad input


def _no_matmul(path: Path) -> Path:
    m = _model([helper.make_node("Relu", ["X"], ["Y"], name="relu")],
               [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 8])],
               [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 8])], [])
    return _save(m, path)


def _b_is_graph_input(path: Path) -> Path:
    m = _model([helper.make_node("MatMul", ["X", "B"], ["Y"], name="mm")],
               [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 64]),
                helper.make_tensor_value_info("B", TensorProto.FLOAT, [64, 32])],
               [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 32])], [])
    return _save(m, path)


def _b_is_overridable_initializer(path: Path) -> Path:
    w = np.ones((64, 32), F32)
    m = _model([helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")],
               [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 64]),
                helper.make_tensor_value_info("W", TensorProto.FLOAT, [64, 32])],
               [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 32])], [numpy_helper.from_array(w, "W")])
    return _save(m, path)


def _double_weight(path: Path) -> Path:
    w = np.ones((64, 32), np.float64)
    m = _model([helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")],
               [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [2, 64])],
               [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, [2, 32])], [numpy_helper.from_array(w, "W")])
    return _save(m, path)


def _good(path: Path) -> Path:
    return transformer(path, 64, seed=5)


BAD = [
    # id, model, request kwargs, error class name, status code, substrings of the message
    ("no-matmul", _no_matmul, {}, "RequestFailed", "FAILED_PRECONDITION", ["nothing to materialize", "no node of the op types rewritten (MatMul, Gemm)"]),
    ("b-graph-input", _b_is_graph_input, {}, "RequestFailed", "FAILED_PRECONDITION",
     ["nothing to materialize", "MatMul mm", "B is a graph input, not a weight", "not an initializer"]),
    ("b-overridable", _b_is_overridable_initializer, {}, "RequestFailed", "FAILED_PRECONDITION",
     ["nothing to materialize", "also a graph input"]),
    ("double-weight", _double_weight, {}, "RequestFailed", "FAILED_PRECONDITION",
     ["nothing to materialize", "DOUBLE", "FLOAT or FLOAT16"]),
    ("block-48", _good, {"block_size": 48}, "InvalidArgument", "INVALID_ARGUMENT", ["block size 48"]),
    ("bits-3", _good, {"bits": 3}, "InvalidArgument", "INVALID_ARGUMENT", ["bits 3"]),
    ("accuracy-7", _good, {"accuracy_level": 7}, "InvalidArgument", "INVALID_ARGUMENT", ["accuracy level 7"]),
    ("target", _good, {"target": "tensorrt-fp8"}, "InvalidArgument", "INVALID_ARGUMENT", ["unknown target", "tensorrt-fp8"]),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_refused_cleanly(ctcache, client, tmp_path, case):  # noqa: F811
    _, build, kwargs, cls, code, words = case
    src = tmp_path / "src"
    src.mkdir()
    model = build(src / "m.onnx")
    before = sha256(model)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "m.q.onnx"
    with pytest.raises(getattr(ctcache, cls)) as e:
        client.materialize(model, out, **kwargs)
    assert e.value.code.name == code, e.value
    for w in words:
        assert w.lower() in e.value.details.lower(), f"{w!r} not in {e.value.details!r}"
    assert not out.exists() and not list(out_dir.iterdir()), "something was written"
    assert sorted(p.name for p in src.iterdir()) == ["m.onnx"] and sha256(model) == before


def test_output_onto_the_input_is_refused(ctcache, client, tmp_path):  # noqa: F811
    model = transformer(tmp_path / "m.onnx", 64, seed=6)
    before = sha256(model)
    with pytest.raises(ValueError, match="output path is the input model"):
        client.materialize(model, model)
    assert sha256(model) == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_missing_model(ctcache, client, tmp_path):  # noqa: F811
    with pytest.raises(FileNotFoundError) as e:
        client.materialize(tmp_path / "nope.onnx", tmp_path / "out.onnx")
    assert "nope.onnx" in str(e.value)
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- ctcachectl


def test_ctcachectl_materialize(daemon, small_model, tmp_path):
    out = tmp_path / "cli.onnx"
    j = daemon.json("materialize", str(small_model), "-o", str(out), "--block-size", "64", "--asymmetric")
    for key in ("output", "data_dir", "nodes_rewritten", "initializers_removed", "skipped", "packed", "cached",
                "link", "files", "files_reflinked", "files_linked", "files_copied", "bytes_copied", "model_bytes",
                "payload_bytes", "bits", "block_size", "symmetric", "accuracy_level", "elapsed_us"):
        assert key in j, key
    assert j["output"] == str(out) and j["nodes_rewritten"] == 8 and j["link"] == "auto"
    assert len(j["files"]) == 8 and j["files_linked"] == 0
    assert {f["method"] for f in j["files"]} <= {"reflink", "copy"}
    assert j["files_reflinked"] + j["files_copied"] == 8
    for f in j["files"]:
        assert os.stat(f["path"]).st_nlink == 1
        assert f["bytes_copied"] == (os.stat(f["path"]).st_size if f["method"] == "copy" else 0)
    assert (j["bits"], j["block_size"], j["symmetric"]) == (4, 64, False)
    assert sorted(s["node"] for s in j["skipped"]) == ["attend", "scores"]
    assert j["model_bytes"] == out.stat().st_size
    onnx.checker.check_model(str(out))

    out2 = tmp_path / "cli2.onnx"
    r = daemon.ctl("materialize", str(small_model), "-o", str(out2), "--bits", "8", "--accuracy-level", "4",
                   "--link", "hard")
    assert r.returncode == 0, r.describe()
    assert "8 node(s) -> MatMulNBits (8 bits, block 32, symmetric)" in r.stdout, r.describe()
    assert "(--link hard): 8 file(s) hard-linked;" in r.stdout, r.describe()
    assert "onnx >= 1.21 (onnx.load, onnx.checker) refuses it" in r.stdout, r.describe()
    # Skipped nodes: one line per reason; -v adds each node and its case.
    assert "2 MatMul left as they are: B is computed, not a weight\n" in r.stdout and "scores" not in r.stdout, r.describe()
    rv = daemon.ctl("materialize", str(small_model), "-o", str(tmp_path / "cli2v.onnx"), "-v")
    assert rv.returncode == 0, rv.describe()
    assert "  MatMul scores: input B" in rv.stdout and "  MatMul attend: input B" in rv.stdout, rv.describe()
    a = {n.name: _attrs(n) for n in load_lazy(out2).graph.node if n.op_type == "MatMulNBits"}
    assert len(a) == 8 and all(x["bits"] == 8 and x["accuracy_level"] == 4 for x in a.values())
    assert_same_outputs(out2, quantize(small_model, 8, 32, True, 4), seeds=(11,))

    # --copy is --link copy; the default's output names its methods and has no onnx note.
    out3 = tmp_path / "cli3.onnx"
    j3 = daemon.json("materialize", str(small_model), "-o", str(out3), "--copy")
    assert j3["link"] == "copy" and [f["method"] for f in j3["files"]] == ["copy"] * 8
    r = daemon.ctl("materialize", str(small_model), "-o", str(tmp_path / "cli4.onnx"))
    assert r.returncode == 0 and "(--link auto): 8 file(s) " in r.stdout and "onnx >= 1.21" not in r.stdout, \
        r.describe()
    r = daemon.ctl("materialize", str(small_model), "-o", str(tmp_path / "x.onnx"), "--copy", "--link", "hard")
    assert r.returncode == 2 and "cannot be used with" in r.stderr, r.describe()
    help_text = daemon.ctl("materialize", "--help").stdout
    assert "--link <HOW>" in help_text and "onnx >= 1.21" in help_text, help_text

    bad = _no_matmul(tmp_path / "relu.onnx")
    r = daemon.ctl("materialize", str(bad), "-o", str(tmp_path / "relu.q.onnx"))
    assert r.returncode != 0 and "nothing to materialize" in r.stderr, r.describe()
    assert not (tmp_path / "relu.q.onnx").exists()


def test_ctcachectl_materialize_local(small_model, tmp_path):
    """Without a daemon (--local): packed here into the weights folder, files named as the daemon's, and the
    model opens in onnx."""
    out = tmp_path / "local.onnx"
    r = ctl("--json", "materialize", "--local", str(small_model), "-o", str(out), "--link", "hard")
    assert r.returncode == 0, r.describe()
    j = json.loads(r.stdout)
    assert j["via"] == "local" and [f["method"] for f in j["files"]] == ["in_place"] * 8
    assert j["bytes_copied"] == j["payload_bytes"] and j["files_linked"] == 0
    ref = quantize(small_model, 4, 32, True)
    assert_same_as_quantizer(out, ref, bits=4, block_size=32, symmetric=True)
    assert_opens_in_onnx(out, ref)


# ---------------------------------------------------------------- ctcache.ort


def test_ort_inference_session_through_the_daemon(ctcache, daemon, tmp_path):  # noqa: F811
    import ctcache.ort as cort

    model = transformer(tmp_path / "sess.onnx", 96, seed=21)
    with warnings.catch_warnings():
        warnings.simplefilter("error", cort.FallbackWarning)
        sess = cort.inference_session(model, socket=daemon.socket, sess_options=one_thread(), link="auto",
                                      providers=["CPUExecutionProvider"])
    out = tmp_path / "sess.int4.onnx"  # the default output of a file materialize: next to the model
    assert out.is_file() and (tmp_path / "sess.int4.onnx.weights").is_dir()
    assert all(f.stat().st_nlink == 1 for f in bins(tmp_path / "sess.int4.onnx.weights"))
    ref = quantize(model, 4, 32, True)
    feeds = random_feeds(sess, seed=8)
    for x, y in zip(sess.run(None, feeds), session(ref).run(None, feeds)):
        assert np.array_equal(x, y)

    # ctcache.materialize: the package-level helper, explicit settings and output.
    (tmp_path / "x").mkdir()
    r = ctcache.materialize(model, tmp_path / "x" / "y.onnx", socket=daemon.socket, bits=8, block_size=128,
                            symmetric=False)
    assert r.nodes_rewritten == 8 and (r.bits, r.block_size, r.symmetric) == (8, 128, False)
    assert Path(r.output_path) == tmp_path / "x" / "y.onnx"
    assert cort.default_output_path(model, 8) == tmp_path / "sess.int8.onnx"


def test_ort_inference_session_falls_back_without_daemon(ctcache, tmp_path, monkeypatch):  # noqa: F811
    import ctcache.ort as cort

    model = transformer(tmp_path / "fb.onnx", 64, seed=31)
    nowhere = tmp_path / "no-daemon.sock"
    with pytest.warns(RuntimeWarning, match="MatMulNBitsQuantizer") as w:
        sess = cort.inference_session(model, socket=nowhere, block_size=64, symmetric=False,
                                      sess_options=one_thread(), providers=["CPUExecutionProvider"])
    assert any(issubclass(x.category, cort.FallbackWarning) and str(nowhere) in str(x.message) for x in w)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fb.onnx"], "the fallback wrote files"
    ref = quantize(model, 4, 64, False)
    feeds = random_feeds(sess, seed=9)
    for x, y in zip(sess.run(None, feeds), session(ref).run(None, feeds)):
        assert np.array_equal(x, y)

    # A quantized model of 2 GiB or more goes through a temporary external-data file: force that path.
    monkeypatch.setattr(cort, "_PROTOBUF_LIMIT", 1)
    with pytest.warns(cort.FallbackWarning):
        big = cort.inference_session(model, socket=nowhere, block_size=64, symmetric=False,
                                     sess_options=one_thread(), providers=["CPUExecutionProvider"])
    tmp = Path(big._ctcache_tmpdir.name)
    assert (tmp / "model.onnx").is_file() and (tmp / "model.onnx.data").is_file()
    for x, y in zip(big.run(None, feeds), sess.run(None, feeds)):
        assert np.array_equal(x, y)
    del big

    with pytest.raises(ctcache.DaemonNotRunning):
        cort.inference_session(model, socket=nowhere, fallback=False)
    with pytest.raises(ctcache.DaemonNotRunning):
        ctcache.materialize(model, socket=nowhere)


def test_ort_fallback_reads_hard_linked_external_data(ctcache, tmp_path):  # noqa: F811
    """onnx.load refuses external data files with several hard links (what a materialize leaves); the fallback
    reads them anyway, as onnxruntime does."""
    import ctcache.ort as cort

    inline = transformer(tmp_path / "inline.onnx", 64, seed=41)
    ext_dir = tmp_path / "ext"
    ext_dir.mkdir()
    ext = ext_dir / "ext.onnx"
    onnx.save_model(onnx.load(str(inline)), str(ext), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.data", size_threshold=0)
    os.link(ext_dir / "ext.data", tmp_path / "second-link.data")
    with pytest.raises(Exception, match="hard link"):
        onnx.load(str(ext))
    with pytest.warns(cort.FallbackWarning):
        sess = cort.inference_session(ext, socket=tmp_path / "none.sock", sess_options=one_thread(),
                                      providers=["CPUExecutionProvider"])
    ref = quantize(inline, 4, 32, True)
    feeds = random_feeds(sess, seed=10)
    for x, y in zip(sess.run(None, feeds), session(ref).run(None, feeds)):
        assert np.array_equal(x, y)


def test_package_imports_without_onnxruntime(installed, tmp_path):  # noqa: F811
    code = (
        "import sys\n"
        "sys.modules['onnxruntime'] = None\n"
        "sys.modules['onnx'] = None\n"
        "import ctcache, ctcache.ort\n"
        "assert callable(ctcache.materialize) and ctcache.materialize is ctcache.ort.materialize\n"
        "assert 'onnxruntime' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(installed))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_the_client_checks_each_file_it_writes(ctcache, tmp_path):  # noqa: F811
    """The Python client's writer (no daemon needed): a payload whose bytes are not its entry's is refused and
    nothing is left; the same answer with the right digest is written, model last."""
    import blake3

    from ctcache import materialized

    pb = api()
    src = tmp_path / "payload"
    src.write_bytes(b"\x01" * 1000)
    out = tmp_path / "out" / "m.onnx"

    def answer(digest):
        r = pb.MaterializeResponse(model=b"model", payload_files=[pb.MaterializedPayloadFile(name="a.bin", key="k")])
        r.leases.add(lease_id=1, entry=pb.Entry(key="k", payload_path=str(src), payload_blake3=digest))
        return r

    with pytest.raises(ctcache.PayloadMismatch):
        materialized.write(answer("00" * 32), str(tmp_path / "in.onnx"), str(out), "copy")
    assert not (tmp_path / "out").exists()
    w = materialized.write(answer(blake3.blake3(src.read_bytes()).hexdigest()), str(tmp_path / "in.onnx"), str(out),
                           "copy")
    assert out.read_bytes() == b"model" and w.files_copied == 1 and w.bytes_copied == 1000
    assert (tmp_path / "out" / "m.onnx.weights" / "a.bin").read_bytes() == src.read_bytes()
