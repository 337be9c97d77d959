"""A first run as a new user meets it: what the binaries print, with the environment of root or a service.

* With ``XDG_RUNTIME_DIR`` unset, ``ctcached``, ``ctcachectl devices --local`` and ``ctcachectl inspect`` succeed
  and print no line that says "error" (Mesa's Vulkan device-select layer asks libwayland for a compositor while
  the GPUs are detected; libwayland's complaint goes to the debug log).
* Parse and write errors name the file and say what it means: a truncated model, an output folder that does not
  exist.

Skips when the binaries are not built.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from e2e.harness import bin_dir
from waiting import wait_until

ERROR_LINE = re.compile(r"(^|[^A-Za-z0-9_])(error|Error|ERROR)(:|\s)")


def binary(name: str) -> str:
    p = bin_dir() / name
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.skip(f"{name} not built ({p}); build it or set CTCACHE_BIN_DIR")
    return str(p)


def service_env(home: Path) -> dict:
    """The environment of a service or of root: no XDG_RUNTIME_DIR, no Wayland or X display."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CTCACHE_", "XDG_", "WAYLAND_")) and k != "DISPLAY"}
    env["HOME"] = str(home)
    return env


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if ERROR_LINE.search(line)]


def make_model(path: Path) -> Path:
    w = np.random.default_rng(1).standard_normal((512, 256)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 512])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 256])],
                          [numpy_helper.from_array(w, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    save(m, str(path))
    return path


@pytest.fixture
def home():
    h = Path(tempfile.mkdtemp(prefix="ctc-fr-"))  # short: the default socket lives under it
    yield h
    shutil.rmtree(h, ignore_errors=True)


def run(args, env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def test_offline_commands_print_no_error_without_xdg_runtime_dir(home):
    ctl = binary("ctcachectl")
    env = service_env(home)
    model = make_model(home / "model.onnx")
    compiled = home / "model.compiled.onnx"
    r = run([ctl, "embed", str(model), "-o", str(compiled), "--format", "ort.matmul_nbits", "--local"], env, home)
    assert r.returncode == 0, r.stderr
    for args in (["devices", "--local"], ["inspect", str(compiled)]):
        r = run([ctl, *args], env, home)
        assert r.returncode == 0, f"{args}: {r.stderr}"
        assert r.stdout.strip(), args
        assert not error_lines(r.stderr) and not error_lines(r.stdout), f"{args}:\n{r.stderr}"
    # The GPU detection did run (an adapter or none, but the wgpu path was taken).
    r = run([ctl, "devices", "--local", "--json"], env, home)
    assert r.returncode == 0 and '"type": "cpu"' in r.stdout, r.stderr


def test_daemon_prints_no_error_without_xdg_runtime_dir(home):
    ctcached, ctl = binary("ctcached"), binary("ctcachectl")
    env = dict(service_env(home), RUST_LOG="info")
    socket = home / ".cache" / "ctcache" / "ctcached.sock"  # the default without XDG_RUNTIME_DIR
    log = home / "ctcached.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([ctcached, "--log-format", "human"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=home)
    try:
        def answers() -> bool:
            assert proc.poll() is None, log.read_text(errors="replace")
            return run([ctl, "status"], env, home).returncode == 0

        wait_until(answers, 60, f"an answer on {socket}", interval=0.1,
                   detail=lambda: log.read_text(errors="replace"))
        assert socket.exists()
        r = run([ctl, "devices"], env, home)  # the daemon's own detection
        assert r.returncode == 0, r.stderr
        assert not error_lines(r.stderr), r.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    text = log.read_text(errors="replace")
    assert code == 0, text
    assert not error_lines(text), text


def test_a_truncated_model_is_named_and_explained(home):
    ctl = binary("ctcachectl")
    whole = make_model(home / "model.onnx").read_bytes()
    trunc = home / "trunc.onnx"
    trunc.write_bytes(whole[:19])
    for cmd in ("digest", "check", "inspect"):
        r = run([ctl, cmd, str(trunc)], service_env(home), home)
        assert r.returncode == 1, r.stderr
        assert f"{trunc}: not a complete ONNX model (truncated at byte 19" in r.stderr, f"{cmd}: {r.stderr}"
        assert "panicked" not in r.stderr
    r = run([ctl, "pack", str(trunc), "--initializer", "W", "--format", "ort.matmul_nbits", "-o", str(home / "w.bin")],
            service_env(home), home)
    assert r.returncode == 1 and f"{trunc}: not a complete ONNX model" in r.stderr, r.stderr
    assert not (home / "w.bin").exists()


def test_an_output_that_cannot_be_written_says_so(home):
    ctl = binary("ctcachectl")
    model = make_model(home / "model.onnx")
    # A missing folder is made; a folder that is a file cannot be.
    out = model / "x.bin"
    r = run([ctl, "pack", str(model), "--initializer", "W", "--format", "ort.matmul_nbits", "-o", str(out)],
            service_env(home), home)
    assert r.returncode == 1, r.stderr
    assert f"cannot write {out}: Not a directory" in r.stderr, r.stderr
    assert model.is_file()
