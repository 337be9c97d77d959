"""Locating and running the ``ctcachectl`` binary from the Python tests.

The binary is ``$CTCACHECTL`` if set, else
``${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}/debug/ctcachectl``.  Tests that need it
are skipped (not failed) when it does not exist, so the suite can be collected before
the Rust side is built.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

import pytest

TIMEOUT_S = 120  # per invocation; a hang (e.g. on a nesting bomb) is a failure

PANIC_MARKERS = ("panicked", "RUST_BACKTRACE")


def ctcachectl_path() -> str:
    env = os.environ.get("CTCACHECTL")
    if env:
        return env
    target = os.environ.get("CARGO_TARGET_DIR") or "/var/tmp/ctcache-target"
    return os.path.join(target, "debug", "ctcachectl")


def require_ctcachectl() -> str:
    path = ctcachectl_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"ctcachectl not built ({path}); set CTCACHECTL or build it")
    return path


@dataclass
class Result:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return (
            f"$ ctcachectl {' '.join(self.args)}\n"
            f"exit {self.returncode}\n--- stdout ---\n{self.stdout[:4000]}\n"
            f"--- stderr ---\n{self.stderr[:4000]}"
        )


def run(*args: str, timeout: float = TIMEOUT_S, cwd: str | None = None) -> Result:
    """Run ctcachectl with ``args`` (no shell), capturing text output."""
    exe = require_ctcachectl()
    env = dict(os.environ)
    env.pop("RUST_BACKTRACE", None)  # a panic must not be hidden or provoked by the env
    try:
        p = subprocess.run(
            [exe, *args], capture_output=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL, cwd=cwd
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"ctcachectl {' '.join(args)} did not finish within {timeout} s")
    r = Result(
        list(args),
        p.returncode,
        p.stdout.decode("utf-8", "replace"),
        p.stderr.decode("utf-8", "replace"),
    )
    assert_no_panic(r)
    return r


def assert_no_panic(r: Result) -> None:
    for marker in PANIC_MARKERS:
        assert marker not in r.stderr and marker not in r.stdout, "panic output\n" + r.describe()
    # A Rust panic exits with 101; a signal gives a negative code.
    assert r.returncode not in (101,) and r.returncode >= 0, "crashed\n" + r.describe()


def digest_json(model: str, algorithm: str | None = None, cwd: str | None = None) -> dict:
    """``ctcachectl digest MODEL [--algorithm A] --json`` -> {name: initializer entry}."""
    args = ["digest", model]
    if algorithm is not None:
        args += ["--algorithm", algorithm]
    args.append("--json")
    r = run(*args, cwd=cwd)
    assert r.returncode == 0, r.describe()
    try:
        doc = json.loads(r.stdout)
    except json.JSONDecodeError as e:
        pytest.fail(f"digest --json output is not JSON ({e})\n{r.describe()}")
    assert isinstance(doc, dict) and isinstance(doc.get("initializers"), list), r.describe()
    out = {}
    for entry in doc["initializers"]:
        for key in ("name", "data_type", "dims", "storage", "algorithm", "digest"):
            assert key in entry, f"missing {key!r} in {entry}"
        assert entry["name"] not in out, f"duplicate initializer {entry['name']}"
        out[entry["name"]] = entry
    return out


def run_json(*args: str) -> dict:
    """Run ctcachectl with ``--json`` and parse stdout; fails on a non-zero exit."""
    r = run(*args, "--json")
    assert r.returncode == 0, r.describe()
    return json.loads(r.stdout)
