"""What the tests of the runtime workers share: the onnxruntime library
they load, the levels tried, and ctcached beside a stand-in worker (a
script in place of ``ctcache-onnxruntime-worker`` next to a copy of the
daemon, which finds its worker beside its own executable)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import onnxruntime as ort

from e2e.harness import Daemon

LEVELS = {"extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


def ort_library() -> str:
    """The wheel's libonnxruntime.so, as tests/run.sh exports it."""
    lib = os.environ.get("CTCACHE_TEST_ORT_LIBRARY")
    assert lib, "CTCACHE_TEST_ORT_LIBRARY is not set; tests/run.sh sets it to the wheel's libonnxruntime.so"
    return lib


def daemon_beside(tmp_path: Path, monkeypatch, script: str) -> Daemon:
    """A started daemon whose worker is ``script`` (``{python}`` in it: this
    interpreter); its library is /etc/hostname, which the stand-in ignores."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy(Path(os.environ["CTCACHE_BIN_DIR"]) / "ctcached", bindir / "ctcached")
    worker = bindir / "ctcache-onnxruntime-worker"
    worker.write_text(script.replace("{python}", sys.executable, 1))
    worker.chmod(0o755)
    monkeypatch.setenv("CTCACHE_BIN_DIR", str(bindir))
    return Daemon(tmp_path / "d", args=["--ort-library", "/etc/hostname"]).start()
