"""A rail's host networking as netlink shows it, and the drift the checks hand the remedies."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

from nodeagent.model.words import Words


@dataclass(frozen=True)
class LinkState:
    ifname: str
    index: int
    mtu: int
    admin_up: bool
    carrier: bool
    operstate: str
    # The kernel's own carrier counters (IFLA_CARRIER_CHANGES / _DOWN_COUNT): flaps that
    # happen between two reads, or while a netlink buffer overflowed, are still counted.
    carrier_changes: int | None = None
    carrier_down_count: int | None = None


@dataclass(frozen=True)
class AddressInfo:
    address: str  # without prefix
    prefixlen: int
    family: int  # socket.AF_INET / AF_INET6

    @property
    def cidr(self) -> str:
        return f"{self.address}/{self.prefixlen}"


@dataclass(frozen=True)
class RouteInfo:
    table: int
    dst: str  # "0.0.0.0/0" for default
    gateway: str | None
    oif: int | None
    prefsrc: str | None = None


@dataclass(frozen=True)
class RuleInfo:
    priority: int | None
    src: str | None  # "10.0.0.5/32"
    table: int


@dataclass(frozen=True)
class Deletion:
    """An rtnetlink deletion event, typed: what the kernel just removed."""

    what: Literal["address", "route", "rule"]
    ifindex: int | None = None  # address: its interface
    address: AddressInfo | None = None
    route: RouteInfo | None = None
    rule: RuleInfo | None = None


class EventKind(Words):
    LINK = "link"
    ADDRESS = "address"
    ROUTE = "route"
    RULE = "rule"


@dataclass(frozen=True)
class KernelEvent:
    """One rtnetlink message, decoded on the netlink thread into what the loop uses, so
    the loop never walks a message's attributes."""

    kind: EventKind
    index: int | None = None  # the link's (links, addresses) or the route's output interface
    ifname: str | None = None  # links
    table: int | None = None  # routes and rules (RTA_TABLE/FRA_TABLE: tables past 255)
    src: str | None = None  # a rule's source address, a route's preferred source
    link: LinkState | None = None  # a link's state as the kernel announced it
    deletion: Deletion | None = None  # an IPv4 address, route or rule removed
    # A link that left this network namespace for another (RTM_DELLINK with
    # IFLA_NEW_NETNSID): moved into a pod by a DRA driver or a CNI, not deleted.
    moved_away: bool = False


@dataclass(frozen=True)
class RailObservation:
    """Everything the netlink and sysctl probes saw of one rail at one instant."""

    rail: str
    link: LinkState | None  # None: the interface does not exist
    addresses: tuple[AddressInfo, ...] = ()
    routes: tuple[RouteInfo, ...] = ()  # routes in the rail's table (if any)
    rules: tuple[RuleInfo, ...] = ()  # IPv4 rules that look up the rail's table or name its address
    sysctls: dict[str, str | None] = field(default_factory=dict)  # key -> value, None unreadable


class DriftKind(enum.Enum):
    """What is wrong on a rail, in the order that picks a condition's reason."""

    INTERFACE_MISSING = "InterfaceMissing"
    LINK_ADMIN_DOWN = "LinkDown"
    NO_CARRIER = "NoCarrier"
    ADDRESS_MISSING = "AddressMissing"
    ADDRESS_PREFIX = "AddressPrefixWrong"
    MTU = "MTUMismatch"
    ROUTE_MISSING = "RouteMissing"
    RULE_MISSING = "RuleMissing"
    RULE_STALE = "RuleStale"
    SYSCTL = "SysctlMismatch"
    FOREIGN_ADDRESS = "ForeignAddress"
    # RoCEGIDStable's drift, repaired by re-pinning (remedies/gid.py); never from rail_drift.
    GID_SHIFTED = "GIDIndexShifted"

    @property
    def reason(self) -> str:
        return self.value


DRIFT_ORDER = {kind: i for i, kind in enumerate(DriftKind)}


# Repairs after which the kernel rewrites the port's GID table (its GIDs follow the netdev's
# addresses and state); a route, rule, MTU or sysctl repair leaves the table alone.
GID_AFFECTING = frozenset({DriftKind.INTERFACE_MISSING, DriftKind.LINK_ADMIN_DOWN,
                           DriftKind.ADDRESS_MISSING, DriftKind.ADDRESS_PREFIX,
                           DriftKind.FOREIGN_ADDRESS, DriftKind.GID_SHIFTED})


@dataclass(frozen=True)
class Drift:
    """One difference between a rail's config and the kernel.

    `detail` names the item for kinds that have several (the route's destination, the
    sysctl key, the foreign or wrong-prefix address, the stale rule's priority).
    """

    rail: str
    kind: DriftKind
    message: str
    repairable: bool
    detail: str = ""


@dataclass(frozen=True)
class Neighbour:
    """What the switch port at a rail's other end says of itself in LLDP (IEEE 802.1AB):
    its chassis and port (as their subtypes word them: a MAC as aa:bb:.., a name as is),
    its system name and port description when it sends them."""

    chassis_id: str
    port_id: str
    ttl: int  # seconds the switch says this holds
    system_name: str | None = None
    port_description: str | None = None

    @property
    def switch(self) -> str:
        """How messages and labels name the switch: its system name, else its chassis."""
        return self.system_name or self.chassis_id

    @property
    def port(self) -> str:
        return self.port_description or self.port_id
