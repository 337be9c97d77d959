"""The descriptor channel: a model and the data files the daemon asks for are
opened here, with this process's rights, and handed to the daemon as
descriptors (``SCM_RIGHTS`` on the SOCK_SEQPACKET socket beside the gRPC
one, its path with ``.fds`` added). The daemon then reads those files and
no path, whoever it runs as. A handout lasts until :meth:`Handout.close`.
"""

from __future__ import annotations

import os
import socket

import grpc

from ._pb import ctcache_v1_pb2 as pb

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
    """The daemon's refusal on the channel: a gRPC code name and its sentence."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = getattr(grpc.StatusCode, code, grpc.StatusCode.UNKNOWN)
        self.message = message


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
            first = pb.HandoutRequest(model=pb.HandoutModel(model_path=model_path,
                                                            outputs=[name for name, _ in outputs]))
            socket.send_fds(conn, [first.SerializeToString()], [model.fileno(), *(fd for _, fd in outputs)])
        # Data locations are relative to the folder the model file really is in.
        folder = os.path.dirname(os.path.realpath(model_path))
        while True:
            data, fds, _flags, _ = socket.recv_fds(conn, MAX_PACKET, MAX_FDS)
            for fd in fds:
                os.close(fd)
            if not data:
                raise ConnectionError("the daemon closed the descriptor channel")
            reply = pb.HandoutReply.FromString(data)
            step = reply.WhichOneof("step")
            if step == "needs":
                _answer(conn, folder, list(reply.needs.names))
            elif step == "ready":
                return Handout(conn, reply.ready.handout)
            elif step == "error":
                raise HandoutRefused(reply.error.code, reply.error.message)
            else:
                raise ConnectionError("an empty answer on the descriptor channel")
    except BaseException:
        conn.close()
        raise


def _answer(conn: socket.socket, folder: str, names: list[str]) -> None:
    """Opens the files asked for (a name that does not open, or that would
    leave ``folder``, is sent as missing) and sends their descriptors."""
    files = pb.HandoutFiles()
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
        msg = pb.HandoutRequest(files=files)
        socket.send_fds(conn, [msg.SerializeToString()], opened)
    finally:
        for fd in opened:
            os.close(fd)
