"""The real-model corpus (``real_models.py``) through what ctcache does today.

* Each model is what the corpus says it is (a transformer, a conv net,
  weights in Constant nodes inside If subgraphs, pre-quantized, fp16): a
  corpus that drifted would make the other checks vacuous.
* onnxruntime runs each with its default session options.
* ``ctcachectl digest`` agrees with the independent D3 implementation on
  every initializer of every model.
* The int4 target is a drop-in for onnxruntime's MatMulNBitsQuantizer on the
  real models that have MatMuls: same initializers, bit-identical outputs
  under default session options.

The corpus is fetched (and its sha256 checked) by ``tests/run.sh``; run
alone, this module fetches it the same way. A missing model fails the test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

import ctl
import d3
import real_models
from real_models import CORPUS, RealModel
from test_materialize import quantize

BY_NAME = {m.name: m for m in CORPUS}


@pytest.fixture(scope="module", params=[m.name for m in CORPUS])
def real(request) -> RealModel:
    m = BY_NAME[request.param]
    real_models.fetch(m)  # raises (fails the test) when it cannot be had
    return m


def _graphs(g: onnx.GraphProto):
    """``g`` and every subgraph below it, depth first."""
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(a.g)
            for sub in a.graphs:
                yield from _graphs(sub)


def _constant_weights(g: onnx.GraphProto, at_least: int = 1024):
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.t.data_type == TensorProto.FLOAT and np.prod(a.t.dims) >= at_least:
                    yield n


def _ops(m: onnx.ModelProto) -> set[str]:
    return {n.op_type for g in _graphs(m.graph) for n in g.node}


def _has_role(m: onnx.ModelProto, role: str) -> bool:
    ops = _ops(m)
    top = m.graph
    if role == "transformer":
        float_b = {t.name for t in top.initializer if t.data_type == TensorProto.FLOAT and len(t.dims) == 2}
        return any(n.op_type == "MatMul" and n.input[1] in float_b for n in top.node)
    if role == "conv":
        return bool(ops & {"Conv", "ConvInteger"})
    if role == "constant-weights":
        return any(True for g in _graphs(top) for _ in _constant_weights(g))
    if role == "subgraph-weights":
        return any(True for g in list(_graphs(top))[1:] for _ in _constant_weights(g)) or any(
            g.initializer for g in list(_graphs(top))[1:])
    if role == "prequantized":
        return bool(ops & {"MatMulInteger", "ConvInteger", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul"})
    if role == "fp16":
        return sum(t.data_type == TensorProto.FLOAT16 for t in top.initializer) >= 100
    raise ValueError(role)


def test_the_corpus_covers_what_it_must():
    roles = {r for m in CORPUS for r in m.roles}
    assert {"transformer", "conv", "constant-weights", "subgraph-weights", "prequantized", "fp16"} <= roles
    assert len(CORPUS) >= 6
    assert len({m.sha256 for m in CORPUS}) == len(CORPUS)


def test_each_model_is_what_the_corpus_says(real):
    m = onnx.load(str(real.path))
    missing = [r for r in real.roles if not _has_role(m, r)]
    assert not missing, f"{real.name} lacks {missing}"


def test_onnxruntime_runs_each_model_with_default_options(real):
    sess = ort.InferenceSession(str(real.path))
    assert {i.name for i in sess.get_inputs()} == set(real.inputs)
    outs = sess.run(None, real_models.feeds(real))
    assert outs and all(o.size for o in outs)
    floats = [o for o in outs if o.dtype.kind == "f"]
    assert all(np.isfinite(o).all() for o in floats)


def test_digests_match_the_d3_reference(real):
    report = ctl.digest_json(str(real.path), None)
    m = onnx.load(str(real.path))
    assert set(report) == {t.name for t in m.graph.initializer}
    for t in m.graph.initializer:
        want = d3.digest(numpy_helper.to_array(t), t.data_type, "blake3")
        assert report[t.name]["digest"] == want, t.name


INT4_MODELS = [m.name for m in CORPUS if "transformer" in m.roles]


@pytest.mark.parametrize("name", INT4_MODELS)
def test_int4_is_bit_identical_with_the_quantizer_under_default_options(name, tmp_path: Path):
    real = BY_NAME[name]
    real_models.fetch(real)
    out = tmp_path / "m.onnx"
    r = ctl.run("materialize", "--local", "--target", "onnxruntime-int4", str(real.path), "-o", str(out))
    assert r.returncode == 0, r.describe()
    ref = quantize(real.path, bits=4, block_size=32, symmetric=True)
    got, want = ort.InferenceSession(str(out)), ort.InferenceSession(ref.SerializeToString())
    for seed in (1, 2):
        feeds = real_models.feeds(real, seed)
        for x, y in zip(got.run(None, feeds), want.run(None, feeds)):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert np.array_equal(x, y), f"max |diff| {np.max(np.abs(x.astype(np.float64) - y))}"
