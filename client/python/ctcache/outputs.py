"""Output files this process makes with its own rights: the folders of an
output (made when missing), and the files an Embed is written into. The
daemon opens no output path: it writes into the files handed over with the
model (``HandoutModel.outputs``), and this process renames them into place
in the order the answer says, or removes them.
"""

from __future__ import annotations

import os
import secrets


def make_parents(path: str) -> list[str]:
    """Makes the missing folders of ``path``; returns those made, outermost first."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    made = []
    for d in reversed(missing):
        os.mkdir(d)
        made.append(d)
    return made


def temp_name(folder: str, name: str) -> str:
    """A hidden temp path for ``name`` in ``folder`` that nobody guesses in advance."""
    return os.path.join(folder, f".{name}.tmp-{secrets.token_hex(8)}")


class EmbedFiles:
    """The output folder, model and sidecar an Embed writes into: ``outputs`` to hand over,
    :meth:`commit` once answered (``with`` removes them on an error)."""

    def __init__(self, output_path: str):
        self.path = os.path.abspath(output_path)
        self.folder = os.path.dirname(self.path)
        self._made = make_parents(self.folder)
        self._temps = {}
        self._fds = []
        try:
            self._fds.append(os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            for kind, name in (("model", os.path.basename(self.path)),
                               ("sidecar", os.path.basename(self.path) + ".ctdata")):
                temp = temp_name(self.folder, name)
                self._fds.append(os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                         0o644))
                self._temps[kind] = (temp, os.path.join(self.folder, name))
        except BaseException:
            self._discard()
            raise
        self.outputs = list(zip(("folder", "model", "sidecar"), self._fds))

    def commit(self, r) -> None:
        """Puts the files the daemon wrote in place (the sidecar first when ``r.sidecar_first``)."""
        model, sidecar = self._temps["model"], self._temps["sidecar"]
        order = [model] if not r.sidecar_path else [sidecar, model] if r.sidecar_first else [model, sidecar]
        for temp, final in order:
            os.rename(temp, final)
        self._temps = {k: v for k, v in self._temps.items() if v not in order}
        os.fsync(self._fds[0])
        self._discard(keep_folders=True)

    def _discard(self, keep_folders: bool = False) -> None:
        for temp, _ in self._temps.values():
            try:
                os.unlink(temp)
            except OSError:
                pass
        self._temps = {}
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        if not keep_folders:
            for d in reversed(self._made):
                try:
                    os.rmdir(d)
                except OSError:
                    pass

    def __enter__(self) -> "EmbedFiles":
        return self

    def __exit__(self, kind, *exc) -> None:
        self._discard(keep_folders=kind is None)
