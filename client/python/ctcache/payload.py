"""A compiled tensor's payload held open under a lease."""

from __future__ import annotations

import mmap
import os
import threading
import weakref

import grpc

from . import layout
from ._pb import ctcache_v1_pb2 as pb
from .errors import PayloadMismatch

# The bytes one digest of :meth:`Payload.checked` covers (the daemon's group).
GROUP = 256 * 1024


def _digest(group) -> bytes:
    import blake3

    return blake3.blake3(group).digest()


class Payload:
    """The bytes of one cache entry, read-only, protected from gc by a lease.

    Made by :meth:`ctcache.Client.open_payload`. ``source`` says how the bytes
    were obtained: ``"mmap"`` (the blob file mapped read-only, zero copy) or
    ``"stream"`` (copied over ``ReadPayload`` because the file was not
    readable by this process). The lease is renewed by a daemon thread every
    ttl/3 and released by :meth:`close` (or leaving the ``with`` block). A
    Payload that is garbage-collected without ``close()`` stops renewing and
    its lease expires after the ttl.

    What is checked: when the daemon grants the lease it compares the payload
    file with the one it hashed (identity: device, inode, size, mtime, ctime;
    rehashed if it changed) and refuses damaged bytes (``DATA_LOSS``); a
    streamed copy was checked group by group as the daemon sent it. A mapped
    file whose bytes change on disk *after* the lease was granted (a failing
    disk under a live mapping) is not noticed by :attr:`memoryview`,
    :meth:`numpy` or :meth:`tobytes`: :meth:`checked` hashes the 256 KiB
    groups each read touches, every time, and raises
    :class:`ctcache.PayloadMismatch` instead of returning changed bytes;
    :meth:`verify` rehashes the whole payload now.
    """

    def __init__(self, client, lease: pb.LeaseResponse, entry: pb.Entry, ttl_s: float, allow_mmap: bool = True):
        self.entry = entry
        self.key = entry.key
        self.lease_id = lease.lease_id
        self.ttl_s = ttl_s
        self.path = entry.payload_path
        self.source = ""
        self._client = client
        self._mmap = None
        self._view = None
        self._closed = False
        self._stop = threading.Event()
        self._state = {"error": None, "renewals": 0, "expires_unix_ms": lease.expires_unix_ms}
        self._thread = None
        self._group_digests = None
        try:
            if allow_mmap:
                self._view = self._map()
            if self._view is None:
                self._view = memoryview(client._read_whole_payload(self.key, entry.payload_len))
                self.source = "stream"
        except BaseException:
            self._release_lease()
            raise
        self._thread = threading.Thread(
            target=_renew_loop,
            args=(client._stub, [self.lease_id], ttl_s, self._stop, self._state),
            name=f"ctcache-lease-{self.lease_id}",
            daemon=True,
        )
        self._thread.start()
        weakref.finalize(self, self._stop.set)

    def _map(self):
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size != self.entry.payload_len:
                return None  # not the file the entry describes; ask the daemon
            if size == 0:
                self.source = "mmap"
                return memoryview(b"")
            self._mmap = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except OSError:
            return None
        finally:
            os.close(fd)
        self.source = "mmap"
        return memoryview(self._mmap)

    # ---- the bytes ----

    @property
    def memoryview(self) -> memoryview:
        """A read-only view of the payload (valid until :meth:`close`)."""
        if self._closed:
            raise ValueError("payload is closed")
        return self._view

    def fields(self) -> list:
        """The payload's fields (:class:`ctcache.layout.Field`: name, offset, dtype, shape), in order."""
        return layout.fields(self.entry.struct_type, self.entry.dims)

    def numpy(self, dtype=None, shape=None, *, field: str | None = None):
        """The payload (or one field of it) as a read-only numpy array, without a copy.

        No arguments: the entry's own dtype and shape where its format has
        one, i.e. a single payload field numpy can hold (``cast.f16``:
        float16 in the weight's shape; ``gemm.pack_b.f32``: float32 panels;
        ``ggml.q8_0``: structured blocks ``d``/``qs``); else the bytes as
        flat ``uint8`` (``ort.matmul_nbits`` has three fields: ask for one).
        ``field="scales"``: that field, in its dtype and shape. ``dtype`` /
        ``shape``: the raw bytes viewed as given (``dtype`` defaults to
        ``uint8``).

        Arrays made here keep the mapping alive; do not use them after
        :meth:`close` (the lease is gone, so gc may remove the file; the
        mapping itself stays valid on Linux).
        """
        import numpy as np

        view = self.memoryview
        if field is not None:
            if dtype is not None or shape is not None:
                raise ValueError("numpy(field=...) takes the field's own dtype and shape")
            found = [f for f in self.fields() if f.name == field]
            if not found:
                names = ", ".join(f.name for f in self.fields()) or "none"
                raise KeyError(f"{self.entry.physical_type} has no field {field!r} numpy can hold (fields: {names})")
            return self._field_array(found[0])
        if dtype is None and shape is None:
            fs = self.fields()
            if len(fs) == 1 and layout.payload_fields(self.entry.struct_type) == 1 and fs[0].nbytes == len(view):
                return self._field_array(fs[0])
        arr = np.frombuffer(view, dtype=np.uint8 if dtype is None else dtype)
        return arr if shape is None else arr.reshape(shape)

    def _field_array(self, f):
        import numpy as np

        view = self.memoryview
        if f.offset + f.nbytes > len(view):
            raise ValueError(f"field {f.name!r} ends at byte {f.offset + f.nbytes}, past the {len(view)}-byte payload")
        count = f.nbytes // f.dtype.itemsize
        return np.frombuffer(view, dtype=f.dtype, count=count, offset=f.offset).reshape(f.shape)

    def tobytes(self) -> bytes:
        return self.memoryview.tobytes()

    def __len__(self) -> int:
        return len(self.memoryview)

    def checked(self, offset: int = 0, length: int | None = None) -> memoryview:
        """Bytes ``offset`` to ``offset + length`` (default: to the end), each
        256 KiB group they touch hashed now and compared with its digest.

        The first checked read hashes the whole payload once, compares it
        with the entry's ``payload_blake3`` and keeps one digest per group;
        later reads hash only the groups they touch. Bytes that differ raise
        :class:`ctcache.PayloadMismatch` naming the group, and are never
        returned. The view is of the mapping: bytes read from it later are
        not checked again (needs the ``blake3`` package).
        """
        view = self.memoryview
        end = len(view) if length is None else offset + length
        if offset < 0 or end < offset or end > len(view):
            raise ValueError(f"bytes {offset}..{end} of a payload of {len(view)} bytes")
        digests = self._digests(view)
        for group in range(offset // GROUP, (end + GROUP - 1) // GROUP):
            start = group * GROUP
            if _digest(view[start : start + GROUP]) != digests[group]:
                raise PayloadMismatch(
                    self.key, f"bytes {start}..{min(start + GROUP, len(view))} changed since they were checked"
                )
        return view[offset:end]

    def _digests(self, view) -> list:
        if self._group_digests is None:
            import blake3

            whole = blake3.blake3(max_threads=blake3.blake3.AUTO)
            digests = []
            for start in range(0, len(view), GROUP):
                group = view[start : start + GROUP]
                whole.update(group)
                digests.append(_digest(group))
            if whole.hexdigest() != self.entry.payload_blake3.lower():
                raise PayloadMismatch(
                    self.key, f"its blake3 is {whole.hexdigest()}, the entry says {self.entry.payload_blake3}"
                )
            self._group_digests = digests
        return self._group_digests

    def verify(self) -> bool:
        """True when the bytes, hashed now, match the entry's ``payload_blake3`` (needs the ``blake3`` package)."""
        import blake3

        return blake3.blake3(self.memoryview).hexdigest() == self.entry.payload_blake3

    # ---- the lease ----

    @property
    def lease_error(self):
        """The error of the last failed renewal (the lease may have expired), else None."""
        return self._state["error"]

    @property
    def renewals(self) -> int:
        return self._state["renewals"]

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stops renewing, releases the lease and unmaps (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._release_lease()
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # numpy arrays still point into it; unmapped when they are collected
            self._mmap = None

    def _release_lease(self) -> None:
        try:
            self._client._stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=self.lease_id), timeout=5)
        except (grpc.RpcError, ValueError):
            pass  # daemon gone or channel closed: the lease expires by itself

    def __enter__(self) -> "Payload":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.source}, lease {self.lease_id}"
        return f"<ctcache.Payload {self.entry.physical_type} {self.entry.payload_len} bytes ({state})>"


def _renew_loop(stub, lease_ids: list, ttl_s: float, stop: threading.Event, state: dict) -> None:
    """Renews every lease of ``lease_ids`` each ttl/3 until ``stop`` (a lease found gone is dropped)."""
    # Holds no reference to the Payload, so an unclosed Payload can be collected.
    interval = max(ttl_s / 3.0, 0.05)
    ttl_ms = max(int(ttl_s * 1000), 1)
    live = list(lease_ids)
    while live and not stop.wait(interval):
        for lease_id in list(live):
            try:
                r = stub.RenewLease(pb.RenewLeaseRequest(lease_id=lease_id, ttl_ms=ttl_ms),
                                    timeout=max(interval, 1.0))
                state["renewals"] += 1
                state["expires_unix_ms"] = r.expires_unix_ms
                state["error"] = None
            except grpc.RpcError as e:
                state["error"] = f"{e.code().name}: {e.details()}"
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    live.remove(lease_id)  # the lease is gone; renewing cannot bring it back
            except ValueError as e:  # channel closed
                state["error"] = str(e)
                return
