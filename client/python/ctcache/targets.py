"""A materialize target's request: the target and its settings, built
without the generated classes (:mod:`ctcache.wire`), so a session asked on
the descriptor channel imports no protobuf. gRPC calls read it as their
generated class (:func:`as_generated`)."""

from __future__ import annotations

from . import wire


def target_request(target: str, *, bits=None, block_size=None, symmetric=None, accuracy_level: int = 0,
                   weight_type=None, per_channel: bool = False, reduce_range: bool = False, op_types=None,
                   op_block_list=None) -> wire.Message:
    """A MaterializeRequest of ``target`` and its settings (unset ones left to the daemon's policy)."""
    req = wire.Message("MaterializeRequest", target=target, accuracy_level=int(accuracy_level))
    if bits is not None:
        req.bits = int(bits)
    if block_size is not None:
        req.block_size = int(block_size)
    if symmetric is not None:
        req.symmetric = bool(symmetric)
    if weight_type is not None:
        req.weight_type = str(weight_type)
    req.per_channel = bool(per_channel)
    req.reduce_range = bool(reduce_range)
    req.op_types = [str(t) for t in op_types or []]
    if op_block_list is not None:
        req.op_block_list = ",".join(op_block_list)
    return req


def as_generated(msg: wire.Message, cls):
    """``msg`` as the generated class ``cls`` reads it."""
    return cls.FromString(msg.SerializeToString())
