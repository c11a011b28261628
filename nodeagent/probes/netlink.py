"""Read each rail's kernel state over rtnetlink (pyroute2). Read-only.

`ipr` is a pyroute2 IPRoute opened by the caller (in the agent's own network namespace, or a
named one in tests), so this module never decides where it looks.
"""

from __future__ import annotations

import errno
import functools
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from nodeagent.config import Rail
from nodeagent.io.bounded import BoundedReads, Stuck, Where
from nodeagent.model.network import (
    AddressInfo,
    Deletion,
    EventKind,
    KernelEvent,
    LinkState,
    RailObservation,
    RouteInfo,
    RuleInfo,
)
from nodeagent.probes.sysctl import read_rail_sysctls

IFF_UP = 0x1
RTEXT_FILTER_SKIP_STATS = 1 << 3  # the kernel leaves the link statistics out


_LINK = frozenset({"IFLA_IFNAME", "IFLA_MTU", "IFLA_CARRIER", "IFLA_OPERSTATE",
                   "IFLA_CARRIER_CHANGES", "IFLA_CARRIER_DOWN_COUNT"})
_MOVED = frozenset({"IFLA_NEW_NETNSID"})
_ADDR = frozenset({"IFA_ADDRESS"})
_ROUTE = frozenset({"RTA_TABLE", "RTA_DST", "RTA_GATEWAY", "RTA_OIF", "RTA_PREFSRC"})
_RULE = frozenset({"FRA_SRC", "FRA_PRIORITY", "FRA_TABLE"})


def _attrs(msg: Any, wanted: frozenset[str]) -> dict[str, Any]:
    """The wanted attributes of a message, in one walk of its attribute list: pyroute2's
    msg.get() walks the list on every call (a link has about fifty attributes), and a
    value is decoded only when it is read, so the others are never decoded at all."""
    return {slot[0]: slot[1] for slot in msg.get("attrs") or () if slot[0] in wanted}


def release(msg: Any) -> None:
    """Let reference counting free a message read to the end: pyroute2 makes every message
    and attribute a cycle (its `chain` lists itself; an address attribute holds its message
    as `parent`), so each one lived until the cyclic collector came, which then scanned a
    pass's thousand of them mid-pass: about 7 % of a pass's CPU, up to 5-10 ms at once
    (bench/check_pass.py). The message is not read again after this."""
    stack = [msg]
    while stack:
        m = stack.pop()
        m.chain = m.parent = None
        for slot in dict.get(m, "attrs", None) or ():
            cell = getattr(slot, "cell", None)
            if cell is not None and isinstance(cell[1], dict):
                stack.append(cell[1])


def link_from_msg(msg: Any) -> LinkState:
    a = _attrs(msg, _LINK)
    return LinkState(
        ifname=str(a.get("IFLA_IFNAME")),
        index=int(msg["index"]),
        mtu=int(a.get("IFLA_MTU") or 0),
        admin_up=bool(int(msg["flags"]) & IFF_UP),
        carrier=bool(a.get("IFLA_CARRIER")),
        operstate=str(a.get("IFLA_OPERSTATE") or "UNKNOWN"),
        carrier_changes=a.get("IFLA_CARRIER_CHANGES"),
        carrier_down_count=a.get("IFLA_CARRIER_DOWN_COUNT"),
    )


def _addr_from_msg(msg: Any) -> AddressInfo | None:
    address = _attrs(msg, _ADDR).get("IFA_ADDRESS")
    if address is None:
        return None
    return AddressInfo(address=str(address), prefixlen=int(msg["prefixlen"]), family=msg["family"])


def _route_table(msg: Any, a: dict[str, Any]) -> int:
    return int(a.get("RTA_TABLE") or msg["table"])  # RTA_TABLE: tables past 255


def _route_from_msg(msg: Any, a: dict[str, Any] | None = None) -> RouteInfo:
    a = _attrs(msg, _ROUTE) if a is None else a
    dst = a.get("RTA_DST") or "0.0.0.0"
    return RouteInfo(
        table=_route_table(msg, a),
        dst=f"{dst}/{msg['dst_len']}",
        gateway=a.get("RTA_GATEWAY"),
        oif=a.get("RTA_OIF"),
        prefsrc=a.get("RTA_PREFSRC"),
    )


def _rule_from_msg(msg: Any) -> RuleInfo:
    a = _attrs(msg, _RULE)
    src = a.get("FRA_SRC")
    return RuleInfo(
        priority=a.get("FRA_PRIORITY"),
        src=f"{src}/{msg['src_len']}" if src else None,
        table=int(a.get("FRA_TABLE") or msg["table"]),
    )


_KINDS = {"RTM_NEWLINK": EventKind.LINK, "RTM_DELLINK": EventKind.LINK,
          "RTM_NEWADDR": EventKind.ADDRESS, "RTM_DELADDR": EventKind.ADDRESS,
          "RTM_NEWROUTE": EventKind.ROUTE, "RTM_DELROUTE": EventKind.ROUTE,
          "RTM_NEWRULE": EventKind.RULE, "RTM_DELRULE": EventKind.RULE}


def kernel_event(msg: Any) -> KernelEvent | None:
    """An rtnetlink multicast message typed (None: of a kind the agent does not follow).
    Raises KeyError, TypeError or ValueError for a message of a shape we do not know."""
    kind = _KINDS.get(str(msg.get("event", "")))
    if kind is None:
        return None
    deletion = deletion_from_msg(msg)
    if kind is EventKind.LINK:
        link = link_from_msg(msg)  # a deleted link's last state is no observation
        gone = msg["event"] == "RTM_DELLINK"
        # A link moved to another namespace leaves with the namespace it went to (the
        # kernel's rtmsg_ifinfo_newnet; `ip monitor` shows "new-netnsid").
        moved = gone and bool(_attrs(msg, _MOVED))
        return KernelEvent(kind, index=link.index, ifname=link.ifname,
                           link=None if gone else link, moved_away=moved)
    if kind is EventKind.ADDRESS:
        return KernelEvent(kind, index=int(msg["index"]), deletion=deletion)
    if kind is EventKind.ROUTE:
        route = _route_from_msg(msg)
        return KernelEvent(kind, index=route.oif, table=route.table, src=route.prefsrc,
                           deletion=deletion)
    rule = _rule_from_msg(msg)
    src = rule.src.split("/")[0] if rule.src else None
    return KernelEvent(kind, table=rule.table, src=src, deletion=deletion)


def deletion_from_msg(msg: Any) -> Deletion | None:
    """An IPv4 address, route or rule deletion event, typed; None for anything else."""
    event = str(msg.get("event", ""))
    try:
        if event == "RTM_DELADDR" and msg.get("family") == socket.AF_INET:
            info = _addr_from_msg(msg)
            return None if info is None else Deletion("address", int(msg["index"]), info)
        if event == "RTM_DELROUTE" and msg.get("family") == socket.AF_INET:
            return Deletion("route", route=_route_from_msg(msg))
        if event == "RTM_DELRULE" and msg.get("family") == socket.AF_INET:
            return Deletion("rule", rule=_rule_from_msg(msg))
    except (KeyError, TypeError, ValueError):
        return None  # a message of a shape we do not know: the pass will look anyway
    return None


def _sysctls(procfs_root: Path, ifname: str, keys: list[str],
             where: Where) -> dict[str, str | None]:
    where.path = f"{procfs_root}/sys/net/*/conf/{ifname}"
    return read_rail_sysctls(procfs_root, ifname, keys)


def _read_sysctls(rails: list[Rail], procfs_root: Path, sysctl_keys: dict[str, list[str]],
                  reads: BoundedReads | None) -> dict[str, dict[str, str | None]]:
    """Each rail's sysctls; with `reads` off the caller's thread (a stuck one reads as
    unreadable)."""
    calls = {
        rail.name: functools.partial(_sysctls, procfs_root, rail.interface,
                                     sysctl_keys.get(rail.name, []))
        for rail in rails}
    got: dict[str, dict[str, str | None] | Stuck]
    if reads is None:
        got = {n: call(Where()) for n, call in calls.items()}
    else:
        ran = reads.run({f"sysctl:{n}": call for n, call in calls.items()})
        got = {n: ran[f"sysctl:{n}"] for n in calls}
    return {n: (dict.fromkeys(sysctl_keys.get(n, [])) if isinstance(v, Stuck) else v)
            for n, v in got.items()}


def _missing_is_none(get: Any, ifname: str) -> Any:
    try:
        return next(iter(get("get", ifname=ifname, ext_mask=RTEXT_FILTER_SKIP_STATS)), None)
    except NetlinkError as exc:
        if exc.code != errno.ENODEV:
            raise
        return None


@dataclass
class _Dumps:
    """The kernel's state for the rails: each rail's link by name, then one dump per other
    object kind, whatever the number of rails. (A dump of every link on a node with many
    pods' interfaces cost 8x more, an event pass for one rail ~20x; pyroute2 filters route
    dumps by table in user space, so a dump per rail's table was a dump of every route each
    time.) Each message is made a typed value as it arrives and let go: holding a pass's
    raw messages to the end made every generation-2 collection during a pass 2-3x longer."""

    tables: frozenset[int]
    links: dict[str, LinkState] = field(default_factory=dict)
    addresses: dict[int, list[AddressInfo]] = field(default_factory=dict)
    routes: dict[int, list[RouteInfo]] = field(default_factory=dict)
    rules: list[RuleInfo] = field(default_factory=list)

    def link(self, name: str, msg: Any) -> None:
        if msg is not None:
            self.links[name] = link_from_msg(msg)
            release(msg)

    def addr(self, msg: Any) -> None:
        info = _addr_from_msg(msg)
        if info is not None:
            self.addresses.setdefault(int(msg["index"]), []).append(info)
        release(msg)

    def rule(self, msg: Any) -> None:
        self.rules.append(_rule_from_msg(msg))
        release(msg)

    def route(self, msg: Any) -> None:
        a = _attrs(msg, _ROUTE)
        table = _route_table(msg, a)
        if table in self.tables:  # most routes are other tables' (local, main)
            self.routes.setdefault(table, []).append(_route_from_msg(msg, a))
        release(msg)

    @classmethod
    def read(cls, ipr: Any, rails: list[Rail]) -> _Dumps:
        """Each rail's link, every address, the IPv4 rules and (with a table) the IPv4
        routes.

        pyroute2 0.9's IPRoute is a synchronous face over its AsyncIPRoute (`asyncore`)
        that runs the event loop once per request and once per message of a dump: 24 runs
        in one rail's pass, about a third of the CPU of its netlink reads. Asked on that
        loop in one run instead, the messages are the same and cost about 30 % less (the
        three dumps of 80 messages: 7.0 against 10.5 ms of CPU, measured). An IPRoute
        without that face (another release) is asked the synchronous way."""
        out = cls(frozenset(r.table for r in rails if r.table is not None))
        names = list(dict.fromkeys(r.interface for r in rails))
        core, run = getattr(ipr, "asyncore", None), getattr(ipr, "_run_with_cleanup", None)
        if core is None or run is None:
            for name in names:
                out.link(name, _missing_is_none(ipr.link, name))
            for msg in ipr.get_addr():
                out.addr(msg)
            for msg in ipr.get_rules(family=socket.AF_INET):
                out.rule(msg)
            for msg in ipr.get_routes(family=socket.AF_INET) if out.tables else ():
                out.route(msg)
            return out

        async def link(ifname: str) -> Any:
            try:
                return next(iter(await core.link("get", ifname=ifname,
                                                 ext_mask=RTEXT_FILTER_SKIP_STATS)), None)
            except NetlinkError as exc:
                if exc.code != errno.ENODEV:
                    raise
                return None

        async def collect() -> None:
            for name in names:
                out.link(name, await link(name))
            async for msg in await core.get_addr():
                out.addr(msg)
            async for msg in await core.get_rules(family=socket.AF_INET):
                out.rule(msg)
            if out.tables:
                async for msg in await core.get_routes(family=socket.AF_INET):
                    out.route(msg)

        run(collect)
        return out

    def of(self, rail: Rail, sysctls: dict[str, str | None]) -> RailObservation:
        link = self.links.get(rail.interface)
        if link is None:
            return RailObservation(rail=rail.name, link=None)
        own_src = f"{rail.ip}/32"
        return RailObservation(
            rail=rail.name,
            link=link,
            addresses=tuple(self.addresses.get(link.index, ())),
            routes=tuple(self.routes.get(rail.table, ())) if rail.table is not None else (),
            rules=tuple(r for r in self.rules
                        if r.src == own_src or (rail.table and r.table == rail.table)),
            sysctls=sysctls,
        )


def observe_rails(
    ipr: Any, rails: Iterable[Rail], procfs_root: Path, sysctl_keys: dict[str, list[str]],
    reads: BoundedReads | None = None,
) -> dict[str, RailObservation]:
    """One snapshot of every given rail: link, addresses, its table's routes, its rules, sysctls.

    `sysctl_keys` maps rail name -> sysctl names to read for it; with `reads` they are read
    off the caller's thread (a stuck one reads as unreadable).
    """
    rails = list(rails)
    sysctls = _read_sysctls(rails, procfs_root, sysctl_keys, reads)
    dumps = _Dumps.read(ipr, rails)
    return {rail.name: dumps.of(rail, sysctls[rail.name]) for rail in rails}
