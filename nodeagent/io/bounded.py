"""Reads that may block in a driver, run where a stuck one costs only its own fact.

A wedged sysfs attribute (a firmware command that never completes, a hung FUSE-backed root)
blocks the reading thread in the kernel, and nothing in Python can interrupt it. So the
agent never makes such a read on its main loop: each fact (one device's GID table, one rail's
counters or sysctls, Lustre's health_check) is read on a worker thread and waited for up to a
deadline. A read still running then is reported as stuck, with the path it was on, and left
alone: while it is stuck no second read of the same fact starts, so one wedged attribute
costs at most one thread, never a pile of them, and never the loop.

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
    def __init__(self, deadline: float = DEADLINE) -> None:
        self.deadline = deadline
        self._jobs: queue.SimpleQueue[_Call[Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers = 0
        self._idle = 0
        self._pending: dict[str, _Call[Any]] = {}  # key -> a call not yet returned
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
        the deadline. A call whose previous run is still stuck is not started again.
        An exception in a call is raised here, in the caller's thread."""
        started: dict[str, _Call[T]] = {}
        out: dict[str, T | Stuck] = {}
        now = time.monotonic()
        for key, fn in calls.items():
            with self._lock:
                old = self._pending.get(key)
                if old is not None and not old.done.is_set():
                    out[key] = Stuck(key, now - old.started, old.where.path)
                    continue
                call: _Call[T] = _Call(fn)
                self._pending[key] = call
            started[key] = call
            self._submit(call)
        end = now + self.deadline
        for key, call in started.items():
            if not self._wait(call, end):
                out[key] = Stuck(key, time.monotonic() - call.started, call.where.path)
                continue
            with self._lock:
                self._pending.pop(key, None)
            if call.error is not None:
                raise call.error
            out[key] = call.result  # type: ignore[assignment]
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

    def stuck(self) -> list[Stuck]:
        """The reads still stuck now (for the status file and metrics)."""
        now = time.monotonic()
        with self._lock:
            return [Stuck(k, now - c.started, c.where.path)
                    for k, c in self._pending.items() if not c.done.is_set()]
