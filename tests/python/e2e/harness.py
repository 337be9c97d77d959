"""Running ctcached and ctcachectl for the end-to-end suite.

* :class:`Daemon` -- one ctcached process on its own ``--cache-dir`` and
  ``--socket`` (optionally ``--watch``), restartable on the same folders.
* :func:`ctl` / :func:`ctl_json` -- ``ctcachectl --socket S ...`` through
  ``tests/python/ctl.py`` (``$CTCACHECTL``), failing on a panic.
* :class:`EventRecorder` -- the daemon's event stream (Python client), read on
  a thread so a test can wait for one event with a deadline, or for every
  event emitted so far (:meth:`EventRecorder.settle`).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

import ctl as ctlmod
from waiting import WaitTimeout, wait_until

START_TIMEOUT_S = 30


def bin_dir() -> Path:
    if os.environ.get("CTCACHE_BIN_DIR"):
        return Path(os.environ["CTCACHE_BIN_DIR"])
    return Path(os.environ.get("CARGO_TARGET_DIR") or "/var/tmp/ctcache-target") / "debug"


def ctcached_path() -> str:
    p = bin_dir() / "ctcached"
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.skip(f"ctcached not built ({p}); build it or set CTCACHE_BIN_DIR")
    return str(p)


def ctl(*args: str, timeout: float = ctlmod.TIMEOUT_S) -> ctlmod.Result:
    """``ctcachectl ARGS`` (no shell); fails the test on a panic, returns the result."""
    return ctlmod.run(*args, timeout=timeout)


def ctl_json(*args: str, timeout: float = ctlmod.TIMEOUT_S) -> dict:
    """``ctcachectl ARGS --json``; fails unless it exits 0 with a JSON document."""
    r = ctl(*args, "--json", timeout=timeout)
    assert r.returncode == 0, r.describe()
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError as e:
        pytest.fail(f"not JSON ({e})\n{r.describe()}")


class Daemon:
    """A ctcached on ``root/cache`` and ``root/s.sock``, watching ``watch`` (if
    any), with ``args`` added to its command line."""

    def __init__(self, root: Path, watch: Path | None = None, workers: int = 1, args: list[str] = ()):
        self.root = root
        self.args = list(args)
        self.cache = root / "cache"
        self.socket = root / "s.sock"
        self.watch = watch
        self.workers = workers
        self.generation = 0
        self.proc: subprocess.Popen | None = None
        self.log = root / "ctcached.log"
        root.mkdir(parents=True, exist_ok=True)
        if watch is not None:
            watch.mkdir(parents=True, exist_ok=True)

    # ---- process ----

    def start(self) -> "Daemon":
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.generation += 1
        self.log = self.root / f"ctcached.{self.generation}.log"
        # An empty config file: built-in defaults (the default policy), whatever
        # ~/.config/ctcache/ctcached.toml or CTCACHE_* say on this machine.
        config = self.root / "ctcached.toml"
        config.touch()
        args = [ctcached_path(), "--config", str(config), "--cache-dir", str(self.cache),
                "--socket", str(self.socket), "--workers", str(self.workers), "--log-format", "human"]
        if self.watch is not None:
            args += ["--watch", str(self.watch)]
        args += self.args
        env = {k: v for k, v in os.environ.items() if not k.startswith("CTCACHE_")}
        env.setdefault("RUST_LOG", "info")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env)
        # The socket appears when the daemon listens; a stale one from a killed
        # process is replaced, so also wait until it answers.
        def answers() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(f"ctcached exited with {self.proc.returncode} at start\n{self.log_text()}")
            return self.socket.exists() and ctl("--socket", str(self.socket), "status", timeout=10).returncode == 0

        try:
            wait_until(answers, START_TIMEOUT_S, f"ctcached answering on {self.socket}")
        except WaitTimeout as e:
            self.stop(signal.SIGKILL)
            pytest.fail(f"{e}\n{self.log_text()}")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout: float = 40) -> int | None:
        """Sends ``sig`` (if running) and returns the exit status (negative: killed by a signal)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-6000:]
        except OSError:
            return "(no log)"

    # ---- ctcachectl through this daemon ----

    def ctl(self, *args: str, timeout: float = ctlmod.TIMEOUT_S) -> ctlmod.Result:
        return ctl("--socket", str(self.socket), *args, timeout=timeout)

    def json(self, *args: str, timeout: float = ctlmod.TIMEOUT_S) -> dict:
        return ctl_json("--socket", str(self.socket), *args, timeout=timeout)

    def entries(self) -> dict[str, dict]:
        """``ls --json`` as {key: entry}."""
        return {e["key"]: e for e in self.json("ls")["entries"]}


class EventRecorder:
    """Collects a daemon's events (``Client.events()``) on a thread, every
    one emitted once the constructor returns (``events()`` returns once the
    daemon follows its feed for the stream).
    """

    def __init__(self, ctcache, socket: Path, scratch: Path):
        self._client = ctcache.connect(socket, timeout=10)
        self._scratch = scratch
        self.events: list = []
        self._q: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self._stream = self._client.events()
        self._thread = threading.Thread(target=self._run, name="ctcache-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for ev in self._stream:
                self.events.append(ev)
                self._q.put(ev)
        except BaseException as e:  # the daemon went away, or close()
            self.error = e
        finally:
            self._q.put(None)

    def wait_for(self, pred, timeout: float, what: str):
        """The first event (not yet consumed by wait_for) matching ``pred``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no event {what} within {timeout} s; got {[(e.kind, e.detail) for e in self.events]}")
            try:
                ev = self._q.get(timeout=left)
            except queue.Empty:
                continue
            if ev is None:
                pytest.fail(f"the event stream ended before {what}: {self.error!r}")
            if pred(ev):
                return ev

    def _marker(self):
        """The scratch folder's path, and a matcher for the daemon's watcher events about it."""
        self._scratch.mkdir(parents=True, exist_ok=True)
        marker = str(self._scratch.resolve())

        def watcher_event(word):
            return lambda e: e.kind == "watcher" and e.model_path == marker and word in e.detail

        return marker, watcher_event

    def settle(self, daemon: Daemon, timeout: float = 30) -> None:
        """Returns once every event the daemon emitted before this call is in
        :attr:`events`: the feed is in order, so a marker event emitted now
        (a watch added on the scratch folder, then removed) comes after them.
        A check that something did *not* happen looks at :attr:`events` then."""
        marker, watcher_event = self._marker()
        daemon.json("watch", "add", marker)
        self.wait_for(watcher_event("added"), timeout, what="the marker (watch added)")
        daemon.json("watch", "remove", marker)
        self.wait_for(watcher_event("removed"), timeout, what="the marker (watch removed)")

    def close(self) -> None:
        self._client.close()
        self._thread.join(timeout=10)
