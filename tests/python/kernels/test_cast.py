"""cast.f16 / cast.bf16 payloads are byte-identical with numpy
`astype(np.float16)` and ml_dtypes `astype(bfloat16)` (NaN payloads
included), for every kernel instruction set of this CPU. See packraw.py for
the binary."""

import ml_dtypes
import numpy as np
import pytest

from packraw import first_difference, isas, pack, pack_error

TARGETS = {"cast.f16": np.float16, "cast.bf16": ml_dtypes.bfloat16}


def check(x, fmt, isa):
    with np.errstate(all="ignore"):
        want = x.astype(TARGETS[fmt]).tobytes()
    got, info = pack(fmt, x, isa)
    assert info["name"] == fmt
    assert info["dims"] == ",".join(map(str, x.shape))
    assert got == want, f"{fmt} {x.shape} isa={isa}: {first_difference(got, want)}"


def special_bits():
    s = [
        0x7F800001, 0x7FC00000, 0xFFC00000, 0x7F802000, 0x7FA00000, 0xFF800001, 0x7FFFFFFF,
        0x7F800000, 0xFF800000, 0x7F801FFF, 0x7FC00001, 0x477FEFFF, 0x477FF000, 0x477FE000,
        0x33000000, 0x33000001, 0x387FC000, 0x387FE000, 0x38800000, 0x7F7FFFFF, 0x00000001,
        0x00008000, 0x00018000, 0x3F808000, 0x3F818000, 0x3F801000, 0x3F803000, 0x80000000, 0,
    ]
    s = np.array(s + [b | 0x80000000 for b in s], np.uint32)
    # Every rounding boundary of the half range, plus its neighbours.
    e = np.arange(0x33000000, 0x47800000, 0x1000, dtype=np.uint32)
    return np.concatenate([s, e - 1, e, e + 1])


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("fmt", sorted(TARGETS))
def test_specials_and_boundaries(isa, fmt):
    x = special_bits().view(np.float32)
    check(x, fmt, isa)
    for n in [1, 7, 15, 16, 17, 33]:  # vector tails
        check(x[:n], fmt, isa)


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("fmt", sorted(TARGETS))
def test_random_bit_patterns(isa, fmt):
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    check(bits.view(np.float32).reshape(256, 4096), fmt, isa)


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("fmt", sorted(TARGETS))
def test_shapes(isa, fmt):
    rng = np.random.default_rng(8)
    for shape in [(), (0,), (1,), (3, 5), (2, 3, 4, 5), (70001,)]:
        check(rng.standard_normal(shape).astype(np.float32), fmt, isa)


def test_refusals():
    assert "supported: FLOAT" in pack_error("cast.f16", np.zeros(4, np.float16))
