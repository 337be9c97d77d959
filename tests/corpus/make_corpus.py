#!/usr/bin/env python3
"""Generate the malformed-model corpus (tests/corpus/malformed/) and its valid controls
(tests/corpus/valid/).

Every file is written with a tiny hand-written protobuf encoder (varint, tag,
length-delimited; see tests/python/d3.py), never with onnx's classes, so the output is
byte-for-byte deterministic and independent of the installed onnx/protobuf versions, and
so it can contain what no well-behaved writer produces (wrong wire types, 11-byte varints,
lying lengths) and the compiled-tensor fields onnx does not know (ModelProto.struct_types =
1000, devices = 1001, compiled_tensors = 1002, TypeProto.struct_type = 1000; field numbers
from proto/onnx/onnx.proto).

Outputs:
  malformed/<name>.onnx  one defect each, named for it (all < 64 KiB)
  malformed/ext_data.bin the small external data file the external-data cases point at
  malformed/EXPECTED.tsv file, command that must fail (check|digest), lowercase substring
                         expected in the error message
  malformed/README.md    what each file contains
  valid/*.onnx (+ .bin)  the undamaged base models the malformed files are derived from;
                         `check` and `digest` must accept them (controls)

Usage:
  python tests/corpus/make_corpus.py            # (re)write the corpus next to this script
  python tests/corpus/make_corpus.py --out DIR  # write elsewhere (the reproducibility test)
  python tests/corpus/make_corpus.py --verify   # also check every file against the
                                                # compiled proto/onnx/onnx.proto (needs
                                                # grpcio-tools) and onnx
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))

from d3 import (  # noqa: E402  (path set up above)
    WT_I32,
    WT_I64,
    WT_LEN,
    WT_VARINT,
    digest_raw,
    pb_bytes,
    pb_str,
    pb_tag,
    pb_uint,
    pb_varint,
)

MAX_FILE = 64 * 1024

FLOAT, INT32, INT64, STRING, UINT64, INT4 = 1, 6, 7, 8, 13, 22

# ---------------------------------------------------------------------------------------
# Message builders (field numbers from proto/onnx/onnx.proto)
# ---------------------------------------------------------------------------------------

# The base initializer: W, FLOAT [2, 3].
W_VALUES = [0.5, -1.0, 2.0, 3.25, -0.0, 8.0]
W_RAW = struct.pack("<6f", *W_VALUES)
assert len(W_RAW) == 24


def kv(key: str, value: str) -> bytes:
    """StringStringEntryProto."""
    return pb_str(1, key) + pb_str(2, value)


def packed_varints(field: int, values) -> bytes:
    return pb_bytes(field, b"".join(pb_varint(v) for v in values))


def tensor(
    name: str = "W",
    dims=(2, 3),
    data_type: int | None = FLOAT,
    raw: bytes | None = W_RAW,
    extra: bytes = b"",
) -> bytes:
    """TensorProto: dims(1, unpacked like onnx writes them), data_type(2), name(8),
    raw_data(9), then ``extra`` (typed fields, external data ...)."""
    out = b"".join(pb_uint(1, d) for d in dims)
    if data_type is not None:
        out += pb_uint(2, data_type)
    out += pb_str(8, name)
    if raw is not None:
        out += pb_bytes(9, raw)
    return out + extra


def external(location: str | None, offset=None, length=None, extra_keys=()) -> bytes:
    """external_data(13) entries + data_location(14) = EXTERNAL."""
    out = b""
    for key, value in (("location", location), ("offset", offset), ("length", length), *extra_keys):
        if value is not None:
            out += pb_bytes(13, kv(key, str(value)))
    return out + pb_uint(14, 1)


def tensor_type(elem_type: int, dims=None) -> bytes:
    """TypeProto{tensor_type{elem_type, shape}}; dims None = rank-0 (scalar) shape."""
    shape = b"".join(pb_bytes(1, pb_uint(1, d)) for d in (dims or ()))
    return pb_bytes(1, pb_uint(1, elem_type) + pb_bytes(2, shape))


def value_info(name: str, type_proto: bytes) -> bytes:
    return pb_str(1, name) + pb_bytes(2, type_proto)


def node(inputs, outputs, op_type: str) -> bytes:
    return b"".join(pb_str(1, i) for i in inputs) + b"".join(pb_str(2, o) for o in outputs) + pb_str(4, op_type)


GRAPH_DOC = "Base graph of the ctcache malformed-model corpus: Y = Identity(W), W a FLOAT [2, 3] initializer."


def graph(initializers=None, raw_initializers: bytes = b"") -> bytes:
    """GraphProto: Identity(W) -> Y, initializers, output Y: FLOAT [2, 3], a doc_string
    (long enough that the graph's length prefix is a 2-byte varint)."""
    if initializers is None:
        initializers = [tensor()]
    return (
        pb_bytes(1, node(["W"], ["Y"], "Identity"))
        + pb_str(2, "corpus")
        + b"".join(pb_bytes(5, t) for t in initializers)
        + raw_initializers
        + pb_bytes(12, value_info("Y", tensor_type(FLOAT, [2, 3])))
        + pb_str(10, GRAPH_DOC)
    )


def model(graph_bytes: bytes | None = None, extra: bytes = b"", raw_graph_field: bytes | None = None) -> bytes:
    """ModelProto: ir_version(1)=10, producer_name(2), opset_import(8) {"" 21}, then
    graph(7) LAST (so cutting the file anywhere after the header lands inside the
    graph), then ``extra`` (fields 1000-1002)."""
    head = pb_uint(1, 10) + pb_str(2, "ctcache-corpus") + pb_bytes(8, pb_str(1, "") + pb_uint(2, 21))
    if raw_graph_field is not None:
        g = raw_graph_field
    else:
        g = pb_bytes(7, graph() if graph_bytes is None else graph_bytes)
    return head + g + extra


# --- compiled-tensor extension ---------------------------------------------------------

W_DIGEST = bytes.fromhex(digest_raw(FLOAT, (2, 3), W_RAW, "blake3"))


def struct_type_array(element_type: bytes, dimension: int | None = None, dims_index: int | None = None,
                      name: str | None = "test.f32x6", meta: bool = True, dims_param=()) -> bytes:
    """StructTypeProto{array(1){element_type(1), dimension(2) | dims_index(3)}, name(8),
    metadata_props(10), dims_param(11)}."""
    arr = pb_bytes(1, element_type)
    if dimension is not None:
        arr += pb_uint(2, dimension)
    if dims_index is not None:
        arr += pb_uint(3, dims_index)
    out = pb_bytes(1, arr)
    return out + struct_type_tail(name, meta, dims_param)


def struct_type_tail(name: str | None, meta: bool = True, dims_param=()) -> bytes:
    out = b""
    if name is not None:
        out += pb_str(8, name)
    if meta:
        out += pb_bytes(10, kv("ctcache.format_version", "1")) + pb_bytes(10, kv("ctcache.packer", "test.identity"))
    for p in dims_param:
        out += pb_str(11, p)
    return out


def struct_type_structure(fields: list[bytes], name: str | None, meta: bool = True) -> bytes:
    """StructTypeProto{structure(2){field(1)...}}."""
    return pb_bytes(2, b"".join(pb_bytes(1, f) for f in fields)) + struct_type_tail(name, meta)


def field_typed(name: str, type_proto: bytes) -> bytes:
    """StructTypeProto.Field{name(1), type(2)}."""
    return pb_str(1, name) + pb_bytes(2, type_proto)


def type_struct(struct_type: bytes) -> bytes:
    """TypeProto{struct_type(1000)}."""
    return pb_bytes(1000, struct_type)


def type_index_ref(index: int) -> bytes:
    """TypeProto{struct_type(1000){type_index(5)}}: a static reference."""
    return type_struct(pb_uint(5, index))


F32_LEAF = tensor_type(FLOAT)  # scalar FLOAT leaf
ST_F32X6 = struct_type_array(F32_LEAF, dimension=6)  # 6 x FLOAT = 24 bytes
DEVICE_CPU = pb_str(1, "cpu") + pb_str(3, "x86_64-avx2")


def struct_value(type_index: int | None = 0, inline: bytes | None = None, raw: bytes | None = W_RAW,
                 extra: bytes = b"") -> bytes:
    """StructProto{type(1), struct_type(2), raw_data(3), ...}."""
    out = b""
    if type_index is not None:
        out += pb_uint(1, type_index)
    if inline is not None:
        out += pb_bytes(2, inline)
    if raw is not None:
        out += pb_bytes(3, raw)
    return out + extra


def compiled(source: str = "W", value: bytes | None = None, device: int | None = 0,
             digest: bytes | None = W_DIGEST, algorithm: str | None = "blake3", extra: bytes = b"") -> bytes:
    """CompiledTensorProto{source_name(1), value(2), device(3), source_digest(4),
    digest_algorithm(5), metadata_props(6)}."""
    out = pb_str(1, source)
    out += pb_bytes(2, struct_value() if value is None else value)
    if device is not None:
        out += pb_uint(3, device)
    if digest is not None:
        out += pb_bytes(4, digest)
    if algorithm is not None:
        out += pb_str(5, algorithm)
    return out + extra


def compiled_section(struct_types=(ST_F32X6,), devices=(DEVICE_CPU,), entries=None) -> bytes:
    """ModelProto fields 1000 (struct_types), 1001 (devices), 1002 (compiled_tensors)."""
    if entries is None:
        entries = [compiled()]
    return (
        b"".join(pb_bytes(1000, s) for s in struct_types)
        + b"".join(pb_bytes(1001, d) for d in devices)
        + b"".join(pb_bytes(1002, e) for e in entries)
    )


def compiled_model(**kw) -> bytes:
    return model(extra=compiled_section(**kw))


# ---------------------------------------------------------------------------------------
# Corpus entries
# ---------------------------------------------------------------------------------------


# A known field with the wrong wire type: prost (ctcache's decoder) rejects it ("invalid
# wire type"); protobuf C++/upb keep it as an unknown field instead, so the Python
# verification cannot tell either way.
WRONG_WIRE = None


@dataclass
class Entry:
    name: str  # file name
    data: bytes
    commands: tuple[str, ...]  # commands that must fail (exit 1)
    substring: str  # lowercase substring expected in the error message
    what: str  # one-line description for README.md
    parses: bool | None = True  # does the ctcache proto (onnx.proto) decode it? None: n/a


def entries() -> list[Entry]:
    E: list[Entry] = []
    BOTH = ("check", "digest")

    def add(name, data, commands, substring, what, parses=True):
        E.append(Entry(name, data, tuple(commands), substring, what, parses))

    base = model()

    # --- not a model at all ------------------------------------------------------------
    add("empty_file.onnx", b"", BOTH, "empty",
        "zero bytes (decodes as an all-default ModelProto: no graph, ir_version 0)")
    add("not_a_model_png.onnx",
        bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"),
        BOTH, "malformed protobuf", "a 1x1 PNG image", parses=False)
    add("not_a_model_text.onnx", b"This is not an ONNX model.\nJust some text.\n", BOTH, "malformed protobuf",
        "a text file", parses=False)
    add("not_a_model_zip.onnx", b"PK\x03\x04\x14\x00\x00\x00\x08\x00" + bytes(20), BOTH, "malformed protobuf",
        "the start of a ZIP archive (what torch.save writes)", parses=False)
    add("model_without_graph.onnx", pb_uint(1, 10) + pb_bytes(8, pb_str(1, "") + pb_uint(2, 21)), BOTH, "graph",
        "a well-formed ModelProto with ir_version and opset_import but no graph")

    # --- truncated at several offsets ---------------------------------------------------
    g_start = base.index(pb_tag(7, WT_LEN) + pb_varint(len(graph())))
    graph_payload_start = g_start + 1 + len(pb_varint(len(graph())))
    raw_at = base.index(W_RAW)
    init_at = base.index(pb_tag(5, WT_LEN), graph_payload_start)
    cuts = [
        ("truncated_after_first_tag", 1, "only the tag of ir_version, no value"),
        ("truncated_after_graph_tag", g_start + 1, "cut right after the graph field's tag"),
        ("truncated_in_graph_length", g_start + 2, "cut inside the graph's 2-byte length varint"),
        ("truncated_in_graph_node", graph_payload_start + 4, "cut inside the graph's first node"),
        ("truncated_in_initializer_header", init_at + 3, "cut inside the initializer's dims"),
        ("truncated_in_raw_data", raw_at + 10, "cut in the middle of raw_data"),
        ("truncated_half", len(base) // 2, "cut at half the file"),
        ("truncated_last_byte_missing", len(base) - 1, "the last byte removed"),
    ]
    assert len(pb_varint(len(graph()))) == 2, "graph length must be a 2-byte varint for these cuts"
    for name, cut, what in cuts:
        assert 0 < cut < len(base)
        # A cut before the graph's payload hits the end of input ("truncated"); a cut inside
        # it makes the graph's declared length exceed the rest ("exceeds").
        sub = "truncated" if cut <= graph_payload_start else "exceeds"
        add(f"{name}.onnx", base[:cut], BOTH, sub, f"valid_plain.onnx {what} (offset {cut} of {len(base)})", parses=False)

    # --- wire-level errors ----------------------------------------------------------------
    add("wire_graph_as_varint.onnx", model(raw_graph_field=pb_tag(7, WT_VARINT) + pb_varint(5)), BOTH, "wire",
        "ModelProto.graph (7) sent with wire type varint", parses=WRONG_WIRE)
    add("wire_initializer_as_fixed32.onnx",
        model(graph(initializers=[], raw_initializers=pb_tag(5, WT_I32) + b"\x01\x02\x03\x04")), BOTH, "wire",
        "GraphProto.initializer (5) sent with wire type fixed32", parses=WRONG_WIRE)
    add("wire_dims_as_fixed64.onnx",
        model(graph([tensor(dims=()) + pb_tag(1, WT_I64) + (2).to_bytes(8, "little")])), BOTH, "wire",
        "TensorProto.dims (1) sent with wire type fixed64", parses=WRONG_WIRE)
    add("wire_dims_packed_junk.onnx",
        model(graph([pb_bytes(1, b"\x02\x03\xff\xff") + tensor(dims=())])), BOTH, "truncated",
        "TensorProto.dims as a length-delimited (packed) run whose last varint never ends", parses=False)
    add("wire_raw_data_as_varint.onnx",
        model(graph([tensor(raw=None) + pb_tag(9, WT_VARINT) + pb_varint(24)])), BOTH, "wire",
        "TensorProto.raw_data (9) sent with wire type varint", parses=WRONG_WIRE)
    add("wire_type_7_invalid.onnx", base + pb_tag(3, 7) + b"\x00", BOTH, "wire",
        "a field with wire type 7 (does not exist) after a valid model", parses=False)
    add("wire_type_group_start.onnx", base + pb_tag(30, 3), BOTH, "wire",
        "an unterminated group (deprecated wire type 3) after a valid model", parses=False)
    add("wire_field_number_zero.onnx", pb_tag(0, WT_LEN) + b"\x00" + base, BOTH, "field number 0",
        "a field with number 0 before a valid model", parses=False)

    # --- varints that never end / are too long ---------------------------------------------
    add("varint_11_bytes_ir_version.onnx", pb_tag(1, WT_VARINT) + b"\xff" * 10 + b"\x01" + base[2:], BOTH, "varint",
        "ir_version encoded as an 11-byte varint", parses=False)
    add("varint_11_bytes_in_dims.onnx",
        model(graph([pb_tag(1, WT_VARINT) + b"\x80" * 10 + b"\x00" + tensor(dims=(3,), raw=W_RAW[:12])])), BOTH, "varint",
        "a dims value encoded as an 11-byte varint", parses=False)
    add("varint_unterminated_at_eof.onnx", base + pb_tag(1, WT_VARINT) + b"\xff\xff\xff", BOTH, "truncated",
        "a varint whose continuation bits run into the end of the file", parses=False)

    # --- lying length prefixes ----------------------------------------------------------
    head = base[:g_start]
    add("huge_length_graph_2e62.onnx", head + pb_tag(7, WT_LEN) + pb_varint(1 << 62) + graph(), BOTH, "exceeds",
        "the graph's length prefix says 2^62 bytes", parses=False)
    add("huge_length_u64_max.onnx", head + pb_tag(7, WT_LEN) + pb_varint((1 << 64) - 1) + graph(), BOTH, "exceeds",
        "the graph's length prefix is 2^64-1 (overflows offset + length)", parses=False)
    big_raw = tensor(raw=None) + pb_tag(9, WT_LEN) + pb_varint(1 << 62) + W_RAW
    add("huge_length_raw_data_2e62.onnx",
        head + pb_tag(7, WT_LEN) + pb_varint(len(graph([big_raw]))) + graph([big_raw]), BOTH, "exceeds",
        "raw_data's length prefix says 2^62 bytes (the enclosing lengths are consistent)", parses=False)
    add("length_beyond_parent.onnx",
        model(graph([tensor(raw=None) + pb_tag(9, WT_LEN) + pb_varint(200) + W_RAW])), BOTH, "exceeds",
        "raw_data claims 200 bytes but its TensorProto ends after 24 (the file is longer)", parses=False)

    # --- tensor data errors (decode fine; the digest cannot be computed) -------------------
    def tmodel(t: bytes) -> bytes:
        return model(graph([t]))

    add("dims_negative.onnx", tmodel(tensor(dims=(2, -3))), ("digest",), "dims",
        "FLOAT tensor with dims [2, -3]")
    add("dims_product_overflows_u64.onnx", tmodel(tensor(dims=(1 << 32, 1 << 32, 2))), ("digest",), "dims",
        "dims [2^32, 2^32, 2]: the element count overflows u64")
    add("dims_bytes_overflow_u64.onnx", tmodel(tensor(dims=(1 << 62,))), ("digest",), "size",
        "dims [2^62] FLOAT: the count fits, count x 4 bytes overflows u64")
    add("dims_huge_small_data.onnx", tmodel(tensor(dims=(1 << 40,))), ("digest",), "needs",
        "dims [2^40] with 24 bytes of raw_data (must be rejected without allocating)")
    add("raw_data_too_short.onnx", tmodel(tensor(raw=W_RAW[:20])), ("digest",), "needs",
        "FLOAT [2, 3] with 20 bytes of raw_data (24 needed)")
    add("raw_data_too_long.onnx", tmodel(tensor(raw=W_RAW + b"\0\0\0\0")), ("digest",), "needs",
        "FLOAT [2, 3] with 28 bytes of raw_data (24 needed)")
    add("raw_data_int4_odd_too_short.onnx", tmodel(tensor(dims=(5,), data_type=INT4, raw=b"\x21\x43")), ("digest",), "needs",
        "INT4 [5] with 2 bytes of raw_data (3 needed: the padded last byte is missing)")
    floats5 = pb_bytes(4, W_RAW[:20])
    add("float_data_count_short.onnx", tmodel(tensor(raw=None, extra=floats5)), ("digest",), "needs",
        "FLOAT [2, 3] with 5 float_data values")
    floats7 = pb_bytes(4, W_RAW + W_RAW[:4])
    add("float_data_count_long.onnx", tmodel(tensor(raw=None, extra=floats7)), ("digest",), "needs",
        "FLOAT [2, 3] with 7 float_data values")
    add("int32_data_int4_count_mismatch.onnx",
        tmodel(tensor(dims=(5,), data_type=INT4, raw=None, extra=packed_varints(5, [0x21, 0x43]))), ("digest",), "needs",
        "INT4 [5] with 2 int32_data entries (3 packed bytes needed)")
    add("string_data_count_mismatch.onnx",
        tmodel(tensor(dims=(3,), data_type=STRING, raw=None, extra=pb_bytes(6, b"a") + pb_bytes(6, b"b"))), ("digest",), "needs",
        "STRING [3] with 2 string_data entries")
    add("typed_field_wrong_kind_int64_for_float.onnx",
        tmodel(tensor(raw=None, extra=packed_varints(7, [1, 2, 3, 4, 5, 6]))), ("digest",), "field",
        "FLOAT [2, 3] with its values in int64_data")
    add("typed_field_wrong_kind_float_for_int32.onnx",
        tmodel(tensor(dims=(2,), data_type=INT32, raw=None, extra=pb_bytes(4, W_RAW[:8]))), ("digest",), "field",
        "INT32 [2] with its values in float_data")
    add("typed_field_wrong_kind_double_for_uint64.onnx",
        tmodel(tensor(dims=(3,), data_type=UINT64, raw=None, extra=pb_bytes(10, W_RAW))), ("digest",), "field",
        "UINT64 [3] with its values in double_data (uint64_data expected)")
    add("raw_data_and_typed_field_both.onnx",
        tmodel(tensor(extra=pb_bytes(4, W_RAW))), ("digest",), "both",
        "FLOAT [2, 3] with both raw_data and float_data")
    add("data_type_99_unknown.onnx", tmodel(tensor(dims=(6,), data_type=99)), ("digest",), "type",
        "data_type 99 (no such ONNX type)")
    add("data_type_0_undefined.onnx", tmodel(tensor(dims=(6,), data_type=0)), ("digest",), "type",
        "data_type 0 (UNDEFINED), written explicitly")
    add("data_type_missing.onnx", tmodel(tensor(dims=(6,), data_type=None)), ("digest",), "type",
        "no data_type field at all (defaults to UNDEFINED)")
    add("data_type_negative.onnx", tmodel(tensor(dims=(6,), data_type=-1)), ("digest",), "type",
        "data_type -1 (10-byte varint)")

    # --- external data errors (ext_data.bin is 64 bytes, next to the models) --------------
    def ext_model(*args, **kw) -> bytes:
        return tmodel(tensor(raw=None, extra=external(*args, **kw)))

    add("external_absolute_location.onnx", ext_model("/etc/passwd", 0, 24), ("digest",), "external",
        "external location /etc/passwd (absolute paths are refused even when the file exists)")
    add("external_dotdot_location.onnx", ext_model("../malformed/ext_data.bin", 0, 24), ("digest",), "external",
        "external location ../malformed/ext_data.bin ('..' is refused even when it resolves)")
    add("external_missing_file.onnx", ext_model("no_such_file.bin", 0, 24), ("digest",), "external",
        "external location that does not exist")
    add("external_location_is_directory.onnx", ext_model(".", 0, 24), ("digest",), "external",
        "external location '.', a directory")
    add("external_no_location.onnx", ext_model(None, 0, 24), ("digest",), "external",
        "data_location EXTERNAL with offset and length but no location key")
    add("external_offset_past_eof.onnx", ext_model("ext_data.bin", 1000, 24), ("digest",), "external",
        "offset 1000 in a 64-byte file")
    add("external_length_past_eof.onnx", ext_model("ext_data.bin", 48, 24), ("digest",), "external",
        "offset 48 + length 24 in a 64-byte file")
    add("external_offset_length_overflow.onnx", ext_model("ext_data.bin", 8, (1 << 64) - 4), ("digest",), "external",
        "offset 8 (inside the file) + length 2^64-4 overflows u64")
    add("external_offset_huge.onnx", ext_model("ext_data.bin", (1 << 64) - 8, 24), ("digest",), "external",
        "offset 2^64-8, length 24")
    add("external_negative_offset.onnx", ext_model("ext_data.bin", -8, 24), ("digest",), "external",
        "offset -8")
    add("external_negative_length.onnx", ext_model("ext_data.bin", 0, -24), ("digest",), "external",
        "length -24")
    add("external_offset_not_a_number.onnx", ext_model("ext_data.bin", "0x10", 24), ("digest",), "external",
        "offset '0x10' (not a decimal integer)")
    add("external_length_size_mismatch.onnx", ext_model("ext_data.bin", 0, 20), ("digest",), "does not match",
        "length 20 for a FLOAT [2, 3] tensor (24 bytes)")
    add("external_string_tensor.onnx",
        tmodel(tensor(dims=(2,), data_type=STRING, raw=None, extra=external("ext_data.bin", 0, 16))), ("digest",), "external",
        "a STRING tensor with external data (STRING has no raw form)")

    # --- compiled-tensor section: struct types ----------------------------------------
    add("struct_types_field_garbage.onnx", model(extra=pb_bytes(1000, b"\xff\xff\xff\xff") + compiled_section(struct_types=())),
        ("check",), "struct", "ModelProto.struct_types (1000) holding bytes that are not a StructTypeProto", parses=False)
    add("struct_types_field_as_varint.onnx", model(extra=pb_tag(1000, WT_VARINT) + pb_varint(7)), ("check",), "wire",
        "ModelProto.struct_types (1000) sent with wire type varint", parses=WRONG_WIRE)
    add("devices_field_garbage.onnx", model(extra=compiled_section(devices=()) + pb_bytes(1001, b"\x0a\xff\x01")),
        ("check",), "device", "ModelProto.devices (1001) holding a truncated DeviceProto", parses=False)
    add("compiled_tensors_field_garbage.onnx", model(extra=compiled_section(entries=[]) + pb_bytes(1002, b"\x12\x10\x08")),
        ("check",), "compiled", "ModelProto.compiled_tensors (1002) holding a truncated CompiledTensorProto", parses=False)

    add("compiled_dangling_struct_type_index.onnx", compiled_model(entries=[compiled(value=struct_value(type_index=7))]),
        ("check",), "struct", "StructProto.type = 7 with one struct type")
    add("compiled_negative_struct_type_index.onnx", compiled_model(entries=[compiled(value=struct_value(type_index=-2))]),
        ("check",), "struct", "StructProto.type = -2 (only -1 is allowed, with an inline type)")
    add("compiled_type_minus1_without_inline.onnx", compiled_model(entries=[compiled(value=struct_value(type_index=-1))]),
        ("check",), "struct", "StructProto.type = -1 but no inline struct_type")
    add("compiled_index_and_inline_both.onnx",
        compiled_model(entries=[compiled(value=struct_value(type_index=0, inline=ST_F32X6))]),
        ("check",), "struct", "StructProto.type = 0 and an inline struct_type")
    add("compiled_unconstrained_inline_type.onnx",
        compiled_model(entries=[compiled(value=struct_value(type_index=-1, inline=pb_str(8, "no.kind")))]),
        ("check",), "struct", "inline struct_type with no kind (an unconstrained type as a value)")

    cyc_a = struct_type_structure([field_typed("a", type_index_ref(1))], "cyc.a")
    cyc_b = struct_type_structure([field_typed("b", type_index_ref(0))], "cyc.b")
    add("struct_type_cycle_two.onnx", compiled_model(struct_types=(cyc_a, cyc_b)), ("check",), "cycle",
        "struct_types[0].structure.field.type -> type_index 1, struct_types[1] -> type_index 0; the entry uses type 0")
    self_ref = struct_type_array(type_index_ref(0), dimension=2, name="cyc.self")
    add("struct_type_cycle_self.onnx", compiled_model(struct_types=(self_ref,)), ("check",), "cycle",
        "struct_types[0] is an array whose element_type is type_index 0 (itself)")
    cyc_x = struct_type_structure([field_typed("x", type_index_ref(2))], "cyc.x")
    cyc_y = struct_type_structure([field_typed("y", type_index_ref(1))], "cyc.y")
    add("struct_type_cycle_unreferenced.onnx", compiled_model(struct_types=(ST_F32X6, cyc_x, cyc_y)), ("check",), "cycle",
        "the entry uses the valid struct_types[0]; struct_types[1] and [2] reference each other (used by no entry)")
    add("struct_type_index_dangling_in_field.onnx",
        compiled_model(struct_types=(struct_type_structure([field_typed("x", type_index_ref(9))], "dangling"),)),
        ("check",), "struct", "a structure field referencing type_index 9 with one struct type")

    # Size arithmetic.
    add("struct_array_dimension_2e63_float.onnx",
        compiled_model(struct_types=(struct_type_array(F32_LEAF, dimension=1 << 63),),
                       entries=[compiled(value=struct_value(raw=W_RAW[:4]))]),
        ("check",), "size", "Array(FLOAT, dimension 2^63): the size in bits overflows u64")
    add("struct_array_dimension_u64_max.onnx",
        compiled_model(struct_types=(struct_type_array(F32_LEAF, dimension=(1 << 64) - 1),),
                       entries=[compiled(value=struct_value(raw=W_RAW[:4]))]),
        ("check",), "size", "Array(FLOAT, dimension 2^64-1)")
    inner = struct_type_array(F32_LEAF, dimension=1 << 32, name=None, meta=False)
    add("struct_nested_array_size_overflow.onnx",
        compiled_model(struct_types=(struct_type_array(type_struct(inner), dimension=1 << 32),)),
        ("check",), "size", "Array(Array(FLOAT, 2^32), 2^32): 2^64 elements x 32 bits")
    add("compiled_payload_size_mismatch.onnx", compiled_model(entries=[compiled(value=struct_value(raw=W_RAW[:20]))]),
        ("check",), "size", "6 x FLOAT type (24 bytes) with a 20-byte payload")
    add("struct_dims_index_out_of_range.onnx",
        compiled_model(struct_types=(struct_type_array(F32_LEAF, dims_index=3, dims_param=("n",)),),
                       entries=[compiled(value=struct_value(extra=pb_uint(7, 6)))]),
        ("check",), "dims", "Array count dims_index 3 with a single dims_param")
    add("struct_type_name_duplicate.onnx", compiled_model(struct_types=(ST_F32X6, ST_F32X6)), ("check",), "name",
        "two struct_types named test.f32x6")
    add("struct_type_name_empty.onnx", compiled_model(struct_types=(struct_type_array(F32_LEAF, dimension=6, name=None),)),
        ("check",), "name", "a model-level struct type without a name")

    # Nesting bombs: as deep as fits in 64 KiB (10,000 levels of Array-of-Array need
    # about 125 KB; the limit any sane decoder enforces is in the tens or hundreds).
    # prost's recursion limit (100) stops the decoder first: "recursion limit reached".
    for label, level in (("array", _nest_array), ("sequence", _nest_sequence)):
        depth = _max_depth(level)
        st = level(depth)
        add(f"struct_nesting_bomb_{label}_depth_{depth}.onnx",
            compiled_model(struct_types=(st,), entries=[compiled(value=struct_value(raw=W_RAW[:4]))]),
            ("check",), "recursion limit",
            f"struct_types[0]: {depth} nested levels of {'Array(element_type = struct_type Array(...))' if label == 'array' else 'TypeProto.sequence_type inside an Array element_type'}",
            parses=None)

    # Devices.
    add("compiled_device_index_out_of_range.onnx", compiled_model(entries=[compiled(device=5)]), ("check",), "device",
        "CompiledTensorProto.device = 5 with one device")
    add("compiled_device_index_negative.onnx", compiled_model(entries=[compiled(device=-1)]), ("check",), "device",
        "CompiledTensorProto.device = -1")
    add("compiled_no_devices.onnx", compiled_model(devices=()), ("check",), "device",
        "an entry with device 0 and no ModelProto.devices")
    add("devices_duplicate.onnx", compiled_model(devices=(DEVICE_CPU, DEVICE_CPU)), ("check",), "device",
        "two identical DeviceProto descriptors")

    # Entries.
    add("compiled_missing_source.onnx", compiled_model(entries=[compiled(source="nope")]), ("check",), "source",
        "source_name 'nope' names no initializer")
    add("compiled_empty_digest.onnx", compiled_model(entries=[compiled(digest=None)]), ("check",), "digest",
        "empty source_digest")
    add("compiled_empty_algorithm.onnx", compiled_model(entries=[compiled(algorithm=None)]), ("check",), "algorithm",
        "empty digest_algorithm")
    add("compiled_duplicate_cache_key.onnx", compiled_model(entries=[compiled(), compiled()]), ("check",), "duplicate",
        "two entries with the same (source_name, device, physical type)")
    add("compiled_metadata_keys_duplicate.onnx",
        compiled_model(entries=[compiled(extra=pb_bytes(6, kv("k", "1")) + pb_bytes(6, kv("k", "2")))]),
        ("check",), "metadata", "an entry whose metadata_props repeat the key 'k'")
    add("compiled_external_payload_without_length.onnx",
        compiled_model(entries=[compiled(value=struct_value(raw=None, extra=pb_bytes(4, kv("location", "ext_data.bin")) + pb_bytes(4, kv("offset", "0"))))]),
        ("check",), "length", "StructProto external_data with location and offset but no length (mandatory)")
    return E


def _nest_array(depth: int) -> bytes:
    """Array(element_type = TypeProto.struct_type Array(...)) ``depth`` levels, FLOAT at the
    bottom, every dimension 1 (so the size is a harmless 32 bits)."""
    st = struct_type_array(F32_LEAF, dimension=1, name=None, meta=False)
    for _ in range(depth - 1):
        st = struct_type_array(type_struct(st), dimension=1, name=None, meta=False)
    return st + struct_type_tail("bomb.array")


def _nest_sequence(depth: int) -> bytes:
    """Array(element_type = sequence_type(sequence_type(... FLOAT))) ``depth`` levels."""
    tp = F32_LEAF
    for _ in range(depth):
        tp = pb_bytes(4, pb_bytes(1, tp))  # TypeProto{sequence_type(4){elem_type(1)}}
    return struct_type_array(tp, dimension=1, name="bomb.sequence")


def _max_depth(level, budget: int = MAX_FILE - 2048, cap: int = 10_000) -> int:
    """Largest depth (<= cap) whose nesting fits ``budget`` bytes."""
    lo, hi = 1, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(level(mid)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


# ---------------------------------------------------------------------------------------
# Valid controls
# ---------------------------------------------------------------------------------------

EXT_DATA = bytes(range(64))  # malformed/ext_data.bin
VALID_EXT = b"HDR-" + W_RAW + b"-TAIL"  # valid/valid_external.bin: W at offset 4


def valid_files() -> dict[str, bytes]:
    return {
        "valid_plain.onnx": model(),
        "valid_compiled.onnx": compiled_model(),
        "valid_external.onnx": model(graph([tensor(raw=None, extra=external("valid_external.bin", 4, 24))])),
        "valid_external.bin": VALID_EXT,
    }


# ---------------------------------------------------------------------------------------
# Writing and verification
# ---------------------------------------------------------------------------------------


def write(out_dir: str) -> list[Entry]:
    mal = os.path.join(out_dir, "malformed")
    val = os.path.join(out_dir, "valid")
    for d in (mal, val):
        if os.path.isdir(d):
            shutil.rmtree(d)
        os.makedirs(d)
    es = entries()
    names = [e.name for e in es]
    assert len(names) == len(set(names)), "duplicate corpus names"
    for e in es:
        assert len(e.data) < MAX_FILE, (e.name, len(e.data))
        with open(os.path.join(mal, e.name), "wb") as f:
            f.write(e.data)
    with open(os.path.join(mal, "ext_data.bin"), "wb") as f:
        f.write(EXT_DATA)
    with open(os.path.join(mal, "EXPECTED.tsv"), "w", newline="\n") as f:
        f.write("# Generated by tests/corpus/make_corpus.py: edit the substrings there and rerun it.\n"
                "# Each row: a file that `ctcachectl <command> FILE` must reject with exit 1 and an\n"
                "# error message containing <substring> (case-insensitive).\n"
                "file\tcommand\tsubstring\n")
        for e in es:
            for cmd in e.commands:
                f.write(f"{e.name}\t{cmd}\t{e.substring}\n")
    with open(os.path.join(mal, "README.md"), "w", newline="\n") as f:
        f.write("# Malformed models\n\nGenerated by `tests/corpus/make_corpus.py` (do not edit by hand). "
                "Every file must make the listed `ctcachectl` commands exit 1 with a message "
                "(never a panic); `EXPECTED.tsv` lists the command and a substring of the message. "
                "`ext_data.bin` (64 bytes, 0x00..0x3f) is the data file the external-data cases "
                "point at. The undamaged base models are in `../valid/`.\n\n"
                "| file | bytes | fails | defect |\n|---|---|---|---|\n")
        for e in es:
            f.write(f"| `{e.name}` | {len(e.data)} | {', '.join(e.commands)} | {e.what} |\n")
    for name, data in valid_files().items():
        with open(os.path.join(val, name), "wb") as f:
            f.write(data)
    return es


def verify(out_dir: str, es: list[Entry]) -> None:
    """Decode every file with the project's own proto (compiled with grpc_tools into a
    temp dir, never committed) and check the valid controls with onnx."""
    import importlib.util

    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        # Compile a copy with another package name: the wire format does not depend on
        # it, and the messages must not clash with the onnx package's descriptor pool.
        src = open(os.path.join(REPO, "proto", "onnx", "onnx.proto")).read()
        assert "package onnx;" in src
        with open(os.path.join(tmp, "ctcache_verify.proto"), "w") as f:
            f.write(src.replace("package onnx;", "package ctcache_verify;"))
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp}", f"--python_out={tmp}", "ctcache_verify.proto"],
            check=True,
        )
        spec = importlib.util.spec_from_file_location("ctcache_verify_pb2", os.path.join(tmp, "ctcache_verify_pb2.py"))
        pb = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(pb)

        def parses(data: bytes) -> bool:
            try:
                pb.ModelProto.FromString(data)
                return True
            except Exception:
                return False

        problems = []
        for e in es:
            if e.parses is not None and parses(e.data) != e.parses:
                problems.append(f"{e.name}: parses={parses(e.data)}, expected {e.parses}")
        # Controls decode, and onnx accepts the plain/external ones.
        val = os.path.join(out_dir, "valid")
        for name in ("valid_plain.onnx", "valid_compiled.onnx", "valid_external.onnx"):
            data = open(os.path.join(val, name), "rb").read()
            m = pb.ModelProto.FromString(data)
            if name == "valid_compiled.onnx":
                assert len(m.struct_types) == 1 and len(m.devices) == 1 and len(m.compiled_tensors) == 1
                ct = m.compiled_tensors[0]
                assert ct.source_digest == W_DIGEST and ct.value.raw_data == W_RAW
                assert m.struct_types[0].array.dimension == 6
            else:
                onnx.checker.check_model(os.path.join(val, name))
                t = onnx.load(os.path.join(val, name), load_external_data=False).graph.initializer[0]
                arr = onnx.numpy_helper.to_array(t, val)
                assert arr.tolist() == [W_VALUES[:3], W_VALUES[3:]], arr
    # A few semantic cases must still decode with onnx's own classes.
    for e in es:
        if e.parses and not e.name.startswith(("struct", "compiled", "devices")):
            try:
                onnx.ModelProto.FromString(e.data)
            except Exception as ex:  # pragma: no cover
                problems.append(f"{e.name}: onnx cannot parse it ({ex})")
    if problems:
        raise SystemExit("verification failed:\n" + "\n".join(problems))
    print(f"verified {len(es)} malformed files and the valid controls")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=HERE, help="corpus root (default: this script's folder)")
    ap.add_argument("--verify", action="store_true", help="decode-check the result (needs grpcio-tools, onnx)")
    args = ap.parse_args()
    es = write(args.out)
    print(f"wrote {len(es)} malformed files to {os.path.join(args.out, 'malformed')}")
    if args.verify:
        verify(args.out, es)


if __name__ == "__main__":
    main()
