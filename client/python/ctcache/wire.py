"""The API's messages on the wire without the protobuf runtime.

The descriptor channel's few messages are all a session from a runtime form
exchanges with the daemon; importing protobuf (and the API's generated
modules) costs a fresh process more than reading them. This codec reads and
writes protobuf's wire format for the messages the generated
``ctcache._pb.wire_schema`` lists (made from the API's protos with the
stubs, so the two never drift). A :class:`Message` reads like the generated
classes do: fields as attributes (an unset one is its default),
``HasField``, ``WhichOneof``, ``SerializeToString``.

Bytes from the other side are hostile until read: a malformed message
raises :class:`WireError`, never another exception.
"""

from __future__ import annotations

import operator
import struct

from ._pb import wire_schema

PACKAGE = "ctcache.v1"

# descriptor.proto's field types, grouped by how they travel.
_DOUBLE, _FLOAT, _INT64, _UINT64, _INT32, _FIXED64, _FIXED32, _BOOL = 1, 2, 3, 4, 5, 6, 7, 8
_STRING, _GROUP, _MESSAGE, _BYTES, _UINT32, _ENUM, _SFIXED32, _SFIXED64, _SINT32, _SINT64 = range(9, 19)
_VARINT_TYPES = {_INT64, _UINT64, _INT32, _BOOL, _UINT32, _ENUM, _SINT32, _SINT64}
_FIXED = {_DOUBLE: "<d", _FLOAT: "<f", _FIXED64: "<Q", _FIXED32: "<I", _SFIXED32: "<i", _SFIXED64: "<q"}
_WIRE_TYPE = {**{t: 0 for t in _VARINT_TYPES}, _DOUBLE: 1, _FIXED64: 1, _SFIXED64: 1, _FLOAT: 5, _FIXED32: 5,
              _SFIXED32: 5, _STRING: 2, _BYTES: 2, _MESSAGE: 2}
_DEFAULT = {_STRING: "", _BYTES: b"", _BOOL: False, _DOUBLE: 0.0, _FLOAT: 0.0}
_MAX_DEPTH = 64


class WireError(ValueError):
    """Bytes that are no message of the type read (truncated, malformed, or out of the schema)."""


#: Each type's fields by number and by name, built once (decoding makes many messages).
_TYPES: dict = {}

#: The values each integer type holds: protobuf refuses others, prost would cut them.
_RANGES = {_INT32: (-(1 << 31), (1 << 31) - 1), _SINT32: (-(1 << 31), (1 << 31) - 1),
           _SFIXED32: (-(1 << 31), (1 << 31) - 1), _ENUM: (-(1 << 31), (1 << 31) - 1),
           _UINT32: (0, (1 << 32) - 1), _FIXED32: (0, (1 << 32) - 1),
           _INT64: (-(1 << 63), (1 << 63) - 1), _SINT64: (-(1 << 63), (1 << 63) - 1),
           _SFIXED64: (-(1 << 63), (1 << 63) - 1), _UINT64: (0, (1 << 64) - 1), _FIXED64: (0, (1 << 64) - 1)}


def _full_name(type_name: str) -> str:
    """A type's full name: one without a package is one of ``ctcache.v1``."""
    return type_name if "." in type_name else f"{PACKAGE}.{type_name}"


def _schema(type_name: str) -> tuple[dict, dict]:
    known = _TYPES.get(type_name)
    if known is None:
        try:
            fields = wire_schema.MESSAGES[type_name]
        except KeyError:
            raise WireError(f"{type_name} is no message of the API") from None
        known = _TYPES[type_name] = (fields, {f[0]: (n, f) for n, f in fields.items()})
    return known


class Message:
    """One message: ``Message("CompileRequest", runtime="openvino")``
    (a name without a package is one of ``ctcache.v1``)."""

    __slots__ = ("_type", "_fields", "_by_name", "_values")

    def __init__(self, type_name: str, **values):
        full = _full_name(type_name)
        fields, by_name = _schema(full)
        object.__setattr__(self, "_type", full)
        object.__setattr__(self, "_fields", fields)
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_values", {})
        for name, value in values.items():
            setattr(self, name, value)

    def _field(self, name: str):
        try:
            return self._by_name[name]
        except KeyError:
            raise AttributeError(f"{self._type} has no field {name!r}") from None

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        _, (_, kind, repeated, held, _, _) = self._field(name)
        if name in self._values:
            return self._values[name]
        if held in wire_schema.MAPS:
            return self._values.setdefault(name, {})
        if repeated:
            return self._values.setdefault(name, [])
        if kind == _MESSAGE:
            return Message(held)  # read-only default: setting it is no presence
        return _DEFAULT.get(kind, 0)

    def __setattr__(self, name: str, value) -> None:
        _, (_, _, _, _, oneof, _) = self._field(name)
        if oneof:
            for other in [n for n in self._values if self._by_name[n][1][4] == oneof]:
                del self._values[other]
        self._values[name] = value

    def HasField(self, name: str) -> bool:  # noqa: N802 -- as the generated classes name it
        _, (_, _, _, _, _, presence) = self._field(name)
        if not presence:
            raise ValueError(f"{self._type}.{name} has no presence")
        return name in self._values

    def WhichOneof(self, oneof: str):  # noqa: N802
        for name in self._values:
            if self._by_name[name][1][4] == oneof:
                return name
        return None

    def SerializeToString(self) -> bytes:  # noqa: N802
        out = bytearray()
        for number, (name, kind, repeated, held, _, presence) in self._fields.items():
            if name not in self._values:
                continue
            value = self._values[name]
            if held in wire_schema.MAPS:
                (_, key_kind, *_), (_, value_kind, *_) = wire_schema.MESSAGES[held].values()
                for k in sorted(value):
                    # An entry carries its key and value even when default, as protobuf writes it.
                    entry = bytearray()
                    _put_field(entry, 1, key_kind, k)
                    _put_field(entry, 2, value_kind, value[k])
                    _put_len(out, number, bytes(entry))
            elif repeated and kind in _WIRE_TYPE and _WIRE_TYPE[kind] != 2:
                if value:
                    packed = bytearray()
                    for v in value:
                        _put_scalar(packed, kind, v)
                    _put_len(out, number, bytes(packed))
            elif repeated:
                for v in value:
                    _put_field(out, number, kind, v)
            elif presence or not _is_default(kind, value):
                _put_field(out, number, kind, value)
        return bytes(out)

    def __eq__(self, other) -> bool:
        return (isinstance(other, Message) and self._type == other._type
                and self.SerializeToString() == other.SerializeToString())

    def __repr__(self) -> str:
        return f"{self._type.rsplit('.', 1)[-1]}({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"


def _is_default(kind: int, value) -> bool:
    if kind in (_DOUBLE, _FLOAT):
        return struct.pack("<d", value) == bytes(8)  # -0.0 is sent, as protobuf sends it
    return value == _DEFAULT.get(kind, 0)


def decode(type_name: str, data: bytes) -> Message:
    """The message of ``type_name`` in ``data`` (unknown fields skipped)."""
    return _decode(_full_name(type_name), memoryview(bytes(data)), 0)


def _decode(full: str, data: memoryview, depth: int) -> Message:
    if depth > _MAX_DEPTH:
        raise WireError(f"messages nested deeper than {_MAX_DEPTH}")
    msg = Message(full)
    fields, values = msg._fields, msg._values
    pos, end = 0, len(data)
    while pos < end:
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise WireError(f"{full}: field number 0")
        if wire == 0:
            raw, pos = _varint(data, pos)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > end:
                raise WireError(f"{full}: a fixed-size field past the end")
            raw, pos = data[pos:pos + size], pos + size
        elif wire == 2:
            size, pos = _varint(data, pos)
            if size > end - pos:
                raise WireError(f"{full}: a length past the end")
            raw, pos = data[pos:pos + size], pos + size
        else:
            raise WireError(f"{full}: wire type {wire} (groups are not read)")
        field = fields.get(number)
        if field is None:
            continue
        name, kind, repeated, held, _, _ = field
        if kind == _GROUP or kind not in _WIRE_TYPE:
            raise WireError(f"{full}.{name}: a field type this codec does not read")
        if held in wire_schema.MAPS:
            if wire != 2:
                raise WireError(f"{full}.{name}: a map entry must be length-delimited")
            entry = _decode(held, raw, depth + 1)
            values.setdefault(name, {})[entry.key] = entry.value
            continue
        if repeated and wire == 2 and _WIRE_TYPE[kind] != 2:
            values.setdefault(name, []).extend(_unpack(full, name, kind, raw))
            continue
        if wire != _WIRE_TYPE[kind]:
            raise WireError(f"{full}.{name}: wire type {wire}, the schema says {_WIRE_TYPE[kind]}")
        value = _value(full, name, kind, held, raw, depth)
        if repeated:
            values.setdefault(name, []).append(value)
        else:
            setattr(msg, name, value)  # a oneof's member clears the others
    return msg


def _value(full: str, name: str, kind: int, held: str, raw, depth: int):
    if kind == _MESSAGE:
        return _decode(held, raw, depth + 1)
    if kind == _BYTES:
        return bytes(raw)
    if kind == _STRING:
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise WireError(f"{full}.{name}: a string that is not UTF-8") from None
    if kind in _FIXED:
        return struct.unpack(_FIXED[kind], raw)[0]
    return _from_varint(kind, raw)


def _unpack(full: str, name: str, kind: int, raw) -> list:
    out, pos = [], 0
    if kind in _FIXED:
        size = struct.calcsize(_FIXED[kind])
        if len(raw) % size:
            raise WireError(f"{full}.{name}: a packed field cut mid-value")
        return [v for (v,) in struct.iter_unpack(_FIXED[kind], raw)]
    while pos < len(raw):
        v, pos = _varint(raw, pos)
        out.append(_from_varint(kind, v))
    return out


def _from_varint(kind: int, v: int):
    if kind == _BOOL:
        return v != 0
    if kind in (_SINT32, _SINT64):
        return (v >> 1) ^ -(v & 1)
    if kind in (_INT32, _ENUM):
        v &= 0xFFFFFFFF
        return v - (1 << 32) if v >> 31 else v
    if kind == _INT64:
        return v - (1 << 64) if v >> 63 else v
    if kind == _UINT32:
        return v & 0xFFFFFFFF
    return v


def _varint(data, pos: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(pos, min(pos + 10, len(data))):
        b = data[i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value & 0xFFFFFFFFFFFFFFFF, i + 1
        shift += 7
    raise WireError("a varint past the end or longer than ten bytes")


def _put_varint(out: bytearray, v: int) -> None:
    v &= 0xFFFFFFFFFFFFFFFF
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _put_len(out: bytearray, number: int, data: bytes) -> None:
    _put_varint(out, number << 3 | 2)
    _put_varint(out, len(data))
    out += data


def _put_scalar(out: bytearray, kind: int, v) -> None:
    if kind in _RANGES:
        low, high = _RANGES[kind]
        v = operator.index(v)  # TypeError for what is no integer, as protobuf's
        if not low <= v <= high:
            raise ValueError(f"{v} is out of range for the field ({low} to {high})")
    if kind in _FIXED:
        out += struct.pack(_FIXED[kind], v)
    elif kind in (_SINT32, _SINT64):
        _put_varint(out, (v << 1) ^ (v >> 63))
    else:
        _put_varint(out, int(v))


def _put_field(out: bytearray, number: int, kind: int, v) -> None:
    if kind == _MESSAGE:
        # A generated class's message is taken too (its own serialization).
        _put_len(out, number, v.SerializeToString())
    elif kind == _STRING:
        _put_len(out, number, v.encode("utf-8"))
    elif kind == _BYTES:
        _put_len(out, number, bytes(v))
    else:
        _put_varint(out, number << 3 | _WIRE_TYPE[kind])
        _put_scalar(out, kind, v)
