"""Every output type carries a decoder FunctionProto (standard ONNX ops):
run with onnxruntime on the payload's leaves, it must give the FLOAT source
tensor that the format means (checked against numpy / gguf dequantization,
exactly). See packraw.py for the binary."""

import warnings

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants
from onnx import TensorProto, helper

from packraw import isas, pack_full

ISA = isas()[-1]


def run_decoder(decoder: bytes, leaves: dict[str, np.ndarray], shape: tuple) -> np.ndarray:
    fn = onnx.FunctionProto.FromString(decoder)
    assert fn.domain == "ctcache" and list(fn.output) == ["output"]
    assert list(fn.input) == list(leaves), (list(fn.input), list(leaves))
    feeds, infos = {}, []
    for name, arr in leaves.items():
        if arr.dtype == ml_dtypes.bfloat16:
            infos.append(helper.make_tensor_value_info(name, TensorProto.BFLOAT16, arr.shape))
            feeds[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(arr.view(np.uint16), onnx_element_type=16)
        else:
            infos.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
            feeds[name] = arr
    node = helper.make_node(fn.name, list(leaves), ["output"], domain="ctcache")
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)
    graph = helper.make_graph([node], "decode", infos, [out])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ctcache", 1)], functions=[fn]
    )
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def nibbles(b: np.ndarray) -> np.ndarray:
    return np.stack([b & 15, b >> 4], axis=-1).reshape(*b.shape[:-1], -1)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bits,sym", [(4, True), (4, False), (8, True), (8, False)])
@pytest.mark.parametrize("k,n,bs", [(33, 5, 16), (64, 3, 32), (100, 7, 64), (5, 2, 256)])
def test_matmul_nbits(dtype, bits, sym, k, n, bs):
    w = np.random.default_rng(k * n).standard_normal((k, n)).astype(dtype)
    payload, info, dec = pack_full("ort.matmul_nbits", w, ISA, bits=bits, block_size=bs, symmetric=sym)
    kb = -(-k // bs)
    blob = bs * bits // 8
    buf = np.frombuffer(payload, np.uint8)
    b = buf[: n * kb * blob].reshape(n, kb, blob)
    scales = buf[n * kb * blob : n * kb * (blob + w.itemsize)].view(dtype).reshape(n, kb)
    leaves = {"B": b, "scales": scales}
    codes = (nibbles(b) if bits == 4 else b).astype(np.float32)
    if sym:
        zp = np.full((n, kb), 1 << (bits - 1), np.float32)
    else:
        z = buf[n * kb * (blob + w.itemsize) :].reshape(n, -1)
        leaves["zero_points"] = z
        zp = (nibbles(z)[:, :kb] if bits == 4 else z).astype(np.float32)
    leaves["K"] = np.array(k, np.int64)
    want = ((codes - zp[..., None]) * scales.astype(np.float32)[..., None]).reshape(n, -1)[:, :k].T
    got = run_decoder(dec, leaves, (k, n))
    assert got.shape == (k, n)
    np.testing.assert_array_equal(got, want)
    step = np.abs(scales.astype(np.float32)).max()
    assert np.abs(got - w.astype(np.float32)).max() <= step  # a real dequantization


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bits,sym", [(4, True), (4, False), (8, False)])
@pytest.mark.parametrize("k,n,bs", [(33, 5, 16), (100, 7, 64), (5, 1, 256)])
def test_matmul_nbits_transposed(dtype, bits, sym, k, n, bs):
    """transposed=true: the source is W[N, K] (Gemm transB=1); the payload is
    that of W^T untransposed, and the decoder gives back W[N, K]."""
    w = np.random.default_rng(k * n + 1).standard_normal((n, k)).astype(dtype)
    params = dict(bits=bits, block_size=bs, symmetric=sym)
    payload, info, dec = pack_full("ort.matmul_nbits", w, ISA, transposed=True, **params)
    plain, _, plain_dec = pack_full("ort.matmul_nbits", np.ascontiguousarray(w.T), ISA, **params)
    assert payload == plain
    assert info["name"].endswith(".t"), info
    kb = -(-k // bs)
    blob = bs * bits // 8
    buf = np.frombuffer(payload, np.uint8)
    leaves = {
        "B": buf[: n * kb * blob].reshape(n, kb, blob),
        "scales": buf[n * kb * blob : n * kb * (blob + w.itemsize)].view(dtype).reshape(n, kb),
    }
    if not sym:
        leaves["zero_points"] = buf[n * kb * (blob + w.itemsize) :].reshape(n, -1)
    leaves["K"] = np.array(k, np.int64)
    got = run_decoder(dec, leaves, (n, k))
    assert got.shape == (n, k)
    np.testing.assert_array_equal(got, run_decoder(plain_dec, leaves, (k, n)).T)
    step = np.abs(leaves["scales"].astype(np.float32)).max()
    assert np.abs(got - w.astype(np.float32)).max() <= step


@pytest.mark.parametrize("fmt,qt", [("ggml.q8_0", T.Q8_0), ("ggml.q4_0", T.Q4_0)])
@pytest.mark.parametrize("shape", [(32,), (3, 64), (2, 3, 96)])
def test_ggml(fmt, qt, shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    payload, _, dec = pack_full(fmt, x, ISA)
    bb = 34 if qt == T.Q8_0 else 18
    blocks = np.frombuffer(payload, np.uint8).reshape(*shape[:-1], shape[-1] // 32, bb)
    d = np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0]
    qs = np.ascontiguousarray(blocks[..., 2:])
    if qt == T.Q8_0:
        qs = qs.view(np.int8)
    got = run_decoder(dec, {"blocks.d": d, "blocks.qs": qs}, shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = quants.dequantize(np.frombuffer(payload, np.uint8).reshape(*shape[:-1], -1), qt)
    assert got.shape == shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt,t", [("cast.f16", np.float16), ("cast.bf16", ml_dtypes.bfloat16)])
@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4)])
def test_cast(fmt, t, shape):
    x = np.asarray(np.random.default_rng(2).standard_normal(shape), np.float32)
    payload, _, dec = pack_full(fmt, x, ISA)
    values = np.frombuffer(payload, t).reshape(shape)
    got = run_decoder(dec, {"values": values}, shape)
    np.testing.assert_array_equal(got, x.astype(t).astype(np.float32))


@pytest.mark.parametrize("nr", [8, 16, 32])
def test_gemm_pack_b(nr):
    w = np.random.default_rng(3).standard_normal((9, 37)).astype(np.float32)
    payload, _, dec = pack_full("gemm.pack_b.f32", w, ISA, panel=nr)
    panels = np.frombuffer(payload, np.float32).reshape(-1, 9, nr)
    got = run_decoder(dec, {"panels": panels, "N": np.array(37, np.int64)}, (9, 37))
    np.testing.assert_array_equal(got, w)
