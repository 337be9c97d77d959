"""Sessions from runtime compiled forms (D15): onnxruntime's optimized model,
made once per host by the daemon's worker, opened with the optimizer off.

The form's key is the model's content, this process's onnxruntime (version
and build), the provider and the level: a session from it computes what
onnxruntime's own session at that level computes. Used by
:func:`ctcache.ort.inference_session` with ``optimize=``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: The levels a form is made at, as onnxruntime's GraphOptimizationLevel names them.
LEVELS = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "layout": "ORT_ENABLE_LAYOUT",
          "all": "ORT_ENABLE_ALL"}

CPU_PROVIDER = "CPUExecutionProvider"


@dataclass
class FormAnswer:
    """A session from a form, or why there is none (``session`` None)."""

    session: object = None
    compiled: bool = False
    why: str = ""


def level_options(level: str):
    """SessionOptions at ``level`` (what onnxruntime's own session would run)."""
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, LEVELS[level])
    return so


def why_not_served(level: str, sess_options, providers) -> str:
    """Why a request cannot be served from a form ("" when it can)."""
    if level not in LEVELS:
        raise ValueError(f"optimize must be one of {', '.join(LEVELS)}, not {level!r}")
    if sess_options is not None:
        return ("sess_options given: a form's key cannot see everything SessionOptions change "
                "(free dimension overrides, config entries), so onnxruntime makes this session itself")
    names = [p[0] if isinstance(p, (tuple, list)) else p for p in (providers or [])]
    if any(n != CPU_PROVIDER for n in names):
        return f"forms are made for {CPU_PROVIDER} only (asked: {', '.join(names)})"
    return ""


def session_from_form(client, path, level: str, providers, lease_ttl_s: float = 30.0, target: str | None = None,
                      target_settings: dict | None = None) -> FormAnswer:
    """A session on the daemon's form of ``path`` at ``level``, made with the optimizer off.

    The form's model comes in the answer; its large initializers are the
    cache's payload files, which onnxruntime maps in place, held for this
    process while the session lives (as the zero-write session holds its
    payloads; where this process cannot read them, they come over the
    socket, checked as they are sent, and nothing stays held). ``target``:
    the form of that materialize target's model (``target_settings``).
    """
    import onnxruntime

    from .ort import _close_holder, _session_in_memory

    r, holder = client.compile(path, level=level, runtime_version=onnxruntime.__version__,
                               runtime_build=onnxruntime.get_build_info(), lease_ttl_s=lease_ttl_s, hold=True,
                               target=target, target_settings=target_settings)
    if not r.HasField("form"):
        _close_holder(holder)
        return FormAnswer(why=f"{r.miss.reason}: {r.miss.detail}")
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = _session_in_memory(client, r, holder, so, providers, lease_ttl_s)
    return FormAnswer(session=sess, compiled=r.compiled)


def session_by_descriptor(socket, path, level: str, providers, target: str | None = None,
                          target_settings: dict | None = None) -> FormAnswer | None:
    """The form asked for on the descriptor channel, without gRPC (importing
    a gRPC client costs a fresh process more than the session from a form
    does): a session when every payload file is readable here, held while
    the session lives; ``None`` where this way cannot serve it (no daemon,
    a refusal, payloads this process cannot read, a daemon without the
    step), for the caller to ask over gRPC, which says why or copies.
    """
    import onnxruntime

    from . import handout, wire
    from .ort import session_held_by

    model = os.path.abspath(os.fspath(path))
    req = wire.Message("CompileRequest", model_path=model, runtime="onnxruntime", level=level,
                       runtime_version=onnxruntime.__version__, runtime_build=onnxruntime.get_build_info())
    if target is not None:
        from .targets import target_request

        req.materialize = target_request(target, **(target_settings or {}))
    # A target's refusal: gRPC says which (a target that rewrites nothing is no error).
    asked = handout.ask_handed(socket, model, "compile", req, refusal_raises=target is None)
    if asked is None:
        return None
    h, r = asked
    if not r.HasField("form"):
        return FormAnswer(why=f"{r.miss.reason}: {r.miss.detail}")
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = session_held_by(h, r, so, providers)
    if sess is None:
        return None
    return FormAnswer(session=sess, compiled=r.compiled)
