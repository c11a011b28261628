"""The RDMA side of a rail: GID table, queue pairs, counters, port and PCIe health, pins."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

from nodeagent.model.words import Words


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


class PortState(Words):
    """An RDMA port's logical state, as sysfs `ports/N/state` words it (the kernel's
    state_name[] in drivers/infiniband/core/sysfs.c, after "N: "; enum ib_port_state)."""

    NOP = "NOP"
    DOWN = "DOWN"
    INIT = "INIT"
    ARMED = "ARMED"
    ACTIVE = "ACTIVE"
    ACTIVE_DEFER = "ACTIVE_DEFER"


class PhysState(Words):
    """An RDMA port's physical state, as sysfs `ports/N/phys_state` words it (the kernel's
    phys_state_to_str() in drivers/infiniband/core/sysfs.c; enum ib_port_phys_state)."""

    SLEEP = "Sleep"
    POLLING = "Polling"
    DISABLED = "Disabled"
    CONFIGURATION_TRAINING = "PortConfigurationTraining"
    LINK_UP = "LinkUp"
    LINK_ERROR_RECOVERY = "LinkErrorRecovery"
    PHY_TEST = "Phy Test"


@dataclass(frozen=True)
class PortHealth:
    """One rail's RDMA port as sysfs shows it at one moment (None: unreadable)."""

    device: str
    port: int
    state: PortState | None = None  # None: unreadable, or a word this agent does not know
    phys_state: PhysState | None = None
    link_layer: str | None = None  # "Ethernet" or "InfiniBand"
    rate_gbps: float | None = None
    rate: str | None = None  # as the kernel says it: "200 Gb/sec (4X HDR)"
    hca_type: str | None = None
    fw_ver: str | None = None
    pcie: PcieLink | None = None  # None: no PCI function (soft-RoCE) or not readable
    counters: dict[str, int] = field(default_factory=dict)  # counters/ and hw_counters/
    unreadable: tuple[str, ...] = ()  # attributes that could not be read, for the message


@dataclass(frozen=True)
class Pin:
    """A learned or configured GID pin for one rail."""

    index: int
    device: str | None = None
    port: int | None = None
    learned: bool = False


@dataclass(frozen=True)
class GidShift:
    """A rail whose IPv4 RoCE v2 GID is off its pinned index."""

    device: str
    port: int
    index: int  # where it is now
    pinned: int
    slot_taken_by: str | None  # the GID now at the pinned index, if any


@dataclass(frozen=True)
class CongestionSample:
    """One rail's congestion counters at one moment: its RDMA port's, and its netdev's
    ethtool statistics for the names the port does not have."""

    device: str
    port: int
    interface: str
    counters: dict[str, int] = field(default_factory=dict)
    unreadable: tuple[str, ...] = ()  # what could not be read, for the message
