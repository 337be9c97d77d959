"""onnxruntime helpers: quantized models materialized by ctcached.

Three targets: ``"onnxruntime-int4"`` (the default; MatMulNBits),
``"onnxruntime-int8"`` (byte for byte what
``onnxruntime.quantization.quantize_dynamic`` writes; fallback: that tool)
and ``"onnxruntime-fp16"`` (what ``onnxruntime.transformers.float16.
convert_float_to_float16(keep_io_types=True)`` writes; fallback: that tool).

    import ctcache.ort
    sess = ctcache.ort.inference_session("/models/m.onnx")    # MatMulNBits weights from the cache
    r = ctcache.materialize("/models/m.onnx")                 # -> /models/m.int4.onnx (+ m.int4.onnx.weights/)

:func:`materialize` writes (with this process's rights) a copy of an
fp32/fp16 model that the daemon builds, in which every eligible MatMul (and
Gemm) is a ``com.microsoft::MatMulNBits`` whose weights come from the
daemon's cached ``ort.matmul_nbits`` payloads: reflinks where the filesystem supports them (a warm materialize then writes
a few kilobytes of model, whatever the size of the weights), else copies;
hard links with ``link="hard"``.

:func:`inference_session` is the drop-in: it returns an
``onnxruntime.InferenceSession`` on that 4-bit form, by default writing no
file at all (``link="memory"``: the model's bytes come from the daemon, the
weights are the cache's payload files, which onnxruntime maps in place).
When no daemon answers
(and ``fallback=True``) it warns (:class:`FallbackWarning`) and quantizes in
this process with onnxruntime's own ``MatMulNBitsQuantizer`` (same settings),
which gives the same weights, only slower.

onnxruntime and onnx are imported only when these functions run, so
``import ctcache`` works without them.

Note: ``onnx.load(path)`` (onnx >= 1.21) refuses external data files with
more than one hard link, which is what ``link="hard"`` payloads are.
onnxruntime loads them fine; to read such a model with onnx use
``onnx.load(path, load_external_data=False)``. The default (``link="auto"``)
gives every file one link, which onnx loads.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import errors

if TYPE_CHECKING:
    from pathlib import Path

    from ._pb import ctcache_v1_pb2 as pb

# grpc and protobuf (the client) are imported where a call needs them, and
# what only a fallback or a file output uses where it is used: a fresh
# process's session pays for no import it does not run.

#: Settings used when a call leaves them unset and no daemon decides
#: (the daemon's own default policy for ``ort.matmul_nbits``).
DEFAULT_BITS = 4
DEFAULT_BLOCK_SIZE = 32
DEFAULT_SYMMETRIC = True

#: The targets :func:`materialize` and :func:`inference_session` take.
TARGET_INT4 = "onnxruntime-int4"
TARGET_INT8 = "onnxruntime-int8"
TARGET_FP16 = "onnxruntime-fp16"
TARGETS = (TARGET_INT4, TARGET_INT8, TARGET_FP16)

# ModelProto serialization limit: a model at least this large goes through a file.
_PROTOBUF_LIMIT = 2 << 30

__all__ = [
    "DEFAULT_BITS",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_SYMMETRIC",
    "TARGETS",
    "TARGET_FP16",
    "TARGET_INT4",
    "TARGET_INT8",
    "LINK_MEMORY",
    "AsIsWarning",
    "FallbackWarning",
    "SessionReport",
    "default_output_path",
    "inference_session",
    "materialize",
    "quantize_dynamic_in_process",
    "quantize_in_process",
]


class FallbackWarning(RuntimeWarning):
    """No daemon answered: the model was quantized in this process instead."""


class AsIsWarning(RuntimeWarning):
    """The target rewrites nothing in this model: the session runs it as it is."""


def _log_report(report) -> None:
    """The report at INFO on the ``ctcache`` logger; without ``logging``
    imported, no handler could take it, and it is not imported for it."""
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.getLogger("ctcache").info("%s", report)


@dataclass
class SessionReport:
    """What :func:`inference_session` did, as ``session.ctcache_report``.

    ``source``: ``"daemon"`` (the target's model, or the runtime's form,
    from the cache), ``"as-is"`` (nothing to rewrite: the model itself),
    ``"fallback"`` (no daemon: the reference tool in this process) or
    ``"runtime"`` (no form: onnxruntime made the session itself). ``cached`` and
    ``packed`` count the weights served from the cache and packed for this
    call; ``skipped`` lists ``(node, op type, reason)`` of the nodes left as
    they are; ``why`` says why the source is not the daemon's model;
    ``seconds`` is the whole call, session creation included."""

    path: str
    target: str
    source: str
    rewritten: int = 0
    cached: int = 0
    packed: int = 0
    skipped: list = field(default_factory=list)
    why: str = ""
    seconds: float = 0.0

    def __str__(self) -> str:
        if self.source == "daemon":
            what = (f"{self.rewritten} node(s) rewritten, {self.cached} weight(s) from the cache, "
                    f"{self.packed} packed now, {len(self.skipped)} node(s) left as they are")
        else:
            what = f"{self.source}: {self.why}"
        return f"ctcache {self.target} session of {self.path}: {what} ({self.seconds:.3f} s)"


def _cache_home() -> Path:
    from pathlib import Path

    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"])
    return Path.home() / ".cache"


def default_output_path(path, bits: int | None = None, target: str = TARGET_INT4, weight_type: str | None = None,
                        watched=()) -> Path:
    """Where :func:`materialize` writes when given no output path.

    ``<folder>/<stem>.int4.onnx`` next to the model (``.int8.onnx`` with
    ``bits=8``; ``bits=None`` names it int4 though the daemon's policy has
    the last word), its weights in ``<stem>.int4.onnx.weights/``. When the
    model's folder is not writable, or lies in one of the ``watched``
    folders (where the daemon would take the output for a new model to
    pack): ``$XDG_CACHE_HOME/ctcache/materialized/
    <hash of the model's absolute path>/<stem>.int4.onnx`` (``~/.cache`` when
    ``XDG_CACHE_HOME`` is unset). ``target="onnxruntime-int8"``:
    ``<stem>.dynamic-int8.onnx`` (``dynamic-uint8`` with ``weight_type="uint8"``);
    ``"onnxruntime-fp16"``: ``<stem>.fp16.onnx``.
    """
    import hashlib
    from pathlib import Path

    src = Path(os.path.abspath(os.fspath(path)))
    stem = src.name[:-5] if src.name.endswith(".onnx") else src.name
    if target == TARGET_INT8:
        name = f"{stem}.dynamic-{weight_type or 'int8'}.onnx"
    elif target == TARGET_FP16:
        name = f"{stem}.fp16.onnx"
    else:
        name = f"{stem}.int{bits or DEFAULT_BITS}.onnx"
    folder = Path(os.path.realpath(src.parent))
    inside_watched = any(folder == w or w in folder.parents for w in (Path(os.path.realpath(d)) for d in watched))
    if os.access(src.parent, os.W_OK | os.X_OK) and not inside_watched:
        return src.parent / name
    key = hashlib.blake2b(str(src).encode(), digest_size=8).hexdigest()
    out = _cache_home() / "ctcache" / "materialized" / key
    out.mkdir(parents=True, exist_ok=True)
    return out / name


def materialize(path, output_path=None, *, socket=None, bits: int | None = None, block_size: int | None = None,
                symmetric: bool | None = None, accuracy_level: int = 0, link: str = "auto", copy: bool = False,
                target: str = TARGET_INT4, weight_type: str | None = None, per_channel: bool = False,
                reduce_range: bool = False, op_types=None, op_block_list=None,
                timeout: float | None = None) -> pb.MaterializeResponse:
    """Writes the quantized form of a model for ``target``, built by the daemon (see :meth:`Client.materialize`).

    ``target="onnxruntime-int8"`` takes ``weight_type`` / ``per_channel`` /
    ``reduce_range`` / ``op_types`` (``quantize_dynamic``'s),
    ``"onnxruntime-fp16"`` takes ``op_block_list`` (the converter's); the
    default, ``"onnxruntime-int4"``, takes the MatMulNBits settings below.

    ``output_path=None``: :func:`default_output_path` (``<stem>.int4.onnx``
    next to the model, or under ``$XDG_CACHE_HOME/ctcache/materialized/``
    when the daemon watches the model's folder). ``socket=None``: :func:`ctcache.default_socket`.
    Unset ``bits`` / ``block_size`` / ``symmetric``: the daemon's policy,
    else 4 / 32 / symmetric. ``link``: how the weight files are made
    (``"auto"``, ``"reflink"``, ``"copy"``, ``"hard"``; ``copy=True`` is
    ``"copy"``). Raises :class:`~ctcache.DaemonNotRunning` when no daemon
    answers.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r} (known: {', '.join(TARGETS)})")
    from .client import connect

    with connect(socket) as c:
        out = output_path
        if out is None:
            out = default_output_path(path, bits, target, weight_type, watched=c.watches())
        return c.materialize(path, out, bits=bits, block_size=block_size, symmetric=symmetric,
                             accuracy_level=accuracy_level, link=link, copy=copy, target=target,
                             weight_type=weight_type, per_channel=per_channel, reduce_range=reduce_range,
                             op_types=op_types, op_block_list=op_block_list, timeout=timeout)


def _tensors(graph):
    """Every TensorProto of a graph: initializers and attribute tensors, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _tensors(a.g)
            for g in a.graphs:
                yield from _tensors(g)


def _load_model(path):
    """``onnx.load`` with external data, also when a data file has several hard links.

    onnx >= 1.21 refuses such files ("potential hardlink attack"); they are
    what a materialize with ``link="hard"`` leaves behind. onnxruntime reads
    them, so read them here too: only relative locations inside the model's
    folder.
    """
    from pathlib import Path

    import onnx

    path = os.fspath(path)
    try:
        return onnx.load(path)
    except Exception as e:  # noqa: BLE001 -- onnx.checker.ValidationError, from the C++ side
        if "hard link" not in str(e):
            raise
    model = onnx.load(path, load_external_data=False)
    base = os.path.dirname(os.path.abspath(path))
    for t in _tensors(model.graph):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        parts = Path(loc).parts
        if not loc or os.path.isabs(loc) or ".." in parts:
            raise errors.CtcacheError(f"{path}: tensor {t.name!r} has external data outside the model's folder: {loc!r}")
        offset = int(info.get("offset") or 0)
        length = int(info["length"]) if info.get("length") else -1
        with open(os.path.join(base, loc), "rb") as f:
            f.seek(offset)
            data = f.read(length)
        if length >= 0 and len(data) != length:
            raise errors.CtcacheError(f"{path}: tensor {t.name!r}: {loc} holds {len(data)} of {length} bytes at {offset}")
        t.raw_data = data
        t.data_location = onnx.TensorProto.DEFAULT
        del t.external_data[:]
    return model


@contextlib.contextmanager
def _quiet_reference_tools():
    """onnxruntime's quantizers log every node at INFO (and one module calls
    ``logging.basicConfig`` on import): silenced for the call, the root
    logger's handlers and level as they were after it."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    disabled = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(disabled)
        for h in root.handlers[:]:
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)


def quantize_in_process(path, *, bits: int | None = None, block_size: int | None = None,
                        symmetric: bool | None = None, accuracy_level: int = 0):
    """The model quantized by onnxruntime's ``MatMulNBitsQuantizer`` (QOperator) in this process.

    The same rewrite of MatMul nodes as the daemon's (the quantizer leaves
    Gemm alone); unset settings are 4 bits, block 32, symmetric. Returns an
    ``onnx.ModelProto``.
    """
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = _load_model(path)
    q = MatMulNBitsQuantizer(
        model,
        bits=DEFAULT_BITS if bits is None else int(bits),
        block_size=DEFAULT_BLOCK_SIZE if block_size is None else int(block_size),
        is_symmetric=DEFAULT_SYMMETRIC if symmetric is None else bool(symmetric),
        accuracy_level=int(accuracy_level) or None,
    )
    q.process()
    return q.model.model


def quantize_dynamic_in_process(path, *, weight_type: str | None = None, per_channel: bool = False,
                                reduce_range: bool = False, op_types=None):
    """The model quantized by ``onnxruntime.quantization.quantize_dynamic`` in this process.

    Same settings as the ``onnxruntime-int8`` target (unset: int8, per
    tensor, MatMul). Returns an ``onnx.ModelProto``.
    """
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    wt = {None: QuantType.QInt8, "int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
    if weight_type not in wt:
        raise ValueError(f"weight_type must be 'int8' or 'uint8', not {weight_type!r}")
    with tempfile.TemporaryDirectory(prefix="ctcache-q8-") as d:
        out = os.path.join(d, "q.onnx")
        quantize_dynamic(os.fspath(path), out, weight_type=wt[weight_type], per_channel=per_channel,
                         reduce_range=reduce_range, op_types_to_quantize=list(op_types or ["MatMul"]))
        return onnx.load(out)


def _session_on_model(model, sess_options, providers):
    """A session on an in-memory model: from bytes below 2 GiB, else from a temporary file with external data."""
    import tempfile

    import onnx
    import onnxruntime

    try:
        size = model.ByteSize()
    except Exception:  # noqa: BLE001 -- protobuf refuses to size it: certainly too large
        size = _PROTOBUF_LIMIT
    if size < _PROTOBUF_LIMIT:
        return onnxruntime.InferenceSession(model.SerializeToString(), sess_options=sess_options,
                                            providers=providers)
    tmp = tempfile.TemporaryDirectory(prefix="ctcache-q-")
    file = os.path.join(tmp.name, "model.onnx")
    onnx.save_model(model, file, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)
    sess = onnxruntime.InferenceSession(file, sess_options=sess_options, providers=providers)
    sess._ctcache_tmpdir = tmp  # the files live as long as the session
    return sess


#: numpy element types of the ONNX data types an in-memory session feeds
#: (the others go through ``OrtValue.ortvalue_from_numpy_with_onnx_type``
#: as raw integers of their width, see :data:`_RAW_TYPES`).
_NUMPY_TYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
                9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}
# bfloat16 and the float8 types: their bits, as onnxruntime takes them.
_RAW_TYPES = {16: "uint16", 17: "uint8", 18: "uint8", 19: "uint8", 20: "uint8"}

#: ``link`` of :func:`inference_session` that writes no file.
LINK_MEMORY = "memory"


def _ort_value(view: memoryview, t):
    """The OrtValue over bytes ``[t.offset, t.offset + t.length)`` of a payload view, no copy."""
    import numpy as np
    import onnxruntime

    name = _NUMPY_TYPES.get(t.data_type) or _RAW_TYPES.get(t.data_type)
    if name is None:
        raise errors.CtcacheError(f"{t.name}: element type {t.data_type} cannot be fed from memory")
    dtype = np.dtype(name)
    count = 1
    for d in t.dims:
        count *= d
    if count * dtype.itemsize != t.length or t.offset + t.length > len(view):
        raise errors.CtcacheError(f"{t.name}: {t.length} bytes at {t.offset} are not {list(t.dims)} x {name}")
    arr = np.frombuffer(view, dtype=dtype, count=count, offset=t.offset).reshape(tuple(t.dims))
    if t.data_type in _RAW_TYPES:
        return onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(arr, t.data_type)
    return onnxruntime.OrtValue.ortvalue_from_numpy(arr)


def _close_holder(holder) -> None:
    """Ends a hold's connection (``None``: no handout was made)."""
    if holder is not None:
        holder.close()


class _SessionLeases:
    """The leases a zero-write session holds: renewed by one thread for as long
    as the session lives (they run out ``ttl_s`` after it is collected)."""

    def __init__(self, client, leases, ttl_s: float):
        import threading
        import weakref

        from .payload import _renew_loop

        self.lease_ids = [lease.lease_id for lease in leases]
        self.state = {"error": None, "renewals": 0, "expires_unix_ms": 0}
        stop = threading.Event()
        threading.Thread(target=_renew_loop, args=(client._stub, self.lease_ids, ttl_s, stop, self.state),
                         name="ctcache-session-leases", daemon=True).start()
        weakref.finalize(self, stop.set)


def _in_memory_by_descriptor(path, socket, sess_options, providers, settings):
    """``(session, answer)``: a session on the in-memory Materialize answer
    asked on the descriptor channel (no gRPC), its payloads held while it
    lives; ``None`` where this way cannot
    serve it (no daemon, payloads this process cannot read, an answer too
    large for memory), for gRPC to ask, which copies or writes a file."""
    from . import handout
    from .targets import target_request

    name = os.path.abspath(os.fspath(path))
    req = target_request(**settings)
    req.model_path = name
    # Refusals are final but an answer too large for memory, which gRPC
    # meets with a file.
    asked = handout.ask_handed(socket, name, "materialize", req,
                               refusal_raises=lambda e: e.code_name != "RESOURCE_EXHAUSTED")
    if asked is None:
        return None
    h, r = asked
    sess = session_held_by(h, r, sess_options, providers)
    return None if sess is None else (sess, r)


def session_held_by(h, r, sess_options, providers):
    """A session on the model of an answer held by handout ``h`` (a
    Materialize answer, or a form's), onnxruntime mapping its payload files
    in place, held while the session lives; ``None`` (``h`` closed) where
    this process cannot read them."""
    import weakref

    import onnxruntime

    try:
        if not all(os.access(lease.entry.payload_path, os.R_OK) for lease in r.leases):
            h.close()
            return None
        so = sess_options if sess_options is not None else onnxruntime.SessionOptions()
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", r.external_data_dir)
        sess = onnxruntime.InferenceSession(r.model, sess_options=so, providers=providers)
    except BaseException:
        h.close()
        raise
    weakref.finalize(sess, h.close)
    return sess


def _session_in_memory(client, r: pb.MaterializeResponse, holder, sess_options, providers, ttl_s: float):
    """A session on an in-memory Materialize answer, nothing written.

    Where this process can read the payload files, onnxruntime maps them
    itself (the model's locations are relative to the answer's
    ``external_data_dir``, the cache's payload folder): the same path as a
    model file with external data, kept from gc by the answer's one hold
    (``holder``'s connection) for as long as the session lives. Else the
    payloads are streamed copies fed as external initializers, and nothing
    stays held. A daemon without holds leases each payload
    (renewed while the session lives)."""
    import weakref

    import onnxruntime

    from .payload import Payload

    so = sess_options if sess_options is not None else onnxruntime.SessionOptions()
    if all(os.access(lease.entry.payload_path, os.R_OK) for lease in r.leases):
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", r.external_data_dir)
        try:
            held = None if r.held else _SessionLeases(client, r.leases, ttl_s)
            sess = onnxruntime.InferenceSession(r.model, sess_options=so, providers=providers)
        except BaseException:
            _close_holder(holder)
            raise
        if r.held:
            weakref.finalize(sess, _close_holder, holder)
        else:
            _close_holder(holder)
            sess._ctcache_leases = held
        sess._ctcache_client = client
        return sess
    if r.held:
        try:
            copies = {lease.entry.key: memoryview(client._read_whole_payload(lease.entry.key, lease.entry.payload_len))
                      for lease in r.leases}
            values = [_ort_value(copies[t.key], t) for t in r.tensors]
            so.add_external_initializers([t.name for t in r.tensors], values)
            sess = onnxruntime.InferenceSession(r.model, sess_options=so, providers=providers)
        finally:
            _close_holder(holder)  # the copies are this process's
        sess._ctcache_values = values
        sess._ctcache_client = client
        return sess
    _close_holder(holder)
    payloads = {}
    try:
        for lease in r.leases:
            payloads[lease.entry.key] = Payload(client, lease, lease.entry, ttl_s)
        names = [t.name for t in r.tensors]
        values = [_ort_value(payloads[t.key].memoryview, t) for t in r.tensors]
        so.add_external_initializers(names, values)
        sess = onnxruntime.InferenceSession(r.model, sess_options=so, providers=providers)
    except BaseException:
        for p in payloads.values():
            p.close()
        raise
    # What the session reads: kept alive (and the leases renewed) with it.
    sess._ctcache_payloads = list(payloads.values())
    sess._ctcache_values = values
    sess._ctcache_client = client
    return sess


def inference_session(path, *, bits: int | None = None, block_size: int | None = None,
                      symmetric: bool | None = None, accuracy_level: int = 0, output_path=None, socket=None,
                      sess_options=None, providers=None, fallback: bool = True, target: str = TARGET_INT4,
                      weight_type: str | None = None, per_channel: bool = False, reduce_range: bool = False,
                      op_types=None, op_block_list=None, link: str | None = None, lease_ttl_s: float = 30.0,
                      strict: bool = False, optimize: str | None = None):
    """An ``onnxruntime.InferenceSession`` on the quantized form of an fp32/fp16 model.

    ``target="onnxruntime-int4"`` (the default): the MatMulNBits form;
    ``"onnxruntime-int8"``: the ``quantize_dynamic`` form (its fallback is
    ``quantize_dynamic`` itself, with the same ``weight_type`` /
    ``per_channel`` / ``reduce_range`` / ``op_types``);
    ``"onnxruntime-fp16"``: the float16 converter's form with float inputs
    and outputs (fallback: ``convert_float_to_float16(keep_io_types=True)``,
    with the same ``op_block_list``).

    ``link="memory"`` (the default when no ``output_path`` is given) writes
    nothing: the daemon answers the model's bytes, whose external data are
    the cache's payload files, and holds those for this process with one
    lease; onnxruntime maps them in place (where this process cannot read
    them, they are copied over the socket and fed as external initializers,
    and nothing stays held). The hold lasts while the session lives: it ends
    when the session is collected, or when this process ends, however it
    ends (its descriptor-channel connection closes). A ``sess_options`` given is
    used for this session alone (a config entry or the initializers are
    added to it). A model too large for one answer
    (``RESOURCE_EXHAUSTED``) is materialized to a file instead, as with
    ``link="auto"``. With an ``output_path`` (then ``link`` defaults to
    ``"auto"``) or another ``link`` value the model is materialized to a
    file (:func:`materialize`, to ``output_path`` or
    :func:`default_output_path`) with that link mode and the session opened
    on it. ``lease_ttl_s`` is the time of the per-payload leases a daemon
    without holds grants instead (renewed while the session lives).

    When no daemon answers
    (:class:`~ctcache.DaemonNotRunning`, :class:`~ctcache.SocketPermissionDenied`)
    and ``fallback`` is true, warns with :class:`FallbackWarning` and returns
    a session on the model quantized in this process by onnxruntime's
    ``MatMulNBitsQuantizer`` with the same settings (unset: 4 bits, block
    32, symmetric); nothing is written then, except a temporary file for a
    quantized model of 2 GiB or more.

    A model in which the target rewrites nothing (a conv net under int4, a
    model quantized already) is opened as it is, with an
    :class:`AsIsWarning` that says why; ``strict=True`` raises
    :class:`~ctcache.NothingToRewrite` instead. Other daemon errors (bad
    settings, a model the target refuses) are raised.

    ``target=None``: the model as it is. ``optimize="extended"`` (or
    ``"basic"``, ``"layout"``, ``"all"``): the session is made from
    onnxruntime's optimized model at that level of the model as it is
    (``target=None``) or of the target's model (a target that rewrites
    nothing: of the model as it is, with :class:`AsIsWarning`), which the
    daemon's worker makes once per host with the daemon's onnxruntime
    library, its weights the cache's payload files mapped in place, opened
    with the optimizer off (``ORT_DISABLE_ALL``): the outputs of onnxruntime's
    own session at that level, without its optimization at every start. The
    form is served only when this process's onnxruntime (version and build)
    is the daemon's; without a form (another onnxruntime, none configured in
    the daemon, a ``sess_options`` given, a provider other than the CPU's,
    no daemon) onnxruntime makes the session itself at that level, and the
    report's ``why`` says why (``source`` ``"runtime"``).

    The session's ``ctcache_report`` (a :class:`SessionReport`, also logged
    at INFO on the ``ctcache`` logger) says what came from the cache, what
    was packed, what was left as it is and why, and how long it took.
    """
    start = time.monotonic()
    if target is None or optimize is not None:
        settings = dict(bits=bits, block_size=block_size, symmetric=symmetric, accuracy_level=accuracy_level,
                        weight_type=weight_type, per_channel=per_channel, reduce_range=reduce_range,
                        op_types=op_types, op_block_list=op_block_list)
        sess, report = _runtime_session(path, optimize, socket, sess_options, providers, target, settings, strict)
        report.seconds = time.monotonic() - start
        sess.ctcache_report = report
        _log_report(report)
        return sess
    try:
        sess, report = _session(path, output_path, socket, sess_options, providers, fallback, link, lease_ttl_s,
                                bits=bits, block_size=block_size, symmetric=symmetric,
                                accuracy_level=accuracy_level, target=target, weight_type=weight_type,
                                per_channel=per_channel, reduce_range=reduce_range, op_types=op_types,
                                op_block_list=op_block_list)
    except errors.NothingToRewrite as e:
        if strict:
            raise
        warnings.warn(f"ctcache: {e.details}; opening the model as it is", AsIsWarning, stacklevel=2)
        import onnxruntime

        sess = onnxruntime.InferenceSession(os.fspath(path), sess_options=sess_options, providers=providers)
        report = SessionReport(os.fspath(path), target, "as-is", why=e.details)
    report.seconds = time.monotonic() - start
    sess.ctcache_report = report
    _log_report(report)
    return sess


def _runtime_session(path, optimize, socket, sess_options, providers, target, settings, strict):
    """A session from the daemon's form at ``optimize`` of the model as it is
    (``target`` None) or of that target's model, else the session onnxruntime
    makes itself at that level (of the model as it is)."""
    import onnxruntime

    from . import forms

    name = os.fspath(path)
    if target is not None and target not in TARGETS:
        raise ValueError(f"unknown target {target!r} (known: {', '.join(TARGETS)})")
    what = f"form:{optimize}" if target is None else f"{target}+form:{optimize}"
    if optimize is None:
        sess = onnxruntime.InferenceSession(name, sess_options=sess_options, providers=providers)
        return sess, SessionReport(name, "", "runtime", why="no optimize level asked")
    why = forms.why_not_served(optimize, sess_options, providers)
    if not why:
        got = forms.session_by_descriptor(socket, name, optimize, providers, target, settings)
        if got is None:
            got = _form(name, optimize, socket, providers, target, settings, strict)
        if got.session is not None:
            done = "compiled now" if got.compiled else "stored"
            return got.session, SessionReport(name, what, "daemon", cached=int(not got.compiled),
                                              packed=int(got.compiled), why=f"onnxruntime form ({done})")
        why = got.why
    so = sess_options if sess_options is not None else forms.level_options(optimize)
    sess = onnxruntime.InferenceSession(name, sess_options=so, providers=providers)
    return sess, SessionReport(name, what, "runtime", why=why)


def _form(name, optimize, socket, providers, target, settings, strict):
    """The daemon's form (a ``forms.FormAnswer``); a target that rewrites
    nothing gives the form of the model as it is (:class:`AsIsWarning`)."""
    from . import forms
    from .client import connect

    # Not closed once a session has it: grpc's close waits ~0.2 s for its
    # threads; the channel goes with the session.
    c = None
    try:
        c = connect(socket)
        try:
            got = forms.session_from_form(c, name, optimize, providers, target=target, target_settings=settings)
        except errors.NothingToRewrite as e:
            if strict or target is None:
                raise
            warnings.warn(f"ctcache: {e.details}; the form of the model as it is", AsIsWarning, stacklevel=5)
            got = forms.session_from_form(c, name, optimize, providers)
    except (errors.DaemonNotRunning, errors.SocketPermissionDenied) as e:
        if c is not None:
            c.close()
        warnings.warn(f"ctcache: {e} -- onnxruntime optimizes {name} in this process instead",
                      FallbackWarning, stacklevel=5)
        return forms.FormAnswer(why=str(e))
    except BaseException:
        if c is not None:
            c.close()
        raise
    if got.session is None:
        c.close()
    return got


def _report(path, target: str, r: pb.MaterializeResponse) -> SessionReport:
    return SessionReport(os.fspath(path), target, "daemon", rewritten=r.nodes_rewritten, cached=r.cached,
                         packed=r.packed, skipped=[(s.node, s.op_type, s.reason) for s in r.skipped])


def _session(path, output_path, socket, sess_options, providers, fallback, link, lease_ttl_s, *, target,
             **tool_settings):
    """:func:`inference_session` less the as-is case and the timing: (session, report)."""
    import onnxruntime

    settings = dict(tool_settings, target=target)
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r} (known: {', '.join(TARGETS)})")
    if link is None:
        link = LINK_MEMORY if output_path is None else "auto"
    try:
        if link == LINK_MEMORY:
            if output_path is not None:
                raise ValueError("link='memory' writes nothing: output_path must be None")
            got = _in_memory_by_descriptor(path, socket, sess_options, providers, settings)
            if got is not None:
                return got[0], _report(path, target, got[1])
            from .client import connect

            c = connect(socket)
            try:
                r, holder = c.materialize(path, None, in_memory=True, lease_ttl_s=lease_ttl_s, hold=True, **settings)
                sess = _session_in_memory(c, r, holder, sess_options, providers, lease_ttl_s)
                return sess, _report(path, target, r)
            except errors.RequestFailed as e:
                c.close()
                if getattr(e.code, "name", "") != "RESOURCE_EXHAUSTED":
                    raise
                link = "auto"
            except BaseException:
                c.close()
                raise
        r = materialize(path, output_path, socket=socket, link=link, **settings)
    except (errors.DaemonNotRunning, errors.SocketPermissionDenied) as e:
        if not fallback:
            raise
        report = SessionReport(os.fspath(path), target, "fallback", why=str(e))
        return _fallback_session(path, e, sess_options, providers, **settings), report
    sess = onnxruntime.InferenceSession(r.output_path, sess_options=sess_options, providers=providers)
    return sess, _report(path, target, r)


def _fallback_session(path, why, sess_options, providers, *, bits, block_size, symmetric, accuracy_level, target,
                      weight_type, per_channel, reduce_range, op_types, op_block_list):
    """A session on the model quantized in this process by the reference tool for ``target``."""
    tool = {TARGET_INT8: "quantize_dynamic", TARGET_FP16: "convert_float_to_float16"}.get(
        target, "MatMulNBitsQuantizer")
    warnings.warn(
        f"ctcache: {why} -- quantizing {os.fspath(path)} in this process with onnxruntime's "
        f"{tool} instead (slower; same weights)",
        FallbackWarning,
        stacklevel=4,
    )
    with _quiet_reference_tools():
        if target == TARGET_FP16:
            from onnxruntime.transformers.float16 import convert_float_to_float16

            model = convert_float_to_float16(os.fspath(path), keep_io_types=True, op_block_list=op_block_list)
        elif target == TARGET_INT8:
            model = quantize_dynamic_in_process(path, weight_type=weight_type, per_channel=per_channel,
                                                reduce_range=reduce_range, op_types=op_types)
        else:
            model = quantize_in_process(path, bits=bits, block_size=block_size, symmetric=symmetric,
                                        accuracy_level=accuracy_level)
    return _session_on_model(model, sess_options, providers)
