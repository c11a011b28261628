"""A real FUSE filesystem mirroring a fixture tree, whose chosen files block on read.

Run as its own process: python blockingfs.py BACKING MOUNTPOINT HOLD_FILE PATH [PATH ...].
Every file of BACKING is served read-only; a read of one of the PATHs (relative to the
root, e.g. class/infiniband/mlx5_1/ports/1/gids/3) does not return while HOLD_FILE exists,
as a sysfs attribute whose driver command never completes. Removing HOLD_FILE releases
the blocked reads. A HOLD_FILE that holds a number of seconds makes each such read that
slow instead (a working driver on a busy host), not blocked.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from typing import Any

import mfusepy as fuse


class BlockingFS(fuse.Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, backing: str, hold: str, blocking: set[str]) -> None:
        self.backing = backing
        self.hold = hold
        self.blocking = {"/" + p.strip("/") for p in blocking}

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        try:
            st = os.lstat(self._real(path))
        except OSError as exc:
            raise fuse.FuseOSError(exc.errno) from None
        return {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_size", "st_uid",
                                              "st_gid", "st_atime_ns", "st_mtime_ns",
                                              "st_ctime_ns")} | {
            "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    def open(self, path: str, fi: Any) -> int:
        if fi.flags & (os.O_WRONLY | os.O_RDWR):
            raise fuse.FuseOSError(errno.EROFS)
        fi.direct_io = 1  # no page cache: every read reaches read() below, as sysfs reads do
        return 0

    def _slow_for(self) -> float | None:
        """Seconds a read is to take (None: blocked until released, 0: not held)."""
        try:
            with open(self.hold) as f:
                text = f.read().strip()
        except OSError:
            return 0.0
        return float(text) if text else None

    def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
        if path in self.blocking:
            delay = self._slow_for()
            if delay:
                time.sleep(delay)  # a slow driver: the answer comes, late
            while delay is None and self._slow_for() is None:
                time.sleep(0.05)  # a driver that does not answer
        try:
            with open(self._real(path), "rb") as f:
                f.seek(offset)
                return f.read(size)
        except OSError as exc:  # a directory standing for an EINVAL slot, like the kernel's
            raise fuse.FuseOSError(exc.errno or errno.EIO) from None


def main() -> None:
    backing, mountpoint, hold, *blocking = sys.argv[1:]
    fuse.FUSE(BlockingFS(backing, hold, set(blocking)), mountpoint, foreground=True,
              fsname="blockingfs", subtype="blockingfs", ro=True, raw_fi=True)


if __name__ == "__main__":
    main()
