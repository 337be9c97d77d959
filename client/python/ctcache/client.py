"""The ctcached client: a thin, typed layer over the gRPC API.

Answers are the protobuf messages of ``ctcache/v1/ctcache.proto`` (module
``ctcache.pb``); the onnx messages inside them (DeviceProto,
StructTypeProto) live in ``ctcache.onnx_pb`` under the protobuf package
``ctcache_onnx``, so that they never clash with the ``onnx`` package.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Iterator, Mapping

import grpc

from . import errors, handout, materialized, outputs, targets
from .handout import default_socket
from ._pb import ctcache_v1_pb2 as pb
from ._pb import ctcache_v1_pb2_grpc as pb_grpc
from ._pb import onnx_pb2 as onnx_pb
from .materialized import LINK_MODES, PLACE_METHODS
from .payload import Payload

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
#: Seconds a call that is safe to repeat waits, by default, for a daemon that
#: went away (a restart) to answer again.
DEFAULT_RETRY_FOR = 5.0
#: The RPCs sent again when the connection was lost before their answer:
#: sending them twice does what sending them once does. The others (leases
#: taken or released, outputs written, gc, verify) fail at once.
SAFE_TO_REPEAT = frozenset({
    "GetHostDevices", "ListFormats", "Lookup", "BatchLookup", "ResolveModel", "Prepack", "ReadPayload",
    "RenewLease", "Stats", "List", "AddWatch", "RemoveWatch", "ListWatches", "Events", "Status",
    "RemoteStatus",
})
ON_MISS = {"none": pb.ON_MISS_NONE, "background": pb.ON_MISS_BACKGROUND, "wait": pb.ON_MISS_WAIT}
BACKENDS = {"auto": pb.BACKEND_AUTO, "cpu": pb.BACKEND_CPU, "wgpu": pb.BACKEND_WGPU}
FINAL_STATES = (pb.JOB_STATE_DONE, pb.JOB_STATE_CACHED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED)
SUCCEEDED = (pb.JOB_STATE_DONE, pb.JOB_STATE_CACHED)


def state_name(progress) -> str:
    """A job state as a word: ``queued``, ``running``, ``done``, ``cached``,
    ``failed`` or ``cancelled``."""
    return pb.JobState.Name(progress.state).removeprefix("JOB_STATE_").lower()

#: The trailer by which the daemon names the kind of every error it answers.
_KIND_KEY = "ctcache-error-kind"


def connect(socket: str | os.PathLike | None = None, *, timeout: float = 5.0,
            max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
            retry_for: float = DEFAULT_RETRY_FOR) -> "Client":
    """Connects to ctcached on a Unix socket (default: :func:`default_socket`).

    Waits up to ``timeout`` seconds for the daemon to answer; raises
    :class:`~ctcache.errors.DaemonNotRunning` (naming the socket and how to
    start the daemon) when it does not.

    The client survives daemon restarts: a call that finds the connection
    lost gets a new channel, and the calls in :data:`SAFE_TO_REPEAT` are sent
    again with backoff for up to ``retry_for`` seconds (0: never) before they
    raise :class:`~ctcache.errors.DaemonNotRunning`. A stream the restart cut
    after its first message (Prepack progress, Events, a payload read) raises.
    """
    path = os.path.abspath(os.fspath(socket) if socket is not None else default_socket())
    if not os.path.exists(path):
        raise errors.DaemonNotRunning(path, "no socket file")
    if not os.access(path, os.R_OK | os.W_OK):
        raise errors.SocketPermissionDenied(path)
    channel = _channel(path, max_message_bytes)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        channel.close()
        raise errors.DaemonNotRunning(path, f"the socket exists but nothing answered within {timeout:g} s; a stale socket?") from None
    return Client(path, channel, max_message_bytes=max_message_bytes, retry_for=retry_for)


def _channel(path: str, max_message_bytes: int) -> grpc.Channel:
    return grpc.insecure_channel(
        "unix:" + path,
        options=[
            ("grpc.default_authority", "localhost"),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # A restarted daemon is found again within a fraction of a second
            # (gRPC's default backoff grows to two minutes).
            ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.min_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 500),
        ],
    )


def _format_specs(formats) -> list:
    """None | "id" | {"id": {params}} | [ "id" | ("id", {params}) | FormatSpec ] -> [FormatSpec]."""
    if formats is None:
        return []
    if isinstance(formats, (str, pb.FormatSpec)):
        formats = [formats]
    if isinstance(formats, Mapping):
        formats = list(formats.items())
    out = []
    for f in formats:
        if isinstance(f, pb.FormatSpec):
            out.append(f)
        elif isinstance(f, str):
            out.append(pb.FormatSpec(id=f))
        else:
            fid, params = f
            out.append(pb.FormatSpec(id=fid, params={str(k): str(v) for k, v in (params or {}).items()}))
    return out


def _runtime(runtime):
    if runtime is None or isinstance(runtime, pb.RuntimeIdentity):
        return runtime
    name, ver = runtime
    return pb.RuntimeIdentity(name=name, version=ver)


def _accepted(accepted):
    out = []
    for a in accepted or []:
        if isinstance(a, pb.AcceptedType):
            out.append(a)
        elif isinstance(a, str):
            out.append(pb.AcceptedType(name=a))
        else:
            name, versions = a
            out.append(pb.AcceptedType(name=name, versions=list(versions)))
    return out


def _digest(d) -> bytes:
    return bytes.fromhex(d) if isinstance(d, str) else bytes(d)


def _wait_for_headers(method: str, call, timeout: float) -> None:
    """Returns once ``call`` has its headers or has failed (iterating it
    raises then); cancels it after ``timeout`` seconds. grpc's wait for
    them has no deadline of its own: a thread waits."""
    answered = threading.Event()
    threading.Thread(target=lambda: (call.initial_metadata(), answered.set()), daemon=True,
                     name="ctcache-headers").start()
    if not answered.wait(timeout):
        call.cancel()
        raise errors.DeadlineExceeded(method, grpc.StatusCode.DEADLINE_EXCEEDED,
                                      f"no answer within {timeout:g} s")


def _close(held) -> None:
    """Ends a handout (``None``: none was made)."""
    if held is not None:
        held.close()


def _path(p) -> str:
    return os.path.abspath(os.fspath(p))


def entry_format(entry) -> str:
    """The packer id that produced an entry (``ort.matmul_nbits``), or ``""`` for a client Put."""
    producer = entry.producer
    return "" if producer.startswith("uid:") else producer.split("@", 1)[0]


class Client:
    """A connection to one ctcached. Make it with :func:`connect`; usable as a context manager."""

    def __init__(self, socket: str, channel: grpc.Channel, *,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, retry_for: float = DEFAULT_RETRY_FOR):
        self.socket = socket
        self.retry_for = retry_for
        self._max_message_bytes = max_message_bytes
        self._channel = channel
        self._stub = pb_grpc.CompiledTensorCacheStub(channel)
        self._renew_lock = threading.Lock()

    # ---- plumbing ----

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ctcache.Client {self.socket}>"

    def _error(self, method: str, e: grpc.RpcError) -> errors.CtcacheError:
        code = e.code()
        kind = dict(e.trailing_metadata() or ()).get(_KIND_KEY)
        if code == grpc.StatusCode.UNAVAILABLE and kind is None:
            # No trailer: the channel's own UNAVAILABLE, nobody answered.
            return errors.DaemonNotRunning(self.socket, f"{method}: {e.details()}")
        return errors.refusal(method, code, e.details(), kind or "")

    def _handed(self, req, timeout: float | None, outputs=()) -> handout.Handout:
        """Hands ``req.model_path`` (and the ``outputs`` made for it) over the
        descriptor channel and names the handout in ``req``; the handout lasts
        until it is closed."""
        try:
            h = handout.hand_over(self.socket, req.model_path, timeout, outputs)
        except handout.HandoutRefused as e:
            raise errors.refusal("Handout", e.code_name, e.message, e.kind) from None
        except TimeoutError as e:
            raise errors.DeadlineExceeded("Handout", grpc.StatusCode.DEADLINE_EXCEEDED, str(e)) from None
        except ConnectionError as e:
            raise errors.DaemonNotRunning(self.socket, f"Handout: {e}") from None
        req.handout = h.name
        return h

    def _renew(self, stub) -> None:
        """A new channel in place of the one ``stub`` used, unless another
        thread made one already. The old one is left to calls still on it."""
        with self._renew_lock:
            if self._stub is stub:
                self._channel = _channel(self.socket, self._max_message_bytes)
                self._stub = pb_grpc.CompiledTensorCacheStub(self._channel)

    def _again(self, method: str, e: grpc.RpcError, stub, since: float, pause: float) -> bool:
        """After a failed call: True (having waited ``pause``) when it is to be sent again."""
        if e.code() != grpc.StatusCode.UNAVAILABLE:
            return False
        self._renew(stub)
        if method not in SAFE_TO_REPEAT or time.monotonic() + pause - since > self.retry_for:
            return False
        time.sleep(pause)
        return True

    def _call(self, method: str, request, timeout: float | None = None, *, names_model: bool = False,
              outputs=(), keep_handout: bool = False):
        """Sends ``request``; one that ``names_model`` is handed over (with the
        ``outputs`` made for it) for each attempt (a handout lives on the daemon
        that took it: one restarted knows none), and the handout held until the
        answer; with ``keep_handout``, returned with it, for the caller to close."""
        since, pause = time.monotonic(), 0.02
        while True:
            stub = self._stub
            try:
                held = self._handed(request, timeout, outputs) if names_model else None
            except errors.DaemonNotRunning:
                # A daemon restarting: waited for as a lost connection is.
                if method not in SAFE_TO_REPEAT or time.monotonic() + pause - since > self.retry_for:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
                continue
            try:
                answer = getattr(stub, method)(request, timeout=timeout)
                if keep_handout:
                    answer, held = (answer, held), None
                return answer
            except grpc.RpcError as e:
                if not self._again(method, e, stub, since, pause):
                    raise self._error(method, e) from None
                pause = min(pause * 2, 0.5)
            finally:
                _close(held)

    def _stream(self, method: str, request, timeout: float | None = None, *,
                names_model: bool = False, followed: float | None = None) -> Iterator:
        """As :meth:`_call`, for a stream; a handout is held until the stream
        ends or is abandoned. ``followed``: seconds to wait for the call's
        headers (the daemon sends them once its handler has subscribed),
        else :class:`~ctcache.errors.DeadlineExceeded`."""
        def hand():
            return self._handed(request, timeout) if names_model else None

        # The call starts now, not on the first next().
        held = hand()
        stub = self._stub
        call = getattr(stub, method)(request, timeout=timeout)
        if followed is not None:
            try:
                _wait_for_headers(method, call, followed)
            except BaseException:
                _close(held)
                raise

        def messages():
            nonlocal call, stub, held
            since, pause, started = time.monotonic(), 0.02, False
            try:
                while True:
                    try:
                        for m in call:
                            started = True
                            yield m
                        return
                    except grpc.RpcError as e:
                        if started or not self._again(method, e, stub, since, pause):
                            raise self._error(method, e) from None
                        pause = min(pause * 2, 0.5)
                        _close(held)
                        held = hand()
                        stub = self._stub
                        call = getattr(stub, method)(request, timeout=timeout)
            finally:
                call.cancel()  # no-op once finished; tells the daemon when abandoned
                _close(held)

        return messages()

    # ---- models ----

    def resolve_model(self, path, on_miss: str = "none", *, formats=None, devices=None, runtime=None,
                      timeout: float | None = None) -> pb.ResolveModelResponse:
        """Per initializer of the model: digest, matching entries and miss reasons.

        ``on_miss``: ``"none"`` (only look), ``"background"`` (queue packs for
        what is missing and answer now) or ``"wait"`` (pack what is missing and
        answer when done). ``formats``: ``None`` = the daemon's policy, else
        ids (``"ort.matmul_nbits"``), ``{id: params}`` or FormatSpecs.
        """
        if on_miss not in ON_MISS:
            raise ValueError(f"on_miss must be one of {', '.join(ON_MISS)}, not {on_miss!r}")
        req = pb.ResolveModelRequest(model_path=_path(path), on_miss=ON_MISS[on_miss],
                                     formats=_format_specs(formats), devices=list(devices or []),
                                     runtime=_runtime(runtime))
        return self._call("ResolveModel", req, timeout, names_model=True)

    def prepack(self, path, formats=None, *, initializers=None, wait: bool = True, backend: str = "auto",
                timeout: float | None = None):
        """Packs a model's initializers (default: the daemon's policy).

        ``backend``: ``auto`` (the daemon's choice), ``cpu`` or ``wgpu`` (refused
        when the daemon's host has no hardware wgpu adapter).
        ``wait=True``: returns the final :class:`PrepackProgress` of every job
        (state ``JOB_STATE_DONE`` or ``JOB_STATE_CACHED``, with the entry; see
        :func:`state_name`) and raises
        :class:`~ctcache.errors.PrepackError` if any failed. ``wait=False``:
        returns the progress stream as an iterator; abandoning it cancels the
        jobs no other client shares.
        """
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        req = pb.PrepackRequest(model_path=_path(path), initializers=list(initializers or []),
                                formats=_format_specs(formats), backend=BACKENDS[backend])
        stream = self._stream("Prepack", req, timeout, names_model=True)
        if not wait:
            return stream
        final = {}
        for p in stream:
            if p.state in FINAL_STATES:
                final[(p.initializer, p.format)] = p
        out = list(final.values())
        failed = [p for p in out if p.state not in SUCCEEDED]
        if failed:
            raise errors.PrepackError(out, failed)
        return out

    def embed(self, model_path, output_path, formats=None, *, sidecar: bool = False,
              replace: bool = False, timeout: float | None = None) -> pb.EmbedResponse:
        """Writes a copy of the model with compiled tensors embedded (packs what is missing).

        The output's folders are made when missing, and its files are this process's: made here, written by
        the daemon through their descriptors, renamed into place here."""
        req = pb.EmbedRequest(model_path=_path(model_path), output_path=_path(output_path),
                              formats=_format_specs(formats), sidecar=sidecar, replace=replace)
        with outputs.EmbedFiles(req.output_path) as made:
            r = self._call("Embed", req, timeout, names_model=True, outputs=made.outputs)
            made.commit(r)
        return r

    def materialize(self, model_path, output_path, *, bits: int | None = None, block_size: int | None = None,
                    symmetric: bool | None = None, accuracy_level: int = 0, link: str = "auto",
                    copy: bool = False, target: str = "onnxruntime-int4",
                    weight_type: str | None = None, per_channel: bool = False, reduce_range: bool = False,
                    op_types=None, op_block_list=None, in_memory: bool = False, lease_ttl_s: float = 30.0,
                    hold: bool = False, timeout: float | None = None):
        """Writes an onnxruntime-ready quantized copy of a model (packs what is missing).

        ``target="onnxruntime-int8"``: what ``onnxruntime.quantization.quantize_dynamic``
        writes (DynamicQuantizeLinear + MatMulInteger / ConvInteger, a Gather
        on the quantized table, initializers ``<W>_quantized`` /
        ``<W>_scale`` / ``<W>_zero_point``, the same bytes) with
        ``weight_type`` (``"int8"``, the default, or ``"uint8"``),
        ``per_channel``, ``reduce_range`` and ``op_types`` (its
        ``op_types_to_quantize``: any of ``"MatMul"``, ``"Gather"``,
        ``"Conv"``; default ``["MatMul"]``).
        ``target="onnxruntime-fp16"`` takes ``op_block_list`` (the
        converter's: op types kept in FLOAT behind Casts; ``None``, the
        default, is its ``DEFAULT_OP_BLOCK_LIST``, ``[]`` keeps none).
        The rest of this text is about the default target, ``"onnxruntime-int4"``.

        Every top-level MatMul whose B is a 2-D FLOAT/FLOAT16 initializer (and
        every Gemm with a constant B, transA=0, alpha=beta=1) becomes a
        ``com.microsoft::MatMulNBits``; its weights are external data in
        ``<output file name>.weights/``. This process writes the model and
        those files with its own rights, its folders made when missing (the
        daemon writes no file where a caller points: it builds the model and
        leases its payloads), each file checked against its entry's blake3
        (a mismatch raises :class:`~ctcache.errors.PayloadMismatch` and
        leaves nothing). ``link`` says how those files are made from the
        daemon's cache payloads: ``"auto"`` (a reflink where the filesystem
        supports it, else a copy: files onnx and onnxruntime both load),
        ``"reflink"`` (or fail), ``"copy"``, ``"hard"`` (hard links where the
        kernel lets this user make them, as the store's owner; copies
        elsewhere: no bytes written, but onnx >= 1.21 refuses such files;
        onnxruntime loads them). ``copy=True`` is ``link="copy"``. The
        answer's ``files`` say how each file was placed (``PLACE_METHODS``).
        ``bits`` / ``block_size`` / ``symmetric`` left ``None``: the daemon's
        policy for ``ort.matmul_nbits``, else 4 / 32 / symmetric.
        ``accuracy_level=0`` leaves the attribute out. A model with nothing to
        rewrite raises :class:`~ctcache.errors.RequestFailed`
        (``FAILED_PRECONDITION``); bad settings raise
        :class:`~ctcache.errors.InvalidArgument`.

        ``in_memory=True`` writes nothing (``output_path`` must be ``None``
        and ``link`` left at ``"auto"``): the answer's ``model`` holds the
        model's bytes, ``tensors`` say which payload range (entry ``key``,
        ``offset``, ``length``) holds each new initializer's bytes, and
        ``leases`` hold a lease of ``lease_ttl_s`` on each of those entries,
        taken for this caller (renew or release them). Locations are relative
        to ``external_data_dir``; the initializers the model keeps from the
        source come inline.

        ``hold=True`` (with ``in_memory``; what
        :func:`ctcache.ort.inference_session` asks) returns ``(answer,
        holder)``: one lease over every payload instead (``answer.held``; a
        daemon without holds answers with ``lease_ttl_s`` leases and
        ``held`` false), with no time-to-live, kept until ``holder.close()``
        or until this process ends, however it ends.
        """
        if hold and not in_memory:
            raise ValueError("hold=True keeps the payloads of an in_memory answer")
        if in_memory:
            if output_path is not None:
                raise ValueError("in_memory=True writes nothing: output_path must be None")
            if link != "auto" or copy:
                raise ValueError("in_memory=True writes nothing: link places no file")
        if link not in LINK_MODES:
            raise ValueError(f"link must be one of {', '.join(LINK_MODES)}, not {link!r}")
        if copy and link not in ("auto", "copy"):
            raise ValueError(f"copy=True is link='copy'; it contradicts link={link!r}")
        output = None if in_memory else os.path.abspath(_path(output_path))
        if output is not None:
            materialized.refuse_input(_path(model_path), output)
        # For a file, the leases last while this process copies the payloads.
        ttl_s = lease_ttl_s if in_memory else 600.0
        asked = targets.target_request(target, bits=bits, block_size=block_size, symmetric=symmetric,
                                       accuracy_level=accuracy_level, weight_type=weight_type,
                                       per_channel=per_channel, reduce_range=reduce_range, op_types=op_types,
                                       op_block_list=op_block_list)
        req = targets.as_generated(asked, pb.MaterializeRequest)
        req.model_path = _path(model_path)
        req.in_memory = True
        req.lease_ttl_ms = max(int(ttl_s * 1000), 1)
        req.data_folder = "" if in_memory else materialized.data_folder(output)
        req.hold = hold
        if hold:
            return self._call("Materialize", req, timeout, names_model=True, keep_handout=True)
        r = self._call("Materialize", req, timeout, names_model=True)
        if in_memory:
            return r
        try:
            return materialized.write(r, req.model_path, output, "copy" if copy else link)
        finally:
            for lease in r.leases:
                try:
                    self._stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=lease.lease_id), timeout=5)
                except (grpc.RpcError, ValueError):
                    pass  # daemon gone: the lease expires by itself

    def compile(self, model_path, *, runtime: str = "onnxruntime", level: str | None = None,
                runtime_version: str = "", runtime_build: str = "", lookup_only: bool = False,
                lease_ttl_s: float = 30.0, hold: bool = False, target: str | None = None,
                target_settings: dict | None = None, device: str = "", config: dict | None = None,
                timeout: float | None = None):
        """A runtime's own compiled form of a model, leased: onnxruntime's
        optimized model at ``level`` (default ``extended``), or
        (``runtime="openvino"``) OpenVINO's compiled model for ``device``
        (default ``CPU``) with ``config`` (property names to values), whose
        payload is the blob ``import_model`` reads.

        The daemon's worker compiles it when no form of the key is stored
        (``lookup_only=True``: it only looks). ``runtime_version`` /
        ``runtime_build``: this process's runtime as it reports itself
        (``onnxruntime.__version__``, ``onnxruntime.get_build_info()``); a
        form is served only when they are the daemon's. The answer's ``form``
        is a lease of ``lease_ttl_s`` on the form's entry; ``model`` is the
        form's model, whose large initializers are external data in the
        payload files of ``leases`` (named relative to ``external_data_dir``,
        as an in-memory :meth:`materialize` answers), each leased (release
        them, or let them run out). ``hold=True``: one hold over them all
        instead, kept while the returned holder is open (returns
        ``(answer, holder)``). Without a form, ``miss`` says why
        (``runtime_unavailable``, ``form_key_differs`` naming the part,
        ``no_entry``). ``target``: the form of that materialize target's
        model (``target_settings``: its settings, as :meth:`materialize`
        takes them) instead of the model as it is.
        """
        if level is None and runtime == "onnxruntime":
            level = "extended"
        req = pb.CompileRequest(model_path=_path(model_path), runtime=runtime, level=level or "",
                                provider=device, runtime_version=runtime_version, runtime_build=runtime_build,
                                lookup_only=lookup_only, lease_ttl_ms=max(int(lease_ttl_s * 1000), 1),
                                hold=hold, config={str(k): str(v) for k, v in (config or {}).items()})
        if target is not None:
            asked = targets.target_request(target, **(target_settings or {}))
            req.materialize.CopyFrom(targets.as_generated(asked, pb.MaterializeRequest))
        return self._call("Compile", req, timeout, names_model=True, keep_handout=hold)

    def import_model(self, path, *, timeout: float | None = None) -> pb.ImportResponse:
        """Adds the compiled tensors a model carries to the store."""
        req = pb.ImportRequest(model_path=_path(path))
        return self._call("Import", req, timeout, names_model=True)

    # ---- entries ----

    def lookup(self, source_digest, *, digest_algorithm: str = "blake3", devices=None, runtime=None,
               accepted=None, daemon_produced_only: bool = False, brief: bool = False,
               timeout: float | None = None) -> pb.LookupResponse:
        """Entries usable by the caller for one source digest (bytes or hex), best first; ``.miss`` when none.

        ``brief=True`` leaves out the bulky entry fields (struct type, device, names, paths); the
        entries still open with :meth:`open_payload`.
        """
        req = pb.LookupRequest(source_digest=_digest(source_digest), digest_algorithm=digest_algorithm,
                               devices=list(devices or []), runtime=_runtime(runtime),
                               accepted=_accepted(accepted), daemon_produced_only=daemon_produced_only,
                               brief=brief)
        return self._call("Lookup", req, timeout)

    def list(self, *, format: str = "", device: str = "", source_digest=b"", model_path: str = "",
             limit: int = 0, timeout: float | None = None) -> list:
        """Stored entries, filtered (format = struct type name prefix, device = description substring)."""
        req = pb.ListRequest(format=format, device=device, source_digest=_digest(source_digest),
                             model_path=model_path and _path(model_path), limit=limit)
        return list(self._call("List", req, timeout).entries)

    def open_payload(self, entry, *, ttl_s: float = 30.0, mmap: bool = True) -> Payload:
        """Leases an entry (an Entry or its key) and opens its bytes read-only.

        Maps ``entry.payload_path`` when this process can read it, else copies
        the bytes over ReadPayload. Close the Payload (or use ``with``) to
        release the lease.
        """
        key = entry if isinstance(entry, str) else entry.key
        lease = self._call("AcquireLease", pb.AcquireLeaseRequest(key=key, ttl_ms=max(int(ttl_s * 1000), 1)))
        return Payload(self, lease, lease.entry if lease.HasField("entry") else entry, ttl_s, allow_mmap=mmap)

    def read_payload(self, key: str, offset: int = 0, length: int = 0) -> bytes:
        """Copies bytes ``[offset, offset + length)`` of a payload over ReadPayload (no lease).

        ``length=0`` reads to the end. A range past the end is cut at the end
        (as ``file.read`` does); an offset past the end raises
        :class:`~ctcache.errors.RequestFailed` (``OUT_OF_RANGE``).
        """
        if offset < 0 or length < 0:
            raise ValueError(f"offset and length must be >= 0, not {offset} and {length}")
        return bytes(self._read_range(key, offset, length))

    def _read_range(self, key: str, offset: int, length: int) -> bytearray:
        buf = bytearray()
        req = pb.ReadPayloadRequest(key=key, offset=offset, length=length)
        for chunk in self._stream("ReadPayload", req):
            if chunk.offset != offset + len(buf):
                raise errors.CtcacheError(f"ReadPayload {key}: chunk at {chunk.offset}, expected {offset + len(buf)}")
            buf += chunk.data
            if length and len(buf) > length:
                raise errors.CtcacheError(f"ReadPayload {key}: got more than the {length} bytes asked for")
        return buf

    def _read_whole_payload(self, key: str, size: int) -> bytearray:
        """The whole payload of an entry of ``size`` bytes; any other size is an error."""
        buf = self._read_range(key, 0, 0)
        if len(buf) != size:
            raise errors.CtcacheError(f"ReadPayload {key}: got {len(buf)} bytes, the entry has {size}")
        return buf

    def gc(self, max_bytes: int | None = None, max_age_s: int = 0, *, dry_run: bool = False,
           timeout: float | None = None) -> pb.GcResponse:
        """Evicts entries over a size budget (``max_bytes=0`` = everything not leased) or older than ``max_age_s``."""
        req = pb.GcRequest(max_bytes=max_bytes or 0, has_max_bytes=max_bytes is not None,
                           max_age_s=max_age_s, dry_run=dry_run)
        return self._call("Gc", req, timeout)

    def verify(self, repair: bool = False, *, timeout: float | None = None) -> pb.VerifyResponse:
        return self._call("Verify", pb.VerifyRequest(repair=repair), timeout)

    # ---- the daemon ----

    def status(self, *, timeout: float | None = 10.0) -> pb.StatusResponse:
        return self._call("Status", pb.StatusRequest(), timeout)

    def stats(self, *, timeout: float | None = 10.0) -> pb.StatsResponse:
        return self._call("Stats", pb.StatsRequest(), timeout)

    def host_devices(self, *, timeout: float | None = 10.0) -> list:
        """The daemon host's devices as ``ctcache_onnx.DeviceProto`` messages."""
        return list(self._call("GetHostDevices", pb.GetHostDevicesRequest(), timeout).devices)

    def formats(self, *, timeout: float | None = 10.0) -> list:
        """The packers this daemon offers (FormatInfo messages)."""
        return list(self._call("ListFormats", pb.ListFormatsRequest(), timeout).formats)

    def watches(self, *, timeout: float | None = 10.0) -> list:
        return list(self._call("ListWatches", pb.ListWatchesRequest(), timeout).dirs)

    def add_watch(self, folder, *, timeout: float | None = 10.0) -> list:
        return list(self._call("AddWatch", pb.WatchRequest(dir=_path(folder)), timeout).dirs)

    def remove_watch(self, folder, *, timeout: float | None = 10.0) -> list:
        return list(self._call("RemoveWatch", pb.WatchRequest(dir=_path(folder)), timeout).dirs)

    def events(self, *, timeout: float = 10.0) -> Iterator:
        """The daemon's event stream (entry_added, job_progress, watcher, lease_ended); endless.
        It returns once the daemon follows its feed for this stream (waited
        for ``timeout`` seconds): every event from then on is seen, unless
        the daemon restarts meanwhile."""
        return self._stream("Events", pb.EventsRequest(), followed=timeout)

    def health(self, service: str = "", *, timeout: float | None = 5.0) -> str:
        """grpc.health.v1 status name (``"SERVING"``); needs grpcio-health-checking."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        try:
            r = health_pb2_grpc.HealthStub(self._channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as e:
            raise self._error("Health.Check", e) from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)


__all__ = ["Client", "DEFAULT_RETRY_FOR", "LINK_MODES", "PLACE_METHODS", "SAFE_TO_REPEAT", "connect", "default_socket", "entry_format", "pb", "onnx_pb"]
