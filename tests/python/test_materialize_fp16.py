"""``ctcachectl materialize --target onnxruntime-fp16`` is a drop-in for
``onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)``.

On the synthetic transformer block of test_materialize, an MLP with a Gemm
transB=1, a model whose weights hold subnormals, values past 65504, NaN
and infinities (with a Constant node, a Cast to FLOAT and a weight shared by
two nodes) and a model of the nodes the converter keeps FLOAT behind Casts
(Max, TopK, Resize's scales, ConstantOfShape, Constant weights in If
branches), through the daemon and with ``--local``: every initializer the
reference writes exists in ours under the same name with the same dtype,
dims and bytes; the same nodes; onnxruntime gives bit-identical outputs on
the same inputs; the result passes ``onnx.checker``. Models whose converted
form onnxruntime refuses are refused naming the node, and nothing is
written. The real models are test_real_models.py's.
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
from onnxruntime.transformers.float16 import convert_float_to_float16

from e2e.harness import Daemon, ctl
from test_materialize import _model, _save, gemm_model, transformer
from test_python_client import ctcache, installed  # noqa: F401  (session fixtures: pip-installed client)

F32 = np.float32


@pytest.fixture(scope="module")
def daemon():
    created_xdg = None
    if not os.environ.get("XDG_RUNTIME_DIR"):
        created_xdg = tempfile.mkdtemp(prefix="ct16-xdg-")
        os.chmod(created_xdg, 0o700)
        os.environ["XDG_RUNTIME_DIR"] = created_xdg
    root = Path(tempfile.mkdtemp(prefix="ct16-"))
    d = Daemon(root)
    try:
        yield d.start()
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)
        if created_xdg:
            os.environ.pop("XDG_RUNTIME_DIR", None)
            shutil.rmtree(created_xdg, ignore_errors=True)


def specials_model(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((32, 24)) * F32(10.0) ** rng.integers(-12, 6, (32, 24))).astype(F32)
    w[0, :8] = [1e-9, -1e-9, 3e-8, 7e4, -1e6, 65519.0, 1e-45, -0.0]
    b = rng.standard_normal(24).astype(F32)
    b[:4] = [np.nan, np.inf, -np.inf, 1e-30]
    u = (rng.standard_normal((24, 24)) * 0.1).astype(F32)
    c = helper.make_tensor("c", TensorProto.FLOAT, [2], [2.5e-8, 1e5])
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "B"], ["h1"], name="bias"),
        helper.make_node("Constant", [], ["k"], name="const", value=c),
        helper.make_node("Slice", ["h1", "starts", "ends"], ["h2"], name="slice"),
        helper.make_node("Mul", ["h1", "U0"], ["h3"], name="scale0"),
        helper.make_node("MatMul", ["h3", "U"], ["h4"], name="mm2"),
        helper.make_node("Add", ["h4", "U"], ["h5"], name="addu"),
        helper.make_node("Cast", ["h5"], ["h6"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["h6"], ["s"], name="sum", keepdims=1),
        helper.make_node("Gather", ["k", "zero"], ["k0"], name="pick"),
        helper.make_node("Mul", ["s", "k0"], ["Y"], name="scalek"),
    ]
    inits = [
        numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B"), numpy_helper.from_array(u, "U"),
        numpy_helper.from_array(np.array(0.5, F32), "U0"), numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "starts"), numpy_helper.from_array(np.array([1], np.int64), "ends"),
        numpy_helper.from_array(np.ones(3, F32), "unused"),
    ]
    m = _model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [24, 32])],
               [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 1]),
                helper.make_tensor_value_info("h2", TensorProto.FLOAT, [1, 24])], inits)
    return _save(m, path)


def kept_model(path: Path, seed: int = 0) -> Path:
    """Nodes the converter keeps FLOAT behind Casts (Max with a weight only it
    reads, TopK writing a graph output), Resize with FLOAT scales from a
    Constant, a ConstantOfShape without a value, and Constant weights in If
    branches."""
    rng = np.random.default_rng(seed)
    f = TensorProto.FLOAT

    def branch(name, op):
        c = numpy_helper.from_array(rng.standard_normal(8).astype(F32), f"{name}_w")
        return helper.make_graph(
            [helper.make_node("Constant", [], [f"{name}_c"], name=f"{name}_const", value=c),
             helper.make_node(op, ["h", f"{name}_c"], [f"{name}_out"], name=f"{name}_op")],
            name, [], [helper.make_tensor_value_info(f"{name}_out", f, [2, 8])])

    scales = numpy_helper.from_array(np.array([1, 2], F32), "scales_value")
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["h"], name="mm"),
        helper.make_node("Max", ["h", "M"], ["mx"], name="max"),
        helper.make_node("TopK", ["mx", "k"], ["Y", "I"], name="top"),
        helper.make_node("Shape", ["X"], ["sx"], name="shape"),
        helper.make_node("ConstantOfShape", ["sx"], ["z"], name="zeros"),
        helper.make_node("Add", ["h", "z"], ["hz"], name="addz"),
        helper.make_node("Constant", [], ["scales"], name="scales_const", value=scales),
        helper.make_node("Resize", ["hz", "", "scales"], ["R"], name="resize", mode="nearest"),
        helper.make_node("If", ["C"], ["F"], name="branch", then_branch=branch("then", "Mul"),
                         else_branch=branch("else", "Add")),
    ]
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(F32), "W"),
             numpy_helper.from_array(rng.standard_normal(8).astype(F32), "M"),
             numpy_helper.from_array(np.array([2], np.int64), "k")]
    m = _model(nodes, [helper.make_tensor_value_info("X", f, [2, 8]),
                       helper.make_tensor_value_info("C", TensorProto.BOOL, [])],
               [helper.make_tensor_value_info("Y", f, [2, 2]), helper.make_tensor_value_info("I", TensorProto.INT64, [2, 2]),
                helper.make_tensor_value_info("R", f, [2, 16]), helper.make_tensor_value_info("F", f, [2, 8])], inits)
    return _save(m, path)


MODELS = {
    "transformer": lambda p: transformer(p, 64, seed=5),
    "gemm": lambda p: gemm_model(p, seed=6),
    "specials": lambda p: specials_model(p, seed=7),
    "kept": lambda p: kept_model(p, seed=8),
}


def reference(model: Path) -> Path:
    out = model.with_name(model.stem + ".ref16.onnx")
    onnx.save(convert_float_to_float16(str(model), keep_io_types=True), str(out))
    return out


def feeds_for(path: Path, seed: int):
    rng = np.random.default_rng(seed)
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return {i.name: np.array(seed % 2 == 0) if i.type == "tensor(bool)" else
            (rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]) * 3).astype(F32)
            for i in s.get_inputs()}


def assert_drop_in(ours: Path, ref: Path, seeds=(1, 2)):
    onnx.checker.check_model(str(ours))
    a = {t.name: numpy_helper.to_array(t, base_dir=str(ours.parent)) for t in onnx.load(str(ours)).graph.initializer}
    b = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(ref)).graph.initializer}
    assert sorted(set(b) - set(a)) == [], "initializers the reference writes and we do not"
    for name, want in b.items():
        got = a[name]
        assert (got.dtype, got.shape) == (want.dtype, want.shape), name
        assert got.tobytes() == want.tobytes(), f"{name} differs"
    assert any(v.dtype == np.float16 for v in b.values())
    g = onnx.load(str(ours), load_external_data=False).graph
    assert all(i.type.tensor_type.elem_type != TensorProto.FLOAT16 for i in list(g.input) + list(g.output))
    def nodes(model: Path):
        g = onnx.load(str(model), load_external_data=False).graph
        return sorted((n.op_type, n.name, tuple(n.input), tuple(n.output)) for n in g.node)
    assert nodes(ours) == nodes(ref)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s1 = ort.InferenceSession(str(ours), so, providers=["CPUExecutionProvider"])
    s2 = ort.InferenceSession(str(ref), so, providers=["CPUExecutionProvider"])
    for seed in seeds:
        feeds = feeds_for(ref, seed)
        for x, y in zip(s1.run(None, feeds), s2.run(None, feeds)):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert x.tobytes() == y.tobytes(), f"outputs differ (seed {seed})"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_local_is_a_drop_in_for_the_float16_converter(tmp_path, name):
    model = MODELS[name](tmp_path / f"{name}.onnx")
    ref = reference(model)
    out = tmp_path / "out" / "h.onnx"
    out.parent.mkdir()
    r = ctl("--json", "materialize", "--local", str(model), "-o", str(out), "--target", "onnxruntime-fp16")
    assert r.returncode == 0, r.describe()
    j = json.loads(r.stdout)
    assert j["via"] == "local" and j["target"] == "onnxruntime-fp16"
    assert_drop_in(out, ref)
    if name == "specials":
        got = numpy_helper.to_array(next(t for t in onnx.load(str(out)).graph.initializer if t.name == "W"),
                                    base_dir=str(out.parent))
        assert got.view(np.uint16)[0, :8].tolist() == [1, 0x8001, 1, 0x7BFF, 0xFBFF, 0x7BFF, 1, 0x8000]
        assert "unused" in {t.name: 0 for t in onnx.load(str(out)).graph.initializer}


@pytest.mark.parametrize("name", ["transformer", "specials", "kept"])
def test_daemon_is_a_drop_in_and_caches(daemon, tmp_path, name):
    model = MODELS[name](tmp_path / f"{name}.onnx")
    ref = reference(model)
    out = tmp_path / "d.onnx"
    j = daemon.json("materialize", str(model), "-o", str(out), "--target", "onnxruntime-fp16")
    assert j["via"] == "daemon" and j["target"] == "onnxruntime-fp16" and j["packed"] > 0
    assert_drop_in(out, ref)
    again = daemon.json("materialize", str(model), "-o", str(tmp_path / "d2.onnx"), "--target", "onnxruntime-fp16")
    assert again["packed"] == 0 and again["cached"] == j["packed"]
    assert_drop_in(tmp_path / "d2.onnx", ref, seeds=(4,))


def test_refusals_name_the_problem(daemon, tmp_path):
    quantized = tmp_path / "q.onnx"
    _save(_model([helper.make_node("DynamicQuantizeLinear", ["X"], ["q", "s", "z"], name="dq")],
                 [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4])],
                 [helper.make_tensor_value_info("q", TensorProto.UINT8, [2, 4])], []), quantized)
    ints = tmp_path / "ints.onnx"
    _save(_model([helper.make_node("Add", ["X", "C"], ["Y"])],
                 [helper.make_tensor_value_info("X", TensorProto.INT64, [2])],
                 [helper.make_tensor_value_info("Y", TensorProto.INT64, [2])],
                 [numpy_helper.from_array(np.ones(2, np.int64), "C")]), ints)
    model = transformer(tmp_path / "t.onnx", 64, seed=1)
    cases = [
        ([str(quantized)], "node dq (DynamicQuantizeLinear) reads \"X\""),
        ([str(ints)], "no FLOAT value or weight"),
        ([str(model), "--per-channel"], "--per-channel is not a setting of --target onnxruntime-fp16"),
    ]
    for i, (args, needle) in enumerate(cases):
        out = tmp_path / f"bad{i}" / "o.onnx"
        for local in ([], ["--local"]):
            r = daemon.ctl("materialize", *local, *args, "-o", str(out), "--target", "onnxruntime-fp16")
            assert r.returncode != 0 and needle in r.stderr, r.describe()
            assert not out.exists() and not out.parent.exists(), r.describe()


def test_python_client_and_fallback(ctcache, daemon, tmp_path):  # noqa: F811
    import ctcache.ort as cort

    model = specials_model(tmp_path / "p.onnx", seed=9)
    ref = reference(model)
    r = cort.materialize(model, socket=daemon.socket, target="onnxruntime-fp16")
    assert r.target == "onnxruntime-fp16" and Path(r.output_path) == tmp_path / "p.fp16.onnx"
    assert_drop_in(Path(r.output_path), ref)
    feeds = feeds_for(ref, 8)
    want = ort.InferenceSession(str(ref), providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = cort.inference_session(model, socket=daemon.socket, target="onnxruntime-fp16",
                                  output_path=tmp_path / "s.onnx", providers=["CPUExecutionProvider"])
    for x, y in zip(sess.run(None, feeds), want):
        assert x.tobytes() == y.tobytes()
    with pytest.warns(cort.FallbackWarning, match="convert_float_to_float16"):
        fb = cort.inference_session(model, socket=tmp_path / "none.sock", target="onnxruntime-fp16",
                                    providers=["CPUExecutionProvider"])
    for x, y in zip(fb.run(None, feeds), want):
        assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("block", [["TopK", "Resize"], ["TopK", "Max", "ConstantOfShape"]])
def test_the_op_block_list_is_the_converters(daemon, tmp_path, block):
    """--op-block-list keeps those op types FLOAT behind Casts, as the
    converter's op_block_list does (the default list no longer applies)."""
    model = MODELS["kept"](tmp_path / "k.onnx")
    ref = tmp_path / "ref.onnx"
    onnx.save(convert_float_to_float16(str(model), keep_io_types=True, op_block_list=block), str(ref))
    for local in ([], ["--local"]):
        out = tmp_path / f"o{len(local)}.onnx"
        r = daemon.ctl("materialize", *local, str(model), "-o", str(out), "--target", "onnxruntime-fp16",
                       "--op-block-list", ",".join(block))
        assert r.returncode == 0, r.describe()
        assert_drop_in(out, ref)
    r = daemon.ctl("materialize", str(model), "-o", str(tmp_path / "bad.onnx"), "--op-block-list", "TopK")
    assert r.returncode == 2 and "--op-block-list is a setting of --target onnxruntime-fp16" in r.stderr, r.describe()


def test_a_kept_node_in_a_subgraph_is_refused_as_onnxruntime_refuses_the_converters_model(daemon, tmp_path):
    """Add kept FLOAT inside an If branch: the converter puts the Cast of the
    branch's own value in the top-level graph, and onnxruntime refuses that
    model; the target refuses, naming the node."""
    model = MODELS["kept"](tmp_path / "k.onnx")
    ref = convert_float_to_float16(str(model), keep_io_types=True, op_block_list=["Add"])
    with pytest.raises(Exception, match="invalid model"):
        ort.InferenceSession(ref.SerializeToString(), providers=["CPUExecutionProvider"])
    out = tmp_path / "o.onnx"
    r = daemon.ctl("materialize", str(model), "-o", str(out), "--target", "onnxruntime-fp16", "--op-block-list", "Add")
    assert r.returncode == 1 and "node else_op (Add) inside a subgraph stays FLOAT" in r.stderr, r.describe()
    assert not out.exists()
