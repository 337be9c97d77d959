"""OpenVINO's runtime forms (D15): the compiled model of the CPU plugin,
made once per key by the daemon's OpenVINO worker (``workers/openvino``)
and imported from the cache's mapping by ``ctcache.openvino.compile_model``.

Against OpenVINO's own Python module (the same wheel's library): the
worker's blob is what ``export_model`` writes; a compiled model from a
form gives the outputs of ``Core().compile_model`` of the source, bit for
bit, on the real-model corpus. Each part of the key ends in a miss that
names it; a refused model or config is OpenVINO's words once and no entry;
bad requests are INVALID_ARGUMENT; a rotted form is compiled again.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import openvino as ov
import pytest
from onnx import TensorProto, helper

import real_models
from e2e.harness import Daemon
from test_python_client import ctcache, installed  # noqa: F401  (session fixtures: pip-installed client)
from waiting import wait_until
from worker_daemons import openvino_library as _library
from worker_daemons import small_model, stored_forms


@pytest.fixture
def cov(ctcache):  # noqa: F811
    """ctcache.openvino of the pip-installed client."""
    return importlib.import_module("ctcache.openvino")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("ovforms"), args=["--openvino-library", _library()]).start()
    yield d
    d.stop()


def _forms(d: Daemon) -> list[dict]:
    return stored_forms(d, "openvino.compiled_model")


def _same_outputs(a, b, feeds) -> None:
    for x, y in zip(a(feeds).values(), b(feeds).values()):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


# ---- the worker alone ----

def _worker() -> str:
    exe = Path(os.environ["CTCACHE_BIN_DIR"]) / "ctcache-openvino-worker"
    assert exe.is_file(), f"{exe} is not built"
    return str(exe)


def _run(args: list[str], model: Path | None, out: Path | None, prefix=()) -> subprocess.CompletedProcess:
    """The worker (run by ``prefix``) with ``model`` on its standard input and ``out`` as descriptor 3 (None:
    no descriptor 3)."""
    with open(out or os.devnull, "wb") as o, open(model or os.devnull, "rb") as i:
        fd = o.fileno()
        return subprocess.run([*prefix, _worker(), *args], stdin=i, capture_output=True, text=True, timeout=300,
                              preexec_fn=(lambda: os.dup2(fd, 3)) if out else None, pass_fds=(3,) if out else ())


def test_the_worker_and_the_python_module_meet_on_version_and_build(tmp_path):
    r = _run(["identify", "--library", _library()], None, None)
    assert r.returncode == 0, r.stderr
    build = ov.get_version()
    assert json.loads(r.stdout) == {"runtime": "openvino", "version": build.split("-")[0], "build": build}


@pytest.mark.parametrize("not_ov", ["/lib/x86_64-linux-gnu/libc.so.6", "/etc/hostname", "/nonexistent.so"])
def test_a_library_that_is_not_openvino_is_named_as_such(not_ov):
    r = _run(["identify", "--library", not_ov], None, None)
    assert r.returncode == 2 and not_ov in r.stderr and "not an OpenVINO C library" in r.stderr, r.stderr


def test_the_workers_blob_is_openvinos_own_compiled_model(tmp_path):
    m = real_models.by_name("ddddocr-det")
    real_models.fetch(m)
    blob = tmp_path / "blob"
    r = _run(["compile", "--library", _library()], m.path, blob)
    assert r.returncode == 0, r.stderr
    core = ov.Core()
    imported = core.import_model(blob.read_bytes(), "CPU")
    _same_outputs(imported, core.compile_model(str(m.path), "CPU"), real_models.feeds(m))


def test_the_worker_refuses_garbage_and_a_missing_output(tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    r = _run(["compile", "--library", _library()], garbage, tmp_path / "out")
    assert r.returncode == 3 and r.stderr.startswith("OpenVINO refuses the model:"), r.stderr
    assert (tmp_path / "out").stat().st_size == 0
    r = _run(["compile", "--library", _library()], small_model(tmp_path / "m.onnx"), None)
    assert r.returncode == 1 and "descriptor 3 is not a file" in r.stderr, r.stderr


def test_out_of_its_memory_bound_the_worker_says_so_whether_openvino_throws_or_crashes(tmp_path):
    """OpenVINO short of RLIMIT_DATA throws std::bad_alloc, or faults (here
    near 300 MiB on MiniLM): exit 4 either way, never a crash."""
    m = real_models.by_name("minilm-l3")
    real_models.fetch(m)
    codes = {}
    for mib in (120, 200, 260, 280, 300, 320, 330, 400):
        r = _run(["compile", "--library", _library()], m.path, tmp_path / "out", prefix=["prlimit", f"--data={mib << 20}"])
        codes[mib] = (r.returncode, r.stderr.strip()[-160:])
        assert r.returncode in (0, 4), codes
        assert r.returncode == 0 or "out of memory" in r.stderr or "bad_alloc" in r.stderr, codes
    assert any(c == 4 for c, _ in codes.values()), codes


def test_a_crash_far_from_the_bound_stays_a_crash(tmp_path):
    with open(tmp_path / "out", "wb") as o:
        fd = o.fileno()
        p = subprocess.Popen(["prlimit", f"--data={4 << 30}", _worker(), "compile", "--library", _library()],
                             stdin=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=lambda: os.dup2(fd, 3),
                             pass_fds=(3,))
    def catches_sigsegv():
        status = Path(f"/proc/{p.pid}/status").read_text()
        caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
        return caught >> (signal.SIGSEGV - 1) & 1

    try:
        wait_until(catches_sigsegv, 60, "the worker's crash handler")
        os.kill(p.pid, signal.SIGSEGV)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == -signal.SIGSEGV and b"out of memory" not in err, (p.returncode, err)


# ---- through the daemon ----

@pytest.mark.parametrize("name", ["ddddocr-det", "minilm-l3", "ddddocr-ocr-int8", "magika"])
def test_a_compiled_model_from_a_form_is_openvinos_own(daemon, name, cov):
    m = real_models.by_name(name)
    real_models.fetch(m)
    first = cov.compile_model(m.path, socket=str(daemon.socket))
    assert first.ctcache_report.source == "daemon", first.ctcache_report
    again = cov.compile_model(m.path, socket=str(daemon.socket))
    assert again.ctcache_report == cov.FormReport("daemon", compiled=False), again.ctcache_report
    assert isinstance(again, ov.CompiledModel)
    _same_outputs(again, ov.Core().compile_model(str(m.path), "CPU"), real_models.feeds(m))
    # Imported from the cache's payload file, mapped (not read into memory).
    form = [e for e in _forms(daemon) if str(m.path) in e["model_paths"]]
    assert form, _forms(daemon)
    assert any(e["payload_path"] in Path("/proc/self/maps").read_text() for e in form)


def test_a_fresh_process_imports_a_form_without_grpc_or_protobuf(daemon, installed, tmp_path):  # noqa: F811
    """Asked on the descriptor channel: importing a gRPC client and
    protobuf would cost a fresh process more than the ask does."""
    model = small_model(tmp_path / "fresh.onnx", weight=0.625)
    script = ("import sys, ctcache.openvino as cov\n"
              "c = cov.compile_model(sys.argv[1], socket=sys.argv[2])\n"
              "print(c.ctcache_report.source, any(m in sys.modules for m in ('grpc', 'google.protobuf')))\n")
    r = subprocess.run([sys.executable, "-c", script, str(model), str(daemon.socket)], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(installed)))
    assert r.stdout.split() == ["daemon", "False"], (r.stdout, r.stderr)


def test_each_part_of_the_key_is_a_miss_that_names_it(daemon, tmp_path, cov):
    a = small_model(tmp_path / "a.onnx", weight=0.5)
    b = small_model(tmp_path / "b.onnx", weight=0.25)  # one graph, other weights: another form
    before = len(_forms(daemon))
    for m in (a, b):
        assert cov.compile_model(m, socket=str(daemon.socket)).ctcache_report.source == "daemon"
    assert len(_forms(daemon)) == before + 2
    moved = tmp_path / "elsewhere.onnx"
    a.rename(moved)
    assert cov.compile_model(moved, socket=str(daemon.socket)).ctcache_report.compiled is False
    r = daemon.json("compile", str(moved), "--runtime", "openvino", "--config", "INFERENCE_PRECISION_HINT=f32",
                    "--lookup")
    assert r["miss"]["reason"] == "form_key_differs" and "INFERENCE_PRECISION_HINT" in r["miss"]["detail"], r
    # A changed Constant-node tensor at the same path is another content.
    small_model(b, weight=0.25, constant=2.0)
    r = daemon.json("compile", str(b), "--runtime", "openvino", "--lookup")
    assert r["miss"]["reason"] == "form_key_differs" and "another model content" in r["miss"]["detail"], r


def test_a_config_is_part_of_the_key_and_gives_openvinos_own_outputs(daemon, tmp_path, cov):
    m = small_model(tmp_path / "m.onnx", weight=0.375)
    config = {"INFERENCE_PRECISION_HINT": "f32"}
    got = cov.compile_model(m, config=config, socket=str(daemon.socket))
    assert got.ctcache_report.source == "daemon", got.ctcache_report
    x = {"X": np.arange(4, dtype=np.float32).reshape(1, 4)}
    _same_outputs(got, ov.Core().compile_model(str(m), "CPU", config), x)
    r = daemon.json("compile", str(m), "--runtime", "openvino", "--lookup")
    assert r["miss"]["reason"] == "form_key_differs" and "INFERENCE_PRECISION_HINT" in r["miss"]["detail"], r


def test_a_model_with_external_data_is_compiled_whole(daemon, tmp_path, cov):
    """OpenVINO's reader would look for external data by path; the worker
    opens no file: the daemon puts the data inline from the files handed
    over, and the compiled model is OpenVINO's own of the model on disk."""
    ext = tmp_path / "ext.onnx"
    onnx.save(onnx.load(str(small_model(tmp_path / "src.onnx", weight=0.8125))), str(ext),
              save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    got = cov.compile_model(ext, socket=str(daemon.socket))
    assert got.ctcache_report.source == "daemon", got.ctcache_report
    _same_outputs(got, ov.Core().compile_model(str(ext), "CPU"), {"X": np.full((1, 4), 3, np.float32)})


def test_a_config_of_property_objects_is_keyed_as_openvino_reads_it(daemon, tmp_path, cov):
    """OpenVINO takes a property as its function and an enum or bool value;
    the key is the strings OpenVINO reads them as, so both spellings are
    one form."""
    import openvino.properties as props
    import openvino.properties.hint as hints

    m = small_model(tmp_path / "m.onnx", weight=0.6875)
    objects = {hints.performance_mode: hints.PerformanceMode.LATENCY, hints.enable_cpu_pinning: False}
    first = cov.compile_model(m, config=objects, socket=str(daemon.socket))
    assert first.ctcache_report == cov.FormReport("daemon", compiled=True), first.ctcache_report
    strings = {"PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": "NO"}
    again = cov.compile_model(m, config=strings, socket=str(daemon.socket))
    assert again.ctcache_report == cov.FormReport("daemon", compiled=False), again.ctcache_report
    assert "LATENCY" in str(again.get_property(props.hint.performance_mode))


def test_another_openvino_in_the_client_compiles_its_own(daemon, tmp_path, monkeypatch, cov):
    m = small_model(tmp_path / "m.onnx", weight=0.625)
    monkeypatch.setattr(cov, "runtime_identity", lambda: ("2025.1.0", "2025.1.0-1-other"))
    with pytest.warns(cov.FallbackWarning, match="another runtime version"):
        got = cov.compile_model(m, socket=str(daemon.socket))
    assert got.ctcache_report.source == "runtime" and "2025.1.0" in got.ctcache_report.why, got.ctcache_report
    build = ov.get_version()
    monkeypatch.setattr(cov, "runtime_identity", lambda: (build.split("-")[0], build + "-rebuilt"))
    with pytest.warns(cov.FallbackWarning, match="another build"):
        cov.compile_model(m, socket=str(daemon.socket))


def test_no_openvino_configured_is_a_miss_that_says_so(tmp_path, cov):
    d = Daemon(tmp_path / "d").start()
    try:
        m = small_model(tmp_path / "m.onnx")
        r = d.ctl("compile", str(m), "--runtime", "openvino")
        assert r.returncode == 1 and "openvino is not configured in the daemon (openvino_library)" in r.stderr, \
            r.describe()
        with pytest.warns(cov.FallbackWarning, match="openvino is not configured"):
            got = cov.compile_model(m, socket=str(d.socket))
        assert got.ctcache_report.source == "runtime"
    finally:
        d.stop()


def test_a_library_that_is_not_openvino_is_reported_and_the_rest_served(tmp_path):
    d = Daemon(tmp_path / "d", args=["--openvino-library", "/lib/x86_64-linux-gnu/libc.so.6"]).start()
    try:
        m = small_model(tmp_path / "m.onnx")
        r = d.ctl("compile", str(m), "--runtime", "openvino")
        assert r.returncode == 1 and "not an OpenVINO C library" in r.stderr, r.describe()
        assert "not an OpenVINO C library" in d.ctl("status").stdout
        assert d.ctl("resolve", str(m)).returncode == 0
    finally:
        d.stop()


def test_a_model_or_config_openvino_refuses_is_its_words_once_and_no_entry(daemon, tmp_path):
    g = helper.make_graph([helper.make_node("NoSuchOp", ["X"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])])
    bad = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(bad))
    before = len(_forms(daemon))
    r = daemon.ctl("compile", str(bad), "--runtime", "openvino")
    assert r.returncode == 1 and r.stderr.count("refuses") == 1 and "NoSuchOp" in r.stderr, r.describe()
    r = daemon.ctl("compile", str(small_model(tmp_path / "m.onnx")), "--runtime", "openvino", "--config", "BOGUS=1")
    assert r.returncode == 1 and "BOGUS" in r.stderr, r.describe()
    assert len(_forms(daemon)) == before


def test_a_real_model_openvino_cannot_read_is_its_refusal_as_its_own_compile(daemon, cov, ctcache):  # noqa: F811
    """silero-vad's subgraphs have inputs of unknown rank, which OpenVINO's
    ONNX reader refuses: the daemon says so in its words, once, as
    INVALID_ARGUMENT, and stores nothing; OpenVINO's own compile refuses it too."""
    m = real_models.by_name("silero-vad")
    real_models.fetch(m)
    before = len(_forms(daemon))
    with pytest.raises(ctcache.InvalidArgument, match="Model wasn't fully converted"):
        cov.compile_model(m.path, socket=str(daemon.socket))
    with pytest.raises(RuntimeError, match="Model wasn't fully converted"):
        ov.Core().compile_model(str(m.path), "CPU")
    assert len(_forms(daemon)) == before


@pytest.mark.parametrize("fields, says", [
    (dict(runtime="tensorrt"), "onnxruntime and openvino"),
    (dict(runtime="openvino", level="all"), "no level"),
    (dict(runtime="openvino", device="GPU"), "CPU only"),
    (dict(runtime="openvino", config={"A=B": "1"}), "not a property name"),
    (dict(runtime="openvino", config={"A": "x" * 300}), "not a property value"),
    (dict(runtime="openvino", config={f"K{i}": "1" for i in range(65)}), "at most 64"),
    (dict(runtime="onnxruntime", level="fastest"), "not one of"),
    (dict(runtime="onnxruntime", level="all", device="CUDAExecutionProvider"), "CPUExecutionProvider only"),
    (dict(runtime="onnxruntime", level="all", config={"A": "1"}), "OpenVINO's"),
])
def test_a_bad_compile_request_is_invalid_argument(daemon, tmp_path, ctcache, fields, says):  # noqa: F811
    """Over gRPC and on the descriptor channel alike."""
    from ctcache import handout
    from ctcache._pb import ctcache_v1_pb2 as pb

    m = str(small_model(tmp_path / "m.onnx"))
    with ctcache.connect(str(daemon.socket)) as c:
        with pytest.raises(ctcache.InvalidArgument, match=says):
            c.compile(m, **fields)
    req = pb.CompileRequest(model_path=m, runtime=fields["runtime"], level=fields.get("level", ""),
                            provider=fields.get("device", ""), config=fields.get("config", {}))
    h = handout.hand_over(str(daemon.socket), m)
    try:
        with pytest.raises(handout.HandoutRefused) as e:
            handout.compile_form(h, req)
        assert e.value.code_name == "INVALID_ARGUMENT" and says in e.value.message, e.value.message
    finally:
        h.close()


def test_a_rotted_form_is_never_served(daemon, tmp_path, cov, ctcache):  # noqa: F811
    m = small_model(tmp_path / "m.onnx", weight=0.875)
    with ctcache.connect(str(daemon.socket)) as c:
        made = c.compile(m, runtime="openvino")
        blob = Path(made.form.entry.payload_path)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error", cov.FallbackWarning)
        got = cov.compile_model(m, socket=str(daemon.socket))
    assert got.ctcache_report == cov.FormReport("daemon", compiled=True), got.ctcache_report
    x = {"X": np.ones((1, 4), np.float32)}
    _same_outputs(got, ov.Core().compile_model(str(m), "CPU"), x)
    assert "rotted" in daemon.log_text()


def test_a_policy_rule_compiles_watched_models_before_first_use(tmp_path, cov):
    root, watched = tmp_path / "d", tmp_path / "models"
    root.mkdir()
    (root / "ctcached.toml").write_text('[[policy]]\nformat = "openvino.compiled_model"\n'
                                        'params = { PERFORMANCE_HINT = "LATENCY" }\n')
    d = Daemon(root, watch=watched, args=["--openvino-library", _library()]).start()
    try:
        model = small_model(watched / "m.onnx", weight=0.03125)
        wait_until(lambda: "openvino form (PERFORMANCE_HINT=LATENCY) compiled" in d.log_text(), 60,
                   "the watcher compiling the model's form", detail=d.log_text)
        got = cov.compile_model(model, config={"PERFORMANCE_HINT": "LATENCY"}, socket=str(d.socket))
        assert got.ctcache_report == cov.FormReport("daemon", compiled=False), got.ctcache_report
    finally:
        d.stop()


@pytest.mark.parametrize("params, says", [('{ device = "GPU" }', "CPU only"), ('{ "A=B" = "1" }', "property name")])
def test_a_bad_openvino_rule_is_refused(tmp_path, params, says):
    config = tmp_path / "c.toml"
    config.write_text(f'[[policy]]\nformat = "openvino.compiled_model"\nparams = {params}\n')
    r = subprocess.run([str(Path(os.environ["CTCACHE_BIN_DIR"]) / "ctcached"), "--config", str(config),
                        "--print-config"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and says in r.stderr and "policy[0]" in r.stderr, r.stderr
