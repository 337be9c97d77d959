"""Independent reference implementation of ctcache decision D3 (canonical source digest v1).

    source_digest = H(header || content)
    header  = u32le(data_type) || u32le(rank) || rank x u64le(dim)
    content = the tensor's elements in ONNX raw_data form (row-major, fixed-width
              little-endian, IEEE floats as bits; 4-bit types two per byte, first element
              in the low nibble; 2-bit types four per byte, first element in the lowest
              two bits; last byte zero-padded; BOOL one byte; STRING: for each element
              u64le(byte length) || bytes)
    H       = blake3 (default) or sha256, 32 bytes, lowercase hex.

This module never calls ctcache.  It computes digests straight from numpy arrays (with
its own packing code, not onnx's) and offers helpers that store one array as a
TensorProto in each storage method ONNX allows:

* ``make_raw``      -- ``raw_data``;
* ``make_typed``    -- the typed field onnx uses for the data type (``float_data``,
                       ``int32_data``, ``int64_data``, ``double_data``, ``uint64_data``,
                       ``string_data``), filled by hand so the field is exactly the one
                       chosen, with onnx's conventions (see ``onnx.helper.make_tensor``);
* ``make_external`` -- ``data_location = EXTERNAL`` with ``location``/``offset``/``length``,
                       through :class:`ExternalDataFile` (several tensors per file, at
                       nonzero offsets, with junk bytes around each blob).

Arrays use the numpy dtype onnx uses for the data type
(``onnx.helper.tensor_dtype_to_np_dtype``: ml_dtypes for bfloat16, float8, int4, ...);
STRING arrays are object arrays of ``bytes`` (``str`` is encoded as UTF-8).

A tiny protobuf wire encoder (``pb_*``, :func:`encode_tensor`, :func:`encode_model`) is
included so tests can write both encodings of repeated scalars (packed, as proto3 writers
such as prost emit, and unpacked, one tag per value) whatever onnx's classes choose.

Run ``python d3.py`` for the self-tests (no ctcache needed).
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

import blake3
import numpy as np
import onnx
from onnx import TensorProto, helper

ALGORITHMS = ("blake3", "sha256")
DEFAULT_ALGORITHM = "blake3"

# ---------------------------------------------------------------------------------------
# Data types
# ---------------------------------------------------------------------------------------

# data_type code -> bits per element in raw_data form (STRING has no raw form: None).
ELEMENT_BITS: dict[int, int | None] = {
    TensorProto.FLOAT: 32,
    TensorProto.UINT8: 8,
    TensorProto.INT8: 8,
    TensorProto.UINT16: 16,
    TensorProto.INT16: 16,
    TensorProto.INT32: 32,
    TensorProto.INT64: 64,
    TensorProto.STRING: None,
    TensorProto.BOOL: 8,
    TensorProto.FLOAT16: 16,
    TensorProto.DOUBLE: 64,
    TensorProto.UINT32: 32,
    TensorProto.UINT64: 64,
    TensorProto.COMPLEX64: 64,
    TensorProto.COMPLEX128: 128,
    TensorProto.BFLOAT16: 16,
    TensorProto.FLOAT8E4M3FN: 8,
    TensorProto.FLOAT8E4M3FNUZ: 8,
    TensorProto.FLOAT8E5M2: 8,
    TensorProto.FLOAT8E5M2FNUZ: 8,
    TensorProto.UINT4: 4,
    TensorProto.INT4: 4,
    TensorProto.FLOAT4E2M1: 4,
    TensorProto.FLOAT8E8M0: 8,
    TensorProto.UINT2: 2,
    TensorProto.INT2: 2,
}

#: every data type D3 covers: FLOAT=1 .. INT2=26 (UNDEFINED=0 excluded).
ALL_DATA_TYPES: tuple[int, ...] = tuple(range(1, 27))
assert set(ALL_DATA_TYPES) == set(ELEMENT_BITS)

SUB_BYTE_TYPES = frozenset(c for c, b in ELEMENT_BITS.items() if b is not None and b < 8)
FLOAT8_TYPES = frozenset(
    {
        TensorProto.FLOAT8E4M3FN,
        TensorProto.FLOAT8E4M3FNUZ,
        TensorProto.FLOAT8E5M2,
        TensorProto.FLOAT8E5M2FNUZ,
        TensorProto.FLOAT8E8M0,
    }
)

# Typed field onnx uses for each data type (mirrors onnx.helper.tensor_dtype_to_field,
# spelled out here so this module states the convention it tests).
TYPED_FIELD: dict[int, str] = {
    TensorProto.FLOAT: "float_data",
    TensorProto.COMPLEX64: "float_data",  # (re, im) pairs
    TensorProto.DOUBLE: "double_data",
    TensorProto.COMPLEX128: "double_data",  # (re, im) pairs
    TensorProto.INT64: "int64_data",
    TensorProto.UINT32: "uint64_data",
    TensorProto.UINT64: "uint64_data",
    TensorProto.STRING: "string_data",
}
for _c in ALL_DATA_TYPES:
    TYPED_FIELD.setdefault(_c, "int32_data")  # the rest: one int32 per element/packed byte

# TensorProto field numbers (onnx.proto) used by the wire encoder below.
TENSOR_FIELD_NUMBER = {
    "dims": 1,
    "data_type": 2,
    "float_data": 4,
    "int32_data": 5,
    "string_data": 6,
    "int64_data": 7,
    "name": 8,
    "raw_data": 9,
    "double_data": 10,
    "uint64_data": 11,
    "external_data": 13,
    "data_location": 14,
}


def type_name(data_type: int) -> str:
    return TensorProto.DataType.Name(data_type)


def np_dtype(data_type: int) -> np.dtype:
    """numpy dtype onnx uses for ``data_type`` (ml_dtypes for the exotic ones)."""
    return helper.tensor_dtype_to_np_dtype(data_type)


# ---------------------------------------------------------------------------------------
# Canonical header / content / digest
# ---------------------------------------------------------------------------------------


def header_bytes(data_type: int, dims: Sequence[int]) -> bytes:
    """u32le(data_type) || u32le(rank) || rank x u64le(dim)."""
    out = struct.pack("<II", data_type, len(dims))
    for d in dims:
        if d < 0:
            raise ValueError(f"negative dim {d}")
        out += struct.pack("<Q", d)
    return out


def _uint_view(flat: np.ndarray, nbytes: int) -> np.ndarray:
    """Bit patterns of a flat array whose items are ``nbytes`` wide, as little-endian uints."""
    if flat.dtype.itemsize != nbytes:
        raise ValueError(f"dtype {flat.dtype} is not {nbytes} bytes wide")
    return flat.view(f"u{nbytes}").astype(f"<u{nbytes}", copy=False)


def _pack_bits(codes: Iterable[int], bits: int, count: int) -> bytes:
    """Pack ``count`` codes of ``bits`` bits each LSB-first; last byte zero-padded.

    Written as a plain loop on purpose: it is the reference, not onnx's implementation.
    """
    out = bytearray((count * bits + 7) // 8)
    mask = (1 << bits) - 1
    per_byte = 8 // bits
    for i, c in enumerate(codes):
        out[i // per_byte] |= (int(c) & mask) << ((i % per_byte) * bits)
    return bytes(out)


def _as_bytes(s) -> bytes:
    if isinstance(s, (bytes, bytearray)):
        return bytes(s)
    if isinstance(s, str):
        return s.encode("utf-8")
    raise TypeError(f"STRING element must be bytes or str, got {type(s)}")


def content_bytes(array: np.ndarray, data_type: int) -> bytes:
    """The tensor's elements in canonical (ONNX raw_data) form."""
    array = np.asarray(array)
    flat = array.reshape(-1)  # row-major (C order) element order
    if data_type == TensorProto.STRING:
        return b"".join(struct.pack("<Q", len(b)) + b for b in map(_as_bytes, flat))
    bits = ELEMENT_BITS[data_type]
    if data_type in SUB_BYTE_TYPES:
        # ml_dtypes stores one sub-byte element per byte; the code is in the low bits.
        codes = flat.view(np.uint8) if flat.dtype.itemsize == 1 else flat.astype(np.int64)
        return _pack_bits(codes.tolist(), bits, flat.size)
    if data_type == TensorProto.BOOL:
        return flat.astype(np.uint8).tobytes()
    if data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
        half = bits // 16  # bytes per real component
        comps = flat.view(f"f{half}")  # re, im, re, im ...
        return _uint_view(comps, half).tobytes()
    return _uint_view(flat, bits // 8).tobytes()


def hash_bytes(data: bytes, algorithm: str = DEFAULT_ALGORITHM) -> str:
    if algorithm == "blake3":
        return blake3.blake3(data).hexdigest()
    if algorithm == "sha256":
        return hashlib.sha256(data).hexdigest()
    raise ValueError(f"unknown algorithm {algorithm!r}")


def digest_raw(
    data_type: int, dims: Sequence[int], content: bytes, algorithm: str = DEFAULT_ALGORITHM
) -> str:
    """Digest from an already canonical content buffer."""
    return hash_bytes(header_bytes(data_type, dims) + content, algorithm)


def digest(array: np.ndarray, data_type: int, algorithm: str = DEFAULT_ALGORITHM) -> str:
    """D3 digest of a numpy array interpreted as ONNX ``data_type``, lowercase hex."""
    array = np.asarray(array)
    return digest_raw(data_type, array.shape, content_bytes(array, data_type), algorithm)


# ---------------------------------------------------------------------------------------
# Random test data
# ---------------------------------------------------------------------------------------

_F32_SPECIALS = np.array(
    [
        0x00000000,  # +0.0
        0x80000000,  # -0.0
        0x7F800000,  # +inf
        0xFF800000,  # -inf
        0x7FC00000,  # quiet NaN
        0xFFC00000,  # negative quiet NaN
        0x7FC12345,  # quiet NaN with payload
        0x7F800001,  # signalling NaN (bits must survive every storage path)
        0x00000001,  # smallest denormal
        0x007FFFFF,  # largest denormal
        0x80000001,  # negative denormal
        0x00800000,  # smallest normal
        0x7F7FFFFF,  # largest finite
        0x3F800000,  # 1.0
    ],
    dtype=np.uint32,
)
_F64_SPECIALS = np.array(
    [
        0x0000000000000000,
        0x8000000000000000,
        0x7FF0000000000000,
        0xFFF0000000000000,
        0x7FF8000000000000,
        0xFFF8000000000000,
        0x7FF8000000012345,
        0x7FF0000000000001,  # signalling NaN
        0x0000000000000001,
        0x000FFFFFFFFFFFFF,
        0x8000000000000001,
        0x0010000000000000,
        0x7FEFFFFFFFFFFFFF,
        0x3FF0000000000000,
    ],
    dtype=np.uint64,
)
_F16_SPECIALS = np.array(
    [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x0001, 0x03FF, 0x8001, 0x7BFF],
    dtype=np.uint16,
)
_BF16_SPECIALS = np.array(
    [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0x0001, 0x007F, 0x8001, 0x7F7F],
    dtype=np.uint16,
)

_STRING_POOL = [
    b"",
    b"a",
    b"hello",
    "h\u00e9llo w\u00f6rld \u2603".encode("utf-8"),
    b"with\x00nul",
    b"\xff\xfe not utf-8",
    b"x" * 300,  # length needs a 2-byte varint on the wire
]


def random_array(data_type: int, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Random array of ``shape`` for ``data_type``.

    Floats mix normal values with NaN (several payloads), +-inf, -0.0 and denormals (the
    specials are placed first so small tensors get them); integers include negative
    values and the type's extremes.  Sub-byte and float8 types get random bit patterns.
    """
    shape = tuple(int(d) for d in shape)
    n = math.prod(shape)
    dt = np_dtype(data_type)

    def with_specials(bits: np.ndarray, specials: np.ndarray) -> np.ndarray:
        k = min(n, specials.size)
        bits[:k] = specials[:k]
        return bits

    if data_type == TensorProto.STRING:
        flat = np.empty(n, dtype=object)
        for i in range(n):
            if i < len(_STRING_POOL):
                flat[i] = _STRING_POOL[i]
            else:
                flat[i] = bytes(rng.integers(0, 256, size=int(rng.integers(0, 12)), dtype=np.uint8))
        return flat.reshape(shape)
    if data_type == TensorProto.FLOAT:
        bits = (rng.standard_normal(n).astype(np.float32) * 100).view(np.uint32)
        return with_specials(bits, _F32_SPECIALS).view(np.float32).reshape(shape)
    if data_type == TensorProto.DOUBLE:
        bits = (rng.standard_normal(n) * 1e6).view(np.uint64)
        return with_specials(bits, _F64_SPECIALS).view(np.float64).reshape(shape)
    if data_type == TensorProto.COMPLEX64:
        bits = (rng.standard_normal(2 * n).astype(np.float32)).view(np.uint32)
        return with_specials(bits, _F32_SPECIALS).view(np.complex64).reshape(shape)
    if data_type == TensorProto.COMPLEX128:
        bits = rng.standard_normal(2 * n).view(np.uint64)
        return with_specials(bits, _F64_SPECIALS).view(np.complex128).reshape(shape)
    if data_type == TensorProto.FLOAT16:
        bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        return with_specials(bits, _F16_SPECIALS).view(dt).reshape(shape)
    if data_type == TensorProto.BFLOAT16:
        bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        return with_specials(bits, _BF16_SPECIALS).view(dt).reshape(shape)
    if data_type in FLOAT8_TYPES:
        # Any bit pattern, NaN encodings included (0x7F/0xFF, 0x80 for FNUZ, 0xFF E8M0).
        bits = rng.integers(0, 256, size=n, dtype=np.uint8)
        return with_specials(bits, np.array([0x00, 0x80, 0x7F, 0xFF, 0x01], np.uint8)).view(dt).reshape(shape)
    if data_type == TensorProto.BOOL:
        return rng.integers(0, 2, size=n).astype(bool).reshape(shape)
    if data_type in SUB_BYTE_TYPES:
        bits = ELEMENT_BITS[data_type]
        if data_type in (TensorProto.INT4, TensorProto.INT2):
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        else:
            lo, hi = 0, (1 << bits) - 1
        vals = rng.integers(lo, hi + 1, size=n)
        vals[: min(n, 2)] = [lo, hi][: min(n, 2)]
        if data_type == TensorProto.FLOAT4E2M1:
            return vals.astype(np.uint8).view(dt).reshape(shape)
        return vals.astype(dt).reshape(shape)
    # Plain integers: full range, extremes first.
    info = np.iinfo(dt)
    vals = rng.integers(info.min, info.max, size=n, dtype=dt, endpoint=True)
    ext = np.array([info.min, info.max, 0, -1 if info.min < 0 else 1], dtype=dt)
    vals[: min(n, 4)] = ext[: min(n, 4)]
    return vals.reshape(shape)


# ---------------------------------------------------------------------------------------
# Equality of arrays by bit pattern (NaN-safe)
# ---------------------------------------------------------------------------------------


def same_bits(a: np.ndarray, b: np.ndarray, data_type: int) -> bool:
    """True when two arrays hold the same tensor (dims and element bit patterns)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if data_type == TensorProto.STRING:
        return [_as_bytes(x) for x in a.reshape(-1)] == [_as_bytes(x) for x in b.reshape(-1)]
    return content_bytes(a, data_type) == content_bytes(b, data_type)


# ---------------------------------------------------------------------------------------
# TensorProto builders
# ---------------------------------------------------------------------------------------

STORAGES = ("raw", "typed", "external")


def _base_tensor(name: str, data_type: int, dims: Sequence[int]) -> TensorProto:
    t = TensorProto()
    t.name = name
    t.data_type = data_type
    t.dims.extend(int(d) for d in dims)
    return t


def make_raw(name: str, array: np.ndarray, data_type: int) -> TensorProto:
    """``raw_data`` storage (``onnx.helper.make_tensor(..., raw=True)``)."""
    if data_type == TensorProto.STRING:
        raise ValueError("STRING has no raw_data form")
    array = np.asarray(array)
    return helper.make_tensor(name, data_type, array.shape, content_bytes(array, data_type), raw=True)


def typed_values(array: np.ndarray, data_type: int) -> list:
    """The values onnx puts in the typed field for ``data_type`` (make_tensor(raw=False)).

    * FLOAT / DOUBLE: the values; COMPLEX64 / COMPLEX128: (re, im) pairs in float/double.
    * INT64: int64_data; UINT32 / UINT64: uint64_data.
    * INT8, INT16, INT32: int32_data, sign-extended; UINT8, UINT16: zero-extended.
    * BOOL: 0 / 1 in int32_data.
    * FLOAT16, BFLOAT16: the 16-bit pattern (0..65535) in int32_data.
    * float8 types: the 8-bit pattern (0..255) in int32_data.
    * INT4 / UINT4 / FLOAT4E2M1: two elements per int32_data entry, each entry one packed
      byte (first element in the low nibble), like onnx.numpy_helper._pack_4bitx2.
    * INT2 / UINT2: four elements per entry, first element in the lowest two bits.
    * STRING: string_data, bytes per element.
    Floats are returned as bit-exact numpy arrays; see :func:`make_typed`.
    """
    flat = np.asarray(array).reshape(-1)
    if data_type == TensorProto.STRING:
        return [_as_bytes(x) for x in flat]
    if data_type in (TensorProto.FLOAT, TensorProto.DOUBLE):
        return flat
    if data_type == TensorProto.COMPLEX64:
        return flat.view(np.float32)
    if data_type == TensorProto.COMPLEX128:
        return flat.view(np.float64)
    if data_type in SUB_BYTE_TYPES:
        return list(content_bytes(flat, data_type))  # packed bytes, one per entry
    if data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
        return flat.view(np.uint16).astype(np.int64).tolist()
    if data_type in FLOAT8_TYPES:
        return flat.view(np.uint8).astype(np.int64).tolist()
    if data_type == TensorProto.BOOL:
        return flat.astype(np.int64).tolist()
    return flat.astype(np.int64).tolist() if flat.dtype != np.uint64 else [int(x) for x in flat]


def make_typed(name: str, array: np.ndarray, data_type: int) -> TensorProto:
    """Typed-field storage: only the field onnx's convention names for ``data_type`` is set.

    float_data / double_data are filled by merging their wire encoding (the values' exact
    IEEE bits) so NaN payloads and signalling NaNs survive: assigning through Python
    floats could quiet a signalling NaN.
    """
    array = np.asarray(array)
    t = _base_tensor(name, data_type, array.shape)
    field = TYPED_FIELD[data_type]
    vals = typed_values(array, data_type)
    if field in ("float_data", "double_data"):
        fmt = "<u4" if field == "float_data" else "<u8"
        payload = np.asarray(vals).view(fmt[1:]).astype(fmt).tobytes()
        if payload:
            t.MergeFromString(pb_bytes(TENSOR_FIELD_NUMBER[field], payload))  # packed
    else:
        getattr(t, field).extend(vals)
    return t


@dataclass
class ExternalDataFile:
    """Writes several tensors into one external data file at nonzero offsets.

    ``directory`` is the model's folder; ``location`` is relative to it (may contain
    sub-folders).  Before each blob it writes ``gap`` junk bytes and aligns the offset to
    ``align``; ``close`` appends trailing junk, so a reader that ignores ``length`` or
    ``offset`` hashes the wrong bytes.
    """

    directory: str
    location: str
    align: int = 16
    gap: int = 5

    def __post_init__(self) -> None:
        self.path = os.path.join(self.directory, self.location)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._f = open(self.path, "wb")
        self._f.write(b"CTCACHE-EXTERNAL-TEST\n")  # never at offset 0

    def write(self, data: bytes) -> tuple[int, int]:
        pos = self._f.tell() + self.gap
        pos += (-pos) % self.align
        self._f.write(b"\xa5" * (pos - self._f.tell()))
        self._f.write(data)
        return pos, len(data)

    def close(self) -> None:
        self._f.write(b"\x5a" * 7 + b"TRAILING-JUNK")
        self._f.close()

    def __enter__(self) -> "ExternalDataFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def set_external(t: TensorProto, location: str, offset: int | None, length: int | None) -> TensorProto:
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            e = t.external_data.add()
            e.key, e.value = key, str(value)
    return t


def make_external(
    name: str, array: np.ndarray, data_type: int, data_file: ExternalDataFile
) -> TensorProto:
    """External storage: the raw_data bytes go to ``data_file`` (offset/length recorded)."""
    if data_type == TensorProto.STRING:
        raise ValueError("STRING has no external form")
    array = np.asarray(array)
    offset, length = data_file.write(content_bytes(array, data_type))
    t = _base_tensor(name, data_type, array.shape)
    return set_external(t, data_file.location, offset, length)


def make_tensor(
    name: str,
    array: np.ndarray,
    data_type: int,
    storage: str,
    data_file: ExternalDataFile | None = None,
) -> TensorProto:
    if storage == "raw":
        return make_raw(name, array, data_type)
    if storage == "typed":
        return make_typed(name, array, data_type)
    if storage == "external":
        assert data_file is not None
        return make_external(name, array, data_type, data_file)
    raise ValueError(storage)


def storage_of(t: TensorProto) -> str:
    """How a TensorProto stores its data: 'raw', 'typed' or 'external'."""
    if t.data_location == TensorProto.EXTERNAL:
        return "external"
    if t.HasField("raw_data"):
        return "raw"
    return "typed"


def supported_storages(data_type: int) -> tuple[str, ...]:
    return ("typed",) if data_type == TensorProto.STRING else STORAGES


# ---------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------

IR_VERSION = 12  # IR 12 (ONNX 1.19+) knows every type up to INT2 = 26
OPSET = 25


def make_model(initializers: Sequence[TensorProto], graph_name: str = "d3") -> onnx.ModelProto:
    """A model whose graph holds only ``initializers`` (no nodes, no inputs/outputs)."""
    graph = helper.make_graph([], graph_name, [], [], initializer=list(initializers))
    model = helper.make_model(
        graph, producer_name="ctcache-d3-tests", opset_imports=[helper.make_opsetid("", OPSET)]
    )
    model.ir_version = IR_VERSION
    return model


def save_model(model: onnx.ModelProto, path: str) -> None:
    """Save without onnx's external-data conversion (tensors keep the storage we built)."""
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def decode(t: TensorProto, base_dir: str = "") -> np.ndarray:
    """Decode with onnx (external data resolved against ``base_dir``); STRING as bytes."""
    if t.data_type == TensorProto.STRING:
        return np.array(list(t.string_data), dtype=object).reshape(tuple(t.dims))
    return onnx.numpy_helper.to_array(t, base_dir)


# ---------------------------------------------------------------------------------------
# Minimal protobuf wire encoder
# ---------------------------------------------------------------------------------------

WT_VARINT, WT_I64, WT_LEN, WT_I32 = 0, 1, 2, 5


def pb_varint(value: int) -> bytes:
    """Base-128 varint; negative values are encoded as 64-bit two's complement (10 bytes)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pb_tag(field: int, wire_type: int) -> bytes:
    return pb_varint((field << 3) | wire_type)


def pb_uint(field: int, value: int) -> bytes:
    """A varint field (int32/int64/uint64/enum/bool)."""
    return pb_tag(field, WT_VARINT) + pb_varint(value)


def pb_bytes(field: int, data: bytes) -> bytes:
    """A length-delimited field (bytes, string, sub-message, packed repeated)."""
    return pb_tag(field, WT_LEN) + pb_varint(len(data)) + data


def pb_str(field: int, s: str) -> bytes:
    return pb_bytes(field, s.encode("utf-8"))


def _repeated(field: int, wire_type: int, items: Sequence[bytes], packed: bool) -> bytes:
    """A repeated scalar field: one length-delimited run (packed) or one tag per item."""
    if not items:
        return b""
    if packed:
        return pb_bytes(field, b"".join(items))
    return b"".join(pb_tag(field, wire_type) + it for it in items)


def encode_tensor(t: TensorProto, packed: bool = True) -> bytes:
    """Re-encode a TensorProto by hand, fields in field-number order, defaults omitted.

    ``packed=True`` is what proto3 writers (prost, protobuf-go) emit for repeated scalars;
    ``packed=False`` is the other encoding every parser must accept (one tag per value).
    Floats are copied bit-exactly (signalling NaNs and payloads survive).
    """
    def varints(vals):
        return [pb_varint(int(v)) for v in vals]

    def fixed(vals, fmt):
        raw = np.asarray(vals, dtype=fmt).tobytes()
        w = np.dtype(fmt).itemsize
        return [raw[i : i + w] for i in range(0, len(raw), w)]

    out = bytearray()
    out += _repeated(1, WT_VARINT, varints(t.dims), packed)
    if t.data_type:
        out += pb_uint(2, t.data_type)
    out += _repeated(4, WT_I32, fixed(t.float_data, "<f4"), packed)
    out += _repeated(5, WT_VARINT, varints(t.int32_data), packed)
    for s in t.string_data:
        out += pb_bytes(6, s)
    out += _repeated(7, WT_VARINT, varints(t.int64_data), packed)
    if t.name:
        out += pb_str(8, t.name)
    if t.HasField("raw_data"):
        out += pb_bytes(9, t.raw_data)
    out += _repeated(10, WT_I64, fixed(t.double_data, "<f8"), packed)
    out += _repeated(11, WT_VARINT, varints(t.uint64_data), packed)
    for e in t.external_data:
        out += pb_bytes(13, pb_str(1, e.key) + pb_str(2, e.value))
    if t.data_location:
        out += pb_uint(14, t.data_location)
    return bytes(out)


def encode_model(tensors: Sequence[TensorProto], packed: bool = True, graph_name: str = "d3wire") -> bytes:
    """A ModelProto (ir_version, producer, graph{name, initializers}, opset_import) whose
    tensors are encoded by :func:`encode_tensor` (packed or unpacked repeated scalars)."""
    graph = pb_str(2, graph_name) + b"".join(pb_bytes(5, encode_tensor(t, packed)) for t in tensors)
    return (
        pb_uint(1, IR_VERSION)
        + pb_str(2, "ctcache-d3-tests")
        + pb_bytes(7, graph)
        + pb_bytes(8, pb_str(1, "") + pb_uint(2, OPSET))
    )


# ---------------------------------------------------------------------------------------
# Self-tests (no ctcache involved)
# ---------------------------------------------------------------------------------------

SELFTEST_SHAPES = [(), (0,), (3, 0, 2), (1,), (2,), (3,), (5,), (7,), (2, 3), (3, 5), (2, 3, 4)]


def _selftest_known_answers() -> None:
    # FLOAT [2] = [1.0, -0.0]; header 01000000 01000000 0200000000000000.
    a = np.array([1.0, -0.0], dtype=np.float32)
    assert header_bytes(1, a.shape).hex() == "01000000" "01000000" "0200000000000000"
    assert content_bytes(a, 1).hex() == "0000803f" "00000080"
    # INT4 [3] = [1, -1, 7] -> 0xf1, 0x07 (first element in the low nibble, padded).
    assert content_bytes(np.array([1, -1, 7], dtype=np_dtype(22)), 22) == b"\xf1\x07"
    # UINT2 [5] = [0, 1, 2, 3, 1] -> 0b11_10_01_00 = 0xe4, then 0x01.
    assert content_bytes(np.array([0, 1, 2, 3, 1], dtype=np_dtype(25)), 25) == b"\xe4\x01"
    # STRING [2] = ["", "ab"].
    s = np.array([b"", b"ab"], dtype=object)
    assert content_bytes(s, 8) == bytes(8) + b"\x02" + bytes(7) + b"ab"
    # Scalar: rank 0, no dims in the header.
    assert header_bytes(7, ()) == b"\x07\x00\x00\x00\x00\x00\x00\x00"
    # Hash functions themselves.
    assert hash_bytes(b"", "sha256") == hashlib.sha256(b"").hexdigest()
    assert hash_bytes(b"", "blake3") == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"


def _selftest_onnx_agreement(tmpdir: str) -> int:
    """Every type x shape x storage: onnx decodes the TensorProto back to the same array,
    our raw content equals onnx's own raw encoding, and the digest of the decoded array
    equals the digest of the original."""
    rng = np.random.default_rng(20240601)
    checked = 0
    for dt in ALL_DATA_TYPES:
        tensors = []
        arrays = {}
        with ExternalDataFile(tmpdir, f"self_{dt}.bin") as ext:
            for shape in SELFTEST_SHAPES:
                arr = random_array(dt, shape, rng)
                want = {alg: digest(arr, dt, alg) for alg in ALGORITHMS}
                if dt != TensorProto.STRING:
                    # onnx's own raw encoding agrees with ours.
                    ref = helper.make_tensor("r", dt, arr.shape, arr, raw=True).raw_data
                    assert ref == content_bytes(arr, dt), (type_name(dt), shape)
                for storage in supported_storages(dt):
                    name = f"{type_name(dt)}_{'x'.join(map(str, shape)) or 'scalar'}_{storage}"
                    t = make_tensor(name, arr, dt, storage, ext)
                    assert storage_of(t) == storage or math.prod(shape) == 0
                    tensors.append(t)
                    arrays[name] = (arr, want)
        # Serialize and re-read the model, then decode each tensor with onnx.
        model = make_model(tensors)
        path = os.path.join(tmpdir, f"self_{dt}.onnx")
        save_model(model, path)
        onnx.checker.check_model(path)  # valid ONNX (external data resolved too)
        loaded = onnx.load(path, load_external_data=False)
        for t in loaded.graph.initializer:
            arr, want = arrays[t.name]
            back = decode(t, tmpdir)
            assert same_bits(back, arr, dt), t.name
            for alg in ALGORITHMS:
                assert digest(back, dt, alg) == want[alg], (t.name, alg)
            checked += 1
        # Typed fields match what onnx.helper.make_tensor(raw=False) writes (no NaN
        # payload concerns: compare the decoded bits).
        for shape in SELFTEST_SHAPES:
            arr = random_array(dt, shape, rng)
            ours = make_typed("t", arr, dt)
            vals = arr if dt != TensorProto.STRING else [bytes(x) for x in arr.reshape(-1)]
            if dt in FLOAT8_TYPES:
                continue  # make_tensor(raw=False) saturate-casts float8: bit patterns differ
            theirs = helper.make_tensor("t", dt, arr.shape, vals, raw=False)
            field = TYPED_FIELD[dt]
            if dt in (1, 11, 14, 15):
                a_ = np.asarray(getattr(ours, field))
                b_ = np.asarray(getattr(theirs, field))
                assert a_.tobytes() == b_.tobytes() or np.isnan(a_).any(), (type_name(dt), shape)
            else:
                assert list(getattr(ours, field)) == list(getattr(theirs, field)), (type_name(dt), shape)
            for other in {"float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"} - {field}:
                assert len(getattr(ours, other)) == 0
            assert not ours.HasField("raw_data")
    return checked


def _selftest_wire(tmpdir: str) -> None:
    """The hand encodings (packed and unpacked) parse with onnx into the same tensors."""
    rng = np.random.default_rng(7)
    cases = []
    for dt in ALL_DATA_TYPES:
        arr = random_array(dt, (3, 5), rng)  # 15 elements: includes the float specials
        cases.append((dt, arr, make_typed(f"p{dt}", arr, dt)))
    for packed in (True, False):
        m = onnx.ModelProto.FromString(encode_model([t for _, _, t in cases], packed))
        for (dt, arr, _), t in zip(cases, m.graph.initializer):
            assert same_bits(decode(t), arr, dt), (type_name(dt), packed)


def selftest() -> None:
    import tempfile

    _selftest_known_answers()
    with tempfile.TemporaryDirectory() as d:
        n = _selftest_onnx_agreement(d)
        _selftest_wire(d)
    print(f"d3 self-test OK ({n} tensors decoded by onnx and re-digested)")


if __name__ == "__main__":
    selftest()
