"""Reads that may block in a driver, run where a stuck one costs only its own fact.

A wedged sysfs attribute (a firmware command that never completes, a hung FUSE-backed root)
blocks the reading thread in the kernel, and nothing in Python can interrupt it. So the
agent never makes such a read on its main loop: each fact (one device's GID table, one rail's
counters or sysctls, Lustre's health_check) is read on a worker thread and waited for up to a
deadline. A read still running then is slow or stuck, and left alone: while it runs no second
read of the same fact starts, so one wedged attribute costs at most one thread, never a pile
of them, and never the loop.

Slow is not stuck. On a loaded host (a GPU node's CPUs are busy by design) a working read can
wait hundreds of milliseconds for a CPU and the GIL: 0.7 s was seen in the TCG lab with two
CPU-bound processes beside it. Such a read keeps its fact at the value its last completed
read returned (never a guess) until it has run for STUCK_AFTER, and only then is the fact
reported stuck (Unknown, with the path it is on). A fact read for the first time has no last
value: its pass waits for it up to STUCK_AFTER (the daemon repairs meanwhile: while_waiting).

Workers are daemon threads: a command like `check` exits even if a read never returns.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

DEADLINE = 0.5  # seconds a pass waits for its reads, all of them together
# Seconds a read may run before its fact is Unknown: ten times the pass's deadline, far past
# any wait for a CPU (a runnable thread gets one within tens of ms on a busy host, hundreds
# under emulation), yet well inside the 30 s cadence of node-problem-detector's plugins, so
# a wedged driver is named before any other tool would notice it.
STUCK_AFTER = 5.0
MAX_WORKERS = 64
WAIT_SLICE = 0.002  # seconds between calls of while_waiting


class Where:
    """What a read is doing now: a stuck one is reported with the path it is on."""

    __slots__ = ("path",)

    def __init__(self) -> None:
        self.path = ""


@dataclass(frozen=True)
class Stuck:
    """A read that did not return within the deadline (or is still stuck from before)."""

    key: str
    seconds: float
    path: str

    def describe(self) -> str:
        where = f" at {self.path}" if self.path else ""
        return f"read of {self.key}{where} has not returned for {self.seconds:.1f}s"


class _Call(Generic[T]):
    __slots__ = ("done", "error", "fn", "result", "started", "where")

    def __init__(self, fn: Callable[[Where], T]) -> None:
        self.fn = fn
        self.where = Where()
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None
        self.started = time.monotonic()


class BoundedReads:
    def __init__(self, deadline: float = DEADLINE, stuck_after: float = STUCK_AFTER) -> None:
        self.deadline = deadline
        self.stuck_after = max(stuck_after, deadline)
        self._jobs: queue.SimpleQueue[_Call[Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers = 0
        self._idle = 0
        self._pending: dict[str, _Call[Any]] = {}  # key -> a call not yet returned
        self._last: dict[str, Any] = {}  # key -> what its last completed read returned
        # Called every WAIT_SLICE while a caller waits (the daemon repairs deletions that
        # arrive meanwhile: the thread is idle until the reads return anyway).
        self.while_waiting: Callable[[], None] | None = None

    def _work(self) -> None:
        while True:
            call = self._jobs.get()
            with self._lock:
                self._idle -= 1
            try:
                call.result = call.fn(call.where)
            except BaseException as exc:  # handed to the caller, never lost in a thread
                call.error = exc
            call.done.set()
            with self._lock:
                self._idle += 1

    def _submit(self, call: _Call[Any]) -> None:
        with self._lock:
            if self._idle == 0 and self._workers < MAX_WORKERS:
                self._workers += 1
                self._idle += 1
                threading.Thread(target=self._work, name="bounded-read", daemon=True).start()
        self._jobs.put(call)

    def run(self, calls: Mapping[str, Callable[[Where], T]]) -> dict[str, T | Stuck]:
        """Run every call (keyed by the fact it reads) and wait for them together, at most
        the deadline; a call still running then answers with its fact's last value until
        it is stuck (see the module's doc). A call whose previous run has not returned is
        not started again. An exception in a call is raised here, in the caller's thread."""
        running: dict[str, _Call[T]] = {}
        for key, fn in calls.items():
            with self._lock:
                old = self._pending.get(key)
                if old is not None and not old.done.is_set():
                    running[key] = old  # still running from an earlier pass
                    continue
                if old is not None and old.error is None:  # returned after its pass gave up
                    self._last[key] = old.result
                call: _Call[T] = _Call(fn)
                self._pending[key] = call
            running[key] = call
            self._submit(call)
        end = time.monotonic() + self.deadline
        out: dict[str, T | Stuck] = {}
        for key, call in running.items():
            done = self._wait(call, end)
            if not done and key not in self._last:  # nothing known yet: wait until stuck
                done = self._wait(call, call.started + self.stuck_after)
            if done:
                with self._lock:
                    self._pending.pop(key, None)
                if call.error is not None:
                    self._last.pop(key, None)
                    raise call.error
                out[key] = self._last[key] = call.result  # type: ignore[assignment]
            elif time.monotonic() - call.started < self.stuck_after:
                out[key] = self._last[key]  # slow, not stuck: the fact as last read
            else:
                out[key] = Stuck(key, time.monotonic() - call.started, call.where.path)
        return {key: out[key] for key in calls}

    def _wait(self, call: _Call[Any], end: float) -> bool:
        hook = self.while_waiting
        while True:
            left = end - time.monotonic()
            if hook is None or left <= 0:
                return call.done.wait(max(0.0, left))
            if call.done.wait(min(left, WAIT_SLICE)):
                return True
            hook()

    def one(self, key: str, fn: Callable[[Where], T]) -> T | Stuck:
        return self.run({key: fn})[key]
