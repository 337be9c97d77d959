"""ort.float16 payloads are byte-identical with what onnxruntime's float16
converter (`onnxruntime.transformers.float16`) writes for a FLOAT
initializer stored as raw data: the clamp into [min_positive_val,
max_finite_val] by magnitude, then numpy's float16 cast (NaN payloads
included), for every kernel instruction set of this CPU and every allowed
parameter value. See packraw.py for the binary."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.transformers.float16 import convert_float_to_float16, convert_np_to_float16

from packraw import first_difference, isas, pack, pack_error

PARAMS = [(lo, hi) for lo in ("5.96e-08", "1e-07") for hi in ("65504", "10000")]


def check(x, isa, lo="5.96e-08", hi="65504"):
    want = convert_np_to_float16(x.reshape(-1), float(lo), float(hi)).tobytes()
    got, info = pack("ort.float16", x, isa, min_positive_val=lo, max_finite_val=hi)
    assert info["name"] == f"ort.float16.min{lo}.max{hi}"
    assert info["dims"] == ",".join(map(str, x.shape))
    assert got == want, f"{x.shape} isa={isa} {lo} {hi}: {first_difference(got, want)}"


def special_bits():
    s = [
        0x7F800001, 0x7FC00000, 0x7F802000, 0x7FA00000, 0x7FFFFFFF, 0x7F800000, 0x7F801FFF,
        0x477FEFFF, 0x477FF000, 0x477FE000, 0x477FE001, 0x461C4000, 0x461C4001, 0x461C3FFF,
        0x33000000, 0x33000001, 0x33800000, 0x337FFFFF, 0x33800001, 0x33D6BF95, 0x33D6BF94,
        0x33D6BF96, 0x387FC000, 0x38800000, 0x7F7FFFFF, 0x00000001, 0x00800000, 0x3F800000, 0,
    ]
    s = np.array(s + [b | 0x80000000 for b in s], np.uint32)
    e = np.arange(0x33000000, 0x47800000, 0x1000, dtype=np.uint32)
    return np.concatenate([s, e - 1, e, e + 1])


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("lo,hi", PARAMS)
def test_specials_and_boundaries(isa, lo, hi):
    x = special_bits().view(np.float32)
    # The thresholds themselves and their float32 neighbours.
    t = np.array([float(lo), float(hi)], np.float32)
    near = np.concatenate([t, np.nextafter(t, 0), np.nextafter(t, np.inf)])
    x = np.concatenate([x, near, -near])
    check(x, isa, lo, hi)
    for n in [1, 7, 8, 9, 15, 16, 17, 33]:  # vector tails
        check(x[:n], isa, lo, hi)


@pytest.mark.parametrize("isa", isas())
def test_random_bit_patterns(isa):
    rng = np.random.default_rng(17)
    bits = rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    check(bits.view(np.float32).reshape(256, 4096), isa)


@pytest.mark.parametrize("isa", isas())
def test_shapes_and_scales(isa):
    rng = np.random.default_rng(18)
    for shape in [(), (0,), (1,), (3, 5), (2, 3, 4, 5), (70001,)]:
        for scale in (1.0, 1e-7, 1e5):
            check((rng.standard_normal(shape) * scale).astype(np.float32), isa)


def test_same_as_the_converter_on_a_model():
    rng = np.random.default_rng(19)
    w = (rng.standard_normal((64, 32)) * np.float32(10.0) ** rng.integers(-12, 7, (64, 32))).astype(np.float32)
    w[0, :4] = [np.nan, np.inf, -np.inf, 1e6]
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 32])
    g = helper.make_graph(
        [helper.make_node("MatMul", ["A", "W"], ["Y"])], "g", [a], [y], [numpy_helper.from_array(w, "W")]
    )
    m = convert_float_to_float16(helper.make_model(g), keep_io_types=True)
    ref = next(t for t in m.graph.initializer if t.name == "W")
    assert ref.data_type == TensorProto.FLOAT16
    got, _ = pack("ort.float16", w, isas()[-1])
    assert got == ref.raw_data, first_difference(got, ref.raw_data)


def test_not_a_plain_cast():
    x = np.array([1e-9, -1e-9, 1e5, -1e5], np.float32)
    got, _ = pack("ort.float16", x, isas()[0])
    plain, _ = pack("cast.f16", x, isas()[0])
    assert np.frombuffer(got, np.uint16).tolist() == [1, 0x8001, 0x7BFF, 0xFBFF]
    assert got != plain


def test_refusals():
    assert "supported: FLOAT" in pack_error("ort.float16", np.zeros(4, np.float16))
    e = pack_error("ort.float16", np.zeros(4, np.float32), max_finite_val="1e4")
    assert "allowed: 65504, 10000" in e
