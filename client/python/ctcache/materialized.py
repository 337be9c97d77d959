"""A materialized model written by this process, with its own rights.

The daemon writes no file where a caller points: it builds the model in
memory for the output's data folder (``data_folder``) and leases each payload
the model reads. :func:`write` places the payload files in
``<output>.weights/`` (a reflink, a copy, or a hard link where the kernel
lets this user make one), checks each against its entry's blake3 before it
takes its name, then writes the model, each file atomically (temp, fsync,
rename). A failure removes what it made. The Rust clients do the same
(``ctcache::materialize::write_answer``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from . import errors
from .outputs import make_parents, temp_name
from ._pb import ctcache_v1_pb2 as pb

# ioctl FICLONE: the new file shares the source's extents.
_FICLONE = 0x40049409
# Errors by which a filesystem says it cannot reflink this pair of files.
_NO_REFLINK = {errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.ENOSYS}
# Errors after which a hard link gives way to a copy (fs.protected_hardlinks,
# another filesystem, the link limit).
_NO_LINK = {errno.EPERM, errno.EACCES, errno.EXDEV, errno.EMLINK, errno.EOPNOTSUPP}
#: ``MaterializeRequest.link`` values by name.
LINK_MODES = {"auto": pb.LINK_MODE_AUTO, "reflink": pb.LINK_MODE_REFLINK, "copy": pb.LINK_MODE_COPY,
              "hard": pb.LINK_MODE_HARD}
#: ``MaterializeFile.method`` values by name (the names ``ctcachectl --json`` prints).
PLACE_METHODS = {pb.PLACE_METHOD_REFLINK: "reflink", pb.PLACE_METHOD_COPY: "copy",
                 pb.PLACE_METHOD_HARD_LINK: "hard_link", pb.PLACE_METHOD_IN_PLACE: "in_place"}
_METHOD_VALUES = {name: value for value, name in PLACE_METHODS.items()}


def data_folder(output_path: str) -> str:
    """The data folder's name beside ``output_path``: ``m.onnx`` -> ``m.onnx.weights``."""
    return os.path.basename(output_path) + ".weights"


def write(r: pb.MaterializeResponse, model_path: str, output_path: str, link: str) -> pb.MaterializeResponse:
    """Writes the answer ``r`` to ``output_path`` (its folders made when missing), its files placed by
    ``link`` (``auto``, ``reflink``, ``copy``, ``hard``); returns ``r`` with what was written."""
    out = os.path.abspath(output_path)
    refuse_input(model_path, out)
    made = make_parents(os.path.dirname(out))
    try:
        return _write(r, out, link)
    except BaseException:
        for d in reversed(made):
            try:
                os.rmdir(d)
            except OSError:
                pass
        raise


def refuse_input(model_path: str, output_path: str) -> None:
    """Refuses an output that is the input model itself (however the path spells it)."""
    if os.path.exists(output_path) and os.path.exists(model_path) and os.path.samefile(output_path, model_path):
        raise ValueError(f"{output_path}: the output path is the input model; choose another path")


def _write(r: pb.MaterializeResponse, out: str, link: str) -> pb.MaterializeResponse:
    entries = {l.entry.key: l.entry for l in r.leases}
    folder = os.path.join(os.path.dirname(out), data_folder(out))
    for f in r.payload_files:
        if f.name in ("", ".", "..") or "/" in f.name or "\0" in f.name or f.key not in entries:
            raise ValueError(f"the daemon's Materialize answer names an unusable file {f.name!r}")
    made_folder = _folder(folder)
    placed = []  # (path, method, bytes copied)
    try:
        for f in r.payload_files:
            placed.append(_place(entries[f.key], folder, f.name, link))
        _fsync_dir(folder)
        _write_file(out, bytes(r.model))
    except BaseException:
        for path, _, _ in placed:
            _unlink(path)
        if made_folder:
            _rmdir(folder)
        raise
    _prune(folder, {f.name for f in r.payload_files})
    written = pb.MaterializeResponse()
    written.CopyFrom(r)
    for field in ("model", "leases", "external_data_dir", "files"):
        written.ClearField(field)
    written.output_path, written.data_dir = out, folder
    written.link = LINK_MODES[link]
    written.model_bytes = len(r.model)
    for path, method, n in placed:
        written.files.add(path=path, method=_METHOD_VALUES[method], bytes_copied=n)
    written.files_reflinked = sum(m == "reflink" for _, m, _ in placed)
    written.files_copied = sum(m == "copy" for _, m, _ in placed)
    written.files_linked = sum(m == "hard_link" for _, m, _ in placed)
    written.bytes_copied = sum(n for _, _, n in placed)
    return written


def _folder(path: str) -> bool:
    """Makes the data folder when missing (True); an existing one must be a real folder of this user's."""
    try:
        os.mkdir(path, 0o755)
        return True
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise FileExistsError(errno.EEXIST, "exists and is not a folder (a symbolic link is not followed)", path)
    if st.st_uid != os.geteuid():
        raise PermissionError(errno.EPERM, "exists and belongs to another user; remove it or choose another output",
                              path)
    return False


def _place(entry, folder: str, name: str, link: str):
    """Makes ``folder/name`` from ``entry``'s payload file as ``link`` says, checked; returns
    (path, method, bytes copied)."""
    final = os.path.join(folder, name)
    temp = temp_name(folder, name)
    try:
        method, copied = _put(entry.payload_path, temp, link)
        digest = _blake3(temp)
        if digest != entry.payload_blake3.lower():
            raise errors.PayloadMismatch(entry.key, f"the copy in {final} hashes to {digest}, "
                                                    f"the entry says {entry.payload_blake3}")
        os.rename(temp, final)
    except BaseException:
        _unlink(temp)
        raise
    return final, method, copied


def _put(src: str, temp: str, link: str):
    """The temp file made from ``src``: (method, bytes copied)."""
    if link == "hard":
        try:
            os.link(src, temp)
            return "hard_link", 0
        except OSError as e:
            if e.errno not in _NO_LINK:
                raise
    with open(src, "rb") as source:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
        with os.fdopen(fd, "wb") as to:
            if link in ("auto", "reflink"):
                try:
                    fcntl.ioctl(to.fileno(), _FICLONE, source.fileno())
                    os.fsync(to.fileno())
                    return "reflink", 0
                except OSError as e:
                    if e.errno not in _NO_REFLINK:
                        raise
                    if link == "reflink":
                        raise OSError(e.errno, f"cannot reflink {src} to {temp} ({e.strerror}): the filesystem has "
                                               "no reflinks, or the cache is on another one; link='auto' copies "
                                               "where reflinks are impossible") from None
            n = _copy(source, to)
            os.fsync(to.fileno())
            return "copy", n


def _copy(source, to) -> int:
    size = os.fstat(source.fileno()).st_size
    n = 0
    while n < size:
        done = os.sendfile(to.fileno(), source.fileno(), n, min(size - n, 1 << 30))
        if done == 0:
            break
        n += done
    return n


def _blake3(path: str) -> str:
    import blake3

    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if os.path.getsize(path):
        h.update_mmap(path)
    return h.hexdigest()


def _write_file(path: str, data: bytes) -> None:
    """Writes ``path`` whole or not at all."""
    folder = os.path.dirname(path)
    temp = temp_name(folder, os.path.basename(path))
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(temp, path)
    except BaseException:
        _unlink(temp)
        raise
    _fsync_dir(folder)


def _prune(folder: str, keep: set) -> None:
    """Removes the files an earlier materialize to this path left; a folder of none goes too."""
    for e in os.scandir(folder):
        if e.is_file(follow_symlinks=False) and e.name not in keep:
            _unlink(e.path)
    if not keep:
        _rmdir(folder)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass
