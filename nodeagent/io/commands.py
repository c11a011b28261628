"""Probe commands in child processes with a timeout, at most one outstanding per key.

A command that touches a dead mount may sit in uninterruptible sleep for good: it is left
running, and no second one is started for its key while it does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from nodeagent.io.bounded import BoundedReads
from nodeagent.model import ProbeResult


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


@dataclass(frozen=True)
class CommandRun:
    returncode: int | None  # None: it did not finish in time, or could not be started
    output: bytes  # the start of its stdout, at most the cap
    seconds: float
    error: str | None = None  # why there is no return code


def run_bounded(argv: list[str], timeout: float, max_output: int = 4096) -> CommandRun:
    """Run a check: stdout kept up to `max_output` bytes (the rest read and dropped, so a
    chatty program never blocks), stderr discarded; past `timeout` its whole process group
    is killed. Whatever it left running in its group is killed when it ends too: a check
    must not leave anything behind."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        return CommandRun(None, b"", 0.0, f"cannot run {argv[0]}: {exc.strerror or exc}")
    kept: list[bytes] = []
    assert proc.stdout is not None
    pipe = proc.stdout

    def drain() -> None:
        size = 0
        with contextlib.suppress(OSError, ValueError):
            while chunk := os.read(pipe.fileno(), 65536):
                if size < max_output:
                    kept.append(chunk[: max_output - size])
                size += len(chunk)

    reader = threading.Thread(target=drain, name="check-output", daemon=True)
    reader.start()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(1.0)  # one in uninterruptible sleep is left; it cannot hold the caller
        reader.join(0.5)
        return CommandRun(None, b"".join(kept), time.monotonic() - started,
                          f"no answer within {timeout:g} s (killed)")
    _kill_group(proc.pid)  # its leftovers, e.g. a background child holding stdout
    reader.join(1.0)
    with contextlib.suppress(OSError):
        pipe.close()
    return CommandRun(proc.returncode, b"".join(kept), time.monotonic() - started)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
