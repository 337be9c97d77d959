"""Cross-check ``ctcachectl digest --json`` against the independent D3 implementation.

For every ONNX element type (FLOAT=1 .. INT2=26) and a set of shapes (scalar, empty,
odd element counts that exercise sub-byte padding, multi-dimensional), the same random
array is stored three ways in one model -- ``raw_data``, the typed field, and external
data (all external tensors of a model share one data file, at nonzero offsets, with junk
around them) -- and ctcache must report, for both algorithms:

* the digest ``d3.digest`` computes from the numpy array,
* one digest for the three storage methods of the same tensor,
* the right ``data_type``, ``dims``, ``algorithm`` and ``storage``.

STRING has no raw or external form in ONNX: typed (string_data) only.

Run:  /var/tmp/ctcache-venv/bin/python -m pytest tests/python/test_digest_crosscheck.py
(the binary is $CTCACHECTL or ${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}/debug/ctcachectl;
tests skip when it is missing).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

import numpy as np
import pytest
from onnx import TensorProto, helper

import ctl
import d3

HEX64 = re.compile(r"^[0-9a-f]{64}$")

# name -> shape.  Element counts 1, 2, 3, 5, 6, 7, 15 cover every remainder mod 2 and
# mod 4, so 4-bit and 2-bit types get every amount of zero padding in the last byte.
SHAPES: dict[str, tuple[int, ...]] = {
    "scalar": (),
    "empty": (0,),
    "empty_3d": (3, 0, 2),
    "n1": (1,),
    "n2": (2,),
    "n3": (3,),
    "n5": (5,),
    "n6": (6,),
    "n7": (7,),
    "m3x5": (3, 5),
    "c2x3x4": (2, 3, 4),
    "w4x33": (4, 33),
    "d1x1x1x9": (1, 1, 1, 9),
}


@dataclass
class Case:
    """One tensor of a cross-check model."""

    name: str
    data_type: int
    shape: tuple[int, ...]
    storage: str
    group: str  # same group = same array, different storage
    expected: dict[str, str] = field(default_factory=dict)  # algorithm -> digest


@dataclass
class BuiltModel:
    path: str
    cases: dict[str, Case]


def _seed(*parts) -> int:
    """Deterministic seed from the parts (no Python hash randomization)."""
    return int(d3.hash_bytes(repr(parts).encode(), "sha256")[:8], 16)


def build_type_model(directory: str, data_type: int) -> BuiltModel:
    """One model per data type: every shape in every storage the type allows."""
    rng = np.random.default_rng(_seed("crosscheck", data_type))
    tname = d3.type_name(data_type)
    tensors, cases = [], {}
    with d3.ExternalDataFile(directory, f"{tname}.data") as ext:  # next to the model
        for shape_name, shape in SHAPES.items():
            arr = d3.random_array(data_type, shape, rng)
            expected = {alg: d3.digest(arr, data_type, alg) for alg in d3.ALGORITHMS}
            group = f"{tname}/{shape_name}"
            for storage in d3.supported_storages(data_type):
                name = f"{tname}.{shape_name}.{storage}"
                tensors.append(d3.make_tensor(name, arr, data_type, storage, ext))
                cases[name] = Case(name, data_type, shape, storage, group, expected)
    path = os.path.join(directory, f"{tname}.onnx")
    d3.save_model(d3.make_model(tensors, graph_name=tname), path)
    return BuiltModel(path, cases)


@pytest.fixture(scope="module")
def type_models(tmp_path_factory) -> dict[int, BuiltModel]:
    root = tmp_path_factory.mktemp("crosscheck")
    return {dt: build_type_model(str(root), dt) for dt in d3.ALL_DATA_TYPES}


def storage_ok(case: Case, reported: str) -> bool:
    """A zero-element tensor stored as raw_data (empty bytes) and one with an empty typed
    field are the same bytes for a proto3 reader, so either answer is right there."""
    if math.prod(case.shape) == 0 and case.storage in ("raw", "typed"):
        return reported in ("raw", "typed")
    return reported == case.storage


def check_report(report: dict, cases: dict[str, Case], algorithm: str) -> None:
    assert set(report) == set(cases), (
        f"initializer names differ: missing {sorted(set(cases) - set(report))}, "
        f"extra {sorted(set(report) - set(cases))}"
    )
    errors = []
    for name, case in cases.items():
        e = report[name]
        want = case.expected[algorithm]
        if e["data_type"] != case.data_type:
            errors.append(f"{name}: data_type {e['data_type']} != {case.data_type}")
        if list(e["dims"]) != list(case.shape):
            errors.append(f"{name}: dims {e['dims']} != {list(case.shape)}")
        if e["algorithm"] != algorithm:
            errors.append(f"{name}: algorithm {e['algorithm']!r} != {algorithm!r}")
        if not HEX64.match(str(e["digest"])):
            errors.append(f"{name}: digest {e['digest']!r} is not 64 lowercase hex digits")
        elif e["digest"] != want:
            errors.append(f"{name}: digest {e['digest']} != d3 {want}")
        if not storage_ok(case, e["storage"]):
            errors.append(f"{name}: storage {e['storage']!r} != {case.storage!r}")
    # One digest per tensor whatever the storage.
    groups: dict[str, set[str]] = {}
    for name, case in cases.items():
        groups.setdefault(case.group, set()).add(report[name]["digest"])
    for group, digests in groups.items():
        if len(digests) != 1:
            errors.append(f"{group}: storage methods give different digests {sorted(digests)}")
    assert not errors, f"{len(errors)} mismatches ({algorithm}):\n" + "\n".join(errors[:60])


# ---------------------------------------------------------------------------------------
# Every type x every storage x both algorithms
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", d3.ALGORITHMS)
@pytest.mark.parametrize("data_type", d3.ALL_DATA_TYPES, ids=d3.type_name)
def test_every_type_every_storage(type_models, data_type, algorithm):
    ctl.require_ctcachectl()
    built = type_models[data_type]
    check_report(ctl.digest_json(built.path, algorithm), built.cases, algorithm)


@pytest.mark.parametrize("data_type", d3.ALL_DATA_TYPES, ids=d3.type_name)
def test_default_algorithm_is_blake3(type_models, data_type):
    ctl.require_ctcachectl()
    built = type_models[data_type]
    check_report(ctl.digest_json(built.path, None), built.cases, "blake3")


@pytest.mark.parametrize("data_type", d3.ALL_DATA_TYPES, ids=d3.type_name)
def test_check_accepts_valid_models(type_models, data_type):
    """The cross-check models are valid ONNX (onnx.checker passes them): `check` says 0."""
    r = ctl.run("check", type_models[data_type].path)
    assert r.returncode == 0, r.describe()


# ---------------------------------------------------------------------------------------
# Wire encodings: packed and unpacked repeated scalars
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_wire_encodings(tmp_path, packed):
    """dims and typed fields encoded packed (proto3 writers) and unpacked (one tag per
    value) give the same digests; raw tensors ride along."""
    ctl.require_ctcachectl()
    rng = np.random.default_rng(_seed("wire", packed))
    tensors, cases = [], {}
    for dt in d3.ALL_DATA_TYPES:
        for shape in [(), (7,), (2, 3, 5)]:
            arr = d3.random_array(dt, shape, rng)
            expected = {alg: d3.digest(arr, dt, alg) for alg in d3.ALGORITHMS}
            for storage in ("raw", "typed") if dt != TensorProto.STRING else ("typed",):
                name = f"{d3.type_name(dt)}.{len(shape)}d.{storage}"
                tensors.append(d3.make_tensor(name, arr, dt, storage))
                cases[name] = Case(name, dt, shape, storage, f"{dt}/{shape}", expected)
    path = tmp_path / "wire.onnx"
    path.write_bytes(d3.encode_model(tensors, packed=packed))
    for alg in d3.ALGORITHMS:
        check_report(ctl.digest_json(str(path), alg), cases, alg)


# ---------------------------------------------------------------------------------------
# What enters the digest and what does not
# ---------------------------------------------------------------------------------------


def test_header_distinguishes_shape_and_type(tmp_path):
    """Same 24 content bytes under different dims / data types: all digests differ,
    each matches d3.  Same tensor under different names: one digest."""
    ctl.require_ctcachectl()
    content = bytes(range(24))
    variants = [
        (TensorProto.FLOAT, (6,)),
        (TensorProto.FLOAT, (2, 3)),
        (TensorProto.FLOAT, (3, 2)),
        (TensorProto.FLOAT, (1, 6)),
        (TensorProto.FLOAT, (6, 1)),
        (TensorProto.INT32, (6,)),
        (TensorProto.UINT32, (6,)),
        (TensorProto.INT16, (12,)),
        (TensorProto.UINT8, (24,)),
        (TensorProto.INT4, (48,)),
        (TensorProto.UINT2, (96,)),
        (TensorProto.DOUBLE, (3,)),
        (TensorProto.COMPLEX64, (3,)),
        (TensorProto.COMPLEX128, (1,)),
    ]
    # Each variant hashes the prefix of `content` its size needs (COMPLEX128 (1,): 16 bytes).
    tensors, cases = [], {}
    for i, (dt, shape) in enumerate(variants):
        nbytes = math.prod(shape) * d3.ELEMENT_BITS[dt] // 8
        data = content[:nbytes]
        name = f"v{i}.{d3.type_name(dt)}.{'x'.join(map(str, shape))}"
        tensors.append(helper.make_tensor(name, dt, shape, data, raw=True))
        exp = {alg: d3.digest_raw(dt, shape, data, alg) for alg in d3.ALGORITHMS}
        cases[name] = Case(name, dt, shape, "raw", name, exp)
    # Renamed copies of the first tensor: the name never enters the digest.
    for j, alias in enumerate(["alias.one", "another/name:0", "\u00fcnicode.name"]):
        t = TensorProto()
        t.CopyFrom(tensors[0])
        t.name = alias
        tensors.append(t)
        first = cases[tensors[0].name]
        cases[alias] = Case(alias, first.data_type, first.shape, "raw", first.group, first.expected)
    path = tmp_path / "header.onnx"
    d3.save_model(d3.make_model(tensors), str(path))
    for alg in d3.ALGORITHMS:
        report = ctl.digest_json(str(path), alg)
        check_report(report, cases, alg)
        distinct = {report[tensors[i].name]["digest"] for i in range(len(variants))}
        assert len(distinct) == len(variants), "dims/data_type must enter the digest"


# ---------------------------------------------------------------------------------------
# External data layouts
# ---------------------------------------------------------------------------------------


def test_external_one_file_per_tensor_in_subfolder(tmp_path):
    """location with a sub-folder ("weights/<name>.bin"), one file per tensor, offsets
    nonzero; the model is run from another working directory (locations are relative to
    the model's folder, not to the cwd)."""
    ctl.require_ctcachectl()
    rng = np.random.default_rng(_seed("subfolder"))
    model_dir = tmp_path / "model dir"  # a space in the path on purpose
    model_dir.mkdir()
    tensors, cases = [], {}
    for dt in d3.ALL_DATA_TYPES:
        if dt == TensorProto.STRING:
            continue
        arr = d3.random_array(dt, (3, 7), rng)
        name = f"{d3.type_name(dt)}.ext"
        with d3.ExternalDataFile(str(model_dir), f"weights/{d3.type_name(dt).lower()}.bin", gap=3) as ext:
            tensors.append(d3.make_external(name, arr, dt, ext))
        exp = {alg: d3.digest(arr, dt, alg) for alg in d3.ALGORITHMS}
        cases[name] = Case(name, dt, (3, 7), "external", name, exp)
    path = model_dir / "m.onnx"
    d3.save_model(d3.make_model(tensors), str(path))
    for alg in d3.ALGORITHMS:
        # cwd is not the model's folder: locations resolve against the model's folder.
        check_report(ctl.digest_json(str(path), alg, cwd=str(tmp_path)), cases, alg)


def test_external_optional_keys(tmp_path):
    """ONNX external data: ``offset`` defaults to 0 and ``length`` to the rest of the
    file.  location only / location + offset / location + length all resolve."""
    ctl.require_ctcachectl()
    rng = np.random.default_rng(_seed("optional-keys"))
    arr = d3.random_array(TensorProto.FLOAT, (4, 5), rng)
    data = d3.content_bytes(arr, TensorProto.FLOAT)
    (tmp_path / "whole.bin").write_bytes(data)  # the whole file is the tensor
    (tmp_path / "tail.bin").write_bytes(b"\x00" * 12 + data)  # tensor runs to EOF
    (tmp_path / "head.bin").write_bytes(data + b"junk after the tensor")
    layouts = {
        "location_only": ("whole.bin", None, None),
        "location_offset": ("tail.bin", 12, None),
        "location_length": ("head.bin", None, len(data)),
        "explicit_zero_offset": ("head.bin", 0, len(data)),
    }
    tensors, cases = [], {}
    exp = {alg: d3.digest(arr, TensorProto.FLOAT, alg) for alg in d3.ALGORITHMS}
    for name, (loc, off, length) in layouts.items():
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(arr.shape))
        tensors.append(d3.set_external(t, loc, off, length))
        cases[name] = Case(name, TensorProto.FLOAT, arr.shape, "external", "one", exp)
    path = tmp_path / "opt.onnx"
    d3.save_model(d3.make_model(tensors), str(path))
    for alg in d3.ALGORITHMS:
        check_report(ctl.digest_json(str(path), alg), cases, alg)


# ---------------------------------------------------------------------------------------
# Large tensors (chunked / multi-threaded hashing)
# ---------------------------------------------------------------------------------------


def test_large_tensors(tmp_path):
    """~12 MiB tensors, sizes not a multiple of any power-of-two chunk: raw, typed
    (float_data) and external must still agree with the one-shot reference."""
    ctl.require_ctcachectl()
    rng = np.random.default_rng(_seed("large"))
    f32 = d3.random_array(TensorProto.FLOAT, (1531, 2053), rng)  # 12.6 MB
    u8 = rng.integers(0, 256, size=12 * 1024 * 1024 + 3, dtype=np.uint8)
    i4 = d3.random_array(TensorProto.INT4, (4_000_001,), rng)  # odd: padded last byte
    tensors, cases = [], {}
    with d3.ExternalDataFile(str(tmp_path), "large.bin", align=4096) as ext:
        for tag, arr, dt, storages in [
            ("f32", f32, TensorProto.FLOAT, d3.STORAGES),
            ("u8", u8, TensorProto.UINT8, ("raw", "external")),
            ("i4", i4, TensorProto.INT4, ("raw", "external")),
        ]:
            exp = {alg: d3.digest(arr, dt, alg) for alg in d3.ALGORITHMS}
            for storage in storages:
                name = f"{tag}.{storage}"
                tensors.append(d3.make_tensor(name, arr, dt, storage, ext))
                cases[name] = Case(name, dt, arr.shape, storage, tag, exp)
    path = tmp_path / "large.onnx"
    d3.save_model(d3.make_model(tensors), str(path))
    for alg in d3.ALGORITHMS:
        check_report(ctl.digest_json(str(path), alg), cases, alg)


# ---------------------------------------------------------------------------------------
# CLI contract details
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["digest"], ["digest", "{model}", "--algorithm", "md5"], ["digest", "{model}", "--no-such-flag"], ["no-such-command"]],
    ids=["digest-without-model", "unknown-algorithm", "unknown-flag", "unknown-command"],
)
def test_usage_errors_exit_2(tmp_path, args):
    """Bad command lines (including an --algorithm value the CLI does not offer) are usage
    errors: exit 2 and a message, no digest output."""
    model = tmp_path / "m.onnx"
    d3.save_model(d3.make_model([d3.make_raw("x", np.zeros(3, np.float32), 1)]), str(model))
    r = ctl.run(*[a.format(model=model) for a in args])
    assert r.returncode == 2, r.describe()
    assert r.stderr.strip(), r.describe()


def test_missing_model_exit_1(tmp_path):
    for cmd in ("digest", "check"):
        r = ctl.run(cmd, str(tmp_path / "does-not-exist.onnx"))
        assert r.returncode == 1, r.describe()
        assert r.stderr.strip(), r.describe()


def test_model_without_initializers(tmp_path):
    path = tmp_path / "empty_graph.onnx"
    d3.save_model(d3.make_model([]), str(path))
    assert ctl.digest_json(str(path), "blake3") == {}
