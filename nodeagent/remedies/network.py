"""Repair rail drift: the only module that changes the kernel.

Planning (drift -> actions) is pure, so `apply --dry-run` prints exactly what `apply` would
run. Execution is idempotent: 'already exists' / 'already gone' count as done.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.config import Config, Rail, sysctl_parts
from nodeagent.io.files import write_attribute
from nodeagent.model import Drift, DriftKind

RT_SCOPE_LINK = 253
RTPROT_STATIC = 4

# Order in which a rail's repairs run: a route needs the link up and the address present.
_OP_ORDER = (
    "link_up",
    "set_mtu",
    "sysctl",
    "addr_add",
    "addr_del",
    "route",
    "rule_add",
    "rule_del",
)


@dataclass(frozen=True)
class Action:
    rail: str
    kind: DriftKind
    op: str
    text: str  # what `apply` reports and `--dry-run` prints
    args: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


def addr_args(cidr: str) -> dict[str, Any]:
    iface = ipaddress.ip_interface(cidr)
    family = socket.AF_INET if iface.version == 4 else socket.AF_INET6
    return {"address": str(iface.ip), "prefixlen": iface.network.prefixlen, "family": family}


def plan_rail(cfg: Config, rail: Rail, ifindex: int | None, drift: Iterable[Drift]) -> list[Action]:
    """The actions that repair a rail's repairable drift, in a safe order."""
    if ifindex is None:
        return []
    label = rail.label
    actions: list[Action] = []
    for d in drift:
        if not d.repairable:
            continue
        k = d.kind
        if k is DriftKind.LINK_ADMIN_DOWN:
            actions.append(
                Action(rail.name, k, "link_up", f"{label}: set link up", {"index": ifindex})
            )
        elif k is DriftKind.MTU and rail.mtu is not None:
            actions.append(
                Action(
                    rail.name,
                    k,
                    "set_mtu",
                    f"{label}: set mtu {rail.mtu}",
                    {"index": ifindex, "mtu": rail.mtu},
                )
            )
        elif k is DriftKind.SYSCTL:
            value = cfg.sysctls_for(rail)[d.detail]
            actions.append(
                Action(
                    rail.name,
                    k,
                    "sysctl",
                    f"{label}: set sysctl {d.detail}={value}",
                    {"key": d.detail, "value": value},
                )
            )
        elif k is DriftKind.ADDRESS_MISSING:
            actions.append(
                Action(
                    rail.name,
                    k,
                    "addr_add",
                    f"{label}: add address {rail.address}",
                    {"index": ifindex, **addr_args(rail.address)},
                )
            )
        elif k in (DriftKind.ADDRESS_PREFIX, DriftKind.FOREIGN_ADDRESS):
            actions.append(
                Action(
                    rail.name,
                    k,
                    "addr_del",
                    f"{label}: remove address {d.detail}",
                    {"index": ifindex, **addr_args(d.detail)},
                )
            )
        elif k is DriftKind.ROUTE_MISSING and rail.table is not None:
            if d.detail == rail.network:
                args = {
                    "dst": rail.network,
                    "oif": ifindex,
                    "table": rail.table,
                    "prefsrc": rail.ip,
                    "scope": RT_SCOPE_LINK,
                    "proto": RTPROT_STATIC,
                }
                text = f"{label}: route {rail.network} dev {rail.interface} table {rail.table}"
            else:
                args = {
                    "dst": "0.0.0.0/0",
                    "gateway": rail.gateway,
                    "oif": ifindex,
                    "table": rail.table,
                    "proto": RTPROT_STATIC,
                }
                text = (
                    f"{label}: route default via {rail.gateway} dev {rail.interface} "
                    f"table {rail.table}"
                )
            actions.append(Action(rail.name, k, "route", text, args))
        elif k is DriftKind.RULE_MISSING and rail.table is not None:
            args = {"src": rail.ip, "src_len": 32, "table": rail.table}
            pref = ""
            if rail.rule_priority is not None:
                args["priority"] = rail.rule_priority
                pref = f" priority {rail.rule_priority}"
            actions.append(
                Action(
                    rail.name,
                    k,
                    "rule_add",
                    f"{label}: add rule from {rail.ip} lookup {rail.table}{pref}",
                    args,
                )
            )
        elif k is DriftKind.RULE_STALE and rail.table is not None:
            actions.append(
                Action(
                    rail.name,
                    k,
                    "rule_del",
                    f"{label}: remove rule from {rail.ip} lookup {rail.table} priority {d.detail}",
                    {"src": rail.ip, "src_len": 32, "table": rail.table, "priority": int(d.detail)},
                )
            )
    actions.sort(key=lambda a: _OP_ORDER.index(a.op))
    return actions


def _netlink_errno(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    return getattr(exc, "errno", None)


def _run(ipr: Any, procfs_root: Path, rail: Rail, action: Action) -> None:
    a = action.args
    if action.op == "link_up":
        ipr.link("set", index=a["index"], state="up")
    elif action.op == "set_mtu":
        ipr.link("set", index=a["index"], mtu=a["mtu"])
    elif action.op == "sysctl":
        write_attribute(procfs_root, sysctl_parts(rail.interface, a["key"]), f"{a['value']}\n")
    elif action.op == "addr_add":
        ipr.addr("add", **a)
    elif action.op == "addr_del":
        ipr.addr("del", **a)
    elif action.op == "route":
        ipr.route("replace", **a)
    elif action.op == "rule_add":
        ipr.rule("add", **a)
    elif action.op == "rule_del":
        ipr.rule("del", **a)
    else:  # pragma: no cover - plan_rail only makes the ops above
        raise ValueError(f"unknown op {action.op}")


_ALREADY_DONE = {
    "addr_add": errno.EEXIST,
    "rule_add": errno.EEXIST,
    "addr_del": errno.EADDRNOTAVAIL,
    "rule_del": errno.ENOENT,
}


def execute(
    ipr: Any, procfs_root: Path, rails: dict[str, Rail], actions: Sequence[Action]
) -> tuple[list[Action], list[str]]:
    """Run actions in order; return (done, one error line per failed action)."""
    done: list[Action] = []
    errors: list[str] = []
    for action in actions:
        try:
            _run(ipr, procfs_root, rails[action.rail], action)
        except Exception as exc:  # NetlinkError, OSError: report it and go on with the rest
            if _netlink_errno(exc) == _ALREADY_DONE.get(action.op):
                continue  # someone else did it between our probe and now
            errors.append(f"{action.text}: failed: {exc}")
            continue
        done.append(action)
    return done, errors
