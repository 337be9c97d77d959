"""The onnxruntime worker (``workers/onnxruntime``) against onnxruntime's
own Python module, on the real-model corpus.

The worker loads the wheel's ``libonnxruntime.so`` (``CTCACHE_TEST_ORT_LIBRARY``,
which ``tests/run.sh`` sets); the Python module is the same release built
into another binary. The two meet on version and build; the optimized
model the worker writes at a level is the one onnxruntime's Python writes
with ``SessionOptions.optimized_model_filepath`` (byte for byte where
onnxruntime writes the same bytes twice: at ``all`` it numbers the layout
reorders of a conv net differently from run to run), and a session of it
with the optimizer off gives the outputs of the session onnxruntime makes
from the source at that level.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ctl
import real_models
from e2e.harness import Daemon
from real_models import CORPUS
from waiting import wait_until
from worker_daemons import LEVELS, daemon_beside
from worker_daemons import ort_library as _library



def _worker() -> str:
    exe = Path(os.environ["CTCACHE_BIN_DIR"]) / "ctcache-onnxruntime-worker"
    assert exe.is_file(), f"{exe} is not built"
    return str(exe)


def _run(args: list[str], model: Path | None, out: Path) -> subprocess.CompletedProcess:
    """The worker with ``model`` on its standard input and ``out`` as
    descriptor 3."""
    with open(out, "wb") as o, open(model or os.devnull, "rb") as i:
        fd = o.fileno()
        return subprocess.run([_worker(), *args], stdin=i, capture_output=True, text=True, timeout=300,
                              preexec_fn=lambda: os.dup2(fd, 3), pass_fds=(3,))


def test_the_worker_and_the_python_module_meet_on_version_and_build(tmp_path):
    r = _run(["identify", "--library", _library()], None, tmp_path / "unused")
    assert r.returncode == 0, r.stderr
    identity = json.loads(r.stdout)
    assert identity == {"runtime": "onnxruntime", "version": ort.__version__,
                        "build": ort.capi._pybind_state.get_build_info()}


@pytest.mark.parametrize("level", sorted(LEVELS))
@pytest.mark.parametrize("name", ["minilm-l3", "ddddocr-det", "silero-vad"])
def test_the_optimized_model_is_onnxruntimes_own(name, level, tmp_path):
    m = real_models.by_name(name)
    real_models.fetch(m)
    ours = tmp_path / "ours.onnx"
    r = _run(["optimize", "--library", _library(), "--level", level], m.path, ours)
    assert r.returncode == 0, r.stderr
    theirs = tmp_path / "theirs.onnx"
    so = ort.SessionOptions()
    so.graph_optimization_level = LEVELS[level]
    so.optimized_model_filepath = str(theirs)
    so.intra_op_num_threads = 1
    own = ort.InferenceSession(m.path.read_bytes(), so, providers=["CPUExecutionProvider"])
    if level == "extended":
        assert ours.read_bytes() == theirs.read_bytes()
    assert _ops(ours) == _ops(theirs)
    off = ort.SessionOptions()
    off.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    from_form = ort.InferenceSession(str(ours), off, providers=["CPUExecutionProvider"])
    feeds = real_models.feeds(m)
    for x, y in zip(from_form.run(None, feeds), own.run(None, feeds)):
        assert x.dtype == y.dtype and np.array_equal(x, y)


def _ops(path: Path) -> Counter:
    return Counter((n.domain, n.op_type) for n in onnx.load(str(path), load_external_data=False).graph.node)


def test_a_model_onnxruntime_refuses_is_its_words_once(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07" + b"not a model")
    r = _run(["optimize", "--library", _library(), "--level", "extended"], bad, tmp_path / "out")
    assert r.returncode == 3
    assert r.stderr.count("onnxruntime refuses the model") == 1, r.stderr


def test_a_worker_out_of_memory_says_so_not_a_refusal(tmp_path):
    """Under a memory bound too small for the encoder, onnxruntime's failed
    allocation (std::bad_alloc) is exit 4, the bound reached, never exit 3,
    which would blame the model. Run under a few bounds, as the worker's
    own allocations and onnxruntime's meet them at different points."""
    m = real_models.by_name("minilm-l3")
    real_models.fetch(m)
    codes = {}
    for mib in (80, 120, 160, 200, 240):
        with open(tmp_path / "out", "wb") as o, open(m.path, "rb") as i:
            fd = o.fileno()
            r = subprocess.run(["prlimit", f"--data={mib << 20}", _worker(), "optimize", "--library", _library(),
                                "--level", "all"], stdin=i, capture_output=True, text=True, timeout=300,
                               preexec_fn=lambda: os.dup2(fd, 3), pass_fds=(3,))
        codes[mib] = (r.returncode, r.stderr.strip()[-200:])
        assert r.returncode in (0, 4), codes
    assert any(c == 4 for c, _ in codes.values()), codes


assert {m.name for m in CORPUS} >= {"minilm-l3", "ddddocr-det", "silero-vad"}


# ---------------------------------------------------------------- the daemon


def _runtime(d: Daemon) -> dict:
    """The daemon's onnxruntime once its worker has answered."""
    def answered():
        rs = ctl.run_json("--socket", str(d.socket), "status")["runtimes"]
        return rs[0] if rs and not rs[0]["checking"] else None
    return wait_until(answered, 60, "the onnxruntime worker's answer in status")


def test_the_daemon_reports_the_onnxruntime_its_worker_loads(tmp_path):
    d = Daemon(tmp_path / "d", args=["--ort-library", _library()]).start()
    try:
        r = _runtime(d)
        assert r["problem"] == ""
        assert (r["name"], r["version"], r["build"]) == (
            "onnxruntime", ort.__version__, ort.capi._pybind_state.get_build_info())
        assert r["library"] == _library() and len(r["library_blake3"]) == 64
        shown = ctl.run("--socket", str(d.socket), "status")
        assert f"onnxruntime  {ort.__version__} from {_library()}" in shown.stdout, shown.stdout
        # The daemon itself never loads it: only its worker does.
        maps = Path(f"/proc/{d.pid}/maps").read_text()
        assert "libonnxruntime" not in maps
    finally:
        d.stop()


@pytest.mark.parametrize("library", ["/etc/hostname", "/lib/x86_64-linux-gnu/libc.so.6"])
def test_a_library_that_is_not_onnxruntime_is_reported_and_the_rest_served(library, tmp_path):
    d = Daemon(tmp_path / "d", args=["--ort-library", library]).start()
    try:
        r = _runtime(d)
        assert "not an onnxruntime library" in r["problem"] and library in r["problem"], r
        assert r["version"] == ""
        assert ctl.run("--socket", str(d.socket), "ls").returncode == 0
        assert "runtime forms of onnxruntime are off, everything else is served" in d.log_text()
    finally:
        d.stop()


def test_no_library_configured_shows_no_runtime(tmp_path):
    d = Daemon(tmp_path / "d").start()
    try:
        assert ctl.run_json("--socket", str(d.socket), "status")["runtimes"] == []
    finally:
        d.stop()


FAKE_WORKER = """#!{python}
import json, os, resource
fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
with open({seen!r}, "w") as f:
    json.dump({{"fds": fds, "data": resource.getrlimit(resource.RLIMIT_DATA)}}, f)
print(json.dumps({{"runtime": "onnxruntime", "version": "1.99.0", "build": "a stand-in"}}))
"""


def test_the_worker_holds_nothing_of_the_daemons_and_a_bounded_memory(tmp_path, monkeypatch):
    """A stand-in worker beside a copy of ctcached records what it was
    given: its standard streams and no other descriptor of the daemon's
    (store files, sockets), and a data segment of 4 GiB at most."""
    import resource
    seen = tmp_path / "seen.json"
    d = daemon_beside(tmp_path, monkeypatch, FAKE_WORKER.format(python="{python}", seen=str(seen)))
    try:
        r = _runtime(d)
        assert (r["version"], r["build"], r["problem"]) == ("1.99.0", "a stand-in", "")
    finally:
        d.stop()
    got = json.loads(seen.read_text())
    # 0-2, and the one listdir itself opened.
    assert got["fds"][:3] == [0, 1, 2] and len(got["fds"]) == 4 and got["fds"][3] == 3, got
    # The soft limit: a hard one the service manager set stays.
    assert got["data"][0] == 4 << 30 and got["data"][1] == resource.getrlimit(resource.RLIMIT_DATA)[1]
