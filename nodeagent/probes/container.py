"""What a training container sees of the fabric (read by `nodeagent preflight`, inside the
pod): the RDMA devices it may open, and its environment. Every reader takes its roots.

A device is usable from a container when its uverbs character device is there and opens:
the RDMA device plugin mounts `/dev/infiniband/uverbsN` and lets the device cgroup open it
(a container without the resource has no such node, or one it may not open, EPERM).
`/sys/class/infiniband_verbs/uverbsN/ibdev` names the RDMA device behind it
(drivers/infiniband/core/uverbs_main.c, `ibdev_show`).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from nodeagent.io.files import describe_error, read_text_bounded
from nodeagent.model import VerbsDevice


def read_verbs_devices(dev_root: Path, sysfs_root: Path) -> list[VerbsDevice]:
    """Every uverbs node under <dev_root>/infiniband, with its RDMA device's name."""
    base = dev_root / "infiniband"
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith("uverbs"))
    except OSError:
        return []
    return [_one(base / name, sysfs_root) for name in names[:256]]


def _one(node: Path, sysfs_root: Path) -> VerbsDevice:
    ibdev: str | None
    try:
        ibdev = read_text_bounded(sysfs_root / "class" / "infiniband_verbs" / node.name
                                  / "ibdev", 256).strip() or None
    except OSError:
        ibdev = None
    try:
        if not stat.S_ISCHR(os.stat(node).st_mode):
            return VerbsDevice(node.name, ibdev, False, f"{node} is not a character device")
        fd = os.open(node, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        why = ("the container may not open it (device cgroup)" if exc.errno == errno.EPERM
               else describe_error(exc))
        return VerbsDevice(node.name, ibdev, False, f"{node}: {why}")
    os.close(fd)
    return VerbsDevice(node.name, ibdev, True)
