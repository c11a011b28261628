"""Each rail's RDMA port as NHC-style checks see it, from sysfs. Read-only.

Under `class/infiniband/<dev>/`: `fw_ver`, `hca_type`, and per port `state` ("4: ACTIVE"),
`phys_state` ("5: LinkUp"), `link_layer` ("Ethernet"), `rate` ("200 Gb/sec (4X HDR)",
"2.5 Gb/sec (1X SDR)": the kernel's `%d%s Gb/sec (%dX%s)`), the error counters in
`counters/` and the driver's in `hw_counters/`. The PCI function is the device's `device`
link: `current_link_speed` ("16.0 GT/s PCIe"; "8 GT/s" on older kernels),
`current_link_width` ("16"), `max_link_speed`, `max_link_width`. A soft-RoCE device has no
PCI function of its own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from nodeagent.io.bounded import Where
from nodeagent.io.files import read_attribute
from nodeagent.model.rdma import PcieLink, PhysState, PortHealth, PortState
from nodeagent.model.words import Words

W = TypeVar("W", bound=Words)
_NUMBERED = re.compile(r"^\d+:\s*(.+)$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?) Gb/sec")
_SPEED = re.compile(r"^(\d+(?:\.\d+)?) ?GT/s")


def _text(path: Path, where: Where, missing: list[str]) -> str | None:
    where.path = str(path)
    try:
        return read_attribute(path) or None
    except FileNotFoundError:
        return None
    except OSError:
        missing.append(path.name)  # EINVAL while a link trains, EIO from a wedged driver
        return None


def _numbered(text: str | None, words: type[W], where: str, missing: list[str]) -> W | None:
    """"4: ACTIVE" -> PortState.ACTIVE. A word the kernel has no name for ("<unknown>") or
    one newer than this agent reads as unreadable, named in the message."""
    if text is None:
        return None
    match = _NUMBERED.match(text)
    word = match.group(1).strip() if match else text
    try:
        return words(word)
    except ValueError:
        missing.append(f"{where}: unknown word {word[:40]!r}")
        return None


def parse_rate(text: str | None) -> float | None:
    match = _RATE.match(text or "")
    return float(match.group(1)) if match else None


def parse_link_speed(text: str | None) -> float | None:
    match = _SPEED.match(text or "")
    return float(match.group(1)) if match else None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def read_pcie(sysfs: Path, device: str, where: Where, missing: list[str]) -> PcieLink | None:
    link = sysfs / "class" / "infiniband" / device / "device"
    try:
        address = os.path.basename(os.readlink(link))
    except OSError:
        return None
    if not (link / "max_link_width").exists():
        return None  # not a PCI function (a virtual device's parent)
    return PcieLink(
        address=address,
        speed=parse_link_speed(_text(link / "current_link_speed", where, missing)),
        width=_int(_text(link / "current_link_width", where, missing)),
        max_speed=parse_link_speed(_text(link / "max_link_speed", where, missing)),
        max_width=_int(_text(link / "max_link_width", where, missing)))


def read_named_counters(port_dir: Path, names: Iterable[str], where: Where,
                        missing: list[str]) -> dict[str, int]:
    """The named counters of one RDMA port, each from `counters/`, else `hw_counters/`; a
    counter in neither, or not a 64-bit count, is left out."""
    values: dict[str, int] = {}
    for name in names:
        if "/" in name or name.startswith("."):
            continue  # a counter name, never a path
        for directory in (port_dir / "counters", port_dir / "hw_counters"):
            value = _int(_text(directory / name, where, missing))
            if value is not None and 0 <= value < 2**64:
                values[name] = value
                break
    return values


def read_port_health(sysfs: Path, device: str, port: int, counters: Iterable[str] = (),
                     where: Where | None = None) -> PortHealth:
    """The port's attributes and the named counters (each from `counters/`, else
    `hw_counters/`; a counter in neither is left out)."""
    where = where or Where()
    missing: list[str] = []
    base = sysfs / "class" / "infiniband" / device
    ports = base / "ports" / str(port)
    values = read_named_counters(ports, counters, where, missing)
    rate = _text(ports / "rate", where, missing)
    return PortHealth(
        device=device, port=port,
        state=_numbered(_text(ports / "state", where, missing), PortState, "state", missing),
        phys_state=_numbered(_text(ports / "phys_state", where, missing), PhysState,
                             "phys_state", missing),
        link_layer=_text(ports / "link_layer", where, missing),
        rate_gbps=parse_rate(rate), rate=rate,
        hca_type=_text(base / "hca_type", where, missing),
        fw_ver=_text(base / "fw_ver", where, missing),
        pcie=read_pcie(sysfs, device, where, missing),
        counters=values, unreadable=tuple(missing))
