"""The running daemon's status file: what `nodeagent status` reads.

Written atomically after every pass; it carries the daemon's pid and the time of the pass so
a reader can tell a dead daemon or a wedged loop from a healthy one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.fsutil import write_json_atomic

STATUS_FILE = "status.json"


def status_path(runtime_dir: Path) -> Path:
    return Path(runtime_dir) / STATUS_FILE


def write_status(runtime_dir: Path, report: dict[str, Any], daemon: dict[str, Any]) -> None:
    data = dict(report)
    data["daemon"] = {**daemon, "pid": os.getpid(), "updated_at": time.time()}
    write_json_atomic(status_path(runtime_dir), data)


@dataclass(frozen=True)
class StatusView:
    data: dict[str, Any]
    running: bool
    age: float
    stale: bool

    @property
    def problem(self) -> str | None:
        pid = self.data.get("daemon", {}).get("pid")
        if not self.running:
            return f"daemon is not running (pid {pid} is gone); last status is {self.age:.0f}s old"
        if self.stale:
            return f"status is stale: last pass {self.age:.0f}s ago (daemon pid {pid} wedged?)"
        return None


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_status(runtime_dir: Path, stale_after: float) -> StatusView:
    """Raises FileNotFoundError when the daemon never wrote one, ValueError when corrupt."""
    raw = json.loads(status_path(runtime_dir).read_text(encoding="utf-8"))
    if not isinstance(raw, dict) or not isinstance(raw.get("daemon"), dict):
        raise ValueError("not a nodeagent status file")
    daemon = raw["daemon"]
    age = max(0.0, time.time() - float(daemon.get("updated_at", 0)))
    running = _pid_alive(daemon.get("pid"))
    return StatusView(data=raw, running=running, age=age, stale=age > stale_after)
