"""Zero-write sessions: ``ctcache.ort.inference_session`` with no output
path writes no file. The daemon answers the model's bytes, whose external
data are the cache's payload files (relative to its payload folder), and
holds the payloads with one lease; onnxruntime maps them in place, or,
where this process cannot read them, the client feeds copies as external
initializers. For each target the outputs are bit-identical to the session
on the file materialize and to the reference tool's model, on a model whose
kept tensors are external data beside it (inlined in the answer); the one
lease lives as long as the session, or its process; a model too large for
one answer falls back to a file.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest

from test_materialize import daemon, one_thread, random_feeds, session, transformer  # noqa: F401  (fixture)
from test_python_client import ctcache, installed  # noqa: F401  (session fixtures: pip-installed client)

TARGETS = ["onnxruntime-int4", "onnxruntime-int8", "onnxruntime-fp16"]


def listing(*dirs: Path) -> list[str]:
    return sorted(str(p) for d in dirs if d.exists() for p in d.rglob("*"))


def external_model(tmp_path: Path, seed: int) -> Path:
    """A transformer block whose every tensor is external data in one file beside it."""
    inline = transformer(tmp_path / "inline.onnx", 96, seed=seed)
    folder = tmp_path / "model"
    folder.mkdir()
    out = folder / "m.onnx"
    onnx.save_model(onnx.load(str(inline)), str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="m.data", size_threshold=0)
    inline.unlink()
    return out


def reference(model: Path, target: str) -> onnx.ModelProto:
    import ctcache.ort as cort

    if target == "onnxruntime-int8":
        return cort.quantize_dynamic_in_process(model)
    if target == "onnxruntime-fp16":
        from onnxruntime.transformers.float16 import convert_float_to_float16

        return convert_float_to_float16(str(model), keep_io_types=True)
    return cort.quantize_in_process(model)


def same_outputs(a, b, seed: int) -> None:
    feeds = random_feeds(a, seed)
    for x, y in zip(a.run(None, feeds), b.run(None, feeds)):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


@pytest.mark.parametrize("target", TARGETS)
def test_a_session_writes_nothing_and_matches_the_file_and_the_reference(ctcache, daemon, tmp_path,  # noqa: F811
                                                                          monkeypatch, target):
    import ctcache.ort as cort

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    model = external_model(tmp_path, seed=TARGETS.index(target) + 3)
    before = listing(tmp_path)
    with ctcache.connect(daemon.socket) as c:
        leases = c.stats().active_leases
        sess = cort.inference_session(model, socket=daemon.socket, target=target, sess_options=one_thread(),
                                      providers=["CPUExecutionProvider"])
        assert listing(tmp_path) == before, "an in-memory session wrote files"
        assert not hasattr(sess, "_ctcache_payloads"), "onnxruntime maps the payload files itself"
        assert c.stats().active_leases == leases + 1, "one lease holds every payload of the session"
    ref = session(reference(model, target))
    same_outputs(sess, ref, seed=1)
    on_file = cort.inference_session(model, socket=daemon.socket, target=target, link="hard",
                                     sess_options=one_thread(), providers=["CPUExecutionProvider"])
    same_outputs(sess, on_file, seed=2)
    # The mappings outlive everything but the session.
    del on_file, ref
    gc.collect()
    same_outputs(sess, session(reference(model, target)), seed=3)


def test_the_answer_says_where_every_new_initializer_lies(ctcache, daemon, tmp_path):  # noqa: F811
    model = external_model(tmp_path, seed=11)
    with ctcache.connect(daemon.socket) as c:
        r = c.materialize(model, None, in_memory=True, lease_ttl_s=5)
        assert not r.output_path and not r.files and os.path.isdir(r.external_data_dir)
        m = onnx.load_from_string(r.model)
        fed = {t.name: t for t in r.tensors}
        leased = {lease.entry.key for lease in r.leases}
        placeholders = [t for t in m.graph.initializer if t.name in fed]
        assert len(placeholders) == len(fed) > 0
        for t in placeholders:
            f = fed[t.name]
            assert f.key in leased and list(f.dims) == list(t.dims) and f.data_type == t.data_type
        paths = {lease.entry.key: lease.entry.payload_path for lease in r.leases}
        for t in placeholders:
            f, loc = fed[t.name], {e.key: e.value for e in t.external_data}
            # The location is the leased payload's file, in the answer's folder.
            assert os.path.join(r.external_data_dir, loc["location"]) == paths[f.key]
            assert (int(loc["offset"]), int(loc["length"])) == (f.offset, f.length)
        # The source's external data is inlined: the model reads no file of the source's.
        kept = [t for t in m.graph.initializer if t.name not in fed]
        assert kept and all(t.data_location == onnx.TensorProto.DEFAULT and t.raw_data for t in kept)
        for lease in r.leases:
            c._stub.ReleaseLease(ctcache.pb.ReleaseLeaseRequest(lease_id=lease.lease_id))
        with pytest.raises(ValueError, match="writes nothing"):
            c.materialize(model, tmp_path / "x.onnx", in_memory=True)


def test_an_answer_too_large_falls_back_to_a_file(ctcache, daemon, tmp_path, monkeypatch):  # noqa: F811
    import ctcache.ort as cort
    from ctcache.client import Client

    model = external_model(tmp_path, seed=13)
    real = Client.materialize

    def too_large(self, *args, in_memory=False, **kw):
        if in_memory:
            import grpc

            raise ctcache.errors.RequestFailed("Materialize", grpc.StatusCode.RESOURCE_EXHAUSTED, "too large")
        return real(self, *args, **kw)

    monkeypatch.setattr(Client, "materialize", too_large)
    # The descriptor channel's answer is a memfd, never too large for a
    # message: this stands in for its refusal, which gRPC then asks again.
    monkeypatch.setattr(cort, "_in_memory_by_descriptor", lambda *a: None)
    sess = cort.inference_session(model, socket=daemon.socket, sess_options=one_thread(),
                                  providers=["CPUExecutionProvider"])
    written = model.parent / "m.int4.onnx"
    assert written.is_file() and not hasattr(sess, "_ctcache_payloads")
    same_outputs(sess, session(reference(model, "onnxruntime-int4")), seed=4)
    assert os.path.isdir(str(written) + ".weights")


def test_payload_files_this_process_cannot_read_are_fed_as_copies(ctcache, daemon, tmp_path,  # noqa: F811
                                                                  monkeypatch):
    import ctcache.ort as cort

    model = external_model(tmp_path, seed=17)
    real = os.access
    monkeypatch.setattr(cort.os, "access", lambda p, mode: False if "blobs" in str(p) else real(p, mode))
    with ctcache.connect(daemon.socket) as c:
        leases, ended = c.stats().active_leases, lease_end(c, model)
        sess = cort.inference_session(model, socket=daemon.socket, target="onnxruntime-int8",
                                      sess_options=one_thread(), providers=["CPUExecutionProvider"])
        assert sess._ctcache_values and not hasattr(sess, "_ctcache_payloads")
        assert ended.wait(60), "the copies are the process's: the hold ends once they are made"
        assert c.stats().active_leases == leases
    same_outputs(sess, session(reference(model, "onnxruntime-int8")), seed=5)


def lease_end(c, model: Path) -> threading.Event:
    """Set when the daemon says a hold on ``model``'s payloads ended (events followed from now)."""
    events, ended = c.events(), threading.Event()

    def follow():
        for e in events:
            if e.kind == "lease_ended" and e.model_path == str(model.resolve()):
                ended.set()
                return

    threading.Thread(target=follow, daemon=True).start()
    return ended


def test_a_sessions_lease_ends_when_it_is_collected_or_its_process_killed(ctcache, daemon, tmp_path,  # noqa: F811
                                                                           installed):
    import ctcache.ort as cort

    model = external_model(tmp_path, seed=19)
    with ctcache.connect(daemon.socket) as c:
        leases = c.stats().active_leases
        sess = cort.inference_session(model, socket=daemon.socket, providers=["CPUExecutionProvider"])
        assert c.stats().active_leases == leases + 1
        ended = lease_end(c, model)
        del sess
        gc.collect()
        assert ended.wait(60), "a collected session's hold ends"
        assert c.stats().active_leases == leases
        script = ("import sys, ctcache.ort as o\n"
                  "s = o.inference_session(sys.argv[1], socket=sys.argv[2], providers=['CPUExecutionProvider'])\n"
                  "print('READY', flush=True)\n"
                  "sys.stdin.read()\n")
        p = subprocess.Popen([sys.executable, "-c", script, str(model), str(daemon.socket)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(installed)))
        try:
            assert p.stdout.readline().startswith(b"READY")
            assert c.stats().active_leases == leases + 1
            ended = lease_end(c, model)
            p.kill()
        finally:
            p.wait()
        assert ended.wait(60), "a killed process's hold ends with its connection"
        assert c.stats().active_leases == leases


def conv_model(path: Path) -> Path:
    """A Conv and nothing the int4 target rewrites."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    g = helper.make_graph([helper.make_node("Conv", ["X", "W"], ["Y"])], "conv",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4, 6, 6])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("kind", ["int4", "as-is"])
def test_a_fresh_process_opens_its_session_without_grpc_or_protobuf(ctcache, installed, daemon, tmp_path,  # noqa: F811
                                                                     kind):
    """The default session is asked on the descriptor channel: importing a
    gRPC client and protobuf would cost a fresh process more than the ask
    (and what only a fallback or a log uses is not imported either)."""
    model = external_model(tmp_path, seed=23) if kind == "int4" else conv_model(tmp_path / "conv.onnx")
    script = ("import sys, warnings, ctcache.ort as o\n"
              "warnings.simplefilter('ignore')\n"
              "s = o.inference_session(sys.argv[1], socket=sys.argv[2], providers=['CPUExecutionProvider'])\n"
              "gone = [m for m in ('grpc', 'google.protobuf', 'ctcache.client', 'logging', 'tempfile')\n"
              "        if m in sys.modules]\n"
              "print(s.ctcache_report.source, gone)\n")
    r = subprocess.run([sys.executable, "-c", script, str(model), str(daemon.socket)], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(installed)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["daemon" if kind == "int4" else "as-is", "[]"], r.stdout


def test_the_sessions_report_is_logged_where_logging_is_used(ctcache, daemon, tmp_path, caplog):  # noqa: F811
    import logging

    import ctcache.ort as cort

    model = external_model(tmp_path, seed=31)
    with caplog.at_level(logging.INFO, logger="ctcache"):
        sess = cort.inference_session(model, socket=daemon.socket, providers=["CPUExecutionProvider"])
    assert [r.getMessage() for r in caplog.records if r.name == "ctcache"] == [str(sess.ctcache_report)]


def test_the_channels_materialize_step_refuses_as_the_rpc_does(ctcache, daemon, tmp_path):  # noqa: F811
    from ctcache import handout, wire

    model = external_model(tmp_path, seed=29)
    with handout.hand_over(str(daemon.socket), str(model)) as h:
        with pytest.raises(handout.HandoutRefused) as e:
            handout.ask(h, "materialize", wire.Message("MaterializeRequest", target="no-such-target"))
    assert (e.value.code_name, e.value.kind) == ("INVALID_ARGUMENT", "invalid-input"), e.value.message
    # A step that asks nothing, once the handout is made: refused, the connection ended.
    with handout.hand_over(str(daemon.socket), str(model)) as h:
        h._conn.send(wire.Message("HandoutRequest", files=wire.Message("HandoutFiles")).SerializeToString())
        reply = wire.decode("HandoutReply", h._conn.recv(handout.MAX_PACKET))
        assert reply.WhichOneof("step") == "error" and "out of turn" in reply.error.message, reply
        assert h._conn.recv(handout.MAX_PACKET) == b""
    # A model with nothing to rewrite: the kind the client turns into its as-is session.
    with handout.hand_over(str(daemon.socket), str(conv_model(tmp_path / "c.onnx"))) as h:
        with pytest.raises(handout.HandoutRefused) as e:
            handout.ask(h, "materialize", wire.Message("MaterializeRequest", target="onnxruntime-int4"))
    assert (e.value.code_name, e.value.kind) == ("FAILED_PRECONDITION", "nothing-to-rewrite"), e.value.message


def test_unfeedable_ranges_are_refused(ctcache):  # noqa: F811
    import ctcache.ort as cort

    view = memoryview(np.zeros(16, np.uint8).tobytes())
    bad = ctcache.pb.MaterializedTensor(name="t", key="k", offset=8, length=16, data_type=1, dims=[4])
    with pytest.raises(ctcache.CtcacheError, match="are not"):
        cort._ort_value(view, bad)
    odd = ctcache.pb.MaterializedTensor(name="t", key="k", offset=0, length=2, data_type=8, dims=[1])
    with pytest.raises(ctcache.CtcacheError, match="cannot be fed"):
        cort._ort_value(view, odd)
