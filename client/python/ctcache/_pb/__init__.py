"""The generated gRPC stubs (``onnx_pb2``, ``ctcache_v1_pb2``, ``ctcache_v1_pb2_grpc``) and
the messages as :mod:`ctcache.wire` reads them (``wire_schema``).

An installed package carries them (``setup.py`` generates them at build time).
From a source checkout they are missing here; then they are generated once
from the repository's ``proto/`` with grpc_tools into
``~/.cache/ctcache/python-stubs/KEY/`` and that folder is added to this
package's search path. Generated code is never committed.
"""

from __future__ import annotations

import os

_here = os.path.dirname(__file__)
_MODULES = ("onnx_pb2", "ctcache_v1_pb2", "ctcache_v1_pb2_grpc", "wire_schema")

if not all(os.path.isfile(os.path.join(_here, m + ".py")) for m in _MODULES):
    from pathlib import Path

    from .. import _stubs

    _root = _stubs.find_proto_root(Path(_here))
    if _root is None:
        raise ImportError(
            "ctcache: the gRPC stubs are not generated and no proto/ folder was found; "
            "install the package with `pip install ./client/python` or set CTCACHE_PROTO_DIR"
        )
    __path__.append(str(_stubs.ensure_cached(_root)))  # noqa: F821 - package __path__
