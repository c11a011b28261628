"""RoCEGIDStable: every rail's IPv4 RoCE v2 GID sits at its pinned index.

Pure: config x GID table x pins (x QPs) -> Finding, plus the pins a healthy pass has learned
and the shifted rails that may be re-pinned now.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nodeagent.config import Config, Rail
from nodeagent.model.conditions import ROCE_GID_STABLE, Finding, Problems
from nodeagent.model.rdma import GidEntry, GidShift, GidTable, GidType, Pin, QueuePairs

if TYPE_CHECKING:
    from nodeagent.checks.facts import Facts


@dataclass(frozen=True)
class GidVerdict:
    finding: Finding
    learned: dict[str, Pin] = field(default_factory=dict)  # rail -> pin to persist
    observed: dict[str, int] = field(default_factory=dict)  # rail -> index seen now
    shifts: dict[str, GidShift] = field(default_factory=dict)  # rail -> its shift
    repin: tuple[str, ...] = ()  # shifted rails that may be re-pinned now


def rail_entries(rail: Rail, table: GidTable) -> list[GidEntry]:
    """The GIDs that belong to the rail's netdev (and its configured device/port)."""
    return [
        e
        for e in table.for_netdev(rail.interface)
        if (rail.rdma_device is None or e.device == rail.rdma_device)
        and (rail.rdma_device is None or e.port == rail.rdma_port)
    ]


def ipv4_v2_entries(rail: Rail, table: GidTable) -> list[GidEntry]:
    """The rail's IPv4 RoCE v2 GIDs (normally one), lowest index first."""
    return sorted((e for e in rail_entries(rail, table)
                   if e.gid_type is GidType.ROCE_V2 and e.ipv4 == rail.ip),
                  key=lambda e: e.index)


def pin_for(rail: Rail, learned: Mapping[str, Pin]) -> Pin | None:
    if rail.gid_index is not None:
        return Pin(index=rail.gid_index, device=rail.rdma_device, port=rail.rdma_port)
    return learned.get(rail.name)


def repin_verdict(cfg: Config, rail: Rail, shift: GidShift,
                  qps: QueuePairs | None) -> str | None:
    """Why a shifted rail cannot be re-pinned now, or None when it can."""
    if cfg.gid_repin == "never":
        return "re-pinning is off (gid_repin: never)"
    if not cfg.manages(rail):
        return "the rail is observed only (manage: false): re-pinning is left to its owner"
    if shift.slot_taken_by is not None:
        return f"index {shift.pinned} now holds {shift.slot_taken_by}: re-pin cannot land there"
    if qps is None:
        return "re-pin waits: QPs not looked at yet"
    if qps.error:
        return f"re-pin waits: QPs unknown ({qps.error})"
    users = qps.using(shift.device, shift.port)
    if users:
        shown = ", ".join(q.describe() for q in users[:3])
        more = f" and {len(users) - 3} more" if len(users) > 3 else ""
        return (f"re-pin waits for {len(users)} QP(s) on {shift.device} port {shift.port}: "
                f"{shown}{more}")
    return None


def _unreadable(rail: Rail, device: str | None, table: GidTable) -> str | None:
    """Why the rail's GIDs may be hidden: the read errors of its own device (configured or
    where its GIDs were last seen), or of any device while its device is not known."""
    errors = table.errors_on(device)
    if not errors:
        return None
    shown = "; ".join(str(e) for e in errors[:2])
    more = f" and {len(errors) - 2} more" if len(errors) > 2 else ""
    if device is None:
        return f"{rail.label}: its RDMA device is not known and GIDs are unreadable: {shown}{more}"
    return f"{rail.label}: GID table unreadable ({shown}{more})"


@dataclass
class _Tally:
    """What the rails' GIDs add to the verdict besides its problems."""

    notes: list[str] = field(default_factory=list)
    new_pins: dict[str, Pin] = field(default_factory=dict)
    observed: dict[str, int] = field(default_factory=dict)
    shifts: dict[str, GidShift] = field(default_factory=dict)
    repin: list[str] = field(default_factory=list)


def _no_gids(rail: Rail, device: str | None, table: GidTable, problems: Problems) -> None:
    """A rail with no GID at all in the table: unreadable, gone from its device, or no
    device found."""
    unreadable = _unreadable(rail, device, table)
    if unreadable:
        problems.unknown("GIDTableUnreadable", unreadable, node=True)
    elif rail.rdma_device is None and device is not None:
        problems.fail("GIDMissing", f"{rail.label}: no GIDs on {rail.interface} from "
                                    f"{device} (where they were last seen)")
    else:
        where = rail.rdma_device or "any RDMA device"
        problems.fail("RDMADeviceNotFound",
                      f"{rail.label}: no GIDs on {rail.interface} from {where}")


def _against_pin(cfg: Config, rail: Rail, v2: list[GidEntry], table: GidTable,
                 learned: Mapping[str, Pin], qps: QueuePairs | None, problems: Problems,
                 tally: _Tally) -> None:
    """A rail's IPv4 RoCE v2 GID against its pin: learned when there is none, shifted
    (re-pinned when nothing holds the port) when it is elsewhere."""
    current = v2[0]
    pin = pin_for(rail, learned)
    if pin is not None and pin.device not in (None, current.device):
        pin = None  # learned on other hardware: learn again
    if pin is None:
        tally.new_pins[rail.name] = Pin(
            index=current.index, device=current.device, port=current.port, learned=True)
        tally.notes.append(
            f"{rail.name}: learned pin {current.device}/{current.port} index {current.index}")
    elif all(e.index != pin.index for e in v2):
        taken = next((e.gid for e in table.entries if e.device == current.device
                      and e.port == current.port and e.index == pin.index), None)
        shift = GidShift(current.device, current.port, current.index, pin.index, taken)
        tally.shifts[rail.name] = shift
        why = repin_verdict(cfg, rail, shift, qps)
        if why is None:
            tally.repin.append(rail.name)
        problems.fail("GIDIndexShifted",
                      f"{rail.label}: IPv4 RoCE v2 GID at index {current.index}, "
                      f"pinned {pin.index} ({current.device} port {current.port}); "
                      + (why or "re-pinning: no QP uses the port"))
    else:
        tally.notes.append(f"{rail.name}: {current.device}/{current.port} index {pin.index}")


def _rail_gid(cfg: Config, rail: Rail, table: GidTable, learned: Mapping[str, Pin],
              qps: QueuePairs | None, seen: Mapping[str, tuple[str, int]],
              problems: Problems, tally: _Tally) -> None:
    entries = rail_entries(rail, table)
    if not entries:
        _no_gids(rail, rail.rdma_device or seen.get(rail.name, (None, 1))[0], table,
                 problems)
        return
    v2 = ipv4_v2_entries(rail, table)
    if not v2:
        unreadable = _unreadable(rail, entries[0].device, table)
        if unreadable is not None:  # it may sit in a slot that could not be read
            problems.unknown("GIDTableUnreadable", unreadable, node=True)
            return
        problems.fail("GIDMissing", f"{rail.label}: no IPv4 RoCE v2 GID for {rail.ip} "
                                    f"on {entries[0].device} port {entries[0].port}")
        return
    tally.observed[rail.name] = v2[0].index
    _against_pin(cfg, rail, v2, table, learned, qps, problems, tally)


def gid_verdict(cfg: Config, facts: Facts) -> GidVerdict:
    """The pass's GID verdict (through facts.derive: once, for the judge, the re-pin and
    the probes' targets alike)."""
    return gid_finding(cfg, facts.gid_table, facts.pins, facts.qps, facts.rail_seen)


def gid_finding(
    cfg: Config, table: GidTable, learned: Mapping[str, Pin], qps: QueuePairs | None = None,
    seen: Mapping[str, tuple[str, int]] | None = None,
) -> GidVerdict:
    """`qps` (every QP on the host) decides whether shifted rails may be re-pinned; without
    it a shift is only reported. `seen`: rail -> the device and port its GIDs were last
    seen on (a rail without `rdma_device` is judged on that device's errors only)."""
    problems = Problems(ROCE_GID_STABLE)
    if not cfg.rails:
        return GidVerdict(problems.finding("NotConfigured", "no rails configured"))
    seen = seen or {}
    tally = _Tally()
    for rail in cfg.rails:
        with problems.about(rail.name):
            _rail_gid(cfg, rail, table, learned, qps, seen, problems, tally)
    finding = problems.finding("GIDsPinned", f"{table.source}: " + "; ".join(tally.notes))
    return GidVerdict(finding, tally.new_pins, tally.observed, tally.shifts,
                      tuple(tally.repin))
