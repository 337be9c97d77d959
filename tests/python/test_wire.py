"""ctcache.wire, the protobuf-free codec of the descriptor channel, against
protobuf itself: every message of the API, filled at random, reads and
writes byte for byte as the generated classes do; hostile bytes are a
WireError and nothing else."""

from __future__ import annotations

import random
import struct

import pytest

from test_python_client import ctcache, installed  # noqa: F401  (session fixtures: pip-installed client)

SEEDS = range(12)


@pytest.fixture(scope="module")
def wire(ctcache):
    from ctcache import wire as mod

    return mod


@pytest.fixture(scope="module")
def classes(ctcache):
    """The generated class of every message the wire schema lists."""
    from google.protobuf import message_factory

    from ctcache._pb import ctcache_v1_pb2, wire_schema

    pool = ctcache_v1_pb2.DESCRIPTOR.pool
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
            for name in wire_schema.MESSAGES if name not in wire_schema.MAPS}


def _scalar(f, rng: random.Random):
    t = f.type
    if t == f.TYPE_BOOL:
        return rng.random() < 0.5
    if t == f.TYPE_STRING:
        return "".join(rng.choice("aZ09 ./é€😀") for _ in range(rng.randint(0, 8)))
    if t == f.TYPE_BYTES:
        return rng.randbytes(rng.randint(0, 12))
    if t == f.TYPE_DOUBLE:
        return rng.choice([0.0, -0.0, 1.5, rng.uniform(-1e300, 1e300)])
    if t == f.TYPE_FLOAT:
        return struct.unpack("<f", struct.pack("<f", rng.uniform(-1e30, 1e30)))[0]
    if t == f.TYPE_ENUM:
        return rng.choice(f.enum_type.values).number
    if t in (f.TYPE_INT32, f.TYPE_SINT32, f.TYPE_SFIXED32):
        return rng.choice([0, -1, 1, -(1 << 31), (1 << 31) - 1, rng.randint(-(1 << 31), (1 << 31) - 1)])
    if t in (f.TYPE_UINT32, f.TYPE_FIXED32):
        return rng.choice([0, 1, (1 << 32) - 1, rng.randint(0, (1 << 32) - 1)])
    if t in (f.TYPE_INT64, f.TYPE_SINT64, f.TYPE_SFIXED64):
        return rng.choice([0, -1, -(1 << 63), (1 << 63) - 1, rng.randint(-(1 << 63), (1 << 63) - 1)])
    return rng.choice([0, 1, (1 << 64) - 1, rng.randint(0, (1 << 64) - 1)])


def _fill(msg, rng: random.Random, depth: int = 0) -> None:
    for f in msg.DESCRIPTOR.fields:
        if rng.random() < 0.35:
            continue
        value = getattr(msg, f.name) if f.type == f.TYPE_MESSAGE or _repeated(f) else None
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_f, value_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            for _ in range(rng.randint(0, 3)):
                k = _scalar(key_f, rng)
                if value_f.message_type is not None:
                    value[k].SetInParent()
                    if depth < 3:
                        _fill(value[k], rng, depth + 1)
                else:
                    value[k] = _scalar(value_f, rng)
        elif _repeated(f) and f.type == f.TYPE_MESSAGE:
            for _ in range(rng.randint(0, 2 if depth < 3 else 0)):
                _fill(value.add(), rng, depth + 1)
        elif _repeated(f):
            value.extend(_scalar(f, rng) for _ in range(rng.randint(0, 4)))
        elif f.type == f.TYPE_MESSAGE:
            value.SetInParent()
            if depth < 3:
                _fill(value, rng, depth + 1)
        else:
            setattr(msg, f.name, _scalar(f, rng))


def _holds_a_map(msg) -> bool:
    for f, value in msg.ListFields():
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            return True
        if f.type == f.TYPE_MESSAGE and any(_holds_a_map(m) for m in (value if _repeated(f) else [value])):
            return True
    return False


def _repeated(f) -> bool:
    return f.is_repeated if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED


@pytest.mark.parametrize("seed", SEEDS)
def test_every_message_reads_and_writes_as_protobuf_does(wire, classes, seed):
    rng = random.Random(seed)
    for name, cls in classes.items():
        original = cls()
        _fill(original, rng)
        sent = original.SerializeToString(deterministic=True)
        read = wire.decode(name, sent)
        again = read.SerializeToString()
        assert cls.FromString(again) == original, name
        # Byte for byte where protobuf fixes the order (a map's entries are in upb's own order).
        assert again == sent or _holds_a_map(original), f"{name}: the codec writes other bytes than protobuf"


def test_the_schema_is_the_generated_classes(ctcache, classes):
    from ctcache._pb import wire_schema

    for name, cls in classes.items():
        ours = {n: (f[0], f[1]) for n, f in wire_schema.MESSAGES[name].items()}
        theirs = {f.number: (f.name, f.type) for f in cls.DESCRIPTOR.fields}
        assert ours == theirs, name


def test_reads_like_the_generated_classes(wire):
    r = wire.decode("CompileResponse", b"")
    assert not r.HasField("form") and r.form.entry.payload_path == "" and not r.HasField("form")
    assert r.leases == [] and r.compiled is False and r.model == b"" and r.compile_us == 0
    with pytest.raises(ValueError):
        r.HasField("compiled")  # a proto3 scalar has no presence
    with pytest.raises(AttributeError):
        r.no_such_field  # noqa: B018
    with pytest.raises(wire.WireError):
        wire.Message("NoSuchMessage")
    step = wire.Message("HandoutReply", needs=wire.Message("HandoutNeeds", names=["a"]))
    step.error = wire.Message("HandoutError", code="INTERNAL")
    assert step.WhichOneof("step") == "error" and not step.HasField("needs")
    back = wire.decode("HandoutReply", step.SerializeToString())
    assert back.WhichOneof("step") == "error" and back.error.code == "INTERNAL"
    req = wire.Message("CompileRequest", config={"B": "2", "A": "1"}, lease_ttl_ms=0)
    assert wire.decode("CompileRequest", req.SerializeToString()).config == {"A": "1", "B": "2"}


@pytest.mark.parametrize("field, value, error", [
    ("bits", 1 << 32, ValueError),        # uint32: prost would cut it to 0
    ("bits", -1, ValueError),
    ("accuracy_level", 1 << 63, ValueError),  # int64
    ("block_size", 32.0, TypeError),
])
def test_a_value_out_of_its_fields_range_is_refused_as_protobuf_refuses_it(wire, ctcache, field, value, error):
    from ctcache._pb import ctcache_v1_pb2 as pb

    with pytest.raises(error):
        wire.Message("MaterializeRequest", **{field: value}).SerializeToString()
    with pytest.raises(error):
        pb.MaterializeRequest(**{field: value})


def test_a_refusal_by_code_name_is_the_clients_error_for_that_code(ctcache):
    """The descriptor channel names a code; the error is the one gRPC's
    code gives, its ``code`` the grpc.StatusCode, resolved when read."""
    import grpc

    from ctcache import errors, handout

    e = errors.refusal("Materialize", "RESOURCE_EXHAUSTED", "full")
    assert type(e) is errors.ResourceExhausted and e.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(e) == "Materialize: RESOURCE_EXHAUSTED: full"
    as_is = errors.refusal("Materialize", "FAILED_PRECONDITION", "none", "nothing-to-rewrite")
    assert type(as_is) is errors.NothingToRewrite and as_is.code == grpc.StatusCode.FAILED_PRECONDITION
    assert type(errors.refusal("Compile", "NO_SUCH_CODE", "?")) is errors.Unknown
    assert errors.refusal("Compile", "NO_SUCH_CODE", "?").code == grpc.StatusCode.UNKNOWN
    assert type(errors.refusal("Compile", grpc.StatusCode.NOT_FOUND, "gone")) is errors.NotFound
    assert handout.HandoutRefused("DATA_LOSS", "rotted").code == grpc.StatusCode.DATA_LOSS


def test_an_answer_is_a_file_of_exactly_the_length_announced(ctcache, tmp_path):
    import os

    from ctcache import handout

    fd = os.memfd_create("answer")
    try:
        os.write(fd, b"abcdef")
        assert handout._sealed_answer(fd, 6) == b"abcdef"
        for announced in (5, 7, 1 << 40):
            with pytest.raises(ConnectionError, match="not the"):
                handout._sealed_answer(fd, announced)
    finally:
        os.close(fd)
    r, w = os.pipe()
    try:
        with pytest.raises(ConnectionError):
            handout._sealed_answer(r, 0)
    finally:
        os.close(r)
        os.close(w)


def test_a_generated_message_is_taken_as_a_field(wire, ctcache):
    from ctcache._pb import ctcache_v1_pb2 as pb

    inner = pb.MaterializeRequest(target="onnxruntime-int8", bits=4)
    req = wire.Message("CompileRequest", runtime="onnxruntime", materialize=inner)
    assert pb.CompileRequest.FromString(req.SerializeToString()).materialize == inner


@pytest.mark.parametrize("bad, says", [
    (b"\x08" + b"\xff" * 10 + b"\x01", "varint"),          # eleven bytes
    (b"\x08\x80", "varint"),                                 # cut mid-varint
    (b"\x00\x01", "field number 0"),
    (b"\x0b", "wire type 3"),                                # a group's start
    (b"\x3a\x05ab", "length past the end"),                  # model (7): 5 bytes announced, 2 there
    (b"\x18\x00\x1a\x00", "wire type 2, the schema says 0"),  # compiled (3) as bytes
    (b"\x0a\x03\x0a\x01\xff", "a string"),                   # form.entry... as a string cut wrong
])
def test_hostile_bytes_are_a_wire_error(wire, bad, says):
    with pytest.raises(wire.WireError):
        wire.decode("CompileResponse", bad)


def test_invalid_utf8_and_deep_nesting_are_wire_errors(wire, classes):
    with pytest.raises(wire.WireError, match="UTF-8"):
        wire.decode("HandoutError", b"\x0a\x02\xc3\x28")
    # GraphProto -> NodeProto -> AttributeProto -> GraphProto ... past the depth bound.
    graph = b""
    for _ in range(40):
        attr = b"\x32" + _len(graph)         # AttributeProto.g (6)
        node = b"\x2a" + _len(attr)          # NodeProto.attribute (5)
        graph = b"\x0a" + _len(node)         # GraphProto.node (1)
    with pytest.raises(wire.WireError, match="deeper"):
        wire.decode("ctcache_onnx.GraphProto", graph)
    assert classes  # the classes read it: only the codec bounds it


def _len(b: bytes) -> bytes:
    out, n = bytearray(), len(b)
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + b


@pytest.mark.parametrize("seed", SEEDS)
def test_cut_and_flipped_bytes_never_raise_anything_else(wire, classes, seed):
    rng = random.Random(seed)
    name = "ctcache.v1.CompileResponse"
    full = classes[name]()
    _fill(full, rng)
    sent = full.SerializeToString()
    for cut in range(len(sent)):
        try:
            wire.decode(name, sent[:cut])
        except wire.WireError:
            pass
    for _ in range(300):
        flipped = bytearray(sent)
        for _ in range(rng.randint(1, 4)):
            if flipped:
                flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        try:
            wire.decode(name, bytes(flipped))
        except wire.WireError:
            pass
