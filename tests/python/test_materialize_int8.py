"""``ctcachectl materialize --target onnxruntime-int8`` is a drop-in for
``onnxruntime.quantization.quantize_dynamic(op_types_to_quantize=["MatMul"])``.

For each model (the synthetic transformer block of test_materialize, a model
of Gemms with transB=1 / C / alpha != 1, a model whose weights are shared
between MatMuls and other ops) and each of the four weight type x per
tensor/per channel combinations, with and without reduce_range, through the
daemon and with ``--local``: every initializer the reference writes exists in
ours under the same name (``<W>_quantized``, ``<W>_scale``,
``<W>_zero_point``, ``<B>_Transposed_*`` for Gemm transB=1) with the same
dtype, dims and bytes; onnxruntime gives bit-identical outputs on the same
inputs; the result passes ``onnx.checker``. Bad input is refused naming what
is wrong, and nothing is written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from e2e.harness import Daemon, ctl
from test_materialize import _model, _save, gemm_model, transformer
from test_python_client import ctcache, installed  # noqa: F401  (session fixtures: pip-installed client)

COMBOS = [(wt, pc, rr) for wt in ("int8", "uint8") for pc in (False, True) for rr in (False, True)]


@pytest.fixture(scope="module")
def daemon():
    created_xdg = None
    if not os.environ.get("XDG_RUNTIME_DIR"):
        created_xdg = tempfile.mkdtemp(prefix="ct8-xdg-")
        os.chmod(created_xdg, 0o700)
        os.environ["XDG_RUNTIME_DIR"] = created_xdg
    root = Path(tempfile.mkdtemp(prefix="ct8-"))
    d = Daemon(root)
    try:
        yield d.start()
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)
        if created_xdg:
            os.environ.pop("XDG_RUNTIME_DIR", None)
            shutil.rmtree(created_xdg, ignore_errors=True)


def shared_model(path: Path, seed: int = 0) -> Path:
    """W used by two MatMuls (one quantized copy) and by an Add (stays FLOAT);
    E used by a Gather only (not a MatMul weight: left alone)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((16, 16)) * 0.2).astype(np.float32)
    e = rng.standard_normal((10, 16)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["x"], name="embed"),
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W"], ["h2"], name="mm2"),
        helper.make_node("Add", ["h2", "W"], ["Y"], name="addw"),
    ]
    m = _model(
        nodes,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [16, 16])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(e, "E")],
    )
    return _save(m, path)


def embed_conv_model(path: Path, seed: int = 0) -> Path:
    """Gather, MatMul and Conv for ``--op-types MatMul,Gather,Conv``: a
    table E whose gathered rows a MatMul reads quantized and an Add and a
    graph output read dequantized, gathered again by an unnamed Gather for
    a Relu; a second table T read by a Gather and a
    later MatMul (quantized once, as the Gather asks); a named Conv with a
    bias and pads and an unnamed one without, on one input."""
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((10, 16)).astype(np.float32)
    t = (rng.standard_normal((16, 16)) * 0.3).astype(np.float32)
    w = (rng.standard_normal((16, 16)) * 0.2).astype(np.float32)
    k = (rng.standard_normal((4, 3, 3, 3)) * 0.2).astype(np.float32)
    kb = rng.standard_normal((4,)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["x"], name="embed"),
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm1"),
        helper.make_node("Add", ["x", "h"], ["y1"], name="add"),
        helper.make_node("Gather", ["E", "ids"], ["x2"]),
        helper.make_node("Relu", ["x2"], ["r2"], name="relu2"),
        helper.make_node("Gather", ["T", "ids"], ["tx"], name="embed_t"),
        helper.make_node("MatMul", ["h", "T"], ["y2"], name="mm_t"),
        helper.make_node("Conv", ["img", "K", "KB"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["img", "K"], ["c2"]),
    ]
    m = _model(
        nodes,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [5]),
         helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y1", TensorProto.FLOAT, [5, 16]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 16]),
         helper.make_tensor_value_info("r2", TensorProto.FLOAT, [5, 16]),
         helper.make_tensor_value_info("tx", TensorProto.FLOAT, [5, 16]),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, [5, 16]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 4, 8, 8]),
         helper.make_tensor_value_info("c2", TensorProto.FLOAT, [1, 4, 6, 6])],
        [numpy_helper.from_array(a, n) for a, n in [(e, "E"), (t, "T"), (w, "W"), (k, "K"), (kb, "KB")]],
    )
    return _save(m, path)


ALL_OPS = ["MatMul", "Gather", "Conv"]


def reference(model: Path, wt: str, pc: bool, rr: bool, op_types=("MatMul",)) -> Path:
    out = model.with_name(model.stem + f".ref-{wt}-{pc}-{rr}.onnx")
    quantize_dynamic(
        model,
        out,
        weight_type=QuantType.QInt8 if wt == "int8" else QuantType.QUInt8,
        per_channel=pc,
        reduce_range=rr,
        op_types_to_quantize=list(op_types),
    )
    return out


def flags(wt, pc, rr):
    f = ["--target", "onnxruntime-int8", "--weight-type", wt]
    return f + (["--per-channel"] if pc else []) + (["--reduce-range"] if rr else [])


def inputs_for(model: Path, seed: int):
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in onnx.load(str(model), load_external_data=False).graph.input:
        shape = [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.elem_type == TensorProto.INT64:
            feeds[i.name] = rng.integers(0, 10, shape).astype(np.int64)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def assert_drop_in(ours: Path, ref: Path, seeds=(1, 2)):
    """Same initializers (names, dtypes, dims, bytes), same outputs, checker passes."""
    onnx.checker.check_model(str(ours))
    a = {t.name: numpy_helper.to_array(t, base_dir=str(ours.parent)) for t in onnx.load(str(ours)).graph.initializer}
    b = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(ref)).graph.initializer}
    missing = sorted(set(b) - set(a))
    assert not missing, f"initializers the reference writes and we do not: {missing}"
    for name, want in b.items():
        got = a[name]
        assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape, want.dtype, want.shape)
        assert got.tobytes() == want.tobytes(), f"{name} differs"
    quantized = [n for n in b if n.endswith("_quantized")]
    assert quantized, "the reference quantized nothing"
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s1 = ort.InferenceSession(str(ours), so, providers=["CPUExecutionProvider"])
    s2 = ort.InferenceSession(str(ref), so, providers=["CPUExecutionProvider"])
    for seed in seeds:
        feeds = inputs_for(ref, seed)
        for x, y in zip(s1.run(None, feeds), s2.run(None, feeds)):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert x.tobytes() == y.tobytes(), f"outputs differ (seed {seed}): max {np.abs(x - y).max()}"
    ops = [n.op_type for n in onnx.load(str(ours), load_external_data=False).graph.node]
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops
    return len(quantized)


def assert_same_nodes(ours: Path, ref: Path):
    """The reference's nodes, names included (its order is sorted differently)."""
    def nodes(model: Path):
        g = onnx.load(str(model), load_external_data=False).graph
        return sorted((n.op_type, n.name, tuple(n.input), tuple(n.output)) for n in g.node)
    assert nodes(ours) == nodes(ref)


MODELS = {
    "transformer": lambda p: transformer(p, 64, seed=3),
    "gemm": lambda p: gemm_model(p, seed=4),
    "shared": lambda p: shared_model(p, seed=5),
}


@pytest.mark.parametrize("wt,pc,rr", COMBOS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_local_is_a_drop_in_for_quantize_dynamic(tmp_path, name, wt, pc, rr):
    model = MODELS[name](tmp_path / f"{name}.onnx")
    ref = reference(model, wt, pc, rr)
    out = tmp_path / "out" / "q.onnx"
    out.parent.mkdir()
    r = ctl("--json", "materialize", "--local", str(model), "-o", str(out), *flags(wt, pc, rr))
    assert r.returncode == 0, r.describe()
    j = json.loads(r.stdout)
    assert j["via"] == "local" and j["target"] == "onnxruntime-int8"
    assert (j["weight_type"], j["per_channel"], j["reduce_range"]) == (wt, pc, rr)
    n = assert_drop_in(out, ref)
    assert_same_nodes(out, ref)
    expect = {"transformer": 8, "gemm": 3, "shared": 1}[name]
    assert n == expect and j["nodes_rewritten"] == {"transformer": 8, "gemm": 3, "shared": 2}[name]


@pytest.mark.parametrize("wt,pc,rr", COMBOS)
def test_gather_and_conv_are_a_drop_in(tmp_path, wt, pc, rr):
    model = embed_conv_model(tmp_path / "ec.onnx", seed=11)
    ref = reference(model, wt, pc, rr, ALL_OPS)
    out = tmp_path / "out" / "q.onnx"
    out.parent.mkdir()
    r = ctl("--json", "materialize", "--local", str(model), "-o", str(out), *flags(wt, pc, rr),
            "--op-types", ",".join(ALL_OPS))
    assert r.returncode == 0, r.describe()
    j = json.loads(r.stdout)
    # The three Gathers, both MatMuls, both Convs.
    assert j["nodes_rewritten"] == 7 and j["op_types"] == ALL_OPS, j
    # Per channel, T is quantized per tensor for the Gather that reads it first.
    assert assert_drop_in(out, ref) == 4
    graph = onnx.load(str(out), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("ConvInteger") == 2 and ops.count("Gather") == 3
    dq = sorted(n.output[0] for n in graph.node if n.op_type == "DequantizeLinear")
    assert dq == ["tx", "x", "x2"], dq
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    assert shapes["T_scale"] == [] and shapes["E_zero_point"] == []
    assert_same_nodes(out, ref)


def test_gather_and_conv_through_the_daemon(ctcache, daemon, tmp_path):  # noqa: F811
    import ctcache.ort as cort

    model = embed_conv_model(tmp_path / "ecd.onnx", seed=12)
    ref = reference(model, "uint8", True, True, ALL_OPS)
    for i in range(2):
        out = tmp_path / f"d{i}.onnx"
        j = daemon.json("materialize", str(model), "-o", str(out), *flags("uint8", True, True),
                        "--op-types", ",".join(ALL_OPS))
        assert j["nodes_rewritten"] == 7 and (j["packed"], j["cached"]) == ((4, 0) if i == 0 else (0, 4)), j
        assert_drop_in(out, ref)
    # A session that writes nothing: the same outputs.
    before = sorted(p.name for p in tmp_path.iterdir())
    sess = cort.inference_session(model, socket=daemon.socket, target="onnxruntime-int8", weight_type="uint8",
                                  per_channel=True, reduce_range=True, op_types=ALL_OPS,
                                  providers=["CPUExecutionProvider"])
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    want = ort.InferenceSession(str(ref), providers=["CPUExecutionProvider"])
    for seed in (4, 5):
        feeds = inputs_for(model, seed)
        for x, y in zip(sess.run(None, feeds), want.run(None, feeds)):
            assert x.tobytes() == y.tobytes()


# docs/operations/configure.md's rules for the int8 target (with min_elements = 1 for these small weights).
INT8_POLICY = """
[[policy]]
format = "ort.quantize_dynamic"
used_as = ["MatMul.B"]
min_elements = 1
[[policy]]
format = "ort.quantize_dynamic"
params = { weight_type = "uint8", symmetric = "false" }
used_as = ["Gather.data"]
min_elements = 1
[[policy]]
format = "ort.quantize_dynamic"
rank = 0
used_as = ["Conv.W"]
min_elements = 1
"""


def test_the_policy_prepacks_what_materialize_reads(tmp_path):
    root = tmp_path / "d"
    root.mkdir()
    (root / "ctcached.toml").write_text(INT8_POLICY)
    d = Daemon(root).start()
    try:
        model = embed_conv_model(tmp_path / "p.onnx", seed=13)
        r = d.ctl("prepack", str(model), "--wait")
        assert r.returncode == 0, r.describe()
        j = d.json("materialize", str(model), "-o", str(tmp_path / "o.onnx"), "--target", "onnxruntime-int8",
                   "--op-types", ",".join(ALL_OPS))
        assert j["nodes_rewritten"] == 7 and (j["packed"], j["cached"]) == (0, 4), j
        assert_drop_in(tmp_path / "o.onnx", reference(model, "int8", False, False, ALL_OPS))
    finally:
        d.stop()


@pytest.mark.parametrize("wt,pc,rr", [("int8", False, False), ("uint8", True, False), ("int8", True, True)])
def test_daemon_is_a_drop_in_and_caches(daemon, tmp_path, wt, pc, rr):
    model = transformer(tmp_path / "t.onnx", 96, seed=7)
    ref = reference(model, wt, pc, rr)
    out = tmp_path / "d.onnx"
    j = daemon.json("materialize", str(model), "-o", str(out), *flags(wt, pc, rr))
    assert j["via"] == "daemon" and j["target"] == "onnxruntime-int8" and j["nodes_rewritten"] == 8
    assert j["packed"] + j["cached"] == 8
    assert_drop_in(out, ref)
    again = daemon.json("materialize", str(model), "-o", str(tmp_path / "d2.onnx"), *flags(wt, pc, rr))
    assert again["cached"] == 8 and again["packed"] == 0
    assert_drop_in(tmp_path / "d2.onnx", ref, seeds=(3,))
    # The int4 entries of the same weights are other entries: the int4 target still works.
    j4 = daemon.json("materialize", str(model), "-o", str(tmp_path / "d4.onnx"))
    assert j4["target"] == "onnxruntime-int4" and j4["nodes_rewritten"] == 8


def test_bad_input_is_refused_naming_it(daemon, tmp_path):
    model = transformer(tmp_path / "t.onnx", 64, seed=1)
    relu = tmp_path / "relu.onnx"
    _save(
        _model(
            [helper.make_node("Relu", ["X"], ["Y"])],
            [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])],
            [],
        ),
        relu,
    )
    cases = [
        ([str(relu), "--target", "onnxruntime-int8"], "nothing to materialize"),
        ([str(model), "--target", "onnxruntime-int8", "--weight-type", "int4"], "int4"),
        ([str(model), "--target", "onnxruntime-int9"], "onnxruntime-int9"),
        ([str(model), "--target", "onnxruntime-int8", "--op-types", "Attention"], "\"Attention\" is not supported"),
        ([str(model), "--target", "onnxruntime-int8", "--bits", "8"], "--bits"),
        ([str(model), "--per-channel"], "--per-channel"),
    ]
    for i, (args, needle) in enumerate(cases):
        out = tmp_path / f"bad{i}" / "o.onnx"
        for local in ([], ["--local"]):
            r = daemon.ctl("materialize", *local, *args, "-o", str(out))
            assert r.returncode != 0 and needle in r.stderr, r.describe()
            assert not out.exists() and not out.parent.exists(), r.describe()
    # NaN weights: the reference cannot quantize them either.
    m = onnx.load(str(model))
    w = numpy_helper.to_array(m.graph.initializer[0]).copy()
    w[0, 0] = np.nan
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, m.graph.initializer[0].name))
    nan = tmp_path / "nan.onnx"
    onnx.save(m, str(nan))
    out = tmp_path / "nan.q.onnx"
    r = daemon.ctl("materialize", "--local", str(nan), "-o", str(out), "--target", "onnxruntime-int8")
    assert r.returncode != 0 and "NaN or infinite" in r.stderr, r.describe()
    assert not out.exists()


# ---------------------------------------------------------------- Python client


def _feeds(sess, seed):
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
            for i in sess.get_inputs()}


def test_python_client_takes_the_target(ctcache, daemon, tmp_path):  # noqa: F811
    import ctcache.ort as cort

    model = transformer(tmp_path / "p.onnx", 64, seed=41)
    ref = reference(model, "uint8", True, False)
    r = cort.materialize(model, socket=daemon.socket, target="onnxruntime-int8", weight_type="uint8",
                         per_channel=True)
    assert r.target == "onnxruntime-int8" and r.weight_type == "uint8" and r.per_channel and r.nodes_rewritten == 8
    assert Path(r.output_path) == tmp_path / "p.dynamic-uint8.onnx"
    assert_drop_in(Path(r.output_path), ref)
    sess = cort.inference_session(model, socket=daemon.socket, target="onnxruntime-int8", weight_type="uint8",
                                  per_channel=True, output_path=tmp_path / "s.onnx",
                                  providers=["CPUExecutionProvider"])
    feeds = _feeds(sess, 5)
    want = ort.InferenceSession(str(ref), providers=["CPUExecutionProvider"]).run(None, feeds)
    for x, y in zip(sess.run(None, feeds), want):
        assert x.tobytes() == y.tobytes()
    with pytest.raises(ctcache.errors.InvalidArgument):
        cort.materialize(model, tmp_path / "x.onnx", socket=daemon.socket, target="onnxruntime-int8",
                         weight_type="int4")
    with pytest.raises(ValueError, match="unknown target"):
        cort.materialize(model, socket=daemon.socket, target="onnxruntime-int9")


def test_python_fallback_is_quantize_dynamic(ctcache, tmp_path):  # noqa: F811
    import ctcache.ort as cort

    model = transformer(tmp_path / "fb.onnx", 64, seed=43)
    nowhere = tmp_path / "no-daemon.sock"
    with pytest.warns(cort.FallbackWarning, match="quantize_dynamic"):
        sess = cort.inference_session(model, socket=nowhere, target="onnxruntime-int8", reduce_range=True,
                                      providers=["CPUExecutionProvider"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fb.onnx"], "the fallback wrote files"
    ref = reference(model, "int8", False, True)
    feeds = _feeds(sess, 6)
    want = ort.InferenceSession(str(ref), providers=["CPUExecutionProvider"]).run(None, feeds)
    for x, y in zip(sess.run(None, feeds), want):
        assert x.tobytes() == y.tobytes()
