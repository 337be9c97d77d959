"""ort.matmul_nbits payloads are byte-identical with onnxruntime's
quantize_matmul_4bits / quantize_matmul_8bits (called exactly as
onnxruntime.quantization.matmul_nbits_quantizer does), for every kernel
instruction set of this CPU.

Run: CARGO_TARGET_DIR=... /var/tmp/ctcache-venv/bin/python -m pytest tests/python/kernels
(the pack_raw binary: see packraw.py)."""

import numpy as np
import pytest
from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

from packraw import first_difference, isas, pack, pack_error

BLOCK_SIZES = [16, 32, 64, 128, 256]


def ort_payload(w: np.ndarray, bits: int, bs: int, sym: bool) -> bytes:
    k, n = w.shape
    kb = (k + bs - 1) // bs
    kpack = 8 // bits
    wp = np.pad(w, ((0, kb * bs - k), (0, 0)), "constant") if kb * bs > k else w
    packed = np.zeros((n, kb, bs * bits // 8), np.uint8)
    zp = np.zeros((n, (kb + kpack - 1) // kpack), np.uint8)
    scales = np.zeros((n, kb), w.dtype)
    f = quantize_matmul_4bits if bits == 4 else quantize_matmul_8bits
    f(packed, np.ascontiguousarray(wp), scales, zp, bs, n, k, sym)
    out = packed.tobytes() + scales.astype(scales.dtype.newbyteorder("<")).tobytes()
    if not sym:
        out += zp.tobytes()
    return out


def check(w, bits, bs, sym, isa):
    want = ort_payload(w, bits, bs, sym)
    got, info = pack("ort.matmul_nbits", w, isa, bits=bits, block_size=bs, symmetric=sym)
    name = f"ort.matmul_nbits.b{bits}.bs{bs}.{'sym' if sym else 'asym'}" + (".f16" if w.dtype == np.float16 else "")
    assert info["name"] == name
    assert got == want, f"{w.shape} {w.dtype} bits={bits} bs={bs} sym={sym} isa={isa}: {first_difference(got, want)}"


SHAPES = [(1, 1), (7, 3), (31, 9), (32, 8), (33, 17), (97, 8), (129, 33), (300, 70), (513, 19)]


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_random_shapes(isa, dtype, bits, sym, bs):
    rng = np.random.default_rng(bs * 7 + bits + sym)
    for k, n in SHAPES:
        scale = rng.choice([1e-3, 1.0, 50.0])
        w = (rng.standard_normal((k, n)) * scale).astype(dtype)
        check(w, bits, bs, sym, isa)


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("sym", [True, False])
def test_wide_and_shifted(isa, bits, sym):
    # N >= 512 takes the 32-column tiles; skewed data gives zero points at
    # both ends of the range.
    rng = np.random.default_rng(3)
    for k, n, shift in [(70, 530, 0.0), (64, 517, 3.0), (45, 600, -3.0)]:
        w = (rng.standard_normal((k, n)) + shift).astype(np.float32)
        check(w, bits, 32, sym, isa)
        check(w.astype(np.float16), bits, 64, sym, isa)


def edge_cases():
    rng = np.random.default_rng(11)
    nan, inf = np.float32("nan"), np.float32("inf")
    c = {
        "zeros": np.zeros((64, 9)),
        "negzero": np.full((64, 9), -0.0),
        "const": np.full((64, 9), 1.5),
        "negconst": np.full((64, 9), -2.25),
        "inf": np.tile([1.0, inf, -3.0], (64, 3)),
        "ninf": np.tile([-inf, 2.0, inf], (64, 3)),
        "allnan": np.full((64, 9), nan),
        "denorm": rng.standard_normal((64, 9)) * 1e-40,
        "tiny": rng.standard_normal((64, 9)) * 1e-38,
        "huge": rng.standard_normal((64, 9)) * 3e38,
        "ints": rng.integers(-8, 8, (64, 9)).astype(float),
        "ints15": rng.integers(0, 16, (64, 9)).astype(float),
        "halves": rng.integers(-16, 17, (64, 9)) / 2.0,
        "sym_ties": np.tile([[-8.0], [7.5], [0.5], [-0.5], [1.5], [2.5], [-3.5], [6.5]], (8, 9)),
        "asym_ties": np.tile([[0.0], [15.0], [7.5], [0.5], [14.5], [3.5], [1.0], [2.5]], (8, 9)),
        "positive": rng.uniform(1.0, 2.0, (64, 9)),
        "negative": rng.uniform(-2.0, -1.0, (64, 9)),
    }
    nanmix = rng.standard_normal((64, 9))
    nanmix[3, 0] = nanmix[40, 2] = nan
    nanmix[5:9, 4] = nan
    c["nanmix"] = nanmix
    return c


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", sorted(edge_cases()))
def test_edge_cases(isa, dtype, name):
    with np.errstate(over="ignore"):
        base = edge_cases()[name].astype(dtype)
    for bits in [4, 8]:
        for sym in [True, False]:
            for bs in [16, 32, 64]:
                for k in [64, 63, 61, 17, 1]:
                    check(np.ascontiguousarray(base[:k]), bits, bs, sym, isa)


@pytest.mark.parametrize("isa", isas())
def test_odd_k_every_position(isa):
    # The unpaired last element of an odd K (see nbits_kernel.rs): at a
    # work-item start, mid item, and right after a block boundary.
    rng = np.random.default_rng(5)
    for bs in BLOCK_SIZES:
        for k in sorted({1, 3, bs - 1, bs + 1, 2 * bs + 1, 3 * bs + 1, 4 * bs - 1, 4 * bs + 1}):
            w = rng.standard_normal((k, 11)).astype(np.float32)
            check(w, 4, bs, True, isa)
            check(w, 4, bs, False, isa)


def test_refusals():
    w = np.zeros((4, 4), np.float32)
    assert "allowed: 16, 32, 64, 128, 256" in pack_error("ort.matmul_nbits", w, block_size=48)
    assert "allowed: 4, 8" in pack_error("ort.matmul_nbits", w, bits=2)
    assert "unknown parameter" in pack_error("ort.matmul_nbits", w, colour="red")
    assert "2-D" in pack_error("ort.matmul_nbits", np.zeros((2, 2, 2), np.float32))
