"""ort.quantize_dynamic payloads hold exactly the `<W>_quantized`,
`<W>_scale` and `<W>_zero_point` initializers that
`onnxruntime.quantization.quantize_dynamic` writes for a MatMul weight W
(all four weight type x per-tensor/per-channel combinations, reduce_range,
and the explicit symmetric setting), for every kernel instruction set of
this CPU. See packraw.py for the binary."""

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from packraw import first_difference, isas, pack, pack_error

COMBOS = [
    (wt, pc, rr)
    for wt in ("int8", "uint8")
    for pc in (False, True)
    for rr in (False, True)
]


def reference(w: np.ndarray, weight_type: str, per_channel: bool, reduce_range: bool, symmetric=None):
    """What quantize_dynamic writes for W of a one-MatMul model:
    (quantized, scale, zero_point) as numpy arrays."""
    k = w.shape[-2] if w.ndim >= 2 else w.shape[0]
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, k])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    node = helper.make_node("MatMul", ["A", "W"], ["Y"], name="mm")
    g = helper.make_graph([node], "g", [a], [y], [numpy_helper.from_array(w, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    extra = {} if symmetric is None else {"WeightSymmetric": symmetric}
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "m.onnx", Path(d) / "q.onnx"
        onnx.save(m, src)
        quantize_dynamic(
            src,
            dst,
            weight_type=QuantType.QInt8 if weight_type == "int8" else QuantType.QUInt8,
            per_channel=per_channel,
            reduce_range=reduce_range,
            op_types_to_quantize=["MatMul"],
            extra_options=extra,
        )
        out = onnx.load(dst)
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    return inits["W_quantized"], inits["W_scale"], inits["W_zero_point"]


def ours(w, isa, weight_type, per_channel, reduce_range, symmetric=None):
    if symmetric is None:
        symmetric = weight_type == "int8"
    payload, info = pack(
        "ort.quantize_dynamic",
        w,
        isa,
        weight_type=weight_type,
        per_channel=per_channel,
        reduce_range=reduce_range,
        symmetric=symmetric,
    )
    c = w.shape[-1] if per_channel else 1
    qt = np.int8 if weight_type == "int8" else np.uint8
    scale = np.frombuffer(payload[: 4 * c], "<f4")
    zp = np.frombuffer(payload[4 * c : 5 * c], qt)
    q = np.frombuffer(payload[5 * c :], qt).reshape(w.shape)
    return q, scale, zp, info, payload


def check(w, isa, wt, pc, rr, symmetric=None):
    rq, rs, rz = reference(w, wt, pc, rr, symmetric)
    q, s, z, info, _ = ours(w, isa, wt, pc, rr, symmetric)
    where = f"{w.shape} {wt} per_channel={pc} reduce_range={rr} symmetric={symmetric} isa={isa}"
    assert rq.dtype == q.dtype and rz.dtype == z.dtype, where
    assert rs.dtype == np.float32, where
    assert rs.reshape(-1).tobytes() == s.tobytes(), f"scale {where}: {rs.reshape(-1)} != {s}"
    assert rz.reshape(-1).tobytes() == z.tobytes(), f"zero point {where}: {rz.reshape(-1)} != {z}"
    assert rq.tobytes() == q.tobytes(), f"quantized {where}: {first_difference(q.tobytes(), rq.tobytes())}"
    assert info["name"].startswith(f"ort.quantize_dynamic.{wt}.")
    return info


def weights(seed):
    rng = np.random.default_rng(seed)
    yield rng.standard_normal((64, 40)).astype(np.float32)
    yield (rng.standard_normal((33, 17)) * 1e-3).astype(np.float32)
    yield np.abs(rng.standard_normal((16, 24))).astype(np.float32)  # all >= 0
    yield -np.abs(rng.standard_normal((16, 24))).astype(np.float32)  # all <= 0
    yield np.zeros((8, 9), np.float32)  # scale 1, zero point 0
    # Tiny and subnormal weights: the scale falls below FLOAT's smallest normal.
    yield (rng.standard_normal((8, 16)) * 1e-38).astype(np.float32)
    yield np.full((4, 8), 1e-45, np.float32)
    # Huge ranges (the DOUBLE arithmetic), and a column of zeros.
    big = (rng.standard_normal((12, 16)) * 1e37).astype(np.float32)
    big[:, 3] = 0
    big[0, 0] = np.finfo(np.float32).max
    big[1, 1] = -np.finfo(np.float32).max
    yield big
    # Values on rounding ties: x / scale lands on .5 often.
    t = (rng.integers(-255, 256, (32, 24)) / 2.0).astype(np.float32)
    t[0, :] = 127.0
    t[1, :] = -127.0
    yield t
    yield rng.standard_normal((3, 7, 11)).astype(np.float32)  # batched MatMul weight
    yield rng.standard_normal((1, 1)).astype(np.float32)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    x[2, 5] = -0.0
    yield x


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("wt,pc,rr", COMBOS)
def test_every_combination_matches_quantize_dynamic(isa, wt, pc, rr):
    for w in weights(11):
        check(w, isa, wt, pc, rr)


@pytest.mark.parametrize("isa", isas())
def test_explicit_symmetry_both_ways(isa):
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((40, 24)) + 0.3).astype(np.float32)
    for wt in ("int8", "uint8"):
        for sym in (True, False):
            for pc in (False, True):
                for rr in (False, True):
                    check(w, isa, wt, pc, rr, symmetric=sym)
    check(np.zeros((4, 4), np.float32), isa, "uint8", False, False, symmetric=True)


@pytest.mark.parametrize("isa", isas())
def test_vector_tails_and_larger_weights(isa):
    rng = np.random.default_rng(9)
    for shape in [(1, 7), (3, 9), (2, 15), (5, 17), (300, 257), (1100, 96)]:
        w = rng.standard_normal(shape).astype(np.float32)
        for wt, pc, rr in COMBOS:
            check(w, isa, wt, pc, rr)


def gemm_reference(w, weight_type, per_channel, reduce_range):
    """What quantize_dynamic writes for B of a Gemm with transB=1: it
    replaces the Gemm by a MatMul on a new initializer `B_Transposed`."""
    n, k = w.shape
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, k])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    node = helper.make_node("Gemm", ["A", "B"], ["Y"], name="g", transB=1)
    g = helper.make_graph([node], "g", [a], [y], [numpy_helper.from_array(w, "B")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "m.onnx", Path(d) / "q.onnx"
        onnx.save(m, src)
        quantize_dynamic(
            src,
            dst,
            weight_type=QuantType.QInt8 if weight_type == "int8" else QuantType.QUInt8,
            per_channel=per_channel,
            reduce_range=reduce_range,
            op_types_to_quantize=["MatMul"],
        )
        out = onnx.load(dst)
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    return inits["B_Transposed_quantized"], inits["B_Transposed_scale"], inits["B_Transposed_zero_point"]


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("wt,pc,rr", COMBOS)
def test_gemm_trans_b_weights(isa, wt, pc, rr):
    rng = np.random.default_rng(21)
    for shape in [(24, 40), (7, 9), (1, 5), (130, 70)]:
        w = rng.standard_normal(shape).astype(np.float32)
        rq, rs, rz = gemm_reference(w, wt, pc, rr)
        payload, info = pack(
            "ort.quantize_dynamic", w, isa, weight_type=wt, per_channel=pc, reduce_range=rr,
            symmetric=wt == "int8", transposed=True,
        )
        c = shape[0] if pc else 1
        assert info["name"].endswith(".t") and info["dims"] == f"{shape[1]},{shape[0]}"
        assert payload[: 4 * c] == rs.reshape(-1).tobytes()
        assert payload[4 * c : 5 * c] == rz.reshape(-1).tobytes()
        assert payload[5 * c :] == rq.tobytes(), first_difference(payload[5 * c :], rq.tobytes())


def test_layout_and_decoder():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 5)).astype(np.float32)
    q, s, z, info, payload = ours(w, isas()[0], "uint8", True, False)
    assert info["dims"] == "6,5"
    assert int(info["payload_len"]) == 5 * 4 + 5 + 30 == len(payload)
    assert info["name"] == "ort.quantize_dynamic.uint8.asym.per_channel"
    _, _, _, info, _ = ours(w, isas()[0], "int8", False, True)
    assert info["name"] == "ort.quantize_dynamic.int8.sym.per_tensor.reduce_range"
    assert int(info["payload_len"]) == 4 + 1 + 30


def test_refusals():
    assert "supported: FLOAT" in pack_error("ort.quantize_dynamic", np.zeros((4, 4), np.float16))
    w = np.ones((4, 4), np.float32)
    assert "allowed: int8, uint8" in pack_error("ort.quantize_dynamic", w, weight_type="int4")
    for bad in (np.nan, np.inf, -np.inf):
        x = w.copy()
        x[2, 3] = bad
        for pc in ("false", "true"):
            e = pack_error("ort.quantize_dynamic", x, per_channel=pc)
            assert "element 11" in e and "NaN or infinite" in e, e
    assert "at least one dimension" in pack_error("ort.quantize_dynamic", np.float32(1.0).reshape(()))
    assert "empty" in pack_error("ort.quantize_dynamic", np.zeros((0, 4), np.float32))
