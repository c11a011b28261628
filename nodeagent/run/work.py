"""What the loop is handed: by the sources, the signal handlers and its own timers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Work:
    kind: str  # "event" | "resync" | "reload" (SIGHUP) | "reloaded" (config read, or why not)
    #   | "stop" | "status" (rewrite status file)
    #   | "gid" (a watched slot changed) | "lustre" | "deviceplugin" (new observations)
    msg: Any = None
