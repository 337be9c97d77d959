"""``ctcachectl materialize --local`` streams a model rather than holding it.

A model of 256 MiB of FLOAT MatMul weights in external data (written with
numpy straight to the data file) is materialized to each onnxruntime target
in a child process whose peak RSS is measured the way
``bench/large_model_bench.py`` does it (``ru_maxrss`` of a child forked from
a small process, so the figure is the child's own). The peak must stay under
half the model's size: a materialize that mapped or read the whole model and
kept it resident would pass its size. The output loads in onnxruntime and
gives the same result as the fp32 model, within the target's rounding.
``bench/large_model_bench.sh`` measures the same on 3 GiB.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from e2e.harness import bin_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from large_model_bench import materialize_cmd, run_measured  # noqa: E402
from materialize_bench import make_model  # noqa: E402

LAYERS, DIM = 16, 2048  # 16 x 16 MiB = 256 MiB of fp32 weights
MODEL_MIB = LAYERS * DIM * DIM * 4 / (1 << 20)
# Each target's rounding of weights of scale 1/sqrt(DIM), over 16 layers.
TOLERANCE = {"int4": 0.5, "int8": 0.1, "fp16": 0.01}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("large")
    return make_model(folder, LAYERS, DIM)


@pytest.fixture(scope="module")
def expected(model):
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": _input()})[0]


def _input() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((1, DIM)).astype(np.float32)


@pytest.mark.parametrize("target", ["int4", "int8", "fp16"])
def test_local_materialize_stays_well_under_the_model_size(model, expected, target, tmp_path):
    ctl = bin_dir() / "ctcachectl"
    if not ctl.is_file():
        pytest.skip(f"ctcachectl not built ({ctl}); build it or set CTCACHE_BIN_DIR")
    out = tmp_path / "out" / "model.onnx"
    run = run_measured(materialize_cmd(bin_dir(), model, out, target, None), 600, tmp_path / "ctl.log")
    assert run["rc"] == 0 and not run["timed_out"], run["output"]
    assert run["rss_mib"] < MODEL_MIB / 2, (
        f"peak RSS {run['rss_mib']:.0f} MiB for a {MODEL_MIB:.0f} MiB model: materialize held the model in memory")
    y = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"X": _input()})[0]
    err = np.abs(y - expected).max() / np.abs(expected).max()
    assert err < TOLERANCE[target], f"{target}: relative error {err:.3g}"
