"""OpenVINO compiled models from the daemon's runtime forms (D15).

``compile_model`` returns what ``openvino.Core().compile_model(model,
device, config)`` returns, an ``openvino.CompiledModel``, imported from the
compiled model the daemon's OpenVINO worker made once for this host
(``export_model``'s blob, a store entry) instead of compiled in this
process. The form's key is the model's content, this process's OpenVINO
(version and build), the device, the config and the host's CPU tier: the
imported model computes what this process's own compile computes.

The blob is mapped privately (copy-on-write: OpenVINO wants a writable
tensor) from the cache's payload file and held while the compiled model
lives; where this process cannot read the payload (the daemon as its own
user), its bytes come over the socket, checked as they are sent. Without a
daemon, a usable OpenVINO in it, or a model it can make a form of,
OpenVINO compiles here, with a :class:`FallbackWarning` saying why.
"""

from __future__ import annotations

import mmap
import os
import warnings
import weakref
from dataclasses import dataclass

from . import errors

#: The device forms are made for.
CPU = "CPU"


class FallbackWarning(RuntimeWarning):
    """OpenVINO compiled the model in this process: no form could be served (the message says why)."""


@dataclass
class FormReport:
    """How a compiled model was made, as ``compiled.ctcache_report``: from the
    daemon's form (``source="daemon"``; ``compiled``: made for this call) or
    by OpenVINO here (``source="runtime"``, ``why``)."""

    source: str
    compiled: bool = False
    why: str = ""


@dataclass
class _Served:
    """A form as this process got it: the blob (None: none, ``why``) and what ends its hold."""

    blob: object = None
    release: object = None
    why: str = ""
    compiled: bool = False


def runtime_identity() -> tuple[str, str]:
    """This process's OpenVINO as the daemon's worker reports its own: the
    release (the build number up to its first ``-``) and the whole build number."""
    import openvino

    build = openvino.get_version()
    return build.split("-", 1)[0], build


def compile_model(model, device: str = CPU, config: dict | None = None, socket=None):
    """An ``openvino.CompiledModel`` of the ONNX file ``model`` for ``device``
    with ``config``, imported from the daemon's form (compiled by the daemon
    once per key; see the module's docstring for when OpenVINO compiles here)."""
    import openvino

    core = openvino.Core()
    given = dict(config or {})
    config = _as_strings(given)
    if config is None:
        return _compiled_here(core, model, device, given, "a config value is no property value the daemon can key")
    if not isinstance(model, (str, os.PathLike)):
        return _compiled_here(core, model, device, config, "the model is no file the daemon can read")
    path = os.path.abspath(os.fspath(model))
    if device != CPU:
        return _compiled_here(core, path, device, config, f"forms are made for {CPU} only (asked: {device})")
    got = _by_descriptor(socket, path, config) or _by_grpc(socket, path, config)
    if got.blob is None:
        return _compiled_here(core, path, device, config, got.why)
    import numpy

    try:
        tensor = openvino.Tensor(numpy.frombuffer(got.blob, dtype=numpy.uint8), shared_memory=True)
        compiled = core.import_model(tensor, device, config)
    except BaseException:
        got.release()
        raise
    # The mapping and the hold on the form stay while the compiled model lives.
    weakref.finalize(compiled, got.release)
    compiled.ctcache_report = FormReport("daemon", compiled=got.compiled)
    return compiled


def _as_strings(config: dict) -> dict | None:
    """``config`` as the daemon keys it, property names to strings, as
    OpenVINO reads them: a property given as its function
    (``props.hint.performance_mode``) by its name, an enum by its name, a
    bool as YES or NO, a number as written; ``None`` for anything else."""
    out = {}
    for k, v in config.items():
        name = k() if callable(k) else k
        if isinstance(v, bool):
            value = "YES" if v else "NO"
        elif isinstance(v, (str, int, float)):
            value = str(v)
        elif isinstance(getattr(v, "name", None), str):
            value = v.name
        else:
            return None
        if not isinstance(name, str):
            return None
        out[name] = value
    return out


def _compiled_here(core, model, device: str, config: dict, why: str):
    """OpenVINO's own compile in this process, with a warning saying why."""
    warnings.warn(f"ctcache: {why} -- OpenVINO compiles the model in this process", FallbackWarning,
                  stacklevel=3)
    compiled = core.compile_model(model, device, config)
    compiled.ctcache_report = FormReport("runtime", why=why)
    return compiled


def _request(path: str, config: dict):
    from . import wire

    version, build = runtime_identity()
    return wire.Message("CompileRequest", model_path=path, runtime="openvino", provider=CPU,
                        runtime_version=version, runtime_build=build, config=config)


def _mapped(payload_path: str):
    """The payload file mapped privately, writable (copy-on-write)."""
    with open(payload_path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def _by_descriptor(socket, path: str, config: dict):
    """The form asked on the descriptor channel (no gRPC); ``None`` where
    this way cannot serve it (no daemon, a payload this process cannot
    read, a daemon without the step), for gRPC to ask again, which says
    why or copies."""
    from . import handout

    asked = handout.ask_handed(socket, path, "compile", _request(path, config))
    if asked is None:
        return None
    h, r = asked
    if not r.HasField("form"):
        return _Served(why=f"{r.miss.reason}: {r.miss.detail}")
    try:
        blob = _mapped(r.form.entry.payload_path)
    except OSError:
        h.close()
        return None
    return _Served(blob, _releaser(blob, h), compiled=r.compiled)


def _by_grpc(socket, path: str, config: dict):
    """The form asked over gRPC, or why there is none."""
    from .client import connect

    try:
        c = connect(socket)
    except (errors.DaemonNotRunning, errors.SocketPermissionDenied) as e:
        return _Served(why=str(e))
    try:
        version, build = runtime_identity()
        r, holder = c.compile(path, runtime="openvino", device=CPU, config=config, runtime_version=version,
                              runtime_build=build, hold=True)
        if not r.HasField("form"):
            if holder is not None:
                holder.close()
            return _Served(why=f"{r.miss.reason}: {r.miss.detail}")
        e = r.form.entry
        try:
            blob = _mapped(e.payload_path)
        except OSError:
            # Unreadable here (the daemon as its own user): a private copy,
            # checked as it is sent; nothing stays held.
            blob = c._read_whole_payload(e.key, e.payload_len)
            if holder is not None:
                holder.close()
            holder = None
        return _Served(blob, _releaser(blob, holder), compiled=r.compiled)
    finally:
        c.close()


def _releaser(blob, holder):
    """Ends what a served blob holds: its mapping and its hold."""

    def release():
        if holder is not None:
            holder.close()
        if isinstance(blob, mmap.mmap):
            try:
                blob.close()
            except BufferError:
                pass  # still exported to OpenVINO's tensor: unmapped when collected

    return release
