"""One pass's report and the daemon's status: what the status file, the metrics and the
Node writer consume."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from nodeagent.model.conditions import FABRIC_READY, Finding
from nodeagent.model.kube import DeviceRef
from nodeagent.model.lustre import LustreProbeStatus
from nodeagent.model.network import Neighbour
from nodeagent.model.peers import PeerCard, PeerStats, TransportResult
from nodeagent.model.rdma import PortHealth, RailCounters
from nodeagent.model.words import Words


@dataclass(frozen=True)
class CustomCheckResult:
    """One run of a custom check: ok (exit 0), problem (exit 1) or unknown (exit 2, any
    other code, a timeout, not runnable), with the first line it printed."""

    name: str
    verdict: Literal["ok", "problem", "unknown"]
    message: str
    seconds: float = 0.0


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
class RailLink:
    """The rail's netdev as the pass found it, and what differs from its config."""

    carrier: bool | None = None
    mtu: int | None = None
    drift: tuple[str, ...] = ()


@dataclass(frozen=True)
class RailRoce:
    """Where the rail's RoCE GID is, and where it is pinned: what a job on the node must use
    (nodeagent preflight reads them from the status file)."""

    address: str | None = None
    rdma_device: str | None = None
    rdma_port: int | None = None
    gid_index: int | None = None  # where the rail's IPv4 RoCE v2 GID is now
    gid_index_pinned: int | None = None
    # The GID index NCCL with default settings would pick on the rail's port (checks/nccl).
    nccl_default_gid_index: int | None = None


@dataclass(frozen=True)
class RailLent:
    """A rail whose netdev moved to another network namespace (lent to a pod): while lent,
    it is not checked, probed or repaired."""

    seconds: float  # since it left
    to: str | None = None  # "pod ns/name (claim ns/c)", where the claims name it


@dataclass(frozen=True)
class RailStatus:
    """One rail as the status file, the metrics and `status --json` show it (flat there:
    the groups here are for the code, the JSON keys are the public contract)."""

    name: str
    interface: str
    link: RailLink = RailLink()
    roce: RailRoce = RailRoce()
    counters: RailCounters | None = None
    port: PortHealth | None = None  # with a hardware section
    transport: TransportResult | None = None  # with a transport section: the latest probe
    peers: tuple[PeerStats, ...] | None = None  # with a peers section: each peer's probes
    history: RailTimeline | None = None  # the daemon's own (absent from check/apply)
    lent: RailLent | None = None
    # With an lldp section: the switch port at its far end, while its LLDP holds.
    switch: Neighbour | None = None
    # With a dra section: the rail's device in the driver's ResourceSlices.
    dra_device: DeviceRef | None = None

    def as_dict(self) -> dict[str, Any]:
        link, roce = self.link, self.roce
        out: dict[str, Any] = {
            "name": self.name, "interface": self.interface, "carrier": link.carrier,
            "mtu": link.mtu, "drift": list(link.drift), "gid_index": roce.gid_index,
            "gid_index_pinned": roce.gid_index_pinned, "address": roce.address,
            "rdma_device": roce.rdma_device, "rdma_port": roce.rdma_port,
            "nccl_default_gid_index": roce.nccl_default_gid_index,
        }
        c = self.counters
        if c is not None:
            out.update({
                "link_speed_mbps": c.speed_mbps, "netdev_tx_bytes": c.netdev_tx_bytes,
                "netdev_rx_bytes": c.netdev_rx_bytes, "rdma_tx_bytes": c.rdma_tx_bytes,
                "rdma_rx_bytes": c.rdma_rx_bytes, "rdma_tx_packets": c.rdma_tx_packets,
                "rdma_rx_packets": c.rdma_rx_packets})
        h = self.history
        if h is not None and h.carrier_losses_total is not None:
            out["carrier_losses_total"] = h.carrier_losses_total
            out["carrier_losses_in_window"] = h.carrier_losses_in_window
        if h is not None:
            out["repairs_total"] = dict(h.repairs)
        if self.lent is not None:
            out["lent_seconds"] = round(self.lent.seconds, 1)
            if self.lent.to is not None:
                out["lent_to"] = self.lent.to
        if self.dra_device is not None:
            d = self.dra_device
            out["dra_device"] = {"driver": d.driver, "pool": d.pool, "device": d.device}
        if self.switch is not None:
            s = self.switch
            out["lldp"] = {"switch": s.switch, "port": s.port, "chassis_id": s.chassis_id,
                           "port_id": s.port_id, "system_name": s.system_name,
                           "port_description": s.port_description, "ttl": s.ttl}
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
    # With dra.device_taints: the rails whose device carries the agent's DeviceTaintRule.
    device_taints: tuple[str, ...] | None = None
    device_taints_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.device_taints is None:
            del out["device_taints"], out["device_taints_error"]
        else:
            out["device_taints"] = list(self.device_taints)
        return out


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
