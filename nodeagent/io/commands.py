"""Probe commands in child processes with a timeout, at most one outstanding per key.

A command that touches a dead mount may sit in uninterruptible sleep for good: it is left
running, and no second one is started for its key while it does.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from nodeagent.io.bounded import BoundedReads
from nodeagent.model.lustre import ProbeResult


@dataclass
class BoundedRunner:
    """Runs probe commands in child processes, at most one outstanding per key."""

    outstanding: dict[str, tuple[subprocess.Popen[str], float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    reads: BoundedReads = field(default_factory=BoundedReads)  # health_check, off-thread

    def run(self, key: str, argv: list[str], timeout: float) -> ProbeResult:
        with self.lock:
            stuck = self.outstanding.get(key)
            if stuck is not None:
                proc, started = stuck
                if proc.poll() is None:
                    return ProbeResult(False, False, time.monotonic() - started,
                                       already_running=True)
                del self.outstanding[key]  # it finished at last: probe afresh
            started = time.monotonic()
            try:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, text=True,
                                        start_new_session=True)
            except OSError as exc:
                return ProbeResult(True, False, 0.0, f"cannot run {argv[0]}: {exc}")
            self.outstanding[key] = (proc, started)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Leave it: it may sit in uninterruptible sleep; the next probe waits for it.
            return ProbeResult(False, False, time.monotonic() - started)
        with self.lock:
            self.outstanding.pop(key, None)
        return ProbeResult(True, proc.returncode == 0, time.monotonic() - started, out or "")

    def stuck(self) -> int:
        with self.lock:
            return sum(1 for p, _ in self.outstanding.values() if p.poll() is None)


# The process each check runs under, which nothing the check starts can leave (its module
# says how); run by path with an isolated interpreter that imports only the standard library.
CHECK_SCOPE = Path(__file__).with_name("check_scope.py")
SCOPE_GRACE = 3.0  # for a scope asked to stop: its sweep gives up on a child after 2 s


class ProcessGroups:
    """The scopes of the checks running now: all asked to stop at once when their owner
    stops (the daemon's SIGTERM must not leave a ten-minute check running)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[int] = set()
        self._closed = False

    def add(self, pgid: int) -> bool:
        """False once closed: the caller kills what it just started."""
        with self._lock:
            if not self._closed:
                self._running.add(pgid)
            return not self._closed

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._running.discard(pgid)

    def kill_all(self) -> None:
        with self._lock:
            self._closed = True
            running = list(self._running)
        for pgid in running:
            _stop_scope(pgid)


@dataclass(frozen=True)
class CommandRun:
    returncode: int | None  # None: it did not finish in time, or could not be started
    output: bytes  # the start of its stdout, at most the cap
    seconds: float
    error: str | None = None  # why there is no return code


DRAIN_GRACE = 0.5  # output still read this long after the check ended


def run_bounded(argv: list[str], timeout: float, max_output: int = 4096,
                groups: ProcessGroups | None = None) -> CommandRun:
    """Run a check in its scope (check_scope.py): stdout kept up to `max_output` bytes (the
    rest read and dropped, so a chatty program never blocks), stderr discarded. When it
    ends, or past `timeout`, the scope kills it and everything it started, however it
    detached (setsid, a double fork): a check leaves nothing behind. Its output is read
    for DRAIN_GRACE after it ended, then the pipe is closed: nothing that holds the pipe
    keeps a thread waiting on it. With `groups`, its scope is stopped when they are."""
    started = time.monotonic()
    proc = _start_scope(argv)
    if isinstance(proc, str):
        return CommandRun(None, b"", 0.0, proc)
    if groups is not None and not groups.add(proc.pid):
        _stop_scope(proc.pid)  # its owner stopped while it started
    assert proc.stdout is not None
    pipe = proc.stdout
    kept: list[bytes] = []
    ended = threading.Event()
    reader = threading.Thread(target=_drain, args=(pipe, ended, kept, max_output),
                              name="check-output", daemon=True)
    reader.start()
    try:
        error = _wait_or_kill(proc, timeout)
    finally:
        ended.set()
        reader.join(DRAIN_GRACE + 1.0)
        with contextlib.suppress(OSError):
            pipe.close()
        if groups is not None:
            groups.discard(proc.pid)
    return CommandRun(None if error else proc.returncode, b"".join(kept),
                      time.monotonic() - started, error)


def _start_scope(argv: list[str]) -> subprocess.Popen[bytes] | str:
    """The check started in its scope, or why it cannot run, in one line."""
    if shutil.which(argv[0]) is None:
        why = "no such file" if os.sep in argv[0] and not os.path.exists(argv[0]) else \
            "not an executable" if os.sep in argv[0] else "not found on PATH"
        return f"cannot run {argv[0]}: {why}"
    try:
        return subprocess.Popen([sys.executable, "-I", "-S", str(CHECK_SCOPE), "--", *argv],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        return f"cannot run {argv[0]}: {exc.strerror or exc}"


def _drain(pipe: IO[bytes], ended: threading.Event, kept: list[bytes], max_output: int) -> None:
    """Read the check's output until it is closed, or DRAIN_GRACE after the check ended;
    keep the first `max_output` bytes."""
    size, until = 0, None
    with contextlib.suppress(OSError, ValueError):
        while until is None or time.monotonic() < until:
            if until is None and ended.is_set():
                until = time.monotonic() + DRAIN_GRACE
            if not select.select([pipe], [], [], 0.05)[0]:
                continue
            chunk = os.read(pipe.fileno(), 65536)
            if not chunk:
                return
            if size < max_output:
                kept.append(chunk[: max_output - size])
            size += len(chunk)


def _wait_or_kill(proc: subprocess.Popen[bytes], timeout: float) -> str | None:
    """Wait for the check; past `timeout` its scope is stopped: why, or None when it ended."""
    try:
        proc.wait(timeout)
        return None
    except subprocess.TimeoutExpired:
        _stop_scope(proc.pid)
        try:
            proc.wait(SCOPE_GRACE)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)  # a scope that does not answer: its own group at least
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(1.0)  # one in uninterruptible sleep is left: it cannot hold us
        return f"no answer within {timeout:g} s (killed)"


def _stop_scope(pid: int) -> None:
    """Ask a check's scope to kill the check and all it started, and to exit."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
