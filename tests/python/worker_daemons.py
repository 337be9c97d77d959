"""What the tests of the runtime workers share: the onnxruntime and
OpenVINO libraries they load, the levels tried, the small model the key's
parts are tried on, and ctcached beside a stand-in worker (a
script in place of ``ctcache-onnxruntime-worker`` next to a copy of the
daemon, which finds its worker beside its own executable)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from e2e.harness import Daemon

LEVELS = {"extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


def ort_library() -> str:
    """The wheel's libonnxruntime.so, as tests/run.sh exports it."""
    lib = os.environ.get("CTCACHE_TEST_ORT_LIBRARY")
    assert lib, "CTCACHE_TEST_ORT_LIBRARY is not set; tests/run.sh sets it to the wheel's libonnxruntime.so"
    return lib


def openvino_library() -> str:
    """The wheel's libopenvino_c.so, as tests/run.sh exports it."""
    lib = os.environ.get("CTCACHE_TEST_OPENVINO_LIBRARY")
    assert lib, "CTCACHE_TEST_OPENVINO_LIBRARY is not set; tests/run.sh sets it to the wheel's libopenvino_c.so"
    return lib


def small_model(path: Path, weight: float = 0.5, constant: float = 1.0) -> Path:
    """X[1,4] @ W + C, C a Constant node: what the key's parts are tried on."""
    w = numpy_helper.from_array(np.full((4, 4), weight, np.float32), "W")
    c = helper.make_node("Constant", [], ["C"], value=numpy_helper.from_array(np.full((4,), constant, np.float32)))
    mm = helper.make_node("MatMul", ["X", "W"], ["XW"])
    add = helper.make_node("Add", ["XW", "C"], ["Y"])
    g = helper.make_graph([c, mm, add], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def stored_forms(d: Daemon, physical_type: str) -> list[dict]:
    """The entries of that runtime form type the daemon `d` stores."""
    return [e for e in d.json("ls")["entries"] if e["physical_type"] == physical_type]


def daemon_beside(tmp_path: Path, monkeypatch, script: str, config: str = "") -> Daemon:
    """A started daemon whose worker is ``script`` (``{python}`` in it: this
    interpreter), ``config`` its ctcached.toml; its library is
    /etc/hostname, which the stand-in ignores."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy(Path(os.environ["CTCACHE_BIN_DIR"]) / "ctcached", bindir / "ctcached")
    worker = bindir / "ctcache-onnxruntime-worker"
    worker.write_text(script.replace("{python}", sys.executable, 1))
    worker.chmod(0o755)
    monkeypatch.setenv("CTCACHE_BIN_DIR", str(bindir))
    d = Daemon(tmp_path / "d", args=["--ort-library", "/etc/hostname"])
    (d.root / "ctcached.toml").write_text(config)
    return d.start()
