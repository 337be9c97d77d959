"""ggml.q8_0 / ggml.q4_0 payloads are byte-identical with the gguf Python
package (gguf.quants.quantize), for every kernel instruction set of this
CPU. FLOAT16 sources are compared with gguf on the same values (gguf itself
widens to float32 first). See packraw.py for the binary."""

import warnings

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from packraw import first_difference, isas, pack, pack_error

TYPES = {"ggml.q8_0": T.Q8_0, "ggml.q4_0": T.Q4_0}


def reference(x: np.ndarray, fmt: str) -> bytes:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return quants.quantize(x, TYPES[fmt]).tobytes()


def check(x, fmt, isa):
    want = reference(x, fmt)
    got, info = pack(fmt, x, isa)
    assert info["name"] == fmt
    assert got == want, f"{fmt} {x.shape} {x.dtype} isa={isa}: {first_difference(got, want)}"


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("fmt", sorted(TYPES))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_random(isa, fmt, dtype):
    rng = np.random.default_rng(1)
    for shape in [(32,), (1, 32), (3, 64), (5, 7, 96), (600, 64), (17, 1024)]:
        for scale in [1e-4, 1.0, 300.0]:
            x = (rng.standard_normal(shape) * scale).astype(dtype)
            check(x, fmt, isa)


def blocks(rows):
    """Stacks 32-element rows (padded by cycling) into a [n, 32] array."""
    return np.array([np.resize(np.asarray(r, np.float32), 32) for r in rows], np.float32)


def edge_rows():
    nan, inf = np.float32("nan"), np.float32("inf")
    rng = np.random.default_rng(2)
    rows = [
        [0.0],
        [-0.0],
        [1.0],
        [-1.0],
        [3.0, -3.0, 1.0],  # tie of magnitudes: the first one wins (Q4_0)
        [-3.0, 3.0, 1.0],
        [nan, 1.0],
        [1.0, 2.0, nan],
        [-nan, 1.0],
        [1.0, inf, -2.0],
        [1.0, -inf, -2.0],
        [inf, -inf],
        [nan, inf],
        [127.0, 63.5, -63.5, 0.5, -0.5, 1.5, -2.5],  # Q8_0 exact halves
        [-8.0, 7.5, 0.5, -0.5, 4.5, -4.5],  # Q4_0 halves around 8.5
        [8.0, -7.5, 0.5, -0.5],
        [65504.0, -65519.0, 1.0],
        [1e30, -1e30, 1.0],
        [3.4e38, -3.4e38],
        rng.standard_normal(32) * 1e-42,  # subnormal: 1/d overflows
        rng.standard_normal(32) * 1e-39,
        rng.standard_normal(32) * 1e-37,
        rng.standard_normal(32) * 1e-6,  # d is a half subnormal
        [1.4e-45, -2.8e-45, 0.0],
        [1.2e-38, 0.0],
    ]
    for i in range(32):  # NaN at every position
        r = list(rng.standard_normal(32))
        r[i] = nan
        rows.append(r)
    for i in range(32):  # the maximum at every position
        r = list(rng.uniform(-1, 1, 32))
        r[i] = -5.0 if i % 2 else 5.0
        rows.append(r)
    return blocks(rows)


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("fmt", sorted(TYPES))
def test_edge_blocks(isa, fmt):
    x = edge_rows()
    check(x, fmt, isa)
    for i in range(x.shape[0]):  # one block alone, too
        check(x[i : i + 1], fmt, isa)
    with np.errstate(over="ignore"):
        check(x.astype(np.float16), fmt, isa)


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("fmt", sorted(TYPES))
def test_random_bit_patterns(isa, fmt):
    # Any finite bit pattern (NaN/inf excluded: numpy keeps the payload of
    # exotic NaNs only in some lanes, see ggml_kernel.rs).
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, 32 * 4096, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = np.where(np.isfinite(x), x, np.float32(1.0)).reshape(-1, 32)
    check(x, fmt, isa)


def test_refusals():
    assert "multiple of 32" in pack_error("ggml.q8_0", np.zeros((2, 48), np.float32))
    assert "scalar" in pack_error("ggml.q4_0", np.zeros((), np.float32))
    assert "unknown parameter" in pack_error("ggml.q4_0", np.zeros(32, np.float32), bits=4)
