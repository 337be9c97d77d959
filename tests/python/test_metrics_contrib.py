"""The Grafana dashboard and the Prometheus alert rules under contrib/ name
only metrics the daemon exports.

Running daemons are driven until every metric they can export is on their
/metrics page, and the pages are scraped:

* A (watching a folder, writing to a local S3 server, moto): a watcher
  event, two resolves that ask the remote (misses), pack and upload; a
  Lookup hit and a miss (``why-miss``); ``gc``; as root, an untrusted uid
  over its connection share (``max_connections_per_uid = 1``).
* B (reading A's entries, ``audit_rate = 1``): an honest entry passes its
  audit (hits, bytes in); one whose bytes A's trusted key re-signed after
  changing them fails it (rejected, audit mismatches).
* C (a remote that never answers, one worker, a one-place upload queue):
  errors, the breaker's skips, upload drops.

Every metric name in the dashboard's queries (panel targets and template
variables) and the rules' ``expr`` must then be on one of the pages (exact
names: ``ctcache_pack_seconds`` is a histogram, so ``_bucket`` (with
``le``), ``_sum`` and ``_count`` exist), and each label a selector
filters on, or an aggregation groups by, (other than the scrape's ``job`` and
``instance``) must be a label of that metric. ``up`` is Prometheus's own.

One metric is checked against the daemon's source instead when the test
does not run as root: ``ctcache_connections_refused_total`` is recorded only
for an untrusted uid (not root, not the daemon's uid), which only root can
become here.

Skips when the binaries are not built or moto is not installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import urllib.request
from pathlib import Path

import pytest

from e2e.harness import Daemon
from garage_cluster import free_port, remote_section
from test_first_run import make_model  # a 512 x 256 FLOAT MatMul weight
from waiting import wait_until

yaml = pytest.importorskip("yaml")  # PyYAML, a dependency of moto

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "contrib" / "grafana" / "ctcache-dashboard.json"
RULES = REPO / "contrib" / "prometheus" / "ctcache-alerts.yml"
DAEMON_SRC = [REPO / "daemon" / "src", REPO / "remote" / "src"]

# Series Prometheus makes itself, and the labels a scrape attaches.
PROMETHEUS_OWN = {"up"}
TARGET_LABELS = {"job", "instance"}
# Recorded only for a connection of an untrusted uid (see the module doc).
NEEDS_ROOT = {"ctcache_connections_refused_total"}


# ---- what the contrib files name ----

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
            "offset", "bool", "inf", "nan"}
TOKEN = re.compile(r'''\s+|"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|\[[^\]]*\]|\{[^}]*\}|[A-Za-z_:][A-Za-z0-9_:]*'''
                   r'''|[0-9][0-9.eE+-]*[smhdwy]?|\$\{?[A-Za-z_0-9]+\}?|.''')
MATCHER = re.compile(r'''\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')\s*''')


def selectors(expr: str) -> list[tuple[str | None, list[tuple[str, str, str]]]]:
    """The vector selectors of a PromQL expression: (metric name or None for
    ``{__name__=~...}``, [(label, op, value)]). Function, aggregation and
    keyword names are left out, so are label lists of by/without/on."""
    toks = [t for t in TOKEN.findall(expr) if not t.isspace()]
    out = []
    i = 0
    while i < len(toks):
        t = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else ""
        if t in KEYWORDS and t not in ("and", "or", "unless", "offset", "bool") and nxt == "(":
            depth, i = 0, i + 1  # skip the label list
            while i < len(toks):
                depth += {"(": 1, ")": -1}.get(toks[i], 0)
                i += 1
                if depth == 0:
                    break
            continue
        # A name before "(" is a function, before by/without an aggregation.
        if re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", t) and t not in KEYWORDS and nxt not in ("(", "by", "without"):
            matchers = parse_matchers(nxt, expr) if nxt.startswith("{") else []
            out.append((t, matchers))
            i += 2 if nxt.startswith("{") else 1
            continue
        if t.startswith("{"):
            out.append((None, parse_matchers(t, expr)))
        i += 1
    return out


def parse_matchers(braces: str, expr: str) -> list[tuple[str, str, str]]:
    body = braces[1:-1].strip()
    if not body:
        return []
    got = []
    for part in re.findall(r'''(?:[^,"']|"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')+''', body):
        m = MATCHER.fullmatch(part)
        assert m, f"cannot read the label matcher {part!r} in {expr!r}"
        got.append((m.group(1), m.group(2), m.group(3)[1:-1]))
    return got


def grouping_labels(expr: str) -> set[str]:
    """The labels of by/without/on/ignoring lists."""
    lists = re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr)
    return {label.strip() for lst in lists for label in lst.split(",") if label.strip()}


def label_values_selector(query: str) -> str:
    """``label_values(SELECTOR, label)`` -> SELECTOR (Grafana's variable query)."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*", query)
    return m.group(1) if m else query


def dashboard_exprs(text: str) -> list[tuple[str, str]]:
    """[(where, expr)] of every query in the dashboard JSON."""
    d = json.loads(text)
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if "expr" in t:
                    out.append((f"panel {p.get('title')!r} target {t.get('refId')}", t["expr"]))
            walk(p.get("panels", []))

    walk(d.get("panels", []))
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
            out.append((f"variable ${v['name']}", label_values_selector(q)))
    return out


def rules_exprs(text: str) -> list[tuple[str, str]]:
    doc = yaml.safe_load(text)
    return [(f"alert {r.get('alert') or r.get('record')}", r["expr"])
            for g in doc["groups"] for r in g["rules"]]


# ---- what the daemon exports ----

def exported(pages: list[str]) -> dict[str, set[str]]:
    """{sample name: label keys} over scraped /metrics pages."""
    got: dict[str, set[str]] = {}
    for text in pages:
        for line in text.splitlines():
            m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{([^}]*)\})?\s", line)
            if m:
                keys = set(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', m.group(3) or ""))
                got.setdefault(m.group(1), set()).update(keys)
    return got


def declared_in_source() -> set[str]:
    """Metric names the daemon's source records (``metrics::counter!("name"`` and co)."""
    names = set()
    for d in DAEMON_SRC:
        for f in d.rglob("*.rs"):
            names.update(re.findall(r'metrics::(?:counter|gauge|histogram)!\(\s*"([a-z0-9_]+)"', f.read_text()))
    return names


def problems(file: str, exprs: list[tuple[str, str]], metrics: dict[str, set[str]],
             from_source: set[str] = frozenset()) -> list[str]:
    """What the expressions name that the daemon does not export, one line each."""
    bad = []
    for where, expr in exprs:
        found = selectors(expr)
        if not found:
            bad.append(f"{file}: {where}: no metric in {expr!r}")
        # A grouping label must be a label of some metric of the expression.
        labels = set(TARGET_LABELS).union(*(metrics.get(n, set()) for n, _ in found if n))
        for label in sorted(grouping_labels(expr) - labels):
            bad.append(f"{file}: {where}: groups by {label!r}, a label of none of its metrics")
        for name, matchers in found:
            if name is None:
                regexes = [v for k, op, v in matchers if k == "__name__"]
                if not regexes or not any(re.fullmatch(r, n) for r in regexes for n in metrics):
                    bad.append(f"{file}: {where}: {{{matchers}}} matches no exported metric")
                continue
            if name in PROMETHEUS_OWN:
                continue
            if name in from_source and name not in metrics:
                continue  # checked against the source, see the module doc
            if name not in metrics:
                bad.append(f"{file}: {where}: metric {name} is not exported by the daemon")
                continue
            for key, _, _ in matchers:
                if key not in TARGET_LABELS and key not in metrics[name]:
                    bad.append(f"{file}: {where}: metric {name} has no label {key!r} "
                               f"(it has {sorted(metrics[name]) or 'none'})")
    return bad


# ---- driving the daemons ----

@pytest.fixture(scope="module")
def root():
    r = Path(tempfile.mkdtemp(prefix="ctc-mc-"))  # short: sockets live under it
    yield r
    shutil.rmtree(r, ignore_errors=True)


def scrape(addr: str) -> str:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        return r.read().decode()


def wait_for_metric(d: Daemon, name: str, timeout: float = 60) -> str:
    def page() -> str | None:
        text = scrape(d.metrics)
        return text if name in exported([text]) else None

    return wait_until(page, timeout, f"{name} on {d.root.name}'s /metrics", interval=0.2,
                      detail=lambda: f"{scrape(d.metrics)}\n{d.log_text()}")


def configure(d: Daemon, *lines: str) -> Daemon:
    d.metrics = f"127.0.0.1:{free_port()}"
    (d.root / "ctcached.toml").write_text("\n".join([f'metrics_addr = "{d.metrics}"', *lines]) + "\n")
    return d


def over_the_uid_share(d: Daemon) -> str:
    """A forked child as uid 65534 (gid 0: the socket is 0660 root:root)
    holds three connections while the share is one: the daemon closes two.
    The child holds them until the refusal is on the daemon's /metrics page,
    which is returned."""
    for p in (d.root.parent, d.root):
        p.chmod(0o750)
    connected_r, connected_w = os.pipe()  # the child says it holds its connections
    release_r, release_w = os.pipe()  # closed by the parent: the child may let go
    pid = os.fork()
    if pid == 0:  # the child: socket calls and the pipes only, then _exit
        status = 1
        try:
            os.close(connected_r)
            os.close(release_w)
            os.setgroups([])
            os.setgid(0)
            os.setuid(65534)
            held = [socket.socket(socket.AF_UNIX) for _ in range(3)]
            for c in held:
                c.connect(str(d.socket))
            os.write(connected_w, b"c")
            os.read(release_r, 1)  # end of file once the parent has seen the refusal (or is gone)
            status = 0
        finally:
            os._exit(status)
    os.close(connected_w)
    os.close(release_r)
    try:
        connected = os.read(connected_r, 1) == b"c"  # end of file: the child ended first
        page = wait_for_metric(d, "ctcache_connections_refused_total") if connected else None
    finally:
        os.close(release_w)
        os.close(connected_r)
        _, status = os.waitpid(pid, 0)
    assert connected and os.waitstatus_to_exitcode(status) == 0, "the uid 65534 child could not connect"
    return page


@pytest.fixture(scope="module")
def pages(root) -> list[str]:
    import test_fleet as fleet  # skips without moto

    mp = pytest.MonkeyPatch()
    fleet.aws_env(mp)
    s3 = fleet.S3Server(root).start()
    hole = fleet.Blackhole()
    got: list[str] = []
    try:
        s3.client().create_bucket(Bucket=fleet.BUCKET)
        pub_a = fleet.keygen("a", root)
        def remote(endpoint: str, *more: str, **kw) -> str:
            return remote_section(f"s3://{fleet.BUCKET}/fleet", endpoint, **kw,
                                  extra=[f"timeout_ms = {fleet.TIMEOUT_MS}", *more])

        first = make_model(root / "first.onnx")
        second = fleet.chain_model(root / "second.onnx", 1)

        # A: local traffic, and the writer.
        a = configure(Daemon(root / "a", watch=root / "watched"), "max_connections_per_uid = 1",
                      remote(s3.endpoint, fetch="always", signing_key=root / "a.secret"))
        a.start()
        try:
            (root / "watched" / "notes.txt").write_text("not a model\n")
            wait_for_metric(a, "ctcache_watcher_events_total")
            r = a.ctl("why-miss", str(first), "W")  # before packing: a Lookup miss
            assert r.returncode == 0, r.describe()
            fleet.resolve_wait(a, first)
            fleet.wait_uploads(a, fleet.FORMATS)
            r = a.ctl("why-miss", str(first), "W")  # a Lookup hit
            assert r.returncode == 0, r.describe()
            # Changes the uploaded bytes, re-signed with A's key: B's audit catches it.
            assert fleet.forge_with_trusted_key(s3, root / "a.secret") == fleet.FORMATS
            fleet.resolve_wait(a, second)
            fleet.wait_uploads(a, 2 * fleet.FORMATS)
            r = a.ctl("gc", "--all", "--yes")
            assert r.returncode == 0, r.describe()
            if os.geteuid() == 0:
                over_the_uid_share(a)  # returns once ctcache_connections_refused_total is on the page
            got.append(wait_for_metric(a, "ctcache_gc_evictions_total"))
        finally:
            a.stop()

        # B: an honest fetch passes its audit, a forged one fails it.
        b = configure(Daemon(root / "b"), remote(s3.endpoint, "audit_rate = 1.0", fetch="always", write=False,
                                                     trusted=[pub_a]))
        b.start()
        try:
            fleet.resolve_wait(b, second)
            fleet.resolve_wait(b, first)
            got.append(wait_for_metric(b, "ctcache_remote_audit_mismatches_total"))
        finally:
            b.stop()

        # C: a remote that never answers.
        # Two formats a weight (the panels beside the 4-bit one): more uploads than the queue holds.
        c = configure(Daemon(root / "c"), "workers = 1",
                      remote(hole.endpoint, "upload_queue = 1", fetch="always", signing_key=root / "a.secret"),
                      '[[policy]]\nformat = "gemm.pack_b.f32"\n', '[[policy]]\nformat = "ort.matmul_nbits"\n')
        c.start()
        try:
            fleet.resolve_wait(c, fleet.chain_model(root / "chain.onnx", 4))
            wait_for_metric(c, "ctcache_remote_upload_drops_total")
            wait_for_metric(c, "ctcache_remote_skipped_total")
            got.append(wait_for_metric(c, "ctcache_remote_errors_total"))
        finally:
            c.stop()
    finally:
        hole.close()
        s3.stop()
        mp.undo()
    return got


# ---- the tests ----

def test_the_contrib_files_are_well_formed():
    d = json.loads(DASHBOARD.read_text())
    assert d["schemaVersion"] >= 36 and d["panels"], DASHBOARD
    uids = set(re.findall(r'"uid":\s*"([^"]*)"', DASHBOARD.read_text()))
    # Only the templated data source (and the dashboard's own uid), never a server's data source uid.
    assert uids <= {"${datasource}", d["uid"]}, uids
    doc = yaml.safe_load(RULES.read_text())
    for g in doc["groups"]:
        for r in g["rules"]:
            where = f"{RULES.name}: {r.get('alert')}"
            assert r.get("alert") and r.get("expr"), where
            assert r.get("labels", {}).get("severity") in ("warning", "critical"), where
            assert r.get("annotations", {}).get("summary") and r["annotations"].get("description"), where
            if "for" in r:
                assert re.fullmatch(r"\d+[smh]", r["for"]), where


def test_every_metric_they_name_is_exported(pages):
    metrics = exported(pages)
    from_source = set()
    if os.geteuid() != 0:
        from_source = NEEDS_ROOT & declared_in_source()
        assert from_source == NEEDS_ROOT, f"no longer in the daemon's source: {NEEDS_ROOT - from_source}"
    bad = (problems("contrib/grafana/ctcache-dashboard.json", dashboard_exprs(DASHBOARD.read_text()),
                    metrics, from_source)
           + problems("contrib/prometheus/ctcache-alerts.yml", rules_exprs(RULES.read_text()),
                      metrics, from_source))
    assert not bad, "\n".join(bad) + "\n\nexported: " + ", ".join(sorted(metrics))


def test_a_name_or_label_the_daemon_does_not_export_fails(pages):
    """The check can fail: a copy of the files with a misspelt metric, a
    suffix the histogram lacks, and a label the metric lacks."""
    metrics = exported(pages)
    rules = RULES.read_text().replace("ctcache_remote_upload_drops_total", "ctcache_remote_upload_dropped_total")
    bad = problems("ctcache-alerts.yml (copy)", rules_exprs(rules), metrics, NEEDS_ROOT)
    assert bad == ["ctcache-alerts.yml (copy): alert CtcacheRemoteUploadDrops: metric "
                   "ctcache_remote_upload_dropped_total is not exported by the daemon"], bad
    dash = DASHBOARD.read_text().replace("ctcache_pack_seconds_count", "ctcache_pack_seconds_total")
    bad = problems("dashboard (copy)", dashboard_exprs(dash), metrics, NEEDS_ROOT)
    assert len(bad) == 1 and "ctcache_pack_seconds_total is not exported" in bad[0], bad
    bad = problems("x", [("expr", 'rate(ctcache_gc_evictions_total{reason="x", job="j"}[5m])')], metrics)
    assert len(bad) == 1 and "has no label 'reason'" in bad[0], bad
    bad = problems("x", [("expr", "sum by (phase) (rate(ctcache_remote_errors_total[5m]))")], metrics)
    assert len(bad) == 1 and "groups by 'phase'" in bad[0], bad


def test_state_gauges_are_on_the_first_scrape(root):
    """Before any request: the build, the store, leases and watches."""
    d = configure(Daemon(root / "fresh"))
    d.start()
    try:
        text = scrape(d.metrics)
        assert {"ctcache_build_info", "ctcache_store_bytes", "ctcache_store_entries", "ctcache_leases",
                "ctcache_watches"} <= set(exported([text])), text
        assert re.search(r'^ctcache_build_info\{version="\d+\.\d+\.\d+"\} 1$', text, re.M), text
        assert re.search(r"^ctcache_store_entries 0$", text, re.M), text
    finally:
        d.stop()


def test_pack_times_are_a_histogram_with_the_packs_in_it(pages):
    """The pack-time quantiles read 0 once a summary's sliding minute had no
    pack; the buckets keep every pack, and Prometheus takes the quantiles."""
    text = "\n".join(pages)
    inf = [float(v) for v in re.findall(r'^ctcache_pack_seconds_bucket\{[^}]*le="\+Inf"[^}]*\} (\S+)$', text, re.M)]
    assert inf and max(inf) >= 1, text[:2000]
    assert not re.search(r"^ctcache_pack_seconds\{[^}]*quantile=", text, re.M)
    sums = [float(v) for v in re.findall(r"^ctcache_pack_seconds_sum\{[^}]*\} (\S+)$", text, re.M)]
    assert sums and max(sums) > 0
