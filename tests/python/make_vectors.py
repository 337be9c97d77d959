#!/usr/bin/env python3
"""Print D3 (canonical source digest v1) test vectors as a Markdown table for docs/FORMAT.md.

Each vector is a small tensor given in one storage method (raw_data, a typed field, or
external data); the digest never depends on the storage, so the same row holds for the
other methods.  The script checks itself: every tensor is built as a TensorProto in the
stated storage, serialized, decoded back with onnx (external data from a temp file) and
re-digested with the independent reference in d3.py.

    python tests/python/make_vectors.py            # print the table
    python tests/python/make_vectors.py --write    # also write vectors.md and vectors.json
                                                   # (full hex, for unit tests) next to it
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import tempfile
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto as T

import d3

HERE = os.path.dirname(os.path.abspath(__file__))
TRUNCATE_AT = 48  # content longer than this is shown as head ... tail


@dataclass
class Vector:
    title: str  # human description of the values
    data_type: int
    array: np.ndarray
    storage: str  # raw | typed | external


def bits(data_type: int, shape, patterns) -> np.ndarray:
    """Array of ``data_type`` from raw bit patterns (for exact float specials)."""
    dt = d3.np_dtype(data_type)
    width = {1: "u1", 2: "u2", 4: "u4", 8: "u8"}[dt.itemsize]
    return np.array(patterns, dtype=width).view(dt).reshape(shape)


def vectors() -> list[Vector]:
    f32 = np.float32
    v = [
        Vector("[[1.0, -2.5], [0.0, -0.0]]", T.FLOAT, np.array([[1.0, -2.5], [0.0, -0.0]], f32), "raw"),
        Vector("[NaN (0x7fc00000), +inf, -inf, smallest denormal (0x00000001)]", T.FLOAT,
               bits(T.FLOAT, (4,), [0x7FC00000, 0x7F800000, 0xFF800000, 0x00000001]), "typed"),
        Vector("[3.141592653589793, -0.0]", T.DOUBLE, np.array([np.pi, -0.0]), "external"),
        Vector("scalar -1", T.INT64, np.array(-1, dtype=np.int64), "typed"),
        Vector("empty, dims [0]", T.UINT8, np.zeros((0,), np.uint8), "raw"),
        Vector("empty, dims [3, 0, 2]", T.FLOAT, np.zeros((3, 0, 2), f32), "typed"),
        Vector("[-128, 0, 127]", T.INT8, np.array([-128, 0, 127], np.int8), "typed"),
        Vector("[-1, 32767]", T.INT16, np.array([-1, 32767], np.int16), "typed"),
        Vector("[1.0, -0.0, 65504.0] (bits in int32_data)", T.FLOAT16,
               np.array([1.0, -0.0, 65504.0], np.float16), "typed"),
        Vector("[1.0, -inf]", T.BFLOAT16, bits(T.BFLOAT16, (2,), [0x3F80, 0xFF80]), "raw"),
        Vector("bits [0x00, 0x38 (1.0), 0x7f (NaN), 0xfe (-448)]", T.FLOAT8E4M3FN,
               bits(T.FLOAT8E4M3FN, (4,), [0x00, 0x38, 0x7F, 0xFE]), "raw"),
        Vector("bits [0x7f (1.0), 0xff (NaN)]", T.FLOAT8E8M0, bits(T.FLOAT8E8M0, (2,), [0x7F, 0xFF]), "typed"),
        Vector("[-8, -1, 0, 7, 3] (odd count: last nibble padded)", T.INT4,
               np.array([-8, -1, 0, 7, 3], d3.np_dtype(T.INT4)), "typed"),
        Vector("[1, 15, 9]", T.UINT4, np.array([1, 15, 9], d3.np_dtype(T.UINT4)), "raw"),
        Vector("bits [0x1 (0.5), 0x7 (6.0), 0xf (-6.0)]", T.FLOAT4E2M1,
               bits(T.FLOAT4E2M1, (3,), [0x1, 0x7, 0xF]), "external"),
        Vector("[0, 1, 2, 3, 1] (5 elements: 2 bytes)", T.UINT2, np.array([0, 1, 2, 3, 1], d3.np_dtype(T.UINT2)), "raw"),
        Vector("[-2, -1, 1]", T.INT2, np.array([-2, -1, 1], d3.np_dtype(T.INT2)), "typed"),
        Vector("[true, false, true]", T.BOOL, np.array([True, False, True]), "raw"),
        Vector("[0, 4294967295] (in uint64_data)", T.UINT32, np.array([0, 2**32 - 1], np.uint32), "typed"),
        Vector("[0, 18446744073709551615]", T.UINT64, np.array([0, 2**64 - 1], np.uint64), "typed"),
        Vector("[1+2j, -0-1j] (pairs in float_data)", T.COMPLEX64, np.array([1 + 2j, complex(-0.0, -1)], np.complex64), "typed"),
        Vector("scalar 1-1j", T.COMPLEX128, np.array(1 - 1j, np.complex128), "raw"),
        Vector('["", "h\u00e9llo"]', T.STRING, np.array([b"", "h\u00e9llo".encode()], dtype=object), "typed"),
        Vector('scalar "ctcache"', T.STRING, np.array(b"ctcache", dtype=object), "typed"),
        Vector("element i = i / 64 (16 KiB of content)", T.FLOAT,
               (np.arange(64 * 64, dtype=f32) / 64).reshape(64, 64), "external"),
    ]
    return v


def storage_label(vec: Vector) -> str:
    if vec.storage == "typed":
        return f"typed (`{d3.TYPED_FIELD[vec.data_type]}`)"
    return {"raw": "`raw_data`", "external": "external data"}[vec.storage]


def short_hex(data: bytes) -> str:
    if len(data) <= TRUNCATE_AT:
        return data.hex() or "(empty)"
    return f"{data[:32].hex()}...{data[-8:].hex()} ({len(data)} bytes)"


def self_check(vec: Vector, tmpdir: str, idx: int) -> None:
    """Build the stated storage, round-trip through onnx, re-digest, compare."""
    with d3.ExternalDataFile(tmpdir, f"v{idx}.bin") as ext:
        t = d3.make_tensor(f"v{idx}", vec.array, vec.data_type, vec.storage, ext)
    assert d3.storage_of(t) == vec.storage or vec.array.size == 0
    back = onnx.TensorProto.FromString(t.SerializeToString())
    arr = d3.decode(back, tmpdir)
    assert d3.same_bits(arr, vec.array, vec.data_type), vec.title
    for alg in d3.ALGORITHMS:
        assert d3.digest(arr, vec.data_type, alg) == d3.digest(vec.array, vec.data_type, alg)


def build() -> tuple[str, list[dict]]:
    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, vec in enumerate(vectors(), 1):
            self_check(vec, tmp, i)
            header = d3.header_bytes(vec.data_type, vec.array.shape)
            content = d3.content_bytes(vec.array, vec.data_type)
            dig = {alg: d3.digest_raw(vec.data_type, vec.array.shape, content, alg) for alg in d3.ALGORITHMS}
            dims = list(vec.array.shape)
            rows.append(
                f"| {i} | {d3.type_name(vec.data_type)} ({vec.data_type}) `{dims}` {vec.title} "
                f"| {storage_label(vec)} | `{header.hex()}` | `{short_hex(content)}` "
                f"| `{dig['blake3']}` | `{dig['sha256']}` |"
            )
            records.append(
                {
                    "title": vec.title,
                    "data_type": vec.data_type,
                    "dims": dims,
                    "storage": vec.storage,
                    "header_hex": header.hex(),
                    "content_hex": content.hex(),
                    "blake3": dig["blake3"],
                    "sha256": dig["sha256"],
                }
            )
    md = (
        "<!-- generated by tests/python/make_vectors.py; do not edit by hand -->\n"
        "D3 canonical source digest v1: `H(header || content)`, header = "
        "`u32le(data_type) || u32le(rank) || rank x u64le(dim)`. "
        "The digest does not depend on the storage method shown.\n\n"
        "| # | tensor | stored as | header (hex) | content (hex) | blake3 | sha256 |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    return md, records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="write vectors.md and vectors.json next to this script")
    args = ap.parse_args()
    md, records = build()
    print(md, end="")
    if args.write:
        with open(os.path.join(HERE, "vectors.md"), "w", newline="\n") as f:
            f.write(md)
        with open(os.path.join(HERE, "vectors.json"), "w", newline="\n") as f:
            json.dump({"version": 1, "vectors": records}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
