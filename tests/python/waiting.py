"""The suite's one way to wait for something: :func:`wait_until`, a poll of
the condition itself with a deadline.

A test waits on what it needs (a socket answering, a metric on a page, a
count reaching n, the clock passing a time the daemon stated), never for a
fixed time that assumes how long something takes. Where the daemon says
what happened as an event, a test waits on the event instead
(``e2e.harness.EventRecorder.wait_for``). This module's ``time.sleep`` is
the poll interval, the suite's one such call.

Standard library only: bench scripts import it through garage_cluster.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: How often a condition is looked at, unless a caller says otherwise.
INTERVAL_S = 0.05


class WaitTimeout(AssertionError):
    """A condition did not hold within its deadline (a test failure under pytest)."""


def wait_until(predicate: Callable[[], T], timeout: float, what: str, *,
               interval: float = INTERVAL_S, ignore: tuple[type[BaseException], ...] = (),
               detail: Callable[[], str] | None = None,
               error: type[BaseException] = WaitTimeout) -> T:
    """Calls ``predicate`` until it returns a true value, and returns that value.

    ``timeout`` seconds after the first call, raises ``error`` (default
    :class:`WaitTimeout`) saying ``what`` was waited for, the last value (or
    the last ignored exception) and ``detail()`` (a log tail, say) when given.
    An exception of a type in ``ignore`` counts as "not yet"; any other
    exception from ``predicate`` (an assertion that a process still runs, say)
    propagates at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            last = predicate()
        except ignore as e:
            last = e
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            message = f"{what}: not within {timeout:g} s (last: {last!r})"
            if detail is not None:
                message += "\n" + detail()
            raise error(message)
        time.sleep(interval)


def now_ms() -> int:
    """The wall clock in unix milliseconds, as the daemon stamps entries and leases."""
    return time.time_ns() // 1_000_000


def clock_past(unix_ms: int, what: str, timeout: float = 10) -> None:
    """Waits until the wall clock's millisecond is later than ``unix_ms`` (a
    time the daemon stated), so that a stamp taken from now on is greater."""
    wait_until(lambda: now_ms() > unix_ms, timeout, f"the clock to pass {unix_ms} ms ({what})",
               interval=0.001)
