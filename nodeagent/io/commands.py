"""Probe commands in child processes with a timeout, at most one outstanding per key.

A command that touches a dead mount may sit in uninterruptible sleep for good: it is left
running, and no second one is started for its key while it does.
"""

from __future__ import annotations

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
