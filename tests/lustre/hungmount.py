"""A FUSE mount that hangs on demand, and how to count the probes stuck on it."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
SOURCE = "10.0.0.1@o2ib:/scratch"


@dataclass
class HungMount:
    mountpoint: Path
    hold: Path
    proc: subprocess.Popen[bytes]

    def hang(self) -> None:
        self.hold.touch()

    def release(self) -> None:
        self.hold.unlink(missing_ok=True)

    def lustre_config(self, timeout: str = "1s") -> dict[str, object]:
        return {"mountpoint": str(self.mountpoint), "source": SOURCE, "fstype": "fuse.hungfs",
                "timeout": timeout}


def stuck_probes(mountpoint: Path) -> int:
    """statfs children of the agent still waiting on this mountpoint."""
    count = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0] == b"stat" and str(mountpoint).encode() in argv:
            count += 1
    return count
