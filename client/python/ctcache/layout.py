"""Where the fields of a compiled tensor's payload lie, as numpy dtypes and shapes.

A payload is laid out by its entry's ``struct_type`` (a ``StructTypeProto``,
docs/FORMAT.md) under the entry's ``dims``: the root is a structure whose
fields follow each other, each a scalar, a (nested) array of scalars, or an
array of inline structures. :func:`fields` gives each field it can express
in numpy its byte offset, dtype and shape; a field it cannot (sub-byte
elements, packed arrays, types without a numpy dtype) ends the list, since
the offsets after it would be guesses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# ONNX TensorProto.DataType codes with a native numpy dtype.
_NUMPY_TYPES = {
    1: "<f4", 2: "u1", 3: "i1", 4: "<u2", 5: "<i2", 6: "<i4", 7: "<i8",
    9: "?", 10: "<f2", 11: "<f8", 12: "<u4", 13: "<u8",
}


@dataclass(frozen=True)
class Field:
    """One field of a payload: ``count`` elements of ``dtype`` in ``shape``, starting at byte ``offset``."""

    name: str
    offset: int
    dtype: Any  # numpy.dtype
    shape: tuple

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


def _count(node, dims) -> int | None:
    which = node.WhichOneof("count")
    if which == "dimension":
        return node.dimension
    if which == "dims_index" and node.dims_index < len(dims):
        return dims[node.dims_index]
    return None


def _type(t, dims, np):
    """(dtype, shape) of a TypeProto, or None when numpy cannot hold it."""
    which = t.WhichOneof("value")
    if which == "tensor_type":
        code = _NUMPY_TYPES.get(t.tensor_type.elem_type)
        return (np.dtype(code), ()) if code else None
    if which == "struct_type":
        return _struct(t.struct_type, dims, np)
    return None


def _struct(s, dims, np):
    kind = s.WhichOneof("kind")
    if kind == "array":
        n = _count(s.array, dims)
        elem = _type(s.array.element_type, dims, np) if n is not None else None
        if elem is None:
            return None
        dtype, shape = elem
        return dtype, (n,) + shape
    if kind == "structure":
        parts = []
        for f in s.structure.field:
            if f.WhichOneof("content") != "type":
                continue  # a constant takes no payload bytes
            t = _type(f.type, dims, np)
            if t is None:
                return None
            parts.append((f.name, t[0], t[1]))
        return np.dtype(parts), ()
    return None


def fields(struct_type, dims) -> list[Field]:
    """The payload fields of a root ``StructTypeProto`` under ``dims``, in payload order.

    Stops at the first field numpy cannot express (see the module's doc).
    """
    import numpy as np

    if struct_type.WhichOneof("kind") != "structure":
        return []
    out, offset = [], 0
    for f in struct_type.structure.field:
        if f.WhichOneof("content") != "type":
            continue
        t = _type(f.type, list(dims), np)
        if t is None:
            break
        field = Field(f.name, offset, t[0], t[1])
        out.append(field)
        offset += field.nbytes
    return out


def payload_fields(struct_type) -> int:
    """How many fields of a root structure take payload bytes (constants do not)."""
    if struct_type.WhichOneof("kind") != "structure":
        return 0
    return sum(1 for f in struct_type.structure.field if f.WhichOneof("content") == "type")


__all__ = ["Field", "fields", "payload_fields"]
