"""Repair rail drift: the only module that changes the kernel.

Planning (drift -> actions) is pure, so `apply --dry-run` prints exactly what `apply` would
run. Execution is idempotent: 'already exists' / 'already gone' count as done.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from nodeagent.config import Config, Rail, sysctl_parts
from nodeagent.io.files import write_attribute
from nodeagent.model.network import Drift, DriftKind

log = logging.getLogger(__name__)

RT_SCOPE_LINK = 253
RTPROT_STATIC = 4


@dataclass(frozen=True)
class Action:
    """One repair, typed by what it does. Each kind knows its place in a rail's order (a
    route needs the link up and the address present), how it runs, and which error means
    someone else did it between the probe and now."""

    rail: str
    kind: DriftKind
    text: str  # what `apply` reports and `--dry-run` prints

    ORDER: ClassVar[int] = 0
    ALREADY_DONE: ClassVar[int | None] = None  # errno meaning "done already"

    def run(self, ipr: Any, procfs_root: Path, rail: Rail) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class LinkUp(Action):
    index: int
    ORDER = 0

    def run(self, ipr: Any, procfs_root: Path, rail: Rail) -> None:
        ipr.link("set", index=self.index, state="up")


@dataclass(frozen=True)
class SetMtu(Action):
    index: int
    mtu: int
    ORDER = 1

    def run(self, ipr: Any, procfs_root: Path, rail: Rail) -> None:
        ipr.link("set", index=self.index, mtu=self.mtu)


@dataclass(frozen=True)
class SetSysctl(Action):
    key: str
    value: int
    ORDER = 2

    def run(self, ipr: Any, procfs_root: Path, rail: Rail) -> None:
        write_attribute(procfs_root, sysctl_parts(rail.interface, self.key), f"{self.value}\n")


@dataclass(frozen=True)
class Addr:
    """An interface address as netlink takes it."""

    index: int
    address: str
    prefixlen: int
    family: int

    @classmethod
    def of(cls, index: int, cidr: str) -> Addr:
        iface = ipaddress.ip_interface(cidr)
        family = socket.AF_INET if iface.version == 4 else socket.AF_INET6
        return cls(index, str(iface.ip), iface.network.prefixlen, family)

    def args(self) -> dict[str, Any]:
        return {"index": self.index, "address": self.address, "prefixlen": self.prefixlen,
                "family": self.family}


@dataclass(frozen=True)
class AddAddress(Action):
    addr: Addr
    ORDER = 3
    ALREADY_DONE = errno.EEXIST

    def run(self, ipr: Any, procfs_root: Path, rail: Rail) -> None:
        ipr.addr("add", **self.addr.args())


@dataclass(frozen=True)
class RemoveAddress(Action):
    addr: Addr
    ORDER = 4
    ALREADY_DONE = errno.EADDRNOTAVAIL

    def run(self, ipr: Any, procfs_root: Path, rail: Rail) -> None:
        ipr.addr("del", **self.addr.args())


@dataclass(frozen=True)
class SetRoute(Action):
    dst: str
    oif: int
    table: int
    gateway: str | None = None
    prefsrc: str | None = None
    ORDER = 5

    def run(self, ipr: Any, procfs_root: Path, rail: Rail) -> None:
        args: dict[str, Any] = {"dst": self.dst, "oif": self.oif, "table": self.table,
                                "proto": RTPROT_STATIC}
        if self.gateway is not None:
            args["gateway"] = self.gateway
        else:  # the rail's own subnet: on the link, from the rail's address
            args.update(prefsrc=self.prefsrc, scope=RT_SCOPE_LINK)
        ipr.route("replace", **args)


@dataclass(frozen=True)
class Rule:
    """A policy rule from the rail's address (priority None: the kernel picks it)."""

    src: str
    table: int
    priority: int | None = None

    def args(self) -> dict[str, Any]:
        out: dict[str, Any] = {"src": self.src, "src_len": 32, "table": self.table}
        if self.priority is not None:
            out["priority"] = self.priority
        return out


@dataclass(frozen=True)
class AddRule(Action):
    rule: Rule
    ORDER = 6
    ALREADY_DONE = errno.EEXIST

    def run(self, ipr: Any, procfs_root: Path, rail: Rail) -> None:
        ipr.rule("add", **self.rule.args())


@dataclass(frozen=True)
class RemoveRule(Action):
    rule: Rule
    ORDER = 7
    ALREADY_DONE = errno.ENOENT

    def run(self, ipr: Any, procfs_root: Path, rail: Rail) -> None:
        ipr.rule("del", **self.rule.args())


def _route(rail: Rail, ifindex: int, d: Drift) -> Action | None:
    if rail.table is None:
        return None
    label, k = rail.label, d.kind
    if d.detail == rail.network:
        return SetRoute(rail.name, k, f"{label}: route {rail.network} dev {rail.interface} "
                                      f"table {rail.table}",
                        dst=rail.network, oif=ifindex, table=rail.table, prefsrc=rail.ip)
    return SetRoute(rail.name, k, f"{label}: route default via {rail.gateway} dev "
                                  f"{rail.interface} table {rail.table}",
                    dst="0.0.0.0/0", oif=ifindex, table=rail.table, gateway=rail.gateway)


def _rule(rail: Rail, d: Drift) -> Action | None:
    if rail.table is None:
        return None
    label, k = rail.label, d.kind
    if k is DriftKind.RULE_MISSING:
        pref = f" priority {rail.rule_priority}" if rail.rule_priority is not None else ""
        return AddRule(rail.name, k, f"{label}: add rule from {rail.ip} lookup {rail.table}{pref}",
                       Rule(rail.ip, rail.table, rail.rule_priority))
    return RemoveRule(rail.name, k, f"{label}: remove rule from {rail.ip} lookup {rail.table} "
                                    f"priority {d.detail}",
                      Rule(rail.ip, rail.table, int(d.detail)))


def plan_action(cfg: Config, rail: Rail, ifindex: int, d: Drift) -> Action | None:
    """The action that repairs one drift, or None when there is none."""
    label, k = rail.label, d.kind
    if k is DriftKind.LINK_ADMIN_DOWN:
        return LinkUp(rail.name, k, f"{label}: set link up", ifindex)
    if k is DriftKind.MTU and rail.mtu is not None:
        return SetMtu(rail.name, k, f"{label}: set mtu {rail.mtu}", ifindex, rail.mtu)
    if k is DriftKind.SYSCTL:
        value = cfg.sysctls_for(rail)[d.detail]
        return SetSysctl(rail.name, k, f"{label}: set sysctl {d.detail}={value}", d.detail, value)
    if k is DriftKind.ADDRESS_MISSING:
        return AddAddress(rail.name, k, f"{label}: add address {rail.address}",
                          Addr.of(ifindex, rail.address))
    if k in (DriftKind.ADDRESS_PREFIX, DriftKind.FOREIGN_ADDRESS):
        return RemoveAddress(rail.name, k, f"{label}: remove address {d.detail}",
                             Addr.of(ifindex, d.detail))
    if k is DriftKind.ROUTE_MISSING:
        return _route(rail, ifindex, d)
    if k in (DriftKind.RULE_MISSING, DriftKind.RULE_STALE):
        return _rule(rail, d)
    return None


def plan_rail(cfg: Config, rail: Rail, ifindex: int | None, drift: Iterable[Drift]) -> list[Action]:
    """The actions that repair a rail's repairable drift, in a safe order."""
    if ifindex is None:
        return []
    actions = [a for d in drift if d.repairable
               if (a := plan_action(cfg, rail, ifindex, d)) is not None]
    actions.sort(key=lambda a: a.ORDER)
    return actions


def _netlink_errno(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    return getattr(exc, "errno", None)


def execute(
    ipr: Any, procfs_root: Path, rails: Mapping[str, Rail], actions: Sequence[Action]
) -> tuple[list[Action], list[str]]:
    """Run actions in order; return (done, one error line per failed action)."""
    done: list[Action] = []
    errors: list[str] = []
    gone: set[str] = set()  # rails whose link left this namespace meanwhile
    for action in actions:
        if action.rail in gone:
            continue
        try:
            action.run(ipr, procfs_root, rails[action.rail])
        except Exception as exc:  # NetlinkError, OSError: report it and go on with the rest
            code = _netlink_errno(exc)
            if code is not None and code == action.ALREADY_DONE:
                continue  # someone else did it between our probe and now
            if code == errno.ENODEV:
                # The link is gone from this namespace: moved into a pod (its addresses and
                # routes go first, then the link) or deleted. Its link event says which;
                # nothing to repair on it, and no error of the repair.
                log.debug("%s: its link is gone: %s", action.text, exc)
                gone.add(action.rail)
                continue
            errors.append(f"{action.text}: failed: {exc}")
            continue
        done.append(action)
    return done, errors
