"""The few types shared by probes, checks, remedies and publishers.

Probes produce observations (plain, immutable data read from the world), checks turn
observations into Findings, remedies turn drift into Actions. Nothing here does I/O.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

ConditionStatus = Literal["True", "False", "Unknown"]

class Words(str, enum.Enum):
    """An enum whose members are their words: a str, and str() and f-strings give the word
    (enum.StrEnum, which Python 3.10 lacks)."""

    def __str__(self) -> str:
        return str(self.value)


class ConditionType(Words):
    """The condition types of the public contract (True = good); a str, so the API, the
    status file and the metrics carry the plain name."""

    ROCE_NETWORK_READY = "RoCENetworkReady"
    ROCE_GID_STABLE = "RoCEGIDStable"
    RDMA_DEVICE_PLUGIN_READY = "RDMADevicePluginReady"
    LUSTRE_READY = "LustreReady"
    FABRIC_READY = "FabricReady"
    # Informational (not part of FabricReady unless configured): traffic really uses RDMA.
    FABRIC_TRAFFIC_ON_RDMA = "FabricTrafficOnRDMA"
    # With a `hardware` section: each rail's RDMA port, its HCA's PCIe link, error counters
    # and firmware (part of FabricReady when `hardware.gate`, the default).
    RDMA_HARDWARE_HEALTHY = "RDMAHardwareHealthy"
    # With a `custom_checks` section: the sites' own check scripts (node-problem-detector's
    # custom-plugin convention), part of FabricReady when `custom_checks.gate`, the default.
    CUSTOM_CHECKS_PASSED = "CustomChecksPassed"
    # With a `transport` section: an RC QP pair over each rail's pinned GID exchanged
    # messages (part of FabricReady only with `transport.gate`).
    RDMA_TRANSPORT_VERIFIED = "RDMATransportVerified"
    # With a `peers` section: each rail reached its peers' rails over RoCE (part of
    # FabricReady only with `peers.gate`).
    RDMA_PEERS_REACHABLE = "RDMAPeersReachable"
    # With an `nccl` section: NCCL with its default settings (no NCCL_IB_GID_INDEX) would
    # pick each rail's pinned GID (part of FabricReady only with `nccl.gate`).
    NCCL_DEFAULT_GID_PINNED = "NCCLDefaultGIDPinned"
    # With a `dra` section: the DRA driver's ResourceSlices for this node list each rail's
    # NIC with RDMA (the counterpart of RDMADevicePluginReady for resource.k8s.io/v1).
    RDMA_RESOURCE_SLICES_READY = "RDMAResourceSlicesReady"


ROCE_NETWORK_READY = ConditionType.ROCE_NETWORK_READY
ROCE_GID_STABLE = ConditionType.ROCE_GID_STABLE
RDMA_DEVICE_PLUGIN_READY = ConditionType.RDMA_DEVICE_PLUGIN_READY
LUSTRE_READY = ConditionType.LUSTRE_READY
FABRIC_READY = ConditionType.FABRIC_READY
FABRIC_TRAFFIC_ON_RDMA = ConditionType.FABRIC_TRAFFIC_ON_RDMA
RDMA_HARDWARE_HEALTHY = ConditionType.RDMA_HARDWARE_HEALTHY
CUSTOM_CHECKS_PASSED = ConditionType.CUSTOM_CHECKS_PASSED
RDMA_TRANSPORT_VERIFIED = ConditionType.RDMA_TRANSPORT_VERIFIED
RDMA_PEERS_REACHABLE = ConditionType.RDMA_PEERS_REACHABLE
NCCL_DEFAULT_GID_PINNED = ConditionType.NCCL_DEFAULT_GID_PINNED
RDMA_RESOURCE_SLICES_READY = ConditionType.RDMA_RESOURCE_SLICES_READY


@dataclass(frozen=True)
class SliceDevice:
    """One device of a ResourceSlice (resource.k8s.io/v1), its attributes by qualified name
    (a name without a domain is in the driver's, as the API defines it)."""

    slice: str  # the ResourceSlice's name
    name: str
    attributes: Mapping[str, str | int | bool]


@dataclass(frozen=True)
class SlicesObservation:
    """This node's ResourceSlices of one driver, the current generation of each pool."""

    devices: tuple[SliceDevice, ...] = ()
    error: str | None = None  # why they could not be read
    incomplete: tuple[str, ...] = ()  # pools with fewer slices than they say they have

# The hardware fingerprint labels the agent puts on its Node.
LABEL_PREFIX = "nodeagent.io/"
HCA_TYPE, FW_VERSION, BOARD_ID, DRIVER = (f"{LABEL_PREFIX}rdma-{k}" for k in (
    "hca-type", "fw-version", "board-id", "driver"))
FINGERPRINT_LABELS = (HCA_TYPE, FW_VERSION, BOARD_ID, DRIVER)


@dataclass(frozen=True)
class Finding:
    """The verdict for one condition type: what `kubectl describe node` will show."""

    type: ConditionType
    status: ConditionStatus
    reason: str
    message: str
    # The problems the message joins, one each (a reader lists them without re-splitting).
    problems: tuple[str, ...] = field(default=(), compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "True"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": str(self.type),
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
        }
        if self.problems:
            out["problems"] = list(self.problems)
        return out


@dataclass(frozen=True)
class Problem:
    """One thing a condition found wrong: a failure, or a fact it could not establish."""

    reason: str
    message: str
    unknown: bool = False


@dataclass
class Problems:
    """The one fold from problems to a condition's Finding, shared by every condition so
    status and reason cannot disagree: False when any problem is a failure, with the first
    failure's reason; else Unknown with the first unknown's reason; else True. The message
    names every problem, failures first, each group in the order found."""

    type: ConditionType
    found: list[Problem] = field(default_factory=list)

    def fail(self, reason: str, message: str) -> None:
        self.found.append(Problem(reason, message))

    def unknown(self, reason: str, message: str) -> None:
        self.found.append(Problem(reason, message, unknown=True))

    def extend(self, problems: Iterable[Problem]) -> None:
        self.found.extend(problems)

    def __bool__(self) -> bool:
        return bool(self.found)

    def finding(self, reason: str, message: str) -> Finding:
        """The Finding: the folded problems, or True with `reason` and `message`."""
        if not self.found:
            return Finding(self.type, "True", reason, message)
        return self.folded()

    def folded(self) -> Finding:
        """The Finding of problems already found (there must be some)."""
        assert self.found, "nothing to fold"
        failed = [p for p in self.found if not p.unknown]
        unknown = [p for p in self.found if p.unknown]
        status: ConditionStatus = "False" if failed else "Unknown"
        messages = tuple(p.message for p in failed + unknown)
        return Finding(self.type, status, (failed or unknown)[0].reason, "; ".join(messages),
                       messages)


# ---------------------------------------------------------------- network observations


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


# ---------------------------------------------------------------- GID table


class GidType(enum.Enum):
    """One enum for both sysfs strings and pyverbs numbers (which disagree)."""

    IB_ROCE_V1 = "IB/RoCE v1"
    ROCE_V2 = "RoCE v2"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class GidEntry:
    device: str
    port: int
    index: int
    gid: str  # canonical IPv6 text, e.g. "::ffff:10.10.0.5"
    gid_type: GidType
    ndev: str | None  # netdev name the GID belongs to; None when unknown

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address of an IPv4-mapped GID, else None."""
        prefix = "::ffff:"
        if self.gid.startswith(prefix) and "." in self.gid:
            return self.gid[len(prefix) :]
        return None


@dataclass(frozen=True)
class GidReadError:
    """A device (or port, or slot) whose GIDs could not be read, in one line."""

    device: str | None  # None: no device's own (pyverbs configured but not importable)
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class GidTable:
    """The non-empty entries of every RDMA port, plus where they came from."""

    source: Literal["sysfs", "pyverbs", "none"]
    entries: tuple[GidEntry, ...] = ()
    errors: tuple[GidReadError, ...] = ()  # unreadable devices/ports, one each

    def for_netdev(self, ifname: str) -> tuple[GidEntry, ...]:
        return tuple(e for e in self.entries if e.ndev == ifname)

    def errors_on(self, device: str | None) -> tuple[GidReadError, ...]:
        """The read errors that may hide a device's GIDs (None: any device's)."""
        return tuple(e for e in self.errors if device is None or e.device in (None, device))


@dataclass(frozen=True)
class QueuePair:
    """One QP as the kernel's resource tracking lists it (`rdma res show qp`)."""

    device: str
    port: int | None  # None: not bound to a port yet (RESET state)
    lqpn: int
    type: str  # RC, UD, GSI, SMI, ...
    state: str
    pid: int | None  # None: owned by the kernel (a ULP, or QP0/QP1 of ib_core)
    comm: str

    @property
    def management(self) -> bool:
        """QP0/QP1: every port has them and they hold no RoCE GID."""
        return self.type in ("GSI", "SMI")

    def describe(self) -> str:
        owner = f"pid {self.pid} {self.comm}" if self.pid is not None else f"kernel {self.comm}"
        return f"QP {self.lqpn} {self.type} {self.state} ({owner})"


@dataclass(frozen=True)
class QueuePairs:
    """Every QP on the host, or why they could not be listed."""

    qps: tuple[QueuePair, ...] = ()
    error: str | None = None

    def using(self, device: str, port: int) -> list[QueuePair]:
        """The QPs that may hold a GID of this port (all but the management QPs)."""
        return [q for q in self.qps if q.device == device and q.port in (None, port)
                and not q.management]

    def excluding(self, pid: int) -> QueuePairs:
        """Without one process's QPs: the agent's own transport probe never holds up the
        re-pin it would otherwise wait for."""
        return QueuePairs(tuple(q for q in self.qps if q.pid != pid), self.error)


@dataclass(frozen=True)
class RDMAVolume:
    """RDMA traffic through a port, both directions: packets, and bytes with headers."""

    packets: int = 0
    bytes: int = 0

    def __add__(self, other: RDMAVolume) -> RDMAVolume:
        return RDMAVolume(self.packets + other.packets, self.bytes + other.bytes)

    def __mul__(self, times: int) -> RDMAVolume:
        return RDMAVolume(self.packets * times, self.bytes * times)

    def most(self, other: RDMAVolume) -> RDMAVolume:
        return RDMAVolume(max(self.packets, other.packets), max(self.bytes, other.bytes))


@dataclass(frozen=True)
class RailCounters:
    """A rail's byte counters at one moment (None: not readable)."""

    speed_mbps: int | None = None
    netdev_tx_bytes: int | None = None  # the kernel stack's traffic (TCP and the rest)
    netdev_rx_bytes: int | None = None
    rdma_device: str | None = None
    rdma_port: int = 1
    rdma_tx_bytes: int | None = None  # RDMA traffic (port_xmit_data x 4)
    rdma_rx_bytes: int | None = None
    # Devices without byte counters (soft-RoCE has only hw_counters/sent_pkts, rcvd_pkts)
    # still show whether RDMA moves at all: their packet counters.
    rdma_tx_packets: int | None = None
    rdma_rx_packets: int | None = None
    # The agent's own probes' share of the RDMA counters so far (an upper bound, counted out
    # of the traffic verdict) and the largest one probe charged (one may straddle a sample).
    own_rdma: RDMAVolume = field(default_factory=RDMAVolume)
    own_rdma_largest: RDMAVolume = field(default_factory=RDMAVolume)


@dataclass(frozen=True)
class PcieLink:
    """The PCI function of an RDMA device: the link it trained at and the most it can do.
    Speeds in GT/s, widths in lanes (None: unreadable or not reported)."""

    address: str
    speed: float | None = None
    width: int | None = None
    max_speed: float | None = None
    max_width: int | None = None


@dataclass(frozen=True)
class PortHealth:
    """One rail's RDMA port as sysfs shows it at one moment (None: unreadable)."""

    device: str
    port: int
    state: str | None = None  # "ACTIVE", "DOWN", ... (the text after "4: ")
    phys_state: str | None = None  # "LinkUp", "Disabled", "Polling", ...
    link_layer: str | None = None  # "Ethernet" or "InfiniBand"
    rate_gbps: float | None = None
    rate: str | None = None  # as the kernel says it: "200 Gb/sec (4X HDR)"
    hca_type: str | None = None
    fw_ver: str | None = None
    pcie: PcieLink | None = None  # None: no PCI function (soft-RoCE) or not readable
    counters: dict[str, int] = field(default_factory=dict)  # counters/ and hw_counters/
    unreadable: tuple[str, ...] = ()  # attributes that could not be read, for the message


class TransportStep(Words):
    """Where an active probe broke, in the order a probe goes; the value is the status
    file's and the message's word for it."""

    PYVERBS = "pyverbs"  # not importable: the agent's environment, not the fabric
    DEVICE_OPEN = "device open"
    PORT = "port"
    GID = "GID"
    RESOURCES = "resources"
    QP_INIT = "QP to INIT"
    QP_RTR = "QP to RTR"
    QP_RTS = "QP to RTS"
    COMPLETION = "completion"
    TIMEOUT = "timeout"
    VERBS = "verbs"  # an error outside the steps


@dataclass(frozen=True)
class TransportResult:
    """One active probe of a rail: ok, or the step that failed and why."""

    rail: str
    ok: bool
    step: TransportStep | None = None
    error: str = ""
    messages: int = 0
    latency_p50_us: float | None = None
    latency_p99_us: float | None = None
    bandwidth_gbps: float | None = None
    seconds: float = 0.0
    gid_index: int | None = None
    at: float = 0.0  # when it ran (monotonic), set by whoever ran it
    moved: RDMAVolume = field(default_factory=RDMAVolume)  # at most, on the port


class PeerOutcome(Words):
    """How one probe of a peer ended. Only ROCE_FAILED and MTU_FAILED are fabric verdicts:
    TCP reached the peer's responder, so the node and its agent are there, and RDMA over
    the same rail did not get through."""

    OK = "ok"
    ROCE_FAILED = "RoCE failed"  # the RDMA reads failed or timed out; TCP had worked
    MTU_FAILED = "MTU failed"  # small reads passed, a read at the path MTU did not
    NO_RESPONDER = "no responder"  # TCP did not reach it, or it hung up without a reply
    REFUSED = "refused"  # its responder answered and would not set up (it says why)
    LOCAL = "local error"  # this side could not set up (device, GID, QP)


@dataclass(frozen=True)
class PeerProbe:
    """One probe of one peer on one rail."""

    rail: str
    address: str
    node: str | None
    outcome: PeerOutcome
    error: str = ""  # what failed, in the words of whoever failed (libibverbs, the kernel)
    rtt_us: tuple[float, ...] = ()  # each small read, in order
    mtu: int | None = None  # the path MTU the QP used (bytes), once set up
    at: float = 0.0  # when it ran (monotonic)
    bandwidth_gbps: float | None = None  # the bandwidth sample, on the probes that take it
    moved: RDMAVolume = field(default_factory=RDMAVolume)  # at most, on the port

    @property
    def label(self) -> str:
        return f"{self.node} {self.address}" if self.node else self.address


@dataclass(frozen=True)
class PeerStats:
    """One peer's recent probes, as the condition and the status file see them."""

    address: str
    node: str | None
    last: PeerProbe
    failing_for: int  # the latest probes in a row that did not end OK
    probes: int  # in the window
    failed: int  # in the window
    rtt_p50_us: float | None = None  # over the OK probes' reads in the window
    rtt_p99_us: float | None = None
    totals: Mapping[str, int] = field(default_factory=dict)  # by outcome, since the start
    failing: bool = False  # failing_for reached peers.failures
    bandwidth_gbps: float | None = None  # the latest bandwidth sample in the window

    @property
    def loss(self) -> float:
        return self.failed / self.probes if self.probes else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"address": self.address, "node": self.node, "outcome": str(self.last.outcome),
                "error": self.last.error, "failing_for": self.failing_for,
                "failing": self.failing, "probes": self.probes, "loss": round(self.loss, 4),
                "mtu": self.last.mtu,
                "rtt_p50_us": self.rtt_p50_us, "rtt_p99_us": self.rtt_p99_us,
                "bandwidth_gbps": self.bandwidth_gbps}


@dataclass(frozen=True)
class PeerRef:
    """A peer a rail probes: its rail address, and its node's name for messages; from the
    config's static list or from discovery (the peers' own cards)."""

    address: str
    node: str | None = None

    @property
    def label(self) -> str:
        return f"{self.node} {self.address}" if self.node else self.address


@dataclass(frozen=True)
class RailEndpoint:
    """Where a rail's RDMA traffic starts: its device and port, the pinned index of its
    IPv4 RoCE v2 GID, its address. What the transport and peer probes, the responder and
    the gang's ring probe are given."""

    device: str
    port: int
    gid_index: int
    address: str


@dataclass(frozen=True)
class Targets:
    """Per rail, where its probes start, or why it may not be probed (yet)."""

    ready: Mapping[str, RailEndpoint] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CardRail:
    """One rail on an agent's peer card: where its responder answers."""

    name: str
    address: str  # the rail's IPv4 address
    network: str  # the rail's network (CIDR): peers are found on the same one


@dataclass(frozen=True)
class PeerCard:
    """What an agent publishes (on its own Lease) so that agents on the same rail networks
    can probe it: its rails and its responder's port."""

    node: str
    port: int
    rails: tuple[CardRail, ...]


class MeshVerdict(Words):
    """One peer as its prober last judged it, published for the fleet's mesh view (a word
    each, so the annotation changes only when a verdict does)."""

    OK = "ok"
    ROCE = "roce"  # RoCE fails while TCP reaches the peer's responder
    MTU = "mtu"  # small reads pass, reads at the path MTU fail
    SILENT = "silent"  # no responder on TCP either (its agent is down): not a fabric verdict
    REFUSED = "refused"  # its responder would not set up
    LOCAL = "local"  # this node could not probe at all
    PENDING = "pending"  # not reached yet


@dataclass(frozen=True)
class VerbsDevice:
    """An RDMA device as a container sees it: its uverbs node, and whether it opens."""

    uverbs: str  # uverbs0
    ibdev: str | None  # mlx5_0, rxe0; None when sysfs does not say
    usable: bool  # a character device that opened read-write
    why: str = ""  # when not usable


@dataclass(frozen=True)
class GidSlot:
    """One slot of a port's GID table as a process sees it: what NCCL's selection reads.
    `version` 1 or 2 from gid_attrs/types, None when the read fails with EINVAL (an empty
    slot, or one whose netdev is in another namespace) or says something else; `missing`
    when the types file cannot be opened at all (NCCL fails on that)."""

    index: int
    gid: ipaddress.IPv6Address  # :: for an empty slot
    version: int | None
    missing: bool = False

    @property
    def ipv4(self) -> str | None:
        mapped = self.gid.ipv4_mapped
        return str(mapped) if mapped is not None else None


@dataclass(frozen=True)
class PortView:
    """An RDMA port as a process sees it: state, link layer and every GID slot (the table's
    length is the kernel's gid_tbl_len: NCCL walks all of it)."""

    device: str
    port: int
    active: bool
    ethernet: bool
    slots: tuple[GidSlot, ...]
    state: str = ""  # the kernel's word, for messages: ACTIVE, DOWN, ...


@dataclass(frozen=True)
class NodeRail:
    """A rail as the node's agent reports it: where its GID is pinned."""

    name: str
    address: str | None = None
    device: str | None = None
    port: int | None = None
    gid_index: int | None = None  # the pinned index of its IPv4 RoCE v2 GID


@dataclass(frozen=True)
class NodeVerdict:
    """What the node's agent says (its status file, or its Node): FabricReady, the rails,
    the Lustre mounts; `problem` when it could not be read (the preflight fails closed)."""

    node: str = ""
    ready: bool = False
    reason: str = ""
    message: str = ""
    rails: tuple[NodeRail, ...] = ()
    lustre: tuple[str, ...] = ()
    problem: str | None = None


@dataclass(frozen=True)
class Unfit:
    """One reason a training pod must not start: the check and a line that says what to
    change."""

    check: str  # devices, node, storage, env, gang
    message: str

    def line(self) -> str:
        return f"{self.check}: {self.message}"


@dataclass(frozen=True)
class CustomCheckResult:
    """One run of a custom check: ok (exit 0), problem (exit 1) or unknown (exit 2, any
    other code, a timeout, not runnable), with the first line it printed."""

    name: str
    verdict: Literal["ok", "problem", "unknown"]
    message: str
    seconds: float = 0.0


@dataclass(frozen=True)
class Pin:
    """A learned or configured GID pin for one rail."""

    index: int
    device: str | None = None
    port: int | None = None
    learned: bool = False


# ---------------------------------------------------------------- drift (checks -> remedies)


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


# ---------------------------------------------------------------- Kubernetes objects


@dataclass(frozen=True)
class Toleration:
    key: str = ""  # "" matches every key (only with Exists)
    operator: str = "Equal"
    effect: str = ""  # "" matches every effect


@dataclass(frozen=True)
class Termination:
    """A container's terminated state: its current one, or its last."""

    reason: str = "?"
    exit_code: str = "?"
    finished_at: str = "?"
    message: str = ""


@dataclass(frozen=True)
class ContainerFacts:
    """One container of a pod: its spec image and, once the kubelet reported it, its
    status (what image ran, restarts, waiting reason, terminations)."""

    name: str
    spec_image: str = ""
    reported: bool = False  # the pod's status lists this container
    image: str = ""  # what the kubelet says ran
    image_id: str = ""  # repo@digest on containerd and CRI-O; may be a bare config digest
    restarts: int = 0
    waiting: str = ""  # state.waiting.reason (CrashLoopBackOff, ...)
    terminated: Termination | None = None
    last_terminated: Termination | None = None
    resources: frozenset[str] = frozenset()  # resource names in its limits and requests


@dataclass(frozen=True)
class PodFacts:
    """What the agent reads of a pod, parsed once from the API object."""

    namespace: str
    name: str
    uid: str = ""
    created: str = ""  # creationTimestamp as written (RFC 3339)
    phase: str = ""
    ready: bool = False
    ready_changed: str = ""  # the Ready condition's lastTransitionTime
    deleting: bool = False
    owners: tuple[tuple[str, str], ...] = ()  # (kind, name) of each ownerReference
    containers: tuple[ContainerFacts, ...] = ()
    init_resources: frozenset[str] = frozenset()  # what its init containers request

    def __str__(self) -> str:
        return f"pod {self.namespace}/{self.name}"

    def requests_any(self, resources: Iterable[str]) -> bool:
        asked = self.init_resources.union(*(c.resources for c in self.containers))
        return any(r in asked for r in resources)


@dataclass(frozen=True)
class DaemonSetFacts:
    namespace: str
    name: str
    tolerations: tuple[Toleration, ...] = ()
    images: tuple[str, ...] = ()  # its pod template's container images


@dataclass(frozen=True)
class NodeFacts:
    name: str = ""
    os: str = ""  # status.nodeInfo as the kubelet reports it
    architecture: str = ""
    allocatable: Mapping[str, str] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DevicePluginObservation:
    """This node, the plugin DaemonSet and its pods on this node, parsed once from the API
    (nodeagent.kube.objects): checks read fields, never JSON."""

    node: NodeFacts | None = None
    daemonset: DaemonSetFacts | None = None
    pods: tuple[PodFacts, ...] = ()  # the plugin's, on this node
    node_pods: tuple[PodFacts, ...] = ()  # every pod on this node
    error: str | None = None  # the API could not be read: every fact is Unknown
    images: tuple[ImagePlatforms, ...] = ()  # what the registry says the plugin's images offer
    machine: str = ""  # this host's uname machine (x86_64, aarch64): the platform variant
    # From this node's container runtime, for the newest plugin pod: the platform of each
    # container's pulled image (by container name) and its newest log lines.
    runtime_images: dict[str, ImagePlatforms] = field(default_factory=dict)
    log_lines: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Platform:
    """An OCI platform: os/architecture[/variant]."""

    os: str
    architecture: str
    variant: str = ""

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)

    def runs(self, image: Platform) -> bool:
        """Whether a node of this platform runs an image built for `image`.

        arm64 images rarely name their variant: an empty variant there means v8.
        """
        if (self.os, self.architecture) != (image.os, image.architecture):
            return False
        if not self.variant or not image.variant:
            return True
        return self.variant == image.variant


@dataclass(frozen=True)
class ImagePlatforms:
    """One container image as its registry describes it; `error` when it could not be read
    (the platform fact is then Unknown, never a false alarm)."""

    image: str  # the reference that was resolved
    digest: str = ""
    platforms: tuple[Platform, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class GidShift:
    """A rail whose IPv4 RoCE v2 GID is off its pinned index."""

    device: str
    port: int
    index: int  # where it is now
    pinned: int
    slot_taken_by: str | None  # the GID now at the pinned index, if any


# Lustre: what one look at the configured mounts saw.


@dataclass(frozen=True)
class MountEntry:
    mountpoint: str
    fstype: str
    source: str
    options: frozenset[str]  # per-mount and superblock options, 'flock', 'rw', 'user_xattr'...


class HealthState(Words):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"  # NOT HEALTHY, or a device reported unhealthy
    LBUG = "lbug"  # the client hit an LBUG: it stays broken until a reboot
    UNREADABLE = "unreadable"
    ABSENT = "absent"  # no health_check: the client is not loaded


@dataclass(frozen=True)
class Health:
    """The Lustre client's own verdict (health_check)."""

    state: HealthState
    detail: str = ""


@dataclass
class ProbeResult:
    done: bool  # finished within the timeout
    ok: bool  # finished and succeeded
    seconds: float  # how long it took, or how long it has been running
    output: str = ""
    already_running: bool = False  # a previous probe is still stuck: none was started


@dataclass(frozen=True)
class LustreObservation:
    mounts: dict[str, MountEntry]  # by mountpoint (the last entry wins, as in the kernel)
    mount_errors: tuple[str, ...]
    health: Health
    statfs: dict[str, ProbeResult]  # by configured mountpoint, only for mounts present
    lfs: dict[str, str] | None  # target -> status; None when `lfs` is not there
    lfs_error: str | None = None


@dataclass(frozen=True)
class RailTimeline:
    """What only time shows of a rail (the daemon's flap trackers and repair guard): its
    time-based verdict for RoCENetworkReady (LinkFlapping, ManagedElsewhere), if any, and
    its figures for the status file and the metrics."""

    verdict: tuple[str, str] | None = None  # (reason, message)
    repairs: Mapping[str, int] = field(default_factory=dict)  # action kind -> count
    carrier_losses_total: int | None = None
    carrier_losses_in_window: int | None = None


@dataclass(frozen=True)
class RailStatus:
    """One rail as the status file, the metrics and `status --json` show it."""

    name: str
    interface: str
    carrier: bool | None = None
    mtu: int | None = None
    drift: tuple[str, ...] = ()
    gid_index: int | None = None  # where the rail's IPv4 RoCE v2 GID is now
    gid_index_pinned: int | None = None
    # Where the rail's GID is pinned: what a job on the node must use (nodeagent preflight
    # reads them from the status file).
    address: str | None = None
    rdma_device: str | None = None
    rdma_port: int | None = None
    # The GID index NCCL with default settings would pick on the rail's port (checks/nccl).
    nccl_default_gid_index: int | None = None
    counters: RailCounters | None = None
    port: PortHealth | None = None  # with a hardware section
    transport: TransportResult | None = None  # with a transport section: the latest probe
    peers: tuple[PeerStats, ...] | None = None  # with a peers section: each peer's probes
    # The daemon's own history of the rail (absent from check/apply):
    carrier_losses_total: int | None = None
    carrier_losses_in_window: int | None = None
    repairs_total: Mapping[str, int] | None = None  # drift kind -> repairs since start
    # Seconds since its netdev moved to another network namespace (lent to a pod): while
    # lent, the rail is not checked, probed or repaired.
    lent_seconds: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name, "interface": self.interface, "carrier": self.carrier,
            "mtu": self.mtu, "drift": list(self.drift), "gid_index": self.gid_index,
            "gid_index_pinned": self.gid_index_pinned, "address": self.address,
            "rdma_device": self.rdma_device, "rdma_port": self.rdma_port,
            "nccl_default_gid_index": self.nccl_default_gid_index,
        }
        c = self.counters
        if c is not None:
            out.update({
                "link_speed_mbps": c.speed_mbps, "netdev_tx_bytes": c.netdev_tx_bytes,
                "netdev_rx_bytes": c.netdev_rx_bytes, "rdma_tx_bytes": c.rdma_tx_bytes,
                "rdma_rx_bytes": c.rdma_rx_bytes, "rdma_tx_packets": c.rdma_tx_packets,
                "rdma_rx_packets": c.rdma_rx_packets})
        if self.carrier_losses_total is not None:
            out["carrier_losses_total"] = self.carrier_losses_total
            out["carrier_losses_in_window"] = self.carrier_losses_in_window
        if self.repairs_total is not None:
            out["repairs_total"] = dict(self.repairs_total)
        if self.lent_seconds is not None:
            out["lent_seconds"] = round(self.lent_seconds, 1)
        t = self.transport
        if t is not None:
            out["transport"] = {
                "ok": t.ok, "step": t.step or "", "error": t.error, "messages": t.messages,
                "latency_p50_us": t.latency_p50_us, "latency_p99_us": t.latency_p99_us,
                "bandwidth_gbps": t.bandwidth_gbps, "seconds": t.seconds,
                "gid_index": t.gid_index}
        if self.peers is not None:
            out["peers"] = [p.as_dict() for p in self.peers]
        p = self.port
        if p is not None:
            out["port"] = {
                "device": p.device, "port": p.port, "state": p.state,
                "phys_state": p.phys_state, "link_layer": p.link_layer, "rate": p.rate,
                "hca_type": p.hca_type, "fw_ver": p.fw_ver, "counters": dict(p.counters),
                "pcie": None if p.pcie is None else {
                    "address": p.pcie.address, "speed": p.pcie.speed, "width": p.pcie.width,
                    "max_speed": p.pcie.max_speed, "max_width": p.pcie.max_width}}
        return out


@dataclass
class Report:
    """What check/apply print with --json and what the status file holds."""

    node: str
    findings: list[Finding]
    actions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    gid_source: str = "none"
    rails: list[RailStatus] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)  # hardware fingerprint for the Node

    @property
    def ok(self) -> bool:
        """FabricReady: every condition that gates the node (the informational
        FabricTrafficOnRDMA only when configured to gate)."""
        fabric = [f for f in self.findings if f.type == FABRIC_READY]
        return all(f.ok for f in fabric or self.findings)

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "ok": self.ok,
            "conditions": [f.as_dict() for f in self.findings],
            "actions": list(self.actions),
            "errors": list(self.errors),
            "gid_source": self.gid_source,
            "rails": [r.as_dict() for r in self.rails],
            "labels": dict(self.labels),
        }


@dataclass(frozen=True)
class LustreProbeStatus:
    mountpoint: str
    probe_seconds: float  # how long its statfs took, or has been running
    hung: bool


class DaemonRun(Words):
    """The daemon's state in its status file."""

    RUNNING = "running"
    STOPPED = "stopped"  # SIGTERM: the last pass's verdict, left for `status` to read


@dataclass(frozen=True)
class DaemonState:
    state: DaemonRun
    passes: int
    resync_interval: float
    last_pass_seconds: float
    reload_error: str | None = None  # why the last SIGHUP kept the old config

    def as_dict(self) -> dict[str, Any]:
        return {"state": str(self.state), "reload_error": self.reload_error, "passes": self.passes,
                "resync_interval": self.resync_interval,
                "last_pass_seconds": round(self.last_pass_seconds, 6)}


@dataclass(frozen=True)
class PublisherState:
    """The Node writer's own view of its work: the status file's `kubernetes` section."""

    synced: bool = False  # the Node says what the latest verdict says
    last_error: str | None = None
    tainted: bool = False
    taint_reason: str = ""
    requests: int = 0
    writes: int = 0
    conflicts: int = 0
    errors: int = 0
    events_dropped: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Status:
    """The daemon's snapshot of one pass: what the status file, the metrics and the Node
    writer all consume. `since` is the one record of when each condition took its current
    status (wall clock): the file's `since`, the metrics' transition timestamps and the
    Node's lastTransitionTime all come from it."""

    report: Report
    since: Mapping[str, float] = field(default_factory=dict)
    probe_seconds: Mapping[str, float] = field(default_factory=dict)
    lustre: tuple[LustreProbeStatus, ...] | None = None
    kubernetes: PublisherState | None = None  # the publisher's own view of its work
    daemon: DaemonState | None = None
    peer_card: PeerCard | None = None  # with peers and kubernetes: published on the Lease

    @property
    def ok(self) -> bool:
        return self.report.ok

    @property
    def findings(self) -> list[Finding]:
        return self.report.findings

    @property
    def labels(self) -> dict[str, str]:
        return self.report.labels

    def document(self) -> dict[str, Any]:
        """The status file's document (the public JSON contract), without the daemon
        section the writer adds with its pid and time."""
        data = self.report.as_dict()
        for c in data["conditions"]:
            if c["type"] in self.since:
                c["since"] = rfc3339(self.since[c["type"]])
        data["probe_seconds"] = {k: round(v, 6) for k, v in self.probe_seconds.items()}
        if self.lustre is not None:
            data["lustre"] = [{"mountpoint": p.mountpoint,
                               "probe_seconds": round(p.probe_seconds, 6), "hung": p.hung}
                              for p in self.lustre]
        if self.kubernetes is not None:
            data["kubernetes"] = self.kubernetes.as_dict()
        return data


def rfc3339(wall: float) -> str:
    """Kubernetes' time format, to the second, UTC."""
    return datetime.fromtimestamp(wall, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
