"""The condition types of the public contract and the Findings the checks give them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from nodeagent.model.words import Words

ConditionStatus = Literal["True", "False", "Unknown"]


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
    # With a `congestion` section: no rail's pause frames, congestion notifications or
    # retransmissions grow faster than their rate (part of FabricReady only with
    # `congestion.gate`). True = good, as every condition here: not "FabricCongested".
    FABRIC_NOT_CONGESTED = "FabricNotCongested"
    # With an `lldp` section: each rail's switch port heard over LLDP, and its switch the
    # one expected (part of FabricReady only with `lldp.gate`; no LLDP never counts).
    RAIL_CABLING_VERIFIED = "RailCablingVerified"


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
FABRIC_NOT_CONGESTED = ConditionType.FABRIC_NOT_CONGESTED
RAIL_CABLING_VERIFIED = ConditionType.RAIL_CABLING_VERIFIED


@dataclass(frozen=True)
class Finding:
    """The verdict for one condition type: what `kubectl describe node` will show."""

    type: ConditionType
    status: ConditionStatus
    reason: str
    message: str
    # The problems the message joins, one each (a reader lists them without re-splitting).
    problems: tuple[str, ...] = field(default=(), compare=False)
    # Which rails the status is owed to (the failures', else the unknowns'), and whether
    # some of it is owed to no one rail: what lets one bad rail be gated alone (a DRA
    # device taint) while a node-wide fault still taints the node.
    rails: Mapping[str, str] = field(default_factory=dict, compare=False)  # rail -> reason
    whole_node: bool = field(default=False, compare=False)

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
    rail: str | None = None  # the rail it is about; None: the node as a whole


@dataclass
class Problems:
    """The one fold from problems to a condition's Finding, shared by every condition so
    status and reason cannot disagree: False when any problem is a failure, with the first
    failure's reason; else Unknown with the first unknown's reason; else True. The message
    names every problem, failures first, each group in the order found."""

    type: ConditionType
    found: list[Problem] = field(default_factory=list)
    rail: str | None = None  # set by about(): the rail the problems found now are about

    def fail(self, reason: str, message: str) -> None:
        self.found.append(Problem(reason, message, rail=self.rail))

    def unknown(self, reason: str, message: str, node: bool = False) -> None:
        """`node`: about the node as a whole even inside about() (a table every rail is
        read from, unreadable)."""
        self.found.append(Problem(reason, message, unknown=True,
                                  rail=None if node else self.rail))

    @contextmanager
    def about(self, rail: str) -> Iterator[None]:
        """Problems found inside are about `rail` alone."""
        before, self.rail = self.rail, rail
        try:
            yield
        finally:
            self.rail = before

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
        owed = failed or unknown
        rails: dict[str, str] = {}
        for p in owed:
            if p.rail is not None:
                rails.setdefault(p.rail, p.reason)
        return Finding(self.type, status, owed[0].reason, "; ".join(messages), messages,
                       rails=rails, whole_node=any(p.rail is None for p in owed))
