"""A real Prometheus (Debian's package, which tests/run.sh installs) scrapes a
daemon and finds its state gauges, and the shipped alert rules pass
``promtool check rules``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from e2e.harness import Daemon
from garage_cluster import free_port
from test_metrics_contrib import RULES, configure
from waiting import wait_until

SCRAPE_DEADLINE_S = 60


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: tests/run.sh installs Debian's prometheus package"
    return path


def test_the_shipped_alert_rules_pass_promtool():
    r = subprocess.run([tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        doc = json.load(r)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


@pytest.fixture
def daemon(tmp_path):
    d = configure(Daemon(tmp_path / "d"))
    d.start()
    try:
        yield d
    finally:
        d.stop()


def test_prometheus_scrapes_the_daemon(daemon, tmp_path: Path):
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: ctcache\n"
        f"    static_configs:\n      - targets: ['{daemon.metrics}']\n"
    )
    log = open(tmp_path / "prometheus.log", "wb")
    p = subprocess.Popen([tool("prometheus"), f"--config.file={config}",
                          f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def scraped() -> list:
            assert p.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            return query(port, 'ctcache_build_info{job="ctcache"}')

        found = wait_until(scraped, SCRAPE_DEADLINE_S, "ctcache_build_info scraped by Prometheus", interval=0.5,
                           ignore=(OSError,), detail=lambda: (tmp_path / "prometheus.log").read_text()[-3000:])
        assert found[0]["metric"]["version"], found
        assert [r["value"][1] for r in query(port, 'up{job="ctcache"}')] == ["1"]
        assert query(port, "ctcache_store_entries"), "the store gauge was not scraped"
    finally:
        p.terminate()
        p.wait(timeout=30)
        log.close()
