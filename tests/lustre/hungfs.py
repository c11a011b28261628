"""A real FUSE filesystem whose statfs blocks while a control file exists.

Run as its own process: python hungfs.py MOUNTPOINT FSNAME HOLD_FILE. It mounts in the
foreground; the test creates HOLD_FILE to make statfs hang (as on a dead Lustre server)
and removes it to release the hung calls.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time
from typing import Any

import mfusepy as fuse


class HungFS(fuse.Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, hold: str) -> None:
        self.hold = hold

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        if path != "/":
            raise fuse.FuseOSError(errno.ENOENT)
        now = time.time()
        ns = int(now * 1e9)
        return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, "st_atime": ns,
                "st_mtime": ns, "st_ctime": ns}

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", ".."]

    def statfs(self, path: str) -> dict[str, int]:
        while os.path.exists(self.hold):  # a dead server: the call just does not return
            time.sleep(0.05)
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 20, "f_bfree": 1 << 19,
                "f_bavail": 1 << 19, "f_files": 1000, "f_ffree": 900, "f_namemax": 255}


def main() -> None:
    mountpoint, fsname, hold = sys.argv[1:4]
    fuse.FUSE(HungFS(hold), mountpoint, foreground=True, fsname=fsname, subtype="hungfs")


if __name__ == "__main__":
    main()
