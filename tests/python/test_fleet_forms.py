"""Runtime forms through the fleet tier (moto on loopback; both daemons load
onnxruntime's library).

* Host A compiles an encoder's form and uploads it with its weights, the
  form last; host B, trusting A's key for forms, takes it without a compile
  (its worker never runs), A's exact bytes, and its session gives
  onnxruntime's own outputs.
* A form whose signer is trusted for packs only, one whose weight is gone
  from the bucket and one whose weight's bytes (re-signed by A's key) are
  not the tensor its key names are each rejected by name, and B compiles
  the form itself.
* ``remote push --model`` uploads a form with its weights, and fails by
  name when one of them is gone; a weight too large to share keeps the
  form home; ``fetch = "never"`` or no key trusted for forms asks nothing;
  an OpenVINO form travels whole.
* ``remote pull`` fetches the forms a policy rule asks for, compiling
  nothing; a form's model larger than an answer carries is refused as
  ``too_large``.
* A form fetch stops when nobody waits for it any more (a proxy holds the
  weights' requests, or their answers half sent); a weight's payload answered
  not found after its manifest is asked once more; a full disk during a
  fetch is RESOURCE_EXHAUSTED.
* The daemon as root and as its own user fetches the form of a caller's
  private model from the descriptor it hands over; another user gets none.

Skips when moto is not installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from pathlib import Path

import onnxruntime as ort
import pytest

import real_models
from s3_proxy import S3Proxy, payload_object
from waiting import wait_until
from test_fleet import (BUCKET, chain_model, fill, fleet_daemon, forge_with_trusted_key, keygen,  # noqa: F401
                        metric_sum, payloads, remote_status, root, s3, scrape, start_writing, wait_uploads)
from garage_cluster import remote_section
from test_daemon_user import (CALLER_UID, DAEMON_IDS, DAEMON_UIDS, another_user_gets_no_form, daemon_as_uid,
                              private_model, root_dir, setpriv)  # noqa: F401 (root_dir: a fixture)
from test_fleet import TIMEOUT_MS
from e2e.harness import bin_dir
from test_python_client import ctcache, installed  # noqa: F401  (session fixtures: pip-installed client)
from worker_daemons import LEVELS, openvino_library, ort_library

pytest.importorskip("moto")

LEVEL = "extended"
ORT_FORM = "onnxruntime.optimized_model"


@pytest.fixture(autouse=True)
def _client_installed(ctcache):  # noqa: F811
    """Every test here asks through the pip-installed client."""


def _model() -> Path:
    m = real_models.by_name("minilm-l3")
    real_models.fetch(m)
    return m


def _host(root: Path, name: str, s3, **kw):
    """A daemon of the fleet with both runtime libraries; ``s3`` is anything
    with an ``endpoint``."""
    return fleet_daemon(root, name, s3, args=["--ort-library", ort_library(),
                                              "--openvino-library", openvino_library()], **kw)


def _compile(d, path: Path, **kw):
    import ctcache as client
    with client.connect(str(d.socket)) as c:
        return c.compile(path, **kw)


def _compiled_here(d) -> int:
    return d.log_text().count(" compiled model=")


@pytest.fixture
def uploaded(root, s3):
    """A compiled the encoder's form and uploaded it with its weights;
    returns (A's payloads, A's entries, A's public key line)."""
    m = _model()
    pub_a = keygen("a", root)
    a = _host(root, "a", s3, sign="a")
    try:
        made = _compile(a, m.path, level=LEVEL)
        assert made.compiled and made.HasField("form"), made
        entries = a.entries()
        assert len(made.tensors) > 1 and len(entries) == len({t.key for t in made.tensors}) + 1, entries
        wait_uploads(a, len(entries), timeout=180)
        return payloads(a), entries, pub_a
    finally:
        a.stop()


def _objects(s3, entries: dict, forms: bool = False) -> list[str]:
    """The bucket's objects of the form's weights (``forms``: of the form)."""
    digests = [e["source_digest"] for e in entries.values() if (e["physical_type"] == ORT_FORM) == forms]
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    return [k for k in keys if any(f"-{d}/" in k for d in digests)]


def test_a_second_host_takes_the_form_without_compiling(root, s3, uploaded, cort):
    packed, entries, pub_a = uploaded
    m = _model()
    b = _host(root, "b", s3, write=False, extra=[f'trusted_form_keys = ["{pub_a}"]'])
    try:
        got = _compile(b, m.path, level=LEVEL)
        assert got.HasField("form") and not got.compiled, b.log_text()
        assert _compiled_here(b) == 0 and "form fetched from the fleet" in b.log_text(), b.log_text()
        assert payloads(b) == packed
        st = remote_status(b)
        assert (st["hits"], st["rejected"], st["errors"]) == (1, 0, 0), st
        assert st["bytes_in"] == sum(len(v) for v in packed.values()), st
        sess = cort.inference_session(m.path, target=None, optimize=LEVEL, socket=str(b.socket))
        assert sess.ctcache_report.source == "daemon", sess.ctcache_report
        so = ort.SessionOptions()
        so.graph_optimization_level = LEVELS[LEVEL]
        own = ort.InferenceSession(str(m.path), so, providers=["CPUExecutionProvider"])
        feeds = real_models.feeds(m)
        for x, y in zip(sess.run(None, feeds), own.run(None, feeds)):
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        assert _compiled_here(b) == 0
    finally:
        b.stop()


def _forge_one_weight(s3, root: Path, entries: dict) -> None:
    """One weight's payload changed and its manifest re-signed by A's key:
    blake3 and length consistent, the tensor not the one its key names."""
    weights = _objects(s3, entries)
    one = sorted({k.rsplit("/", 1)[0] for k in weights})[0]
    assert forge_with_trusted_key(s3, root / "a.secret", under=one) == 1


@pytest.mark.parametrize("damage, reason", [
    ("trusted_for_packs_only", "untrusted_form_key"),
    ("weight_gone", "incomplete_form"),
    # Its payload, asked for with its manifest, is never taken without it (D11).
    ("weight_manifest_gone", "incomplete_form"),
    ("weight_forged", "not_its_tensor"),
])
def test_a_form_that_fails_a_check_is_rejected_by_name_and_compiled_here(root, s3, uploaded, damage, reason):
    packed, entries, pub_a = uploaded
    trust, sign = [f'trusted_form_keys = ["{pub_a}"]'], None
    if damage == "trusted_for_packs_only":
        # B's own key is trusted for forms: it asks, and refuses A's form.
        trust, sign = [], "b"
        keygen("b", root)
    elif damage in ("weight_gone", "weight_manifest_gone"):
        c = s3.client()
        for k in _objects(s3, entries):
            if damage == "weight_gone" or k.endswith("/manifest"):
                c.delete_object(Bucket=BUCKET, Key=k)
    else:
        _forge_one_weight(s3, root, entries)
    b = _host(root, "b", s3, sign=sign, trust=[pub_a], write=False, extra=trust)
    try:
        got = _compile(b, _model().path, level=LEVEL)
        assert got.HasField("form") and got.compiled, got
        assert _compiled_here(b) == 1
        st = remote_status(b)
        assert (st["hits"], st["rejected"]) == (0, 1), st
        if damage in ("weight_gone", "weight_manifest_gone"):
            # No weight was taken from the remote (a payload without its
            # manifest never is); B's are its compile's.
            assert st["bytes_in"] == 0, st
        assert metric_sum(scrape(b), f'ctcache_remote_rejected_total{{reason="{reason}"}}') == 1, scrape(b)
        # Only verified bytes stayed: B's form is its own, its weights A's.
        mine = payloads(b)
        assert all(mine[k] == packed[k] for k, e in entries.items() if e["physical_type"] != ORT_FORM)
    finally:
        b.stop()


def test_remote_push_of_a_model_uploads_its_form_with_the_weights(root, s3):
    """A compiled with uploads off; ``remote push --model`` uploads the
    form and every weight it names (they record the model's path too), and
    B takes the form without compiling."""
    m = _model()
    pub_a = keygen("a", root)
    a = _host(root, "a", s3, sign="a", write=False)
    try:
        assert _compile(a, m.path, level=LEVEL).compiled
        entries = a.entries()
    finally:
        a.stop()
    start_writing(a)
    try:
        pushed = a.json("remote", "push", "--model", str(m.path))
        assert (pushed["done"], pushed["failed"]) == (len(entries), 0), pushed
        packed = payloads(a)
    finally:
        a.stop()
    b = _host(root, "b", s3, write=False, extra=[f'trusted_form_keys = ["{pub_a}"]'])
    try:
        got = _compile(b, m.path, level=LEVEL)
        assert got.HasField("form") and not got.compiled, b.log_text()
        assert payloads(b) == packed
    finally:
        b.stop()


@pytest.mark.parametrize("why", ["fetch = never", "no key trusted for forms"])
def test_a_host_that_cannot_take_a_form_asks_nothing(root, s3, uploaded, why):
    packed, entries, pub_a = uploaded
    if why == "fetch = never":
        b = _host(root, "b", s3, write=False, fetch="never", extra=[f'trusted_form_keys = ["{pub_a}"]'])
    else:
        b = _host(root, "b", s3, write=False, trust=[pub_a])
    try:
        assert _compile(b, _model().path, level=LEVEL).compiled
        st = remote_status(b)
        assert (st["hits"], st["misses"], st["rejected"]) == (0, 0, 0), st
        said = "no key is trusted for runtime forms" in b.log_text()
        assert said == (why == "no key trusted for forms"), b.log_text()
        # remote status names the keys trusted for each.
        if why == "fetch = never":
            assert (st["trusted_keys"], st["trusted_form_keys"]) == ([], ["a"]), st
        else:
            assert (st["trusted_keys"], st["trusted_form_keys"]) == (["a"], []), st
            assert re.search(r"trusted for forms\s+none: runtime forms are compiled here",
                             b.ctl("remote", "status").stdout)
    finally:
        b.stop()


def test_a_form_with_a_weight_too_large_to_share_stays_on_its_host(root, s3):
    """A weight over max_object_bytes stops the form's upload job: the
    weights before it go up, the form never does, from the queue or from
    ``remote push``."""
    m = _model()
    keygen("a", root)
    a = _host(root, "a", s3, sign="a", extra=[f"max_object_bytes = {1 << 20}"])
    try:
        made = _compile(a, m.path, level=LEVEL)
        assert max(t.length for t in made.tensors) > 1 << 20
        wait_until(lambda: "a runtime form stays on this host" in a.log_text(), 60, "the form's upload stopped",
                   detail=a.log_text)
        entries = a.entries()
        assert _objects(s3, entries, forms=True) == []
        pushed = a.json("remote", "push", "--model", str(m.path))
        assert pushed["failed"] == 0 and pushed["missing"] >= 2, pushed  # the large weight, and the form
        assert _objects(s3, entries, forms=True) == []
    finally:
        a.stop()


def test_an_openvino_form_travels_whole(root, s3):
    m = _model()
    pub_a = keygen("a", root)
    a = _host(root, "a", s3, sign="a")
    try:
        assert _compile(a, m.path, runtime="openvino").compiled
        wait_uploads(a, 1, timeout=180)
        packed = payloads(a)
    finally:
        a.stop()
    b = _host(root, "b", s3, write=False, extra=[f'trusted_form_keys = ["{pub_a}"]'])
    try:
        got = _compile(b, m.path, runtime="openvino")
        assert got.HasField("form") and not got.compiled, b.log_text()
        assert payloads(b) == packed and _compiled_here(b) == 0
    finally:
        b.stop()


def _shown(key: str) -> str:
    """An entry key of ``ls --json`` as messages show it."""
    assert key.startswith("01") and len(key) == 2 + 3 * 64, key
    return "blake3:" + "/".join(key[2 + 64 * i:2 + 64 * (i + 1)] for i in range(3))


def _forms_of(d) -> list[dict]:
    return [e for e in d.entries().values() if e["physical_type"] == ORT_FORM]


def test_remote_push_of_a_form_whose_weight_is_gone_fails_by_name(root, s3):
    """A weight of the form dropped (rotted, then ``verify --repair``): ``remote push``
    uploads the other weights, refuses the form and says which weight is
    gone; the bucket has no form."""
    m = _model()
    keygen("a", root)
    a = _host(root, "a", s3, sign="a", write=False)
    try:
        made = _compile(a, m.path, level=LEVEL)
        gone = made.tensors[0].key
        blob = Path(a.entries()[gone]["payload_path"])
        data = bytearray(blob.read_bytes())
        data[0] ^= 0xFF
        blob.write_bytes(bytes(data))
        repaired = a.ctl("verify", "--repair", "--json")
        assert gone in json.loads(repaired.stdout)["corrupt"], repaired.describe()
        entries = a.entries()
        assert gone not in entries
    finally:
        a.stop()
    start_writing(a)
    try:
        r = a.ctl("remote", "push", "--model", str(m.path), "--json")
        assert r.returncode == 1 and f"a weight of the form ({_shown(gone)}) is no longer stored" in r.stderr, \
            r.describe()
        pushed = json.loads(r.stdout)
        assert (pushed["done"], pushed["failed"]) == (len(entries) - 1, 1), pushed
        assert _objects(s3, entries, forms=True) == []
    finally:
        a.stop()


def _form_rule(level: str = LEVEL) -> str:
    return f'[[policy]]\nformat = "{ORT_FORM}"\nparams = {{ level = "{level}" }}\n'


@pytest.mark.parametrize("fetch", ["always", "never"])
def test_remote_pull_fetches_the_form_a_policy_rule_asks_for(root, s3, uploaded, fetch):
    """As it does packs, whatever ``fetch`` says."""
    packed, entries, pub_a = uploaded
    m = _model()
    b = _host(root, "b", s3, write=False, fetch=fetch, extra=[f'trusted_form_keys = ["{pub_a}"]'],
              policy=_form_rule())
    try:
        pulled = b.json("remote", "pull", str(m.path))
        assert (pulled["done"], pulled["missing"], pulled["failed"]) == (1, 0, 0), pulled
        assert payloads(b) == packed and _compiled_here(b) == 0
        again = b.json("remote", "pull", str(m.path))
        assert (again["done"], again["present"], again["missing"]) == (0, 1, 0), again
        assert _compile(b, m.path, level=LEVEL, lookup_only=True).HasField("form")
    finally:
        b.stop()


def test_remote_pull_without_a_key_trusted_for_forms_says_so(root, s3, uploaded):
    packed, entries, pub_a = uploaded
    b = _host(root, "b", s3, write=False, trust=[pub_a], policy=_form_rule())
    try:
        pulled = b.json("remote", "pull", str(_model().path))
        assert (pulled["done"], pulled["missing"]) == (0, 1), pulled
        assert "no key is trusted for runtime forms" in pulled["first_error"], pulled
        assert b.entries() == {} and remote_status(b)["misses"] == 0
    finally:
        b.stop()


def test_a_pulled_form_larger_than_an_answer_carries_is_too_large(root, s3, uploaded):
    """B's answers carry less than the form's model: the fetch refuses it
    as ``too_large`` before any weight, and ``remote pull`` says so,
    compiling nothing."""
    packed, entries, pub_a = uploaded
    m = _model()
    (form,) = [k for k, e in entries.items() if e["physical_type"] == ORT_FORM]
    assert len(packed[form]) > 4096
    b = _host(root, "b", s3, write=False, extra=[f'trusted_form_keys = ["{pub_a}"]'],
              settings=[f"max_message_bytes = {(1 << 20) + 4096}"], policy=_form_rule())
    try:
        r = b.ctl("remote", "pull", str(m.path), "--json")
        assert r.returncode == 0, r.describe()
        pulled = json.loads(r.stdout)
        assert (pulled["done"], pulled["missing"]) == (0, 1) and _shown(form) in pulled["first_error"], pulled
        assert metric_sum(scrape(b), 'ctcache_remote_rejected_total{reason="too_large"}') == 1, scrape(b)
        assert b.entries() == {} and _compiled_here(b) == 0
    finally:
        b.stop()


class HeldWeights(S3Proxy):
    """Holds every payload request after the first ``passed`` (an
    onnxruntime form's model comes first, its weights after) until
    ``release`` is set, and counts them."""

    def __init__(self, upstream: str, passed: int = 1):
        self.release = threading.Event()
        self.held = threading.Event()
        self.payloads = 0
        self.passed = passed
        super().__init__(upstream)

    def before(self, method: str, path: str) -> None:
        if method in ("GET", "HEAD") and payload_object(path):
            with self.lock:
                self.payloads += 1
                hold = self.payloads > self.passed
            if hold:
                self.held.set()
                self.release.wait(120)

    def weights_asked(self) -> int:
        """Payloads asked for after the form's model."""
        with self.lock:
            return self.payloads - 1

    def close(self):
        self.release.set()
        super().close()


def _uploaded_chain(root: Path, s3, n: int, openvino: bool = False) -> tuple[Path, str, dict]:
    """Host A compiles the form of a chain of ``n`` MatMuls (onnxruntime's,
    each weight an entry of its own, or OpenVINO's, one blob) and uploads
    it; returns the model, A's public key line and A's payloads."""
    model = chain_model(root / "chain.onnx", n)
    pub_a = keygen("a", root)
    a = _host(root, "a", s3, sign="a")
    try:
        made = _compile(a, model, runtime="openvino") if openvino else _compile(a, model, level=LEVEL)
        assert openvino or len({t.key for t in made.tensors}) == n, made
        wait_uploads(a, 1 if openvino else n + 1, timeout=180)
        return model, pub_a, payloads(a)
    finally:
        a.stop()


@pytest.mark.parametrize("first", ["compile", "remote pull"])
def test_a_remote_pull_and_a_compile_of_one_form_share_its_fetch(root, s3, first):
    """A fetch of a form is under way (its weights held) when the other
    asks for the same form: a pull joins a compile's fetch, a compile joins
    a pull's (even where ``fetch = "never"`` keeps a compile from asking
    the remote itself). Each object is asked for once; both get A's form,
    nothing compiled."""
    n = 6
    model, pub_a, packed = _uploaded_chain(root, s3, n)
    proxy = HeldWeights(s3.endpoint)
    fetch = "never" if first == "remote pull" else "always"
    b = _host(root, "b", proxy, write=False, extra=[f'trusted_form_keys = ["{pub_a}"]'], timeout_ms=120_000,
              policy=_form_rule(), fetch=fetch)
    try:
        run = [os.environ["CTCACHECTL"], "--socket", str(b.socket)]
        asks = {"compile": [*run, "compile", str(model), "--level", LEVEL],
                "remote pull": [*run, "remote", "pull", str(model), "--json"]}
        second = "compile" if first == "remote pull" else "remote pull"
        started = {first: subprocess.Popen(asks[first], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           text=True)}
        assert proxy.held.wait(120), b.log_text()
        started[second] = subprocess.Popen(asks[second], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           text=True)
        wait_until(lambda: "joins the fleet fetch of the form under way" in b.log_text(), 60,
                   f"the {second} joining the {first}'s fetch", detail=b.log_text)
        proxy.release.set()
        outs = {}
        for way, p in started.items():
            outs[way], _ = p.communicate(timeout=120)
            assert p.returncode == 0, (way, outs[way])
        assert json.loads(outs["remote pull"])["done"] == 1, outs
        # The form's model and each weight's payload, once.
        assert proxy.payloads == n + 1, (proxy.payloads, n)
        assert payloads(b) == packed and _compiled_here(b) == 0
    finally:
        b.stop()
        proxy.close()


@pytest.mark.parametrize("way", ["compile", "remote pull", "openvino compile"])
def test_a_form_fetch_stops_when_nobody_waits_for_it(root, s3, way):
    """The caller (of a compile, or of a remote pull) goes while the form's
    weights' requests (or OpenVINO's blob's) are held by the server: the
    fetch stops without their answers, asks for no further weight,
    publishes no form, and the next caller's fetch takes the rest."""
    n = 24
    openvino = way == "openvino compile"
    model, pub_a, packed = _uploaded_chain(root, s3, n, openvino)
    # OpenVINO's form is its one payload: held from the first.
    proxy = HeldWeights(s3.endpoint, passed=0 if openvino else 1)
    b = _host(root, "b", proxy, write=False, extra=[f'trusted_form_keys = ["{pub_a}"]'], timeout_ms=120_000,
              policy=_form_rule())
    asks = {"compile": ["compile", str(model), "--level", LEVEL], "remote pull": ["remote", "pull", str(model)],
            "openvino compile": ["compile", str(model), "--runtime", "openvino"]}
    try:
        p = subprocess.Popen([os.environ["CTCACHECTL"], "--socket", str(b.socket), *asks[way]],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert proxy.held.wait(120), b.log_text()
        p.kill()
        p.wait()
        gone = "its request ended (its caller went, or its deadline passed); it stops"
        wait_until(lambda: gone in b.log_text(), 60,
                   "the daemon seeing its caller gone", detail=b.log_text)
        # While the server still holds the requests under way.
        wait_until(lambda: "fetch stopped: nobody waits for the form any more" in b.log_text(), 60,
                   "the fetch stopping", detail=b.log_text)
        proxy.release.set()
        if openvino:
            assert b.entries() == {}
        else:
            # Only the weights under way when the caller went (one per
            # fetching thread, 16) were asked for.
            asked = proxy.weights_asked()
            assert asked <= 16 < n, (asked, n)
            assert _forms_of(b) == [] and len(b.entries()) <= asked
        if way == "remote pull":
            assert b.json("remote", "pull", str(model))["done"] == 1
        else:
            got = _compile(b, model, runtime="openvino") if openvino else _compile(b, model, level=LEVEL)
            assert got.HasField("form") and not got.compiled, b.log_text()
        assert payloads(b) == packed and _compiled_here(b) == 0
    finally:
        b.stop()
        proxy.close()


class WeightsHeldPartWay(S3Proxy):
    """Sends half of each weight's payload (after the form's model) and
    holds the rest until ``release`` is set."""

    def __init__(self, upstream: str):
        self.release = threading.Event()
        self.held = threading.Event()
        self.payloads = 0
        super().__init__(upstream)

    def reply(self, method: str, path: str, wfile, answer: bytes) -> None:
        if not payload_object(path):
            wfile.write(answer)
            return
        with self.lock:
            self.payloads += 1
            hold = self.payloads > 1
        if not hold:
            wfile.write(answer)
            return
        half = len(answer) // 2
        try:
            wfile.write(answer[:half])
            wfile.flush()
            self.held.set()
            self.release.wait(120)
            wfile.write(answer[half:])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon stopped reading and closed

    def close(self):
        self.release.set()
        super().close()


def test_a_form_fetch_stops_within_the_weights_it_streams(root, s3):
    """The caller goes while every weight under way is half streamed in
    (the server holds the rest): the fetch stops without waiting for the
    server's next bytes, stores no weight and publishes no form."""
    n = 24
    model, pub_a, packed = _uploaded_chain(root, s3, n)
    proxy = WeightsHeldPartWay(s3.endpoint)
    b = _host(root, "b", proxy, write=False, extra=[f'trusted_form_keys = ["{pub_a}"]'], timeout_ms=120_000)
    try:
        p = subprocess.Popen([os.environ["CTCACHECTL"], "--socket", str(b.socket), "compile", str(model),
                              "--level", LEVEL], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert proxy.held.wait(120), b.log_text()
        p.kill()
        p.wait()
        # The server still holds every weight's second half.
        wait_until(lambda: "fetch stopped: nobody waits for the form any more" in b.log_text(), 60,
                   "the fetch stopping while its weights are held", detail=b.log_text)
        assert b.entries() == {} and _compiled_here(b) == 0
    finally:
        b.stop()
        proxy.close()


NO_SUCH_KEY = (404, b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NoSuchKey</Code>'
                    b"<Message>The specified key does not exist.</Message></Error>")


class PayloadNotThereYet(S3Proxy):
    """Answers the first GET of one weight's payload (of source ``digest``)
    not found, as a bucket does between an upload's payload and its
    manifest being read by a fetch of both at once; counts that payload's
    GETs."""

    def __init__(self, upstream: str, digest: str):
        self.digest = digest
        self.asked: dict[str, int] = {}
        super().__init__(upstream)

    def before(self, method: str, path: str) -> tuple[int, bytes] | None:
        path = payload_object(path)
        if method != "GET" or not path or f"-{self.digest}/" not in path:
            return None
        with self.lock:
            self.asked[path] = self.asked.get(path, 0) + 1
            first = len(self.asked) == 1 and self.asked[path] == 1
        return NO_SUCH_KEY if first else None


def test_a_weights_payload_not_found_after_its_manifest_is_asked_once_more(root, s3, uploaded):
    """A weight's manifest is there and its payload answered not found: the
    payload is asked once more, the form taken, nothing compiled."""
    packed, entries, pub_a = uploaded
    digest = next(e["source_digest"] for e in entries.values() if e["physical_type"] != ORT_FORM)
    proxy = PayloadNotThereYet(s3.endpoint, digest)
    b = _host(root, "b", proxy, write=False, extra=[f'trusted_form_keys = ["{pub_a}"]'])
    try:
        got = _compile(b, _model().path, level=LEVEL)
        assert got.HasField("form") and not got.compiled, b.log_text()
        assert sorted(proxy.asked.values())[-1] == 2, proxy.asked
        assert payloads(b) == packed and _compiled_here(b) == 0
        st = remote_status(b)
        assert (st["hits"], st["rejected"], st["errors"]) == (1, 0, 0), st
    finally:
        b.stop()
        proxy.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root only)")
def test_a_full_disk_during_a_form_fetch_is_resource_exhausted(root, s3, uploaded):
    packed, entries, pub_a = uploaded
    m = _model()
    cache = root / "b" / "cache"
    cache.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={(sum(map(len, packed.values())) >> 20) + 32}m",
                    "tmpfs", str(cache)], check=True)
    try:
        b = _host(root, "b", s3, write=False, extra=[f'trusted_form_keys = ["{pub_a}"]'])
        try:
            ballast = fill(cache)
            r = b.ctl("compile", str(m.path), "--level", LEVEL)
            assert r.returncode == 4, r.describe()
            assert _forms_of(b) == [] and _compiled_here(b) == 0
            ballast.unlink()
            got = _compile(b, m.path, level=LEVEL)
            assert got.HasField("form") and not got.compiled, b.log_text()
            assert payloads(b) == packed
        finally:
            b.stop()
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)


@pytest.mark.parametrize("daemon_uid", DAEMON_UIDS, ids=DAEMON_IDS)
def test_a_users_private_model_gets_its_form_from_the_fleet(root, s3, root_dir, daemon_uid):  # noqa: F811
    """The daemon as root and as its own user (setpriv), a caller's private
    model (0600 in a 0700 folder): the form A uploaded is fetched for the
    caller from the descriptor it hands over, B's worker never runs; another
    user, who cannot open the model, gets none."""
    model = private_model(root_dir)
    pub_a = keygen("a", root)
    a = _host(root, "a", s3, sign="a")
    try:
        assert a.json("compile", str(model), "--level", LEVEL)["compiled"]
        wait_uploads(a, len(a.entries()), timeout=180)
    finally:
        a.stop()
    remote = remote_section(f"s3://{BUCKET}/fleet", s3.endpoint, fetch="always", write=False,
                            extra=[f'trusted_form_keys = ["{pub_a}"]', f"timeout_ms = {TIMEOUT_MS}"])
    daemon = daemon_as_uid(root_dir, daemon_uid, ("--ort-library", ort_library()), config=remote)
    socket = next(daemon)
    try:
        r = subprocess.run([*setpriv(CALLER_UID), str(bin_dir() / "ctcachectl"), "--socket", str(socket), "compile",
                            str(model), "--level", LEVEL, "--json"], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, HOME=str(root_dir)))
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        log = (root_dir / "ctcached.log").read_text()
        assert got["form"] is not None and not got["compiled"], (got, log)
        assert "form fetched from the fleet" in log and " compiled model=" not in log, log
        another_user_gets_no_form(socket, root_dir, model, "onnxruntime")
    finally:
        next(daemon, None)


@pytest.fixture
def cort(ctcache):  # noqa: F811
    """ctcache.ort of the pip-installed client."""
    import importlib
    return importlib.import_module("ctcache.ort")
