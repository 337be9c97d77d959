"""Embedded models stay ordinary ONNX models.

`ctcachectl embed` packs initializers locally and splices the compiled tensors
into a copy of the model (byte-preserving rewrite). The result must pass
`onnx.checker.check_model` and `ctcachectl check`, onnxruntime must give
bit-identical outputs, unknown fields must survive, and `strip` must give
back the original bytes.
"""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ctl

FORMATS = ["ort.matmul_nbits", "ggml.q8_0", "ggml.q4_0", "cast.f16", "cast.bf16", "gemm.pack_b.f32"]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def make_model(path, k=256, n=256, with_unknown=True) -> bytes:
    """W1[k, n] feeds a MatMul (65,536 elements by default: what the policy's filters admit);
    W2[n, 64] and the bias B are below them."""
    rng = np.random.default_rng(7)
    w1 = rng.standard_normal((k, n)).astype(np.float32)
    w2 = rng.standard_normal((n, 64)).astype(np.float32)
    bias = rng.standard_normal((64,)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["H"]),
        helper.make_node("Relu", ["H"], ["R"]),
        helper.make_node("Gemm", ["R", "W2", "B"], ["Y"]),
    ]
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 64])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2"), numpy_helper.from_array(bias, "B")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    data = m.SerializeToString()
    if with_unknown:
        # Field 77 inside GraphProto and inside ModelProto: future ONNX fields.
        g_bytes = m.graph.SerializeToString() + _field(77, b"future graph field")
        m.ClearField("graph")
        data = m.SerializeToString() + _field(7, g_bytes) + _field(77, b"future model field")
    path.write_bytes(data)
    return data


def run_model(path, x):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": x})[0]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("sidecar", [False, True])
def test_embedded_model_is_valid_and_runs_identically(tmp_path, fmt, sidecar):
    src = tmp_path / "model.onnx"
    original = make_model(src)
    out = tmp_path / "embedded.onnx"
    args = ["embed", str(src), "-o", str(out), "--format", fmt]
    if sidecar:
        args.append("--sidecar")
    r = ctl.run(*args)
    assert r.returncode == 0, r.describe()
    embedded = out.read_bytes()
    # Every original byte kept in place; compiled fields appended.
    assert embedded[: len(original)] == original
    assert len(embedded) > len(original)
    if sidecar:
        assert (tmp_path / "embedded.onnx.ctdata").exists()

    onnx.checker.check_model(str(out), full_check=True)
    assert ctl.run("check", str(out)).returncode == 0
    inspect = ctl.run_json("inspect", str(out))
    assert inspect["compiled_tensors"], inspect
    assert all(e["status"] == "hit" for e in inspect["compiled_tensors"]), inspect

    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    y0 = run_model(src, x)
    y1 = run_model(out, x)
    assert y0.tobytes() == y1.tobytes()

    stripped = tmp_path / "stripped.onnx"
    assert ctl.run("strip", str(out), "-o", str(stripped)).returncode == 0
    assert stripped.read_bytes() == original


def test_embed_refuses_unsupported_initializer(tmp_path):
    src = tmp_path / "model.onnx"
    make_model(src)
    r = ctl.run("embed", str(src), "-o", str(tmp_path / "o.onnx"), "--format", "ort.matmul_nbits", "--initializer", "B")
    assert r.returncode == 1
    assert "B" in r.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_external_data_is_only_embedded_beside_its_model(tmp_path):
    """The output keeps the model's external-data locations: written in
    another folder it could not find the data, so that is refused, nothing
    written; beside the model it loads in onnx and onnxruntime."""
    src = tmp_path / "model.onnx"
    make_model(src, with_unknown=False)
    m = onnx.load(str(src))
    onnx.save(m, str(src), save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data",
              size_threshold=0)
    elsewhere = tmp_path / "other" / "e.onnx"
    r = ctl.run("embed", str(src), "-o", str(elsewhere), "--format", "cast.f16")
    assert r.returncode != 0 and "model.onnx.data" in r.stderr and "model's folder" in r.stderr, r.describe()
    assert not elsewhere.parent.exists()
    x = np.random.default_rng(2).standard_normal((3, 256)).astype(np.float32)
    beside = tmp_path / "e.onnx"
    # Beside the model, or where a copy of its data file was put first.
    elsewhere.parent.mkdir()
    shutil.copyfile(tmp_path / "model.onnx.data", elsewhere.parent / "model.onnx.data")
    for out in (beside, elsewhere):
        r = ctl.run("embed", str(src), "-o", str(out), "--format", "cast.f16", "--sidecar")
        assert r.returncode == 0, r.describe()
        onnx.checker.check_model(str(out), full_check=True)
        assert run_model(out, x).tobytes() == run_model(src, x).tobytes()
    # A location leaving the folder names no file there, even one that exists
    # (the daemon, embedding for a caller, probes nothing outside the folder).
    m = onnx.load(str(src), load_external_data=False)
    ext = next(t for t in m.graph.initializer if t.name == "B")
    for e in ext.external_data:
        if e.key == "location":
            e.value = "../model.onnx.data"
    inner = tmp_path / "inner"
    inner.mkdir()
    shutil.copyfile(tmp_path / "model.onnx.data", inner / "model.onnx.data")
    escaping = inner / "m.onnx"
    onnx.save(m, str(escaping))
    out = inner / "e.onnx"
    r = ctl.run("embed", str(escaping), "-o", str(out), "--format", "cast.f16", "--initializer", "W1")
    assert r.returncode != 0 and "../model.onnx.data" in r.stderr, r.describe()
    assert not out.exists()


def test_embed_twice_needs_replace(tmp_path):
    src = tmp_path / "model.onnx"
    make_model(src)
    once = tmp_path / "once.onnx"
    assert ctl.run("embed", str(src), "-o", str(once), "--format", "cast.f16").returncode == 0
    r = ctl.run("embed", str(once), "-o", str(tmp_path / "twice.onnx"), "--format", "cast.f16")
    assert r.returncode == 1 and "replace" in r.stderr
    r = ctl.run("embed", str(once), "-o", str(tmp_path / "twice.onnx"), "--format", "cast.f16", "--replace")
    assert r.returncode == 0, r.describe()
    twice = ctl.run_json("inspect", str(tmp_path / "twice.onnx"))
    assert len(twice["compiled_tensors"]) == 1  # W1: W2 and B are below the filters


def test_stale_after_initializer_change(tmp_path):
    """An embedded entry whose initializer changed is a stale miss, not an error."""
    src = tmp_path / "model.onnx"
    make_model(src, with_unknown=False)
    out = tmp_path / "e.onnx"
    assert ctl.run("embed", str(src), "-o", str(out), "--format", "cast.f16", "--initializer", "W1").returncode == 0
    m = onnx.load(str(out))
    w = numpy_helper.to_array(m.graph.initializer[0]).copy()
    w[0, 0] += 1.0
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "W1"))
    # Python protobuf keeps the unknown compiled-tensor fields when re-serializing.
    changed = tmp_path / "changed.onnx"
    changed.write_bytes(m.SerializeToString())
    info = ctl.run_json("inspect", str(changed))
    assert info["compiled_tensors"][0]["status"] == "miss"
    assert info["compiled_tensors"][0]["reason"] == "stale_digest"


def _fields(buf: bytes):
    """(number, wire type, value) of each top-level protobuf field."""
    pos = 0

    def varint():
        nonlocal pos
        shift = out = 0
        while True:
            b = buf[pos]
            pos += 1
            out |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return out

    while pos < len(buf):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, wire, varint()
        elif wire == 2:
            n = varint()
            yield number, wire, buf[pos : pos + n]
            pos += n
        elif wire == 1:
            yield number, wire, buf[pos : pos + 8]
            pos += 8
        elif wire == 5:
            yield number, wire, buf[pos : pos + 4]
            pos += 4
        else:
            raise ValueError(f"wire type {wire}")


def _payloads(model_path):
    """The payload bytes of each compiled tensor (ModelProto field 1002), in order."""
    out = []
    for number, _, entry in _fields(model_path.read_bytes()):
        if number != 1002:
            continue
        value = next(v for n, _, v in _fields(entry) if n == 2)
        raw, ext = b"", {}
        for n, _, v in _fields(value):
            if n == 3:
                raw = v
            elif n == 4:
                kv = {k: x for k, _, x in _fields(v)}
                ext[kv[1].decode()] = kv[2].decode()
        if ext:
            data = (model_path.parent / ext["location"]).read_bytes()
            off, length = int(ext["offset"]), int(ext["length"])
            raw = data[off : off + length]
        out.append(raw)
    return out


@pytest.mark.parametrize("where", ["in_place", "beside", "elsewhere"])
def test_a_second_format_keeps_the_first_entries_right(tmp_path, where):
    """The issue's reproduction: nbits then q8_0 into the same file, another name or another folder.

    Every entry is a hit and its bytes are what `ctcachectl pack` makes for that initializer and
    format (before the fix, in place, the nbits entries pointed into a sidecar rewritten with q8_0
    bytes and still were hits; elsewhere, they pointed at a sidecar that was not there).
    """
    src = tmp_path / "m.onnx"
    make_model(src, with_unknown=False)
    e1 = tmp_path / "e1.onnx"
    # Named initializers: past the policy's size filters (W2 and B are small).
    names = ["--initializer", "W1", "--initializer", "W2"]
    r = ctl.run("embed", str(src), "-o", str(e1), "--format", "ort.matmul_nbits", *names, "--sidecar", "--local")
    assert r.returncode == 0, r.describe()
    out = {"in_place": e1, "beside": tmp_path / "e2.onnx", "elsewhere": tmp_path / "other" / "e2.onnx"}[where]
    out.parent.mkdir(exist_ok=True)
    # Rewriting the input in place is asked for explicitly.
    force = ["--force"] if where == "in_place" else []
    r = ctl.run("embed", str(e1), "-o", str(out), "--format", "ggml.q8_0", *names, "--initializer", "B", "--sidecar", "--local", *force)
    assert r.returncode == 0, r.describe()
    assert ctl.run("check", str(out)).returncode == 0
    entries = ctl.run_json("inspect", str(out))["compiled_tensors"]
    assert all(e["status"] == "hit" for e in entries), entries
    # W1[256, 96] and W2[96, 64] take both formats; B[64] only q8_0.
    assert sorted((e["source_name"], e["packer"]) for e in entries) == [
        ("B", "ggml.q8_0"),
        ("W1", "ggml.q8_0"),
        ("W1", "ort.matmul_nbits"),
        ("W2", "ggml.q8_0"),
        ("W2", "ort.matmul_nbits"),
    ]
    for e, payload in zip(entries, _payloads(out)):
        packed = tmp_path / f"{e['source_name']}.{e['packer']}.bin"
        r = ctl.run("pack", str(src), "--initializer", e["source_name"], "--format", e["packer"], "-o", str(packed))
        assert r.returncode == 0, r.describe()
        assert payload == packed.read_bytes(), (e, where)
