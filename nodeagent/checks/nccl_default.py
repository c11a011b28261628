"""NCCLDefaultGIDPinned: the GID NCCL would pick with its default settings on each rail's
port (checks/nccl.py: NCCL's selection, from its source), against the rail's pin. Pure.

An operator learns before any job runs that a job without NCCL_IB_GID_INDEX would leave
from another GID (a VIP below the pin, an IPv6-only port, a v1 entry winning), and
`fleet -o wide` shows which nodes."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from nodeagent.checks.facts import Facts
from nodeagent.checks.gid import pin_for, rail_entries
from nodeagent.checks.nccl import DEFAULTS, GidChoice, choose_gid
from nodeagent.config import Config
from nodeagent.model.conditions import NCCL_DEFAULT_GID_PINNED, Finding, Problems
from nodeagent.model.jobs import GidSlot, PortView
from nodeagent.model.rdma import GidEntry, GidType

NOT_PINNED = "NCCLDefaultNotPinned"
UNKNOWN = "NCCLDefaultUnknown"
_VERSIONS = {GidType.IB_ROCE_V1: 1, GidType.ROCE_V2: 2}


def port_view(entries: Iterable[GidEntry], device: str, port: int) -> PortView:
    """A port's GID table from the agent's own reading (its non-empty entries): a slot
    absent from it is empty, all zeros with no type, as NCCL reads an empty slot."""
    slots = tuple(GidSlot(e.index, ipaddress.IPv6Address(e.gid), _VERSIONS.get(e.gid_type))
                  for e in sorted(entries, key=lambda e: e.index)
                  if (e.device, e.port) == (device, port))
    return PortView(device, port, True, True, slots, "ACTIVE")


def nccl_defaults(cfg: Config, facts: Facts) -> dict[str, GidChoice]:
    """Each rail's default NCCL choice on the port its GIDs are on (through facts.derive:
    once, for the judge and the rails' status)."""
    out: dict[str, GidChoice] = {}
    table = facts.gid_table
    for rail in cfg.rails:
        mine = rail_entries(rail, table)
        if not mine:
            continue
        device, port = mine[0].device, mine[0].port
        out[rail.name] = choose_gid(port_view(table.entries, device, port), DEFAULTS)
    return out


def nccl_default_finding(cfg: Config, facts: Facts) -> Finding:
    """False on a rail whose default NCCL choice is not its pin (the fix named), Unknown
    while a rail has no GIDs or no pin, else True."""
    problems = Problems(NCCL_DEFAULT_GID_PINNED)
    if not cfg.rails:
        return problems.finding("NotConfigured", "no rails configured")
    defaults = facts.derive(nccl_defaults, cfg)
    fine = []
    for rail in cfg.rails:
        with problems.about(rail.name):
            choice, pin = defaults.get(rail.name), pin_for(rail, facts.pins)
            if choice is None or choice.index is None:
                problems.unknown(UNKNOWN, f"{rail.name}: no GIDs seen on its port")
            elif pin is None:
                problems.unknown(UNKNOWN, f"{rail.name}: its GID is not pinned yet")
            elif choice.index != pin.index:
                problems.fail(NOT_PINNED, (
                    f"{rail.name}: NCCL with default settings would use {choice.device}:"
                    f"{choice.port} {choice.describe()}, not the pinned GID {pin.index} "
                    f"({rail.ip}): jobs must set NCCL_IB_GID_INDEX={pin.index} or "
                    f"NCCL_IB_ADDR_RANGE={rail.network}"))
            else:
                fine.append(f"{rail.name} {choice.device}:{choice.port} GID {choice.index}")
    return problems.finding("NCCLDefaultIsPinned", "NCCL with default settings uses each "
                            f"rail's pinned GID: {', '.join(fine)}")
