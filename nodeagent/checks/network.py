"""RoCENetworkReady: each rail's address, prefix, MTU, link, routes, rule and sysctls.

Pure: config x observations -> drift list and a Finding. No I/O.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from nodeagent.config import Config, Rail
from nodeagent.model.conditions import ROCE_NETWORK_READY, Finding, Problems
from nodeagent.model.network import (
    DRIFT_ORDER,
    Deletion,
    Drift,
    DriftKind,
    LinkState,
    RailObservation,
)

if TYPE_CHECKING:
    from nodeagent.checks.facts import Facts

_LINK_LOCAL_V6 = ipaddress.IPv6Network("fe80::/10")


def desired_routes(rail: Rail) -> list[tuple[str, str | None]]:
    """(destination, gateway) pairs the rail's table must hold."""
    if rail.table is None:
        return []
    routes: list[tuple[str, str | None]] = [(rail.network, None)]
    if rail.gateway is not None:
        routes.append(("0.0.0.0/0", rail.gateway))
    return routes


def deletion_drift(rail: Rail, ifindex: int | None, gone: Deletion) -> list[Drift]:
    """The drift one deletion event makes on a rail, known from the event alone: the rail's
    own address, one of its table's routes, or its policy rule. [] when the deletion is
    not of something the rail owns. Lets the daemon repair before it probes."""
    if gone.address is not None:
        a = gone.address
        if gone.ifindex == ifindex and a.address == rail.ip and a.prefixlen == rail.prefixlen:
            # The kernel drops the table's routes with the address (their source and their
            # gateway's subnet go with it): planned with it, in one repair, rather than
            # from the deletions that follow (each a turn of its own).
            return [Drift(rail.name, DriftKind.ADDRESS_MISSING,
                          f"{rail.label}: address {rail.address} deleted", repairable=True),
                    *(Drift(rail.name, DriftKind.ROUTE_MISSING,
                            f"{rail.label}: route {dst} dropped with the address",
                            repairable=True, detail=dst) for dst, _ in desired_routes(rail))]
        return []
    if rail.table is None:
        return []
    if gone.route is not None and gone.route.table == rail.table:
        r = gone.route
        for dst, gateway in desired_routes(rail):
            if r.dst == dst and (gateway is None or r.gateway == gateway):
                what = f"default via {gateway}" if gateway else dst
                return [Drift(rail.name, DriftKind.ROUTE_MISSING,
                              f"{rail.label}: route {what} deleted from table {rail.table}",
                              repairable=True, detail=dst)]
        return []
    if gone.rule is not None:
        u = gone.rule
        if u.src == f"{rail.ip}/32" and u.table == rail.table and (
                rail.rule_priority is None or u.priority == rail.rule_priority):
            return [Drift(rail.name, DriftKind.RULE_MISSING,
                          f"{rail.label}: rule from {rail.ip} lookup {rail.table} deleted",
                          repairable=True)]
    return []


def _link_drift(rail: Rail, link: LinkState) -> Iterator[Drift]:
    if not link.admin_up:
        yield Drift(rail.name, DriftKind.LINK_ADMIN_DOWN,
                    f"{rail.label}: link is administratively down", repairable=True)
    elif not link.carrier:
        yield Drift(rail.name, DriftKind.NO_CARRIER,
                    f"{rail.label}: no carrier (cable, switch port or peer down)",
                    repairable=False)
    if rail.mtu is not None and link.mtu != rail.mtu:
        yield Drift(rail.name, DriftKind.MTU, f"{rail.label}: MTU {link.mtu}, want {rail.mtu}",
                    repairable=True)


def _address_drift(rail: Rail, obs: RailObservation) -> Iterator[Drift]:
    ours = [a for a in obs.addresses if a.family == socket.AF_INET and a.address == rail.ip]
    if not any(a.prefixlen == rail.prefixlen for a in ours):
        yield Drift(rail.name, DriftKind.ADDRESS_MISSING,
                    f"{rail.label}: address {rail.address} missing", repairable=True)
    for a in ours:
        if a.prefixlen != rail.prefixlen:
            yield Drift(rail.name, DriftKind.ADDRESS_PREFIX,
                        f"{rail.label}: address {a.cidr} has the wrong prefix, want "
                        f"{rail.address}", repairable=True, detail=a.cidr)
    if not rail.exclusive:
        return
    for a in obs.addresses:
        if a.family == socket.AF_INET and a.address == rail.ip:
            continue
        if a.family == socket.AF_INET6 and ipaddress.IPv6Address(a.address) in _LINK_LOCAL_V6:
            continue  # kernel-made link-local; the default GIDs do not depend on it
        yield Drift(rail.name, DriftKind.FOREIGN_ADDRESS,
                    f"{rail.label}: foreign address {a.cidr} on an exclusive rail",
                    repairable=True, detail=a.cidr)


def _route_drift(rail: Rail, link: LinkState, obs: RailObservation) -> Iterator[Drift]:
    for dst, gateway in desired_routes(rail):
        if not any(r.dst == dst and r.oif == link.index
                   and (gateway is None or r.gateway == gateway) for r in obs.routes):
            what = f"default via {gateway}" if gateway else dst
            yield Drift(rail.name, DriftKind.ROUTE_MISSING,
                        f"{rail.label}: route {what} missing in table {rail.table}",
                        repairable=True, detail=dst)


def _rule_drift(rail: Rail, obs: RailObservation) -> Iterator[Drift]:
    if rail.table is None:
        return
    src = f"{rail.ip}/32"
    mine = [r for r in obs.rules if r.src == src and r.table == rail.table]
    want = rail.rule_priority
    if not any(want is None or r.priority == want for r in mine):
        pref = f" priority {want}" if want is not None else ""
        yield Drift(rail.name, DriftKind.RULE_MISSING,
                    f"{rail.label}: rule 'from {rail.ip} lookup {rail.table}'{pref} missing",
                    repairable=True)
    for r in mine:
        if want is not None and r.priority != want:
            yield Drift(rail.name, DriftKind.RULE_STALE,
                        f"{rail.label}: rule 'from {rail.ip} lookup {rail.table}' at "
                        f"priority {r.priority}, want {want}",
                        repairable=True, detail=str(r.priority))


def _sysctl_drift(cfg: Config, rail: Rail, obs: RailObservation) -> Iterator[Drift]:
    for key, want in sorted(cfg.sysctls_for(rail).items()):
        have = obs.sysctls.get(key)
        if have is None:
            yield Drift(rail.name, DriftKind.SYSCTL, f"{rail.label}: sysctl {key} unreadable",
                        repairable=False, detail=key)
        elif have != str(want):
            yield Drift(rail.name, DriftKind.SYSCTL,
                        f"{rail.label}: sysctl {key}={have}, want {want}",
                        repairable=True, detail=key)


def drift_by_rail(cfg: Config, facts: Facts) -> dict[str, list[Drift]]:
    """Each observed rail's drift (through facts.derive: once, for the judge and the
    rails' status)."""
    rails = {r.name: r for r in cfg.rails}
    return {n: rail_drift(cfg, rails[n], o) for n, o in facts.observations.items()
            if n in rails}


def rail_drift(cfg: Config, rail: Rail, obs: RailObservation) -> list[Drift]:
    """Every difference between one rail's config and what the kernel has, worst first."""
    link = obs.link
    if link is None:
        return [Drift(rail.name, DriftKind.INTERFACE_MISSING,
                      f"{rail.label}: interface does not exist", repairable=False)]
    drift = [*_link_drift(rail, link), *_address_drift(rail, obs),
             *_route_drift(rail, link, obs), *_rule_drift(rail, obs),
             *_sysctl_drift(cfg, rail, obs)]
    drift.sort(key=lambda d: DRIFT_ORDER[d.kind])  # stable: same kinds keep their order
    return drift


def network_finding(
    cfg: Config,
    drift: Mapping[str, Sequence[Drift]],
    overrides: Mapping[str, tuple[str, str]] | None = None,
) -> Finding:
    """RoCENetworkReady from the drift that is left after any repair.

    `overrides` maps rail name -> (reason, message) for states only the daemon can see over
    time (LinkFlapping, ManagedElsewhere); they outrank the rail's drift.
    """
    problems = Problems(ROCE_NETWORK_READY)
    if not cfg.rails:
        return problems.finding("NotConfigured", "no rails configured")
    overrides = overrides or {}
    for rail in cfg.rails:
        with problems.about(rail.name):
            if rail.name in overrides:
                problems.fail(*overrides[rail.name])
            for d in drift.get(rail.name, ()):
                problems.fail(d.kind.reason, d.message)
    names = ", ".join(r.name for r in cfg.rails)
    return problems.finding("RailsConfigured", f"{len(cfg.rails)} rail(s) as configured: {names}")
