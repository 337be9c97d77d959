"""The real-model corpus (``real_models.py``) through what ctcache does today.

* Each model is what the corpus says it is (a transformer, a conv net,
  weights in Constant nodes inside If subgraphs, pre-quantized, fp16): a
  corpus that drifted would make the other checks vacuous.
* onnxruntime runs each with its default session options.
* ``ctcachectl digest`` agrees with the independent D3 implementation on
  every initializer of every model.
* The int4 target is a drop-in for onnxruntime's MatMulNBitsQuantizer on the
  real models that have MatMuls: bit-identical outputs under default session
  options.
* ``ctcache.ort.inference_session`` opens a model with nothing to rewrite as
  it is (a warning; ``strict=True`` raises), reports what came from the
  cache, and its no-daemon fallback is quiet.

The corpus is fetched (and its sha256 checked) by ``tests/run.sh``; run
alone, this module fetches it the same way. A missing model fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
from e2e.harness import Daemon
from test_materialize import quantize
from test_python_client import ctcache, installed  # noqa: F401  (session fixtures: pip-installed client)

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


def _typed_shapes(g: onnx.GraphProto) -> dict[str, tuple]:
    def dims(t):
        if not t.HasField("shape"):
            return None
        return tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim)
    return {v.name: (v.type.tensor_type.elem_type, dims(v.type.tensor_type)) for v in g.value_info}


# Models whose every top-level op the Rust shape inference covers: their
# value_info is onnx's, entry for entry.
SHAPES_COMPLETE = ("minilm-l3", "magika")
# What each target converts (the conformance table has the others).
CONVERTED = [("onnxruntime-int8", n) for n in ("minilm-l3", "magika", "ddddocr-det")] + [
    ("onnxruntime-fp16", n) for n in ("minilm-l3", "magika", "ddddocr-det", "silero-vad")]


def _numbers(shape):
    return None if shape is None else tuple(d if isinstance(d, int) else None for d in shape)


@pytest.mark.parametrize("target,name", CONVERTED)
def test_value_info_is_what_onnx_shape_inference_writes(target, name, tmp_path: Path):
    """The int8 and fp16 targets write the value_info onnx's infer_shapes
    gives the source (what quantize_dynamic and the float16 converter
    start from; onnxruntime's optimizer fuses by these shapes). On the
    models whose ops it covers, the very entries onnx writes (FLOAT16 where
    the fp16 target holds the value so), symbols included; on the others,
    never another element type, rank or number than onnx's."""
    real = BY_NAME[name]
    real_models.fetch(real)
    out = tmp_path / "m.onnx"
    flags = ("--op-types", "MatMul,Gather,Conv") if target == "onnxruntime-int8" else ()
    r = ctl.run("materialize", "--local", "--target", target, *flags, str(real.path), "-o", str(out))
    assert r.returncode == 0, r.describe()
    source = onnx.load(str(real.path), load_external_data=False)
    declared = {v.name for v in source.graph.value_info}
    want = {k: v for k, v in _typed_shapes(onnx.shape_inference.infer_shapes(source).graph).items()
            if k not in declared}
    got = {k: v for k, v in _typed_shapes(onnx.load(str(out), load_external_data=False).graph).items()
           if k not in declared}
    if target == "onnxruntime-fp16":
        want = {k: (TensorProto.FLOAT16 if t == TensorProto.FLOAT else t, s) for k, (t, s) in want.items()}
    if name in SHAPES_COMPLETE:
        assert got == want
        assert len(got) > 50
        return
    for k, (t, shape) in got.items():
        assert k in want, f"{k}: onnx infers no type for it"
        wt, wshape = want[k]
        assert t == wt, f"{k}: element type {t}, onnx's {wt}"
        if shape is not None:
            assert _numbers(shape) == _numbers(wshape), f"{k}: shape {shape}, onnx's {wshape}"


# ---------------------------------------------------------------- sessions


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("real-daemon"))
    try:
        yield d.start()
    finally:
        d.stop()


def _same_outputs(a, b, m: RealModel) -> None:
    feeds = real_models.feeds(m)
    for x, y in zip(a.run(None, feeds), b.run(None, feeds)):
        assert np.array_equal(x, y)


def test_a_session_opens_a_model_with_nothing_to_rewrite_as_it_is(ctcache, daemon):  # noqa: F811
    import ctcache.ort

    conv = real_models.fetch(BY_NAME["ddddocr-det"])
    with pytest.warns(ctcache.ort.AsIsWarning, match="no node of the op types rewritten") as caught:
        sess = ctcache.ort.inference_session(conv, socket=str(daemon.socket))
    assert len(caught) == 1
    report = sess.ctcache_report
    assert report.source == "as-is" and "nothing to materialize" in report.why
    assert report.seconds > 0 and "as-is" in str(report)
    _same_outputs(sess, ort.InferenceSession(str(conv)), BY_NAME["ddddocr-det"])
    with pytest.raises(ctcache.NothingToRewrite, match="nothing to materialize"):
        ctcache.ort.inference_session(conv, socket=str(daemon.socket), strict=True)


def test_a_session_reports_what_came_from_the_cache(ctcache, daemon):  # noqa: F811
    import ctcache.ort

    enc = real_models.fetch(BY_NAME["minilm-l3"])
    first = ctcache.ort.inference_session(enc, socket=str(daemon.socket)).ctcache_report
    again = ctcache.ort.inference_session(enc, socket=str(daemon.socket)).ctcache_report
    assert first.source == again.source == "daemon"
    assert first.rewritten == again.rewritten == 18
    assert first.packed + first.cached == again.cached and again.packed == 0
    # The attention MatMuls (both inputs computed) are left, and said so.
    assert len(again.skipped) == 6 and all(op == "MatMul" for _, op, _ in again.skipped)
    assert "18 node(s) rewritten" in str(again) and f"{again.cached} weight(s) from the cache" in str(again)


FALLBACK_SCRIPT = """
import logging, sys, warnings
import ctcache.ort
before = list(logging.getLogger().handlers)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    sess = ctcache.ort.inference_session(sys.argv[1], socket=sys.argv[2], target=sys.argv[3])
assert [x.category.__name__ for x in w] == ["FallbackWarning"], [str(x.message) for x in w]
assert sess.ctcache_report.source == "fallback", sess.ctcache_report
assert logging.getLogger().handlers == before, logging.getLogger().handlers
print("ok", sess.ctcache_report.source)
"""


@pytest.mark.parametrize("target", ["onnxruntime-int4", "onnxruntime-int8"])
def test_the_fallback_is_quiet(installed, tmp_path, target):  # noqa: F811
    """No daemon: one warning, none of the reference tools' INFO lines, the root logger untouched."""
    enc = real_models.fetch(BY_NAME["magika"])
    env = dict(os.environ, PYTHONPATH=f"{installed}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT, str(enc), str(tmp_path / "none.sock"), target],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok fallback"
    assert "INFO" not in r.stderr, r.stderr[:2000]


def test_the_default_output_is_outside_watched_folders(ctcache, tmp_path, monkeypatch):  # noqa: F811
    """A model in a watched folder is materialized under the cache home: the
    watcher would take an output beside it for a new model."""
    watch = tmp_path / "watched"
    d = Daemon(tmp_path / "d", watch=watch)
    d.start()
    try:
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache-home"))
        model = watch / "magika.onnx"
        model.write_bytes(real_models.fetch(BY_NAME["magika"]).read_bytes())
        r = ctcache.materialize(model, socket=str(d.socket))
        out = Path(r.output_path)
        assert watch not in out.parents and (tmp_path / "cache-home") in out.parents, out
        elsewhere = tmp_path / "plain" / "magika.onnx"
        elsewhere.parent.mkdir()
        elsewhere.write_bytes(model.read_bytes())
        assert Path(ctcache.materialize(elsewhere, socket=str(d.socket)).output_path).parent == elsewhere.parent
    finally:
        d.stop()


def test_messages_on_a_conv_net_name_what_it_becomes_and_what_would_take_it(tmp_path):
    conv = real_models.fetch(BY_NAME["ddddocr-det"])
    r = ctl.run("materialize", "--local", str(conv), "-o", str(tmp_path / "int4.onnx"))
    assert r.returncode != 0
    assert r.stderr.strip().endswith(
        "(MatMul, Gemm); --target onnxruntime-int8 --op-types Conv quantizes its 83 Conv"), r.describe()
    assert "  " not in r.stderr, r.describe()
    r = ctl.run("materialize", "--local", "--target", "onnxruntime-int8", "--op-types", "Conv", str(conv),
                "-o", str(tmp_path / "int8.onnx"))
    assert r.returncode == 0, r.describe()
    assert ": 83 node(s) -> ConvInteger (int8, per tensor)," in r.stdout, r.describe()


def test_an_fp16_model_of_constant_weights_says_they_are_in_the_model(tmp_path):
    vad = real_models.fetch(BY_NAME["silero-vad"])
    out = tmp_path / "vad16.onnx"
    r = ctl.run("materialize", "--local", "--target", "onnxruntime-fp16", str(vad), "-o", str(out))
    assert r.returncode == 0, r.describe()
    assert "every weight is in the model; wrote" in r.stdout, r.describe()
    assert not out.with_name("vad16.onnx.weights").exists()


def test_the_default_policy_packs_what_the_default_target_reads(ctcache, tmp_path):  # noqa: F811
    """What the policy packs for an encoder (as a watched folder's model gets
    it) is all its first int4 materialize reads: the MatMul weights in 4
    bits and the embedding table it places whole beside the model; why-miss
    calls both hits."""
    d = Daemon(tmp_path / "d")
    d.start()
    try:
        model = tmp_path / "enc.onnx"
        model.write_bytes(real_models.fetch(BY_NAME["minilm-l3"]).read_bytes())
        r = d.ctl("prepack", str(model), "--wait")
        assert r.returncode == 0, r.describe()
        # why-miss agrees: the embedding table and a MatMul weight are hits.
        source = onnx.load(str(model), load_external_data=False)
        weight = next(n.input[1] for n in source.graph.node if n.op_type == "MatMul"
                      and n.input[1] in {t.name for t in source.graph.initializer})
        for name in ("model.0.auto_model.embeddings.word_embeddings.weight", weight):
            r = d.ctl("why-miss", str(model), name, "--json")
            assert r.returncode == 0 and json.loads(r.stdout)["hit"] is True, r.describe()
        r = d.ctl("materialize", str(model), "-o", str(tmp_path / "out" / "enc.onnx"))
        assert r.returncode == 0, r.describe()
        assert "19 weight(s) from the cache, 0 packed now" in r.stdout, r.describe()
    finally:
        d.stop()
