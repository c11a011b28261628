"""FabricTrafficOnRDMA from fixture counter trees driven over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent.checks.traffic import (
    TrafficDeltas,
    TrafficTracker,
    TrafficWindow,
    fabric_consumers,
    traffic_finding,
)
from nodeagent.config import Config, parse_config
from nodeagent.kube.objects import parse_pod
from nodeagent.model.rdma import RailCounters, RDMAVolume
from nodeagent.probes import peer, transport
from nodeagent.probes.counters import read_rail_counters

MiB = 1 << 20


class Tree:
    """A sysfs fixture: one netdev and its RDMA port, counters set by the test."""

    def __init__(self, root: Path, ifname: str = "r0", device: str = "mlx5_0") -> None:
        self.net = root / "class" / "net" / ifname
        self.port = root / "class" / "infiniband" / device / "ports" / "1" / "counters"
        (self.net / "statistics").mkdir(parents=True)
        self.port.mkdir(parents=True)
        (self.net / "speed").write_text("200000\n")
        self.set(0, 0)

    def set(self, kernel_bytes: int, rdma_words: int) -> None:
        (self.net / "statistics" / "tx_bytes").write_text(f"{kernel_bytes}\n")
        (self.net / "statistics" / "rx_bytes").write_text("0\n")
        (self.port / "port_xmit_data").write_text(f"{rdma_words}\n")
        (self.port / "port_rcv_data").write_text("0\n")


def test_counters_are_read_and_rdma_words_become_bytes(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.set(5000, 1000)
    c = read_rail_counters(tmp_path, "r0", "mlx5_0", 1)
    assert c == RailCounters(speed_mbps=200000, netdev_tx_bytes=5000, netdev_rx_bytes=0,
                             rdma_device="mlx5_0", rdma_port=1, rdma_tx_bytes=4000,
                             rdma_rx_bytes=0)


@pytest.mark.parametrize("speed, garbage, expect_speed", [
    ("-1\n", "not a number", None),  # link down: the kernel says -1
    ("", "", None),  # empty files
])
def test_malformed_counters_read_as_unknown(tmp_path: Path, speed: str, garbage: str,
                                            expect_speed: int | None) -> None:
    tree = Tree(tmp_path)
    (tree.net / "speed").write_text(speed)
    (tree.port / "port_xmit_data").write_text(garbage)
    c = read_rail_counters(tmp_path, "r0", "mlx5_0", 1)
    assert c.speed_mbps == expect_speed and c.rdma_tx_bytes is None
    assert read_rail_counters(tmp_path, "nope", None, 1) == RailCounters()


def config(**traffic: Any) -> Config:
    return parse_config({"rails": [{"name": "rail0", "interface": "r0",
                                    "address": "10.10.0.5/24"}],
                         "fabric_traffic": {"expect": "always", "window": "60s",
                                            "min_kernel_bytes": 100 * MiB, **traffic}})


def drive(tmp_path: Path, cfg: Config, steps: list[tuple[float, int, int]]) -> list[str]:
    """Counters (kernel bytes, RDMA words) at times; the reason after each sample."""
    tree, tracker, reasons = Tree(tmp_path), TrafficTracker(), []
    for now, kernel, words in steps:
        tree.set(kernel, words)
        counters = {"rail0": read_rail_counters(tmp_path, "r0", "mlx5_0", 1)}
        assert cfg.fabric_traffic is not None
        tracker.observe(now, cfg.fabric_traffic.window, counters)
        reasons.append(traffic_finding(cfg, tracker, now, counters, True, "test").reason)
    return reasons


def test_tcp_fallback_is_reported_once_a_window_is_seen(tmp_path: Path) -> None:
    steps = [(0, 0, 0), (30, 60 * MiB, 0), (60, 120 * MiB, 0), (90, 180 * MiB, 0)]
    assert drive(tmp_path, config(), steps) == [
        "Measuring", "Measuring", "TrafficNotOnFabric", "TrafficNotOnFabric"]


def test_rdma_traffic_moving_is_fine(tmp_path: Path) -> None:
    steps = [(0, 0, 0), (30, 60 * MiB, 100), (60, 120 * MiB, 5000)]
    assert drive(tmp_path, config(), steps)[-1] == "TrafficOnFabric"


def test_little_kernel_traffic_is_fine(tmp_path: Path) -> None:
    steps = [(0, 0, 0), (60, 10 * MiB, 0)]
    assert drive(tmp_path, config(), steps)[-1] == "TrafficOnFabric"


def test_recovery_after_fallback_clears_within_a_window(tmp_path: Path) -> None:
    steps = [(0, 0, 0), (60, 200 * MiB, 0), (90, 200 * MiB, 10), (120, 200 * MiB, 10**6),
             (150, 200 * MiB, 2 * 10**6)]
    assert drive(tmp_path, config(), steps) == [
        "Measuring", "TrafficNotOnFabric", "TrafficOnFabric", "TrafficOnFabric",
        "TrafficOnFabric"]


def test_counter_reset_starts_over(tmp_path: Path) -> None:
    steps = [(0, 500 * MiB, 0), (60, 700 * MiB, 0), (70, 1 * MiB, 0), (100, 150 * MiB, 0)]
    assert drive(tmp_path, config(), steps) == [
        "Measuring", "TrafficNotOnFabric", "Measuring", "Measuring"]


def soft_roce(kernel: int, packets: int, own: RDMAVolume,
              largest: RDMAVolume) -> dict[str, RailCounters]:
    """A soft-RoCE rail: packet counters only (hw_counters/sent_pkts, rcvd_pkts)."""
    return {"rail0": RailCounters(netdev_tx_bytes=kernel, netdev_rx_bytes=0,
                                  rdma_device="rxe0", rdma_tx_packets=packets,
                                  rdma_rx_packets=0, own_rdma=own, own_rdma_largest=largest)}


def test_the_agents_own_probes_do_not_pass_a_job_running_over_tcp() -> None:
    """Found in the lab: with a peers section, the probes' packets were the RDMA traffic
    that made a job over TCP look on the fabric. Their share is counted out."""
    cfg, tracker = config(), TrafficTracker()
    one = peer.probe_volume(reads=5, mtu=4096, bandwidth=True)
    reasons = []
    # 60 s of probes both ways (this node's and the peer's: 2 x 60 probes), each charged,
    # and their packets in the port's counters; 200 MiB through the kernel stack.
    for now, probes, job in ((0, 0, 0), (60, 120, 0), (120, 240, 0), (180, 360, 50_000)):
        own = one * probes
        counters = soft_roce(now * 4 * MiB, own.packets + job, own, one)
        tracker.observe(now, 60, counters)
        reasons.append(traffic_finding(cfg, tracker, now, counters, True, "t"))
    assert [f.reason for f in reasons] == [
        "Measuring", "TrafficNotOnFabric", "TrafficNotOnFabric", "TrafficOnFabric"]
    assert f"over RDMA (the agent's probes: at most {one.packets * 120})" in reasons[1].message


def test_one_probe_straddling_a_sample_is_allowed_and_no_more() -> None:
    """A probe's packets may be in the counters before its charge: one probe's worth of
    RDMA beyond the charges is still no job on the fabric; one packet more is."""
    one = transport.probe_volume(messages=100)
    for extra, want in ((one.packets, "TrafficNotOnFabric"),
                        (one.packets + 1, "TrafficOnFabric")):
        tracker = TrafficTracker()
        for now, packets in ((0, 0), (60, extra)):
            counters = soft_roce(now * 4 * MiB, packets, RDMAVolume(), one)
            tracker.observe(now, 60, counters)
        assert traffic_finding(config(), tracker, 60, counters, True, "t").reason == want


def test_probe_volumes_are_bounds_of_the_probes_packets() -> None:
    # Every request may go four times (retry_cnt 3), and each copy is answered.
    # A read of 64 bytes: a request and one response; the read of one path MTU: the same.
    assert peer.probe_volume(reads=1, mtu=1024) == RDMAVolume(
        4 * (2 + 2), 4 * (4 * 128 + 64 + 1024))
    # The sample: 32 reads of the 4 KiB buffer, at MTU 1024 a request and 4 responses each.
    sample = peer.probe_volume(reads=1, mtu=1024, bandwidth=True)
    assert sample.packets - peer.probe_volume(reads=1, mtu=1024).packets == 4 * 32 * 5
    # The transport probe's sends: each packet and its ACK, counted sent and received on
    # the one port: 100 small sends and 8 of 64 KiB at MTU 1024.
    assert transport.probe_volume(100).packets == 4 * 2 * 2 * (100 + 8 * 64)


def test_window_spans_exactly_the_configured_time() -> None:
    w = TrafficWindow(60)
    for t in range(0, 200, 10):
        w.add(t, RailCounters(netdev_tx_bytes=t, netdev_rx_bytes=0, rdma_tx_bytes=0,
                              rdma_rx_bytes=0))
    assert w.deltas(190) == TrafficDeltas(60, 0, 0, 0)
    assert w.samples[0][0] == 130


def test_expectation_and_configuration() -> None:
    cfg = config()
    tracker = TrafficTracker()
    assert traffic_finding(cfg, tracker, 0, {}, False, "no pod").reason == \
        "NoFabricTrafficExpected"
    unknown = traffic_finding(cfg, tracker, 0, {}, None, "pods not known")
    assert (unknown.status, unknown.reason) == ("Unknown", "ExpectationUnknown")
    no_device = traffic_finding(cfg, tracker, 0, {"rail0": RailCounters()}, True, "x")
    assert (no_device.status, no_device.reason, no_device.message) == (
        "Unknown", "CountersUnreadable", "rail0 r0: no RDMA device found")
    off = traffic_finding(parse_config({}), tracker, 0, {}, True, "")
    assert (off.status, off.reason) == ("True", "NotConfigured")


def test_fabric_consumers() -> None:
    def pod(name: str, phase: str, **res: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"namespace": "ml", "name": name}, "status": {"phase": phase},
                "spec": {"containers": [{"name": "c", "resources": res}]}}

    pods = [pod("train", "Running", limits={"nvidia.com/gpu": "8"}),
            pod("rdma", "Pending", requests={"rdma/hca": "1"}),
            pod("done", "Succeeded", limits={"nvidia.com/gpu": "8"}),
            pod("web", "Running", requests={"cpu": "1"})]
    assert fabric_consumers(map(parse_pod, pods), {"nvidia.com/gpu", "rdma/hca"}) == [
        "ml/train", "ml/rdma"]


def rxe_port(root: Path, sent: int, rcvd: int) -> None:
    """What soft-RoCE has: no counters/ directory, packet counts in hw_counters/."""
    hw = root / "class" / "infiniband" / "rxe0" / "ports" / "1" / "hw_counters"
    hw.mkdir(parents=True, exist_ok=True)
    (hw / "sent_pkts").write_text(f"{sent}\n")
    (hw / "rcvd_pkts").write_text(f"{rcvd}\n")
    net = root / "class" / "net" / "ens4" / "statistics"
    net.mkdir(parents=True, exist_ok=True)
    (net / "tx_bytes").write_text(f"{200 * MiB}\n")
    (net / "rx_bytes").write_text("0\n")


def test_devices_without_byte_counters_are_measured_in_packets(tmp_path: Path) -> None:
    cfg = parse_config({"rails": [{"name": "rail0", "interface": "ens4",
                                   "address": "10.10.0.5/24"}],
                        "fabric_traffic": {"expect": "always", "window": "60s",
                                           "min_kernel_bytes": 100 * MiB}})
    assert cfg.fabric_traffic is not None
    rxe_port(tmp_path, 0, 0)
    c = read_rail_counters(tmp_path, "ens4", "rxe0", 1)
    assert (c.rdma_tx_bytes, c.rdma_tx_packets, c.rdma_rx_packets) == (None, 0, 0)
    tracker = TrafficTracker()
    tracker.observe(0.0, 60.0, {"rail0": c})
    (tmp_path / "class/net/ens4/statistics/tx_bytes").write_text(f"{350 * MiB}\n")
    later = {"rail0": read_rail_counters(tmp_path, "ens4", "rxe0", 1)}
    tracker.observe(61.0, 60.0, later)
    flat = traffic_finding(cfg, tracker, 61.0, later, True, "test")
    assert flat.reason == "TrafficNotOnFabric"
    assert "0 packets over RDMA (rxe0 port 1)" in flat.message
    hw = tmp_path / "class/infiniband/rxe0/ports/1/hw_counters"
    (hw / "sent_pkts").write_text("5000\n")
    (tmp_path / "class/net/ens4/statistics/tx_bytes").write_text(f"{500 * MiB}\n")
    moving = {"rail0": read_rail_counters(tmp_path, "ens4", "rxe0", 1)}
    tracker.observe(122.0, 60.0, moving)
    ok = traffic_finding(cfg, tracker, 122.0, moving, True, "test")
    assert ok.reason == "TrafficOnFabric" and "RDMA 5000 packets" in ok.message


def test_port_packet_counters_are_preferred_over_hw_counters(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    (tree.port / "port_xmit_packets").write_text("7\n")
    (tree.port / "port_rcv_packets").write_text("9\n")
    c = read_rail_counters(tmp_path, "r0", "mlx5_0", 1)
    assert (c.rdma_tx_bytes, c.rdma_tx_packets, c.rdma_rx_packets) == (0, 7, 9)
    window = TrafficWindow(60.0)
    window.add(0.0, c)
    assert window.unit == "B", "bytes win when the device counts them"
