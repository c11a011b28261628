"""Per-rail byte counters and link speed from sysfs. Read-only.

The netdev's own counters (`class/net/<if>/statistics/{tx,rx}_bytes`) carry what the kernel
stack sends: TCP and everything else, but not RoCE, which the NIC moves itself. The RDMA
port counters (`class/infiniband/<dev>/ports/<p>/counters/port_{xmit,rcv}_data`) count
RDMA traffic in 4-byte words. Side by side they tell whether traffic uses the fabric.
Devices without byte counters (soft-RoCE) are read by packets: `counters/port_xmit_packets`
and `port_rcv_packets`, else the driver's `hw_counters/sent_pkts` and `rcvd_pkts`.
"""

from __future__ import annotations

from pathlib import Path

from nodeagent.io.bounded import Where
from nodeagent.io.files import read_attribute
from nodeagent.model.rdma import RailCounters

WORD = 4  # port_xmit_data / port_rcv_data count 32-bit words


def _read_int(path: Path, where: Where) -> int | None:
    where.path = str(path)
    try:
        value = int(read_attribute(path))
    except (OSError, ValueError):
        return None  # absent, unreadable (EINVAL while the link is down) or garbage
    return value if -(2**63) <= value < 2**64 else None  # a counter is at most 64 bits


def read_rail_counters(sysfs: Path, ifname: str, device: str | None,
                       port: int, where: Where | None = None) -> RailCounters:
    net = sysfs / "class" / "net" / ifname
    w = where or Where()

    def _int(path: Path) -> int | None:
        return _read_int(path, w)

    speed = _int(net / "speed")
    rdma_tx = rdma_rx = pkts_tx = pkts_rx = None
    if device is not None:
        base = sysfs / "class" / "infiniband" / device / "ports" / str(port)
        counters, hw = base / "counters", base / "hw_counters"
        words_tx, words_rx = _int(counters / "port_xmit_data"), _int(counters / "port_rcv_data")
        rdma_tx = None if words_tx is None else words_tx * WORD
        rdma_rx = None if words_rx is None else words_rx * WORD
        pkts_tx = _first(w, counters / "port_xmit_packets", hw / "sent_pkts")
        pkts_rx = _first(w, counters / "port_rcv_packets", hw / "rcvd_pkts")
    return RailCounters(
        speed_mbps=speed if speed is not None and speed > 0 else None,  # -1: no link
        netdev_tx_bytes=_int(net / "statistics" / "tx_bytes"),
        netdev_rx_bytes=_int(net / "statistics" / "rx_bytes"),
        rdma_device=device, rdma_port=port,
        rdma_tx_bytes=rdma_tx, rdma_rx_bytes=rdma_rx,
        rdma_tx_packets=pkts_tx, rdma_rx_packets=pkts_rx)


def _first(where: Where, *paths: Path) -> int | None:
    for path in paths:
        value = _read_int(path, where)
        if value is not None:
            return value
    return None
