"""gemm.pack_b.f32 payloads equal the panel layout built with numpy: panel
p = W[:, p*NR:(p+1)*NR] (zero-padded), panels back to back. See packraw.py
for the binary."""

import numpy as np
import pytest

from packraw import isas, pack, pack_error


def panels(w: np.ndarray, nr: int) -> bytes:
    k, n = w.shape
    p = -(-n // nr)
    padded = np.zeros((k, p * nr), np.float32)
    padded[:, :n] = w
    return padded.reshape(k, p, nr).transpose(1, 0, 2).tobytes()


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("nr", [8, 16, 32])
def test_panels(isa, nr):
    rng = np.random.default_rng(nr)
    for k, n in [(1, 1), (3, 7), (5, 16), (17, 33), (64, 100)]:
        w = rng.standard_normal((k, n)).astype(np.float32)
        w.view(np.uint32)[0, 0] = 0x7FA00001  # a signalling NaN stays bit-exact
        got, info = pack("gemm.pack_b.f32", w, isa, panel=nr)
        assert info["name"] == f"gemm.pack_b.f32.nr{nr}"
        assert info["dims"] == f"{-(-n // nr)},{k}"
        assert got == panels(w, nr)


def test_host_default():
    w = np.ones((2, 3), np.float32)
    _, info = pack("gemm.pack_b.f32", w, isas()[0])
    assert info["name"] in {"gemm.pack_b.f32.nr8", "gemm.pack_b.f32.nr16", "gemm.pack_b.f32.nr32"}


def test_refusals():
    assert "allowed: host, 8, 16, 32" in pack_error("gemm.pack_b.f32", np.zeros((2, 2), np.float32), panel=4)
