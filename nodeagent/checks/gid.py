"""RoCEGIDStable: every rail's IPv4 RoCE v2 GID sits at its pinned index.

Pure: config x GID table x pins -> Finding, plus the pins a healthy pass has learned.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nodeagent.config import Config, Rail
from nodeagent.model import (
    ROCE_GID_STABLE,
    ConditionStatus,
    Finding,
    GidEntry,
    GidTable,
    GidType,
    Pin,
)


@dataclass(frozen=True)
class GidVerdict:
    finding: Finding
    learned: dict[str, Pin] = field(default_factory=dict)  # rail -> pin to persist
    observed: dict[str, int] = field(default_factory=dict)  # rail -> index seen now


def rail_entries(rail: Rail, table: GidTable) -> list[GidEntry]:
    """The GIDs that belong to the rail's netdev (and its configured device/port)."""
    return [
        e
        for e in table.for_netdev(rail.interface)
        if (rail.rdma_device is None or e.device == rail.rdma_device)
        and (rail.rdma_device is None or e.port == rail.rdma_port)
    ]


def pin_for(rail: Rail, learned: Mapping[str, Pin]) -> Pin | None:
    if rail.gid_index is not None:
        return Pin(index=rail.gid_index, device=rail.rdma_device, port=rail.rdma_port)
    return learned.get(rail.name)


def gid_finding(cfg: Config, table: GidTable, learned: Mapping[str, Pin]) -> GidVerdict:
    if not cfg.rails:
        return GidVerdict(Finding(ROCE_GID_STABLE, "True", "NotConfigured", "no rails configured"))
    problems: list[tuple[str, str, bool]] = []  # reason, message, unknown?
    notes: list[str] = []
    new_pins: dict[str, Pin] = {}
    observed: dict[str, int] = {}
    for rail in cfg.rails:
        entries = rail_entries(rail, table)
        if not entries:
            if table.errors:
                problems.append(
                    (
                        "GIDTableUnreadable",
                        f"{rail.label}: GID table unreadable ({table.errors[0]})",
                        True,
                    )
                )
            else:
                where = rail.rdma_device or "any RDMA device"
                problems.append(
                    (
                        "RDMADeviceNotFound",
                        f"{rail.label}: no GIDs on {rail.interface} from {where}",
                        False,
                    )
                )
            continue
        v2 = sorted(
            (e for e in entries if e.gid_type is GidType.ROCE_V2 and e.ipv4 == rail.ip),
            key=lambda e: e.index,
        )
        if not v2:
            problems.append(
                (
                    "GIDMissing",
                    f"{rail.label}: no IPv4 RoCE v2 GID for {rail.ip} "
                    f"on {entries[0].device} port {entries[0].port}",
                    False,
                )
            )
            continue
        current = v2[0]
        observed[rail.name] = current.index
        pin = pin_for(rail, learned)
        if pin is not None and pin.device not in (None, current.device):
            pin = None  # learned on other hardware: learn again
        if pin is None:
            new_pins[rail.name] = Pin(
                index=current.index, device=current.device, port=current.port, learned=True
            )
            notes.append(
                f"{rail.name}: learned pin {current.device}/{current.port} index {current.index}"
            )
        elif all(e.index != pin.index for e in v2):
            problems.append(
                (
                    "GIDIndexShifted",
                    f"{rail.label}: IPv4 RoCE v2 GID at index {current.index}, "
                    f"pinned {pin.index} ({current.device} port {current.port})",
                    False,
                )
            )
        else:
            notes.append(f"{rail.name}: {current.device}/{current.port} index {pin.index}")
    if problems:
        status: ConditionStatus = (
            "False" if any(not unknown for _, _, unknown in problems) else "Unknown"
        )
        return GidVerdict(
            Finding(ROCE_GID_STABLE, status, problems[0][0], "; ".join(p[1] for p in problems)),
            new_pins,
            observed,
        )
    return GidVerdict(
        Finding(ROCE_GID_STABLE, "True", "GIDsPinned", f"{table.source}: " + "; ".join(notes)),
        new_pins,
        observed,
    )
