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
import ipaddress
import os
import socket
import stat
from pathlib import Path

from nodeagent.io.files import describe_error, read_attribute, read_text_bounded
from nodeagent.model.jobs import GidSlot, PortView, VerbsDevice


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


def read_port_views(sysfs_root: Path, limit: int = 1024) -> list[PortView]:
    """Every RDMA port this process's sysfs shows, with every GID slot as NCCL reads it:
    <dev>/ports/<p>/state ('4: ACTIVE'), link_layer, gids/<i> (all zeros when empty) and
    gid_attrs/types/<i> (EINVAL for an empty slot, or in a pod for one whose netdev is
    elsewhere: NVIDIA/nccl#1573)."""
    base = sysfs_root / "class" / "infiniband"
    try:
        devices = sorted(os.listdir(base))[:64]
    except OSError:
        return []
    out = []
    for device in devices:
        try:
            ports = sorted(int(p) for p in os.listdir(base / device / "ports") if p.isdigit())
        except OSError:
            continue
        for port in ports[:8]:
            out.append(_port_view(base / device / "ports" / str(port), device, port, limit))
    return out


def _attr(path: Path) -> tuple[str | None, int]:
    try:
        return read_attribute(path), 0
    except OSError as exc:
        return None, exc.errno or errno.EIO


def _port_view(base: Path, device: str, port: int, limit: int) -> PortView:
    state, _ = _attr(base / "state")
    word = (state or "").partition(":")[2].strip() or (state or "").strip()
    layer, _ = _attr(base / "link_layer")
    try:
        names = sorted((n for n in os.listdir(base / "gids") if n.isdigit()), key=int)[:limit]
    except OSError:
        names = []
    slots = []
    for name in names:
        text, _ = _attr(base / "gids" / name)
        try:
            gid = ipaddress.IPv6Address((text or "").strip())
        except ValueError:
            gid = ipaddress.IPv6Address(0)
        kind, err = _attr(base / "gid_attrs" / "types" / name)
        version = {"IB/RoCE v1": 1, "RoCE v1": 1, "RoCE v2": 2}.get((kind or "").strip())
        slots.append(GidSlot(int(name), gid, version,
                             missing=err in (errno.ENOENT, errno.ENOTDIR)))
    return PortView(device, port, word == "ACTIVE", (layer or "").strip() == "Ethernet",
                    tuple(slots), word or "state unreadable")


def read_interfaces() -> tuple[list[str], list[str]]:
    """This network namespace's interfaces that are up and running with an address (what
    NCCL_SOCKET_IFNAME may name), and its IPv4 addresses."""
    from pyroute2 import IPRoute

    running: set[int] = set()
    names: dict[int, str] = {}
    with IPRoute() as ipr:
        for link in ipr.get_links():
            names[link["index"]] = link.get_attr("IFLA_IFNAME") or ""
            if link["flags"] & 0x40:  # IFF_RUNNING
                running.add(link["index"])
        addrs = [(a["index"], a["family"], a.get_attr("IFA_ADDRESS")) for a in ipr.get_addr()]
    up = sorted({names[i] for i, _, _ in addrs if i in running and i in names})
    v4 = [addr for _, fam, addr in addrs if fam == socket.AF_INET and addr]
    return up, v4
