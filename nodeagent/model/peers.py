"""The transport and peer probes' results, the rails' endpoints and the peer card."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeagent.model.rdma import RDMAVolume
from nodeagent.model.words import Words


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
class Class:
    """Where in the fabric's QoS a probe's packets go: the GRH traffic class (its top six
    bits are the IP DSCP on RoCE v2) and the service level, as NCCL_IB_TC and NCCL_IB_SL."""

    traffic_class: int = 0
    service_level: int = 0

    @property
    def words(self) -> str:
        """'class 104 (DSCP 26)'"""
        return f"class {self.traffic_class} (DSCP {self.traffic_class >> 2})"


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
    traffic_class: int = 0  # the class it ran in, both ways

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
    def traffic_class(self) -> int:
        return self.last.traffic_class

    @property
    def loss(self) -> float:
        return self.failed / self.probes if self.probes else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"address": self.address, "node": self.node, "outcome": str(self.last.outcome),
                "error": self.last.error, "failing_for": self.failing_for,
                "failing": self.failing, "probes": self.probes, "loss": round(self.loss, 4),
                "mtu": self.last.mtu, "traffic_class": self.traffic_class,
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
    # rail -> the switch it hears over LLDP now (with an lldp section): discovery takes a
    # share of peers under the same switch and a share under others
    switches: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CardRail:
    """One rail on an agent's peer card: where its responder answers."""

    name: str
    address: str  # the rail's IPv4 address
    network: str  # the rail's network (CIDR): peers are found on the same one
    switch: str | None = None  # the switch it hears over LLDP, label-safe; None: not known


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
