"""Runtime compiled forms (D15): onnxruntime's optimized model, made once
per key by the daemon's worker and served to every session after.

Against onnxruntime's own Python module on the real-model corpus: a session
from a form (optimizer off) gives the outputs of the session onnxruntime
makes from the source at that level, bit for bit. Each part of the key ends
in a miss that names it; the failures of the runtimes' own caches are
tests here: one graph with other weights, another runtime build, a worker
killed mid-compile, many processes at once, a full disk, gc, a rotted form.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import real_models
from e2e.harness import Daemon
from test_python_client import ctcache, installed  # noqa: F401  (session fixtures: pip-installed client)
from waiting import wait_until
from worker_daemons import LEVELS, daemon_beside, small_model, stored_forms
from worker_daemons import ort_library as _library



@pytest.fixture
def cort(ctcache):  # noqa: F811
    """ctcache.ort of the pip-installed client."""
    import importlib
    return importlib.import_module("ctcache.ort")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("forms"), args=["--ort-library", _library()]).start()
    yield d
    d.stop()


def _client(d: Daemon):
    import ctcache as client
    return client.connect(str(d.socket))


def _own_session(path: Path, level: str):
    so = ort.SessionOptions()
    so.graph_optimization_level = LEVELS[level]
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _forms(d: Daemon) -> list[dict]:
    return stored_forms(d, "onnxruntime.optimized_model")


@pytest.mark.parametrize("level", sorted(LEVELS))
@pytest.mark.parametrize("name", ["minilm-l3", "ddddocr-det", "silero-vad", "magika"])
def test_a_session_from_a_form_is_onnxruntimes_own_session(daemon, name, level, cort):
    m = real_models.by_name(name)
    real_models.fetch(m)
    first = cort.inference_session(m.path, target=None, optimize=level, socket=str(daemon.socket))
    assert first.ctcache_report.source == "daemon", first.ctcache_report
    assert first.get_session_options().graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    again = cort.inference_session(m.path, target=None, optimize=level, socket=str(daemon.socket))
    assert (again.ctcache_report.source, again.ctcache_report.packed) == ("daemon", 0), again.ctcache_report
    own = _own_session(m.path, level)
    feeds = real_models.feeds(m)
    for x, y in zip(again.run(None, feeds), own.run(None, feeds)):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def test_a_forms_weights_are_entries_mapped_in_place_and_shared(daemon, cort, ctcache):  # noqa: F811
    """The encoder's large initializers are entries of their own: the
    session maps their payload files (nothing copied into the model), and
    the forms at two levels share the weights neither level changes."""
    m = real_models.by_name("minilm-l3")
    real_models.fetch(m)
    sess = cort.inference_session(m.path, target=None, optimize="extended", socket=str(daemon.socket))
    assert sess.ctcache_report.source == "daemon"
    with _client(daemon) as c:
        ext = c.compile(m.path, level="extended")
        basic = c.compile(m.path, level="basic")
    assert len(ext.model) < 1 << 20 and len(ext.tensors) > 0, (len(ext.model), len(ext.tensors))
    assert sum(t.length for t in ext.tensors) > 40 << 20  # the 45 MiB table among them
    shared = {t.key for t in ext.tensors} & {t.key for t in basic.tensors}
    assert shared, "no weight shared between the extended and basic forms"
    maps = Path("/proc/self/maps").read_text()
    files = {lease.entry.payload_path for lease in ext.leases[1:]}
    assert any(f in maps for f in files), "the session maps none of the form's payload files"


@pytest.mark.parametrize("target", ["onnxruntime-int4", "onnxruntime-int8", "onnxruntime-fp16"])
def test_the_form_of_a_targets_model_is_onnxruntimes_own_session_of_it(daemon, target, tmp_path, cort,
                                                                        ctcache):  # noqa: F811
    """optimize= composes with the materialize targets: the form of the
    target's model gives what onnxruntime's own session of that model (as
    ctcache materializes it to a file) gives at that level."""
    m = real_models.by_name("minilm-l3")
    real_models.fetch(m)
    sess = cort.inference_session(m.path, target=target, optimize="extended", socket=str(daemon.socket))
    report = sess.ctcache_report
    assert (report.source, report.target) == ("daemon", f"{target}+form:extended"), report
    written = tmp_path / "t.onnx"
    with _client(daemon) as c:
        c.materialize(m.path, written, target=target)
    own = _own_session(written, "extended")
    feeds = real_models.feeds(m)
    for x, y in zip(sess.run(None, feeds), own.run(None, feeds)):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


def test_a_targets_form_follows_its_sources_weights(daemon, tmp_path, cort):
    """The daemon remembers the digest of a target's model by what its
    answer is made of: a warm request hashes nothing, and a source whose
    weight changed (same path, same graph) gets the form of its own."""
    model = small_model(tmp_path / "t.onnx", weight=0.5)
    ask = dict(target="onnxruntime-fp16", optimize="extended", socket=str(daemon.socket))
    feeds = {"X": np.arange(4, dtype=np.float32).reshape(1, 4)}
    first = cort.inference_session(model, **ask)
    again = cort.inference_session(model, **ask)
    assert (first.ctcache_report.packed, again.ctcache_report.cached) == (1, 1)
    small_model(model, weight=0.25)
    changed = cort.inference_session(model, **ask)
    assert changed.ctcache_report.packed == 1, changed.ctcache_report
    y0, y1 = first.run(None, feeds)[0], changed.run(None, feeds)[0]
    assert y0.tobytes() == again.run(None, feeds)[0].tobytes() and y0.tobytes() != y1.tobytes()
    assert np.allclose(y1, feeds["X"] @ np.full((4, 4), 0.25, np.float32) + 1.0, atol=1e-2)


def test_a_target_with_nothing_to_rewrite_gives_the_form_of_the_model_as_it_is(daemon, cort):
    m = real_models.by_name("ddddocr-det")
    real_models.fetch(m)
    with pytest.warns(cort.AsIsWarning):
        sess = cort.inference_session(m.path, target="onnxruntime-int4", optimize="all", socket=str(daemon.socket))
    assert sess.ctcache_report.source == "daemon", sess.ctcache_report


def test_a_session_from_a_form_needs_no_grpc_or_protobuf(daemon, installed, tmp_path):  # noqa: F811
    """Asked on the descriptor channel, a form costs a fresh process no gRPC
    client and no protobuf (whose imports take longer than the session)."""
    model = small_model(tmp_path / "g.onnx", weight=0.375)
    script = ("import sys, ctcache.ort\n"
              "s = ctcache.ort.inference_session(sys.argv[1], target=None, optimize='extended', socket=sys.argv[2])\n"
              "print(s.ctcache_report.source, s.ctcache_report.packed,\n"
              "      any(m in sys.modules for m in ('grpc', 'google.protobuf')))\n")
    env = dict(os.environ, PYTHONPATH=str(installed))
    said = [subprocess.run([sys.executable, "-c", script, str(model), str(daemon.socket)], capture_output=True,
                           text=True, timeout=120, env=env) for _ in range(2)]
    assert [r.stdout.split() for r in said] == [["daemon", "1", "False"], ["daemon", "0", "False"]], said


def test_each_part_of_the_key_is_a_miss_that_names_it(daemon, tmp_path, ctcache):  # noqa: F811
    model = small_model(tmp_path / "m.onnx")
    with _client(daemon) as c:
        mine = dict(runtime_version=ort.__version__, runtime_build=ort.get_build_info())
        made = c.compile(model, level="extended", **mine)
        assert made.compiled and made.HasField("form"), made
        key = made.form.entry.key
        # Moved and renamed: the same content, the same form.
        moved = tmp_path / "elsewhere" / "renamed.onnx"
        moved.parent.mkdir()
        shutil.copy(model, moved)
        same = c.compile(moved, level="extended", **mine)
        assert (same.compiled, same.form.entry.key) == (False, key)
        # One graph, other weights: another form (TensorRT's engine cache
        # serves one engine to both).
        other = c.compile(small_model(tmp_path / "w.onnx", weight=0.25), level="extended", **mine)
        assert other.compiled and other.form.entry.key != key
        # Another runtime build or version: a miss naming both sides.
        build = c.compile(model, level="extended", runtime_version=ort.__version__, runtime_build="another build")
        assert not build.HasField("form") and build.miss.reason == "form_key_differs"
        assert "another build of the runtime" in build.miss.detail and "another build" in build.miss.detail
        assert ort.get_build_info() in build.miss.detail
        version = c.compile(model, level="extended", runtime_version="1.0.0", runtime_build=ort.get_build_info())
        assert "another runtime version" in version.miss.detail and "1.0.0" in version.miss.detail
        # Another level: looked up, the option named.
        level = c.compile(model, level="all", lookup_only=True, **mine)
        assert level.miss.reason == "form_key_differs", level
        assert "option level set otherwise (the form's: extended; asked: all)" in level.miss.detail
        # A changed Constant node at the same path: another model content.
        small_model(model, constant=2.0)
        changed = c.compile(model, level="extended", lookup_only=True, **mine)
        assert (changed.miss.reason, "another model content" in changed.miss.detail) == ("form_key_differs", True)
        remade = c.compile(model, level="extended", **mine)
        assert remade.compiled and remade.form.entry.key not in (key, other.form.entry.key)


def test_why_miss_explains_a_missing_form_and_says_the_command_that_makes_it(daemon, tmp_path):
    model = small_model(tmp_path / "m.onnx", weight=0.1875)
    assert daemon.ctl("compile", str(model), "--level", "extended").returncode == 0
    r = daemon.ctl("why-miss", str(model), "--form", "onnxruntime", "--level", "all")
    assert r.returncode == 0, r.describe()
    assert "option level set otherwise (the form's: extended; asked: all)" in r.stdout, r.stdout
    hint = [line for line in r.stdout.splitlines() if line.startswith("hint: ")]
    assert hint and f"compile {model} --runtime onnxruntime --level all" in hint[0], r.stdout
    # The hint, run as printed, makes the form: why-miss then finds it.
    made = subprocess.run(hint[0].removeprefix("hint: "), shell=True, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PATH=f"{os.environ['CTCACHE_BIN_DIR']}:{os.environ['PATH']}"))
    assert made.returncode == 0, made.stderr
    j = daemon.json("why-miss", str(model), "--form", "onnxruntime", "--level", "all")
    assert j["form"] is not None and j["miss"] is None and j["hint"] is None, j
    # No runtime of that kind: said, and no command would cure it.
    j = daemon.json("why-miss", str(model), "--form", "openvino")
    assert j["miss"]["reason"] == "runtime_unavailable" and j["hint"] is None, j


def test_resolve_shows_the_forms_of_a_models_content(daemon, tmp_path):
    model = small_model(tmp_path / "r.onnx", weight=0.0078125)
    for level in ("extended", "all"):
        assert daemon.json("compile", "--level", level, str(model))["form"] is not None
    shown = daemon.ctl("resolve", str(model))
    lines = [line for line in shown.stdout.splitlines() if line.startswith("runtime form: ")]
    assert len(lines) == 2 and any("level=extended" in x for x in lines) and any("level=all" in x for x in lines)
    assert all(f"onnxruntime {ort.__version__}" in x and "CPUExecutionProvider" in x for x in lines), lines
    assert len(daemon.json("resolve", str(model))["forms"]) == 2
    # Another content at the path: its resolve shows none.
    small_model(model, weight=0.015625)
    assert daemon.json("resolve", str(model))["forms"] == []


def test_no_runtime_configured_is_a_miss_that_says_so(tmp_path, cort):
    d = Daemon(tmp_path / "d").start()
    try:
        model = small_model(tmp_path / "m.onnx")
        r = d.ctl("compile", str(model))
        assert r.returncode == 1 and "onnxruntime is not configured in the daemon" in r.stdout + r.stderr, r.describe()
        sess = cort.inference_session(model, target=None, optimize="extended", socket=str(d.socket))
        report = sess.ctcache_report
        assert report.source == "runtime" and "onnxruntime is not configured in the daemon" in report.why, report
        assert sess.get_session_options().graph_optimization_level == LEVELS["extended"]
    finally:
        d.stop()


def test_another_onnxruntime_in_the_client_runs_its_own_session(daemon, tmp_path, monkeypatch, cort):
    model = small_model(tmp_path / "m.onnx", weight=0.75)
    monkeypatch.setattr(ort, "__version__", "1.0.0")
    sess = cort.inference_session(model, target=None, optimize="extended", socket=str(daemon.socket))
    report = sess.ctcache_report
    assert report.source == "runtime" and "another runtime version" in report.why, report
    # sess_options carry what the key cannot see: not served from a form.
    monkeypatch.undo()
    sess = cort.inference_session(model, target=None, optimize="extended", socket=str(daemon.socket),
                                         sess_options=ort.SessionOptions())
    assert sess.ctcache_report.source == "runtime" and "sess_options" in sess.ctcache_report.why


def test_a_model_with_external_data_is_compiled_whole(daemon, tmp_path, cort, ctcache):  # noqa: F811
    """The worker opens no file: the daemon puts the model's external data
    inline (read from the files the client handed over) and the key is
    the same as the inline model's (D15 counts external data by content);
    the session gives onnxruntime's own outputs."""
    inline = small_model(tmp_path / "src.onnx", weight=0.4375)
    ext = tmp_path / "ext.onnx"
    onnx.save(onnx.load(str(inline)), str(ext), save_as_external_data=True, location="ext.onnx.data",
              size_threshold=0)
    sess = cort.inference_session(ext, target=None, optimize="extended", socket=str(daemon.socket))
    assert sess.ctcache_report.source == "daemon", sess.ctcache_report
    x = np.ones((1, 4), np.float32)
    assert sess.run(None, {"X": x})[0].tobytes() == _own_session(ext, "extended").run(None, {"X": x})[0].tobytes()
    with _client(daemon) as c:
        a, b = c.compile(ext, level="extended"), c.compile(inline, level="extended")
    assert a.form.entry.key == b.form.entry.key and not b.compiled, (a.form.entry.key, b.form.entry.key)


def test_a_model_too_large_to_give_whole_has_no_form_and_says_why(tmp_path, cort):
    root = tmp_path / "d"
    root.mkdir()
    (root / "ctcached.toml").write_text("memory_budget = 100\n")
    d = Daemon(root, args=["--ort-library", _library()]).start()
    try:
        model = onnx.load(str(small_model(tmp_path / "src.onnx")))
        ext = tmp_path / "ext.onnx"
        onnx.save(model, str(ext), save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
        r = d.json("compile", str(ext), "--lookup")
        assert r["miss"]["reason"] == "not_a_source" and "memory_budget" in r["miss"]["detail"], r
        sess = cort.inference_session(ext, target=None, optimize="extended", socket=str(d.socket))
        assert sess.ctcache_report.source == "runtime" and "memory_budget" in sess.ctcache_report.why
    finally:
        d.stop()


def test_a_model_onnxruntime_refuses_is_its_words_once_and_no_entry(daemon, tmp_path):
    g = helper.make_graph([helper.make_node("NoSuchOp", ["X"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])])
    bad = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(bad))
    before = len(_forms(daemon))
    r = daemon.ctl("compile", str(bad))
    assert r.returncode == 1, r.describe()
    assert r.stderr.count("refuses") == 1 and "NoSuchOp" in r.stderr, r.describe()
    assert len(_forms(daemon)) == before


def test_many_processes_at_once_make_one_compile(tmp_path):
    d = Daemon(tmp_path / "d", args=["--ort-library", _library()]).start()
    try:
        m = real_models.by_name("minilm-l3")
        real_models.fetch(m)
        procs = [subprocess.Popen([os.environ["CTCACHECTL"], "--socket", str(d.socket), "--json", "compile",
                                   "--level", "all", str(m.path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(4)]
        answers = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
            answers.append(json.loads(out))
        assert len({a["form"]["key"] for a in answers}) == 1
        assert d.log_text().count(" compiled model=") == 1, d.log_text()
        # gc evicts forms as any entry.
        assert len(_forms(d)) == 1
        assert d.ctl("gc", "--all", "--yes").returncode == 0
        assert _forms(d) == []
        gone = d.json("compile", "--lookup", "--level", "all", str(m.path))
        assert gone["miss"]["reason"] == "no_entry", gone
    finally:
        d.stop()


def test_a_rotted_form_is_never_served(daemon, tmp_path, cort):
    model = small_model(tmp_path / "m.onnx", weight=0.125)
    with _client(daemon) as c:
        made = c.compile(model, level="extended")
        blob = Path(made.form.entry.payload_path)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    sess = cort.inference_session(model, target=None, optimize="extended", socket=str(daemon.socket))
    assert sess.ctcache_report.source == "daemon" and sess.ctcache_report.packed == 1, sess.ctcache_report
    x = np.ones((1, 4), np.float32)
    assert sess.run(None, {"X": x})[0].tobytes() == _own_session(model, "extended").run(None, {"X": x})[0].tobytes()
    assert "rotted" in daemon.log_text()


def test_a_rotted_weight_of_a_form_is_never_served(daemon, tmp_path, cort, ctcache):  # noqa: F811
    m = real_models.by_name("ddddocr-det")
    real_models.fetch(m)
    with _client(daemon) as c:
        made = c.compile(m.path, level="all")
    assert made.tensors, "the conv net's form moved no weight out"
    blob = Path(next(lease.entry.payload_path for lease in made.leases if lease.entry.key == made.tensors[0].key))
    data = bytearray(blob.read_bytes())
    data[0] ^= 0xFF
    blob.write_bytes(bytes(data))
    sess = cort.inference_session(m.path, target=None, optimize="all", socket=str(daemon.socket))
    assert sess.ctcache_report.source == "daemon" and sess.ctcache_report.packed == 1, sess.ctcache_report
    feeds = real_models.feeds(m)
    own = _own_session(m.path, "all")
    for x, y in zip(sess.run(None, feeds), own.run(None, feeds)):
        assert x.tobytes() == y.tobytes()


STAND_IN = """#!{python}
import json, os, sys, time
if sys.argv[1] == "identify":
    print(json.dumps({"runtime": "onnxruntime", "version": "1.99.0", "build": "a stand-in"}))
    sys.exit(0)
with open({pid} + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename({pid} + ".tmp", {pid})
time.sleep(120)
"""


@pytest.fixture
def slow_worker(tmp_path, monkeypatch):
    """ctcached beside a stand-in worker that records its pid and never ends a compile."""
    pid = tmp_path / "worker.pid"
    d = daemon_beside(tmp_path, monkeypatch, STAND_IN.replace("{pid}", repr(str(pid))))
    yield d, pid
    d.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for this purpose.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_worker_killed_mid_compile_publishes_nothing(slow_worker, tmp_path):
    d, pid_file = slow_worker
    model = small_model(tmp_path / "m.onnx")
    p = subprocess.Popen([os.environ["CTCACHECTL"], "--socket", str(d.socket), "compile", str(model)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(pid_file.exists, 60, "the stand-in worker started")
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1 and "made no form" in err and "signal: 9" in err, (out, err)
    assert d.ctl("status").returncode == 0
    assert _forms(d) == []
    assert list((d.cache / "tmp").iterdir()) == []


ASK_ON_THE_CHANNEL = ("import sys\n"
                      "from ctcache import handout\n"
                      "from ctcache._pb import ctcache_v1_pb2 as pb\n"
                      "h = handout.hand_over(sys.argv[1], sys.argv[2])\n"
                      "handout.compile_form(h, pb.CompileRequest(model_path=sys.argv[2], runtime='onnxruntime',"
                      " level='extended'))\n")


@pytest.mark.parametrize("way", ["grpc", "descriptor channel"])
def test_a_compile_stops_when_its_caller_goes(way, slow_worker, tmp_path, installed):  # noqa: F811
    d, pid_file = slow_worker
    model = small_model(tmp_path / "m.onnx")
    if way == "grpc":
        args = [os.environ["CTCACHECTL"], "--socket", str(d.socket), "compile", str(model)]
    else:
        args = [sys.executable, "-c", ASK_ON_THE_CHANNEL, str(d.socket), str(model)]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=dict(os.environ, PYTHONPATH=str(installed)))
    wait_until(pid_file.exists, 60, "the stand-in worker started")
    worker = int(pid_file.read_text())
    p.kill()
    p.wait()
    wait_until(lambda: not _alive(worker), 30, "the worker killed once nobody waits for its compile")
    assert d.ctl("status").returncode == 0 and _forms(d) == []


def test_a_compile_past_the_time_per_request_is_deadline_exceeded_either_way(tmp_path, monkeypatch, installed,  # noqa: F811
                                                                             ctcache):  # noqa: F811
    pid = tmp_path / "worker.pid"
    d = daemon_beside(tmp_path, monkeypatch, STAND_IN.replace("{pid}", repr(str(pid))),
                      config="request_timeout_secs = 2\n")
    try:
        model = small_model(tmp_path / "m.onnx")
        with _client(d) as c, pytest.raises(ctcache.DeadlineExceeded, match=r"request_timeout_secs \(2 s\)"):
            c.compile(model)
        refusal = ("\nexcept handout.HandoutRefused as e:\n"
                   "    print(e.code_name, e.kind, e.message)\n")
        script = ASK_ON_THE_CHANNEL.replace("handout.compile_form(", "try:\n    handout.compile_form(") + refusal
        r = subprocess.run([sys.executable, "-c", script, str(d.socket), str(model)],
                           capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(installed)))
        words = "DEADLINE_EXCEEDED deadline-exceeded no answer within request_timeout_secs (2 s)"
        assert r.stdout.strip() == words, (r.stdout, r.stderr)
        assert d.ctl("status").returncode == 0 and _forms(d) == []
    finally:
        d.stop()


def test_a_model_rewritten_while_its_compile_waits_is_never_compiled(slow_worker, tmp_path):
    """The model is digested when asked for and compiled when the slot is
    free: its owner may rewrite it in between. The worker gets a private
    copy hashed again, so a form of other bytes is never filed under the
    key of what the model was."""
    d, pid_file = slow_worker
    first, second = small_model(tmp_path / "a.onnx"), small_model(tmp_path / "b.onnx", weight=0.25)
    ask = [os.environ["CTCACHECTL"], "--socket", str(d.socket), "compile"]
    holder = subprocess.Popen([*ask, str(first)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(pid_file.exists, 60, "the stand-in worker holding the slot")
    waiting = subprocess.Popen([*ask, str(second)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: d.log_text().count("compile queued") == 2, 60, "the second compile waiting for the slot")
    # Rewritten in place (the daemon maps the descriptor it was handed):
    # one weight byte changed, still a model.
    data = bytearray(second.read_bytes())
    i = data.rindex(np.float32(0.25).tobytes())
    data[i] ^= 1
    with open(second, "r+b") as f:
        f.write(data)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    _, err = waiting.communicate(timeout=60)
    holder.wait(timeout=60)
    # ABORTED, which ctcachectl says is worth asking again (exit 7).
    assert waiting.returncode == 7 and "the model changed while it was read" in err, err
    assert _forms(d) == []


OUT_OF_MEMORY = """#!{python}
import json, sys
if sys.argv[1] == "identify":
    print(json.dumps({"runtime": "onnxruntime", "version": "1.99.0", "build": "a stand-in"}))
    sys.exit(0)
sys.stdin.buffer.read()
print("onnxruntime refuses the model: Exception during loading: std::bad_alloc", file=sys.stderr)
sys.exit(4)
"""


def test_a_worker_out_of_memory_is_resource_exhausted_not_the_models_fault(tmp_path, monkeypatch):
    d = daemon_beside(tmp_path, monkeypatch, OUT_OF_MEMORY)
    try:
        r = d.ctl("compile", str(small_model(tmp_path / "m.onnx")))
        assert r.returncode == 4, r.describe()
        assert "ran out of its memory bound (RLIMIT_DATA 4 GiB)" in r.stderr and "bad_alloc" in r.stderr, r.stderr
        assert _forms(d) == []
    finally:
        d.stop()


REPLACED = """#!{python}
import json, sys
version = "1.99.0" if sys.argv[1] == "identify" else "1.99.1"
if sys.argv[1] == "optimize":
    sys.stdin.buffer.read()
    with open("/proc/self/fd/3", "wb") as f:
        f.write(b"not read")
print(json.dumps({"runtime": "onnxruntime", "version": version, "build": "a stand-in"}))
"""


def test_a_library_replaced_since_the_start_makes_no_form(tmp_path, monkeypatch):
    """Forms are filed under the identity the daemon found at start: a
    library at that path that says otherwise when it compiles (replaced in
    place) makes no form, and the daemon says to restart."""
    d = daemon_beside(tmp_path, monkeypatch, REPLACED)
    try:
        r = d.ctl("compile", str(small_model(tmp_path / "m.onnx")))
        assert r.returncode == 1 and "library changed since the daemon identified it" in r.stderr, r.describe()
        assert "1.99.0" in r.stderr and "1.99.1" in r.stderr
        assert _forms(d) == []
    finally:
        d.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root only)")
def test_a_full_disk_is_resource_exhausted_and_the_store_intact(tmp_path):
    root = tmp_path / "d"
    cache = root / "cache"
    cache.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(cache)], check=True)
    try:
        d = Daemon(root, args=["--ort-library", _library()]).start()
        try:
            small = d.json("compile", str(small_model(tmp_path / "s.onnx")))
            assert small["form"] is not None
            m = real_models.by_name("ddddocr-det")  # a 20 MB form
            real_models.fetch(m)
            ballast = cache / "ballast"
            with open(ballast, "wb") as f:
                f.write(b"\1" * (50 << 20))
            r = d.ctl("compile", str(m.path))
            assert r.returncode == 4, r.describe()
            assert [e["key"] for e in _forms(d)] == [small["form"]["key"]]
            verified = d.json("verify")
            assert verified["clean"] and verified["corrupt"] == [] and verified["missing"] == [], verified
            ballast.unlink()
            assert d.json("compile", str(m.path))["form"] is not None
        finally:
            d.stop()
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)


def test_forms_answer_in_parallel_threads(daemon, tmp_path, cort):
    """The Python client from several threads of one process: one form."""
    model = small_model(tmp_path / "t.onnx", weight=0.0625)
    keys, errors = [], []

    def one():
        try:
            with warnings.catch_warnings():
                s = cort.inference_session(model, target=None, optimize="all", socket=str(daemon.socket))
            keys.append(s.ctcache_report.source)
        except Exception as e:  # noqa: BLE001 -- collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and keys == ["daemon"] * 4


def test_a_policy_rule_compiles_watched_models_before_first_use(tmp_path, ctcache):  # noqa: F811
    root, watched = tmp_path / "d", tmp_path / "models"
    root.mkdir()
    (root / "ctcached.toml").write_text('[[policy]]\nformat = "onnxruntime.optimized_model"\n'
                                        'params = { level = "all" }\n')
    d = Daemon(root, watch=watched, args=["--ort-library", _library()]).start()
    try:
        model = small_model(watched / "m.onnx", weight=0.03125)
        wait_until(lambda: "onnxruntime form (level=all) compiled" in d.log_text(), 60,
                   "the watcher compiling the model's form", detail=d.log_text)
        with _client(d) as c:
            r = c.compile(model, level="all", lookup_only=True)
        assert r.HasField("form") and not r.compiled, r
    finally:
        d.stop()


def test_a_form_rule_with_another_parameter_is_refused(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[[policy]]\nformat = "onnxruntime.optimized_model"\nparams = { level = "fast" }\n')
    r = subprocess.run([os.environ["CTCACHE_BIN_DIR"] + "/ctcached", "--config", str(config), "--print-config"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "policy[0].params.level" in r.stderr and "fast" in r.stderr, r.stderr
