"""Read RoCE GID tables: from sysfs (always there) or through pyverbs (when it can be had).

Both readers produce the same model (`GidTable` of `GidEntry`), so checks never know which
was used. The kernel layout (drivers/infiniband/core/sysfs.c):
  <sysfs>/class/infiniband/<dev>/ports/<p>/gids/<i>             all zeros when empty
  <sysfs>/class/infiniband/<dev>/ports/<p>/gid_attrs/types/<i>  'IB/RoCE v1' | 'RoCE v2'
  <sysfs>/class/infiniband/<dev>/ports/<p>/gid_attrs/ndevs/<i>  netdev name
(types and ndevs fail with EINVAL for an empty slot).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from nodeagent.io.bounded import BoundedReads, Stuck, Where
from nodeagent.io.files import NotARegularFile, open_counted, read_attribute
from nodeagent.model.rdma import GidEntry, GidReadError, GidTable, GidType
from nodeagent.probes.verbs import load as load_pyverbs

GidSource = Literal["auto", "pyverbs", "sysfs"]

# pyverbs numbers GID types differently in its two calls (design notes):
# query_gid_table / GIDEntry.gid_type: IBV_GID_TYPE_IB=0, IBV_GID_TYPE_ROCE_V1=1, ROCE_V2=2;
# query_gid_type: IBV_GID_TYPE_SYSFS_IB_ROCE_V1=0, IBV_GID_TYPE_SYSFS_ROCE_V2=1.
_ENTRY_TYPES = {0: GidType.IB_ROCE_V1, 1: GidType.IB_ROCE_V1, 2: GidType.ROCE_V2}
_SYSFS_ENUM_TYPES = {0: GidType.IB_ROCE_V1, 1: GidType.ROCE_V2}
_TYPE_STRINGS = {t.value: t for t in GidType}


def gid_type_from_entry(value: int) -> GidType:
    return _ENTRY_TYPES.get(value, GidType.UNKNOWN)


def gid_type_from_query(value: int) -> GidType:
    return _SYSFS_ENUM_TYPES.get(value, GidType.UNKNOWN)


def parse_gid(text: str) -> str | None:
    """Kernel GID text -> canonical form ('::ffff:10.0.0.5' for IPv4); None if empty.

    Raises ValueError on text that is not a GID at all.
    """
    addr = ipaddress.IPv6Address(text.strip())
    if addr.packed == bytes(16):
        return None
    if addr.ipv4_mapped is not None:
        # Spell IPv4-mapped GIDs one way whatever the Python version prints.
        return f"::ffff:{addr.ipv4_mapped}"
    return str(addr)


_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def _read_text(path: Path, where: Where) -> str | None:
    """A sysfs attribute's text, or None when it cannot be read (EINVAL for empty slots, or
    not a regular file)."""
    where.path = str(path)
    try:
        return read_attribute(path)
    except OSError:
        return None


def rdma_devices(sysfs_root: Path) -> list[str]:
    base = sysfs_root / "class" / "infiniband"
    try:
        return sorted(p.name for p in base.iterdir())
    except OSError:
        return []


def _ports(sysfs_root: Path, device: str) -> list[int]:
    base = sysfs_root / "class" / "infiniband" / device / "ports"
    try:
        return sorted(int(p.name) for p in base.iterdir() if p.name.isdigit())
    except OSError:
        return []


def _read_port_sysfs(sysfs_root: Path, device: str, port: int,
                     where: Where) -> tuple[list[GidEntry], list[GidReadError]]:
    base = sysfs_root / "class" / "infiniband" / device / "ports" / str(port)
    entries: list[GidEntry] = []
    errors: list[GidReadError] = []
    try:
        gids_fd = open_counted(base / "gids", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        return [], [GidReadError(device, f"{device} port {port}: cannot list GIDs: "
                                         f"{exc.strerror or exc}")]
    try:
        names = os.listdir(gids_fd)
    except OSError as exc:
        os.close(gids_fd)
        return [], [GidReadError(device, f"{device} port {port}: cannot list GIDs: "
                                         f"{exc.strerror or exc}")]
    try:
        raw_gids: list[tuple[str, str | None]] = []
        for n in sorted(filter(str.isdigit, names), key=int):
            where.path = f"{base}/gids/{n}"
            try:
                raw_gids.append((n, read_attribute(n, dir_fd=gids_fd)))
            except NotARegularFile as exc:
                # Not an empty slot: a slot that cannot be read (a broken driver, a forged
                # tree) is said, or a GID there would be reported missing with no reason.
                errors.append(GidReadError(device, f"{device} port {port} gid {n}: "
                                                   f"{exc.strerror}"))
            except OSError:
                raw_gids.append((n, None))
    finally:
        os.close(gids_fd)
    for name, raw in raw_gids:
        if raw is None or raw == _ZERO_GID:
            continue  # empty slot: no need to parse it or open its attributes
        try:
            gid = parse_gid(raw)
        except ValueError:
            errors.append(GidReadError(
                device, f"{device} port {port} gid {name}: unparsable {raw[:60]!r}"))
            continue
        if gid is None:
            continue
        type_text = _read_text(base / "gid_attrs" / "types" / name, where)
        ndev = _read_text(base / "gid_attrs" / "ndevs" / name, where)
        entries.append(
            GidEntry(
                device=device,
                port=port,
                index=int(name),
                gid=gid,
                gid_type=_TYPE_STRINGS.get(type_text or "", GidType.UNKNOWN),
                ndev=ndev or None,
            )
        )
    return entries, errors


DeviceRead = tuple[list[GidEntry], list[GidReadError]]


def _read_device_sysfs(sysfs_root: Path, device: str, where: Where) -> DeviceRead:
    entries: list[GidEntry] = []
    errors: list[GidReadError] = []
    ports = _ports(sysfs_root, device)
    if not ports:
        errors.append(GidReadError(
            device, f"{device}: no ports readable under {sysfs_root}/class/infiniband"))
    for port in ports:
        got, errs = _read_port_sysfs(sysfs_root, device, port, where)
        entries.extend(got)
        errors.extend(errs)
    return entries, errors


def _per_device(devices: Iterable[str], read: Callable[[str, Where], DeviceRead],
                reads: BoundedReads | None) -> DeviceRead:
    """Each device read on its own (off the caller's thread when `reads` is given): a device
    whose driver does not answer costs its own entries, not the others'."""
    devs = list(devices)
    if reads is None:
        results: dict[str, DeviceRead | Stuck] = {d: read(d, Where()) for d in devs}
    else:
        got = reads.run({f"gid:{d}": functools.partial(read, d) for d in devs})
        results = {d: got[f"gid:{d}"] for d in devs}
    entries: list[GidEntry] = []
    errors: list[GidReadError] = []
    for device, result in results.items():
        if isinstance(result, Stuck):
            errors.append(GidReadError(device, f"{device}: GID table {result.describe()}"))
            continue
        entries.extend(result[0])
        errors.extend(result[1])
    return entries, errors


def read_sysfs(sysfs_root: Path, devices: Iterable[str] | None = None,
               reads: BoundedReads | None = None) -> GidTable:
    """Every non-empty GID of the given (default: all) RDMA devices, from sysfs."""
    devs = rdma_devices(sysfs_root) if devices is None else devices
    entries, errors = _per_device(
        devs, lambda d, w: _read_device_sysfs(sysfs_root, d, w), reads)
    return GidTable(source="sysfs", entries=tuple(entries), errors=tuple(errors))


# ---------------------------------------------------------------- pyverbs


def pyverbs_available() -> bool:
    try:
        load_pyverbs()
    except Exception:  # ImportError, or a build that does not load against this rdma-core
        return False
    return True


def entry_from_pyverbs(
    device: str, entry: Any, ifname_of: Callable[[int], str | None]
) -> GidEntry | None:
    """Map one pyverbs GIDEntry (query_gid_table) to the model; None for an empty slot."""
    gid = parse_gid(entry.gid_str())
    if gid is None:
        return None
    ifindex = int(entry.ndev_ifindex)
    return GidEntry(
        device=device,
        port=int(entry.port_num),
        index=int(entry.gid_index),
        gid=gid,
        gid_type=gid_type_from_entry(int(entry.gid_type)),
        ndev=ifname_of(ifindex) if ifindex else None,
    )


def _ifname_of(ifindex: int) -> str | None:
    try:
        return socket.if_indextoname(ifindex)
    except OSError:
        return None


def _read_device_pyverbs(device: str, where: Where) -> DeviceRead:
    load_pyverbs()
    import pyverbs.device as pvd

    where.path = f"pyverbs {device}"
    entries: list[GidEntry] = []
    try:
        with pvd.Context(name=device) as ctx:
            nports = ctx.query_device().phys_port_cnt
            size = sum(ctx.query_port(p).gid_tbl_len for p in range(1, nports + 1))
            raw = ctx.query_gid_table(size)
    except Exception as exc:  # PyverbsRDMAError and friends: report, don't crash
        return [], [GidReadError(device, f"{device}: pyverbs cannot read the GID table: {exc}")]
    for item in raw:
        try:
            mapped = entry_from_pyverbs(device, item, _ifname_of)
        except ValueError:
            return entries, [GidReadError(device, f"{device}: pyverbs returned an unparsable GID")]
        if mapped is not None:
            entries.append(mapped)
    return entries, []


def read_pyverbs(sysfs_root: Path, devices: Iterable[str] | None = None,
                 reads: BoundedReads | None = None) -> GidTable:
    """Every valid GID through libibverbs: one query_gid_table call per device."""
    devs = rdma_devices(sysfs_root) if devices is None else devices
    entries, errors = _per_device(devs, _read_device_pyverbs, reads)
    entries.sort(key=lambda e: (e.device, e.port, e.index))
    return GidTable(source="pyverbs", entries=tuple(entries), errors=tuple(errors))


def read_gid_table(
    source: GidSource, sysfs_root: Path, devices: Iterable[str] | None = None,
    reads: BoundedReads | None = None,
) -> GidTable:
    """The GID table from the configured source; 'auto' prefers pyverbs when it works.
    With `reads`, each device is read off the caller's thread within its deadline."""
    devs = list(rdma_devices(sysfs_root) if devices is None else devices)
    if not devs:
        return GidTable(source="none")
    if source == "sysfs":
        return read_sysfs(sysfs_root, devs, reads)
    if source == "pyverbs":
        if not pyverbs_available():
            return GidTable(source="pyverbs", errors=(
                GidReadError(None, "pyverbs is configured but not importable"),))
        return read_pyverbs(sysfs_root, devs, reads)
    # pyverbs sees the real devices only: a fixture sysfs root means sysfs.
    if sysfs_root.resolve() == Path("/sys") and pyverbs_available():
        table = read_pyverbs(sysfs_root, devs, reads)
        if not table.errors:
            return table
    return read_sysfs(sysfs_root, devs, reads)
