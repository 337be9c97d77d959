"""The descriptor channel: a model and the data files the daemon asks for are
opened here, with this process's rights, and handed to the daemon as
descriptors (``SCM_RIGHTS`` on the SOCK_SEQPACKET socket beside the gRPC
one, its path with ``.fds`` added). The daemon then reads those files and
no path, whoever it runs as. A handout lasts until :meth:`Handout.close`.
"""

from __future__ import annotations

import os
import socket
import stat
from typing import Mapping

from . import wire

#: The largest message either side sends, and the most descriptors in one.
MAX_PACKET = 128 * 1024
MAX_FDS = 64


class Handout:
    """A model handed over; its ``name`` goes in a request's ``handout`` field."""

    def __init__(self, conn: socket.socket, name: str):
        self._conn = conn
        self.name = name

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "Handout":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class HandoutRefused(Exception):
    """The daemon's refusal on the channel: a gRPC code name, its sentence
    and the error kind (as the gRPC answers' trailer names it)."""

    def __init__(self, code: str, message: str, kind: str = ""):
        super().__init__(message)
        self.code_name = code
        self.message = message
        self.kind = kind

    @property
    def code(self):
        """The ``grpc.StatusCode`` (:func:`ctcache.errors.status_code`)."""
        from .errors import status_code

        return status_code(self.code_name)


def default_socket(env: Mapping[str, str] | None = None) -> str:
    """The daemon's socket as ctcached picks it by default (D8).

    ``$CTCACHE_SOCKET``, else ``$XDG_RUNTIME_DIR/ctcache/ctcached.sock``, else
    ``$XDG_CACHE_HOME/ctcache/ctcached.sock``, else
    ``~/.cache/ctcache/ctcached.sock``. A socket set only in the daemon's
    config file is not seen here: pass it to :func:`connect`.
    """
    env = os.environ if env is None else env
    if env.get("CTCACHE_SOCKET"):
        return env["CTCACHE_SOCKET"]
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "ctcache", "ctcached.sock")
    if env.get("XDG_CACHE_HOME"):
        cache = env["XDG_CACHE_HOME"]
    elif env.get("HOME"):
        cache = os.path.join(env["HOME"], ".cache")
    else:
        cache = "/var/cache"
    return os.path.join(cache, "ctcache", "ctcached.sock")


def hand_over(grpc_socket: str, model_path: str, timeout: float | None = None, outputs=()) -> Handout:
    """Hands the model at the absolute ``model_path`` to the daemon at
    ``grpc_socket``, each wait for it at most ``timeout`` seconds (``None``:
    no limit), with the ``outputs`` made for the request ((name, descriptor)
    pairs, ``HandoutModel.outputs``). A channel that is not there (a daemon
    starting, or gone) raises ``ConnectionError``; a model this process
    cannot open raises its ``OSError``."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.settimeout(timeout)
    try:
        conn.connect(grpc_socket + ".fds")
    except (FileNotFoundError, ConnectionRefusedError) as e:
        conn.close()
        raise ConnectionError(f"the descriptor channel {grpc_socket}.fds: {e.strerror}") from None
    except OSError:
        conn.close()
        raise
    try:
        # This process's own open decides what it may hand over (the daemon
        # opens no path for it): a model it cannot read is its OSError.
        # Not blocking: a FIFO opens at once, for the daemon to refuse.
        model = os.fdopen(os.open(model_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb")
    except OSError:
        conn.close()
        raise
    try:
        with model:
            first = wire.Message("HandoutRequest", model=wire.Message(
                "HandoutModel", model_path=model_path, outputs=[name for name, _ in outputs]))
            socket.send_fds(conn, [first.SerializeToString()], [model.fileno(), *(fd for _, fd in outputs)])
        # Data locations are relative to the folder the model file really is in.
        folder = os.path.dirname(os.path.realpath(model_path))
        while True:
            data, fds, _flags, _ = socket.recv_fds(conn, MAX_PACKET, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
            for fd in fds:
                os.close(fd)
            if not data:
                raise ConnectionError("the daemon closed the descriptor channel")
            reply = _reply(data)
            step = reply.WhichOneof("step")
            if step == "needs":
                _answer(conn, folder, list(reply.needs.names))
            elif step == "ready":
                return Handout(conn, reply.ready.handout)
            elif step == "error":
                raise HandoutRefused(reply.error.code, reply.error.message, reply.error.kind)
            else:
                raise ConnectionError("an empty answer on the descriptor channel")
    except BaseException:
        conn.close()
        raise


#: Each request on a ready handout: (its reply's step, the response type, the RPC it stands for).
_ASKS = {"compile": ("compiled", "CompileResponse", "Compile"),
         "materialize": ("materialized", "MaterializeResponse", "Materialize")}


def ask(h: Handout, step: str, req, timeout: float | None = None) -> wire.Message:
    """Asks ``step`` (``"compile"``: a runtime form; ``"materialize"``: an
    in-memory Materialize answer) with ``req`` (a :class:`wire.Message`,
    or the generated class's) on ``h``'s connection, no gRPC: the answer
    (a :class:`wire.Message`) comes as a sealed memfd, and what it leases is
    held while ``h`` stays open. A refusal raises :class:`HandoutRefused`
    (and ends ``h``); a daemon that does not know the step closes the
    channel (``ConnectionError``)."""
    answered, response, _ = _ASKS[step]
    h._conn.settimeout(timeout)
    socket.send_fds(h._conn, [wire.Message("HandoutRequest", **{step: req}).SerializeToString()], [])
    data, fds, _flags, _ = socket.recv_fds(h._conn, MAX_PACKET, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
    try:
        if not data:
            raise ConnectionError("the daemon closed the descriptor channel")
        reply = _reply(data)
        got = reply.WhichOneof("step")
        if got == "error":
            raise HandoutRefused(reply.error.code, reply.error.message, reply.error.kind)
        if got != answered or len(fds) != 1:
            raise ConnectionError("an answer out of protocol on the descriptor channel")
        answer = _sealed_answer(fds[0], getattr(reply, answered).length)
        try:
            return wire.decode(response, answer)
        except wire.WireError as e:
            raise ConnectionError(f"a malformed answer on the descriptor channel: {e}") from None
    finally:
        for fd in fds:
            os.close(fd)


def _sealed_answer(fd: int, length: int) -> bytes:
    """The answer in the memfd ``fd``: a file of exactly ``length`` bytes."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != length:
        raise ConnectionError(f"the answer's memfd holds {st.st_size} bytes, not the {length} announced")
    answer = bytearray()
    while len(answer) < length:
        more = os.pread(fd, min(length - len(answer), 1 << 24), len(answer))
        if not more:
            raise ConnectionError("the answer's memfd is shorter than announced")
        answer += more
    return bytes(answer)


def compile_form(h: Handout, req, timeout: float | None = None) -> wire.Message:
    """The runtime form of ``h``'s model (:func:`ask` ``"compile"``)."""
    return ask(h, "compile", req, timeout)


def ask_handed(sock, path: str, step: str, req, *, refusal_raises=True):
    """``(handout, answer)`` for ``step`` asked on the descriptor channel of
    a handout of ``path`` (what the answer leases held while the handout
    stays open; closed here when the answer holds nothing: a form's miss);
    ``None`` where this way cannot answer (no daemon, a channel lost or out
    of protocol, or a refusal not raised), for the caller to ask over gRPC.
    A refusal raises the client's error for its code when
    ``refusal_raises`` is True, or a function of the
    :class:`HandoutRefused` that says so."""
    try:
        h = hand_over(os.path.abspath(os.fspath(sock or default_socket())), path)
    except (OSError, HandoutRefused):
        return None
    try:
        r = ask(h, step, req)
    except HandoutRefused as e:
        h.close()
        if not (refusal_raises(e) if callable(refusal_raises) else refusal_raises):
            return None
        from . import errors

        raise errors.refusal(_ASKS[step][2], e.code_name, e.message, e.kind) from None
    except Exception:  # noqa: BLE001 -- a channel lost or out of protocol: gRPC asks again
        h.close()
        return None
    if step == "compile" and not r.HasField("form"):
        h.close()
    return h, r


def _reply(data: bytes) -> wire.Message:
    try:
        return wire.decode("HandoutReply", data)
    except wire.WireError as e:
        raise ConnectionError(f"a malformed message on the descriptor channel: {e}") from None


def _answer(conn: socket.socket, folder: str, names: list[str]) -> None:
    """Opens the files asked for (a name that does not open, or that would
    leave ``folder``, is sent as missing) and sends their descriptors."""
    files = wire.Message("HandoutFiles")
    opened = []
    try:
        for name in names:
            parts = name.replace("\\", "/").split("/")
            fd = None
            if not os.path.isabs(name) and ".." not in parts:
                try:
                    fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                except OSError:
                    fd = None
            if fd is None:
                files.missing.append(name)
            else:
                files.names.append(name)
                opened.append(fd)
        msg = wire.Message("HandoutRequest", files=files)
        socket.send_fds(conn, [msg.SerializeToString()], opened)
    finally:
        for fd in opened:
            os.close(fd)
