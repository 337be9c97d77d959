"""Build hook: generates the gRPC stubs from the repository's proto/ folder.

`pip install ./client/python` runs this with grpcio-tools installed (a build
requirement). The stubs are written into the build tree only, as
ctcache/_pb/{onnx_pb2,ctcache_v1_pb2,ctcache_v1_pb2_grpc}.py(i) and wire_schema.py; nothing
generated lands in the source tree. The proto folder is ../../proto, or
$CTCACHE_PROTO_DIR.
"""

from __future__ import annotations

import importlib.util
import re
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _stubs_module():
    # Loaded by path: ctcache/__init__.py imports grpc, absent at build time.
    spec = importlib.util.spec_from_file_location("_ctcache_stubs", HERE / "ctcache" / "_stubs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Payload.numpy() and Payload.verify(): part of the basic use the README shows.
ARRAY_REQUIREMENTS = ["numpy>=1.21", "blake3>=0.3"]


def _runtime_requirements() -> list[str]:
    """grpcio/protobuf at least as new as the grpcio-tools generating the stubs
    (its generated code checks both at import time), numpy and blake3."""
    reqs = ["grpcio>=1.60", "protobuf>=4.21"]
    try:
        tools = version("grpcio-tools")
    except PackageNotFoundError:
        return reqs + ARRAY_REQUIREMENTS
    reqs = [f"grpcio>={tools}"]
    proto = [r for r in (requires("grpcio-tools") or []) if re.match(r"protobuf\b", r)]
    reqs.append(proto[0].split(";")[0].replace(" ", "") if proto else "protobuf>=4.21")
    return reqs + ARRAY_REQUIREMENTS


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        stubs = _stubs_module()
        root = stubs.find_proto_root(HERE)
        if root is None:
            raise SystemExit(
                "ctcache: proto/ not found above client/python; build from a ctcache checkout "
                "or set CTCACHE_PROTO_DIR to the folder holding ctcache/v1/ctcache.proto"
            )
        for p in stubs.generate(root, Path(self.build_lib)):
            self.announce(f"generated {p}", level=2)


ORT_EXTRA = ["onnxruntime>=1.24", "onnx>=1.21", "onnx-ir"]

setup(
    cmdclass={"build_py": BuildPyWithStubs},
    install_requires=_runtime_requirements(),
    extras_require={
        "health": ["grpcio-health-checking"],
        # ctcache.ort: onnxruntime's session, and its reference tools (the
        # MatMulNBits quantizer imports onnx_ir) for the no-daemon fallback.
        "ort": ORT_EXTRA,
        # ctcache.openvino: OpenVINO's Core, which imports the daemon's forms.
        "openvino": ["openvino>=2025.1"],
        "all": ["grpcio-health-checking", *ORT_EXTRA, "openvino>=2025.1"],
    },
)
