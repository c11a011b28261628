"""FabricTrafficOnRDMA: traffic that should use RDMA really does.

A job that silently falls back to TCP reports success at half speed. While fabric traffic is
expected (pods here request the RDMA resource or GPUs, or the config says always), a rail
whose kernel-stack bytes grow by more than `min_kernel_bytes` over `window` while its RDMA
port counters stay flat is reported `TrafficNotOnFabric`. RDMA is measured in bytes where
the device counts them, else in packets (soft-RoCE), each with its own "flat" threshold.
The agent's own probes move RDMA too (peer probes every second, the transport probe): their
share, an upper bound the probing threads charge (run/own_rdma.py), is counted out, and one
probe's worth more is allowed, since one may straddle a sample.
Informational by default: it joins FabricReady (and so the taint) only with
`fabric_traffic.gate: true`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field

from nodeagent.config import Config
from nodeagent.model.conditions import FABRIC_TRAFFIC_ON_RDMA, Finding, Problems
from nodeagent.model.kube import DevicePluginObservation, PodFacts
from nodeagent.model.rdma import RailCounters


@dataclass(frozen=True)
class RDMAReading:
    """A rail's RDMA counters so far, in `unit`: bytes when the device counts them, else
    packets (soft-RoCE)."""

    unit: str  # "B" or "packets"
    total: int  # the port's, both directions
    own: int  # the agent's probes' share of `total` (an upper bound)
    slack: int  # one probe: it may be in the counters and not yet charged


def rdma_reading(c: RailCounters) -> RDMAReading | None:
    """None when neither bytes nor packets can be read."""
    as_bytes = _sum(c.rdma_tx_bytes, c.rdma_rx_bytes)
    if as_bytes is not None:
        return RDMAReading("B", as_bytes, c.own_rdma.bytes, c.own_rdma_largest.bytes)
    packets = _sum(c.rdma_tx_packets, c.rdma_rx_packets)
    if packets is None:
        return None
    return RDMAReading("packets", packets, c.own_rdma.packets, c.own_rdma_largest.packets)


@dataclass(frozen=True)
class TrafficDeltas:
    """One rail over the last window: kernel bytes, RDMA in the window's unit, and the
    RDMA beyond the agent's own probes (never below zero: their share is a bound)."""

    kernel: int
    rdma: int
    own: int
    slack: int

    @property
    def beyond_probes(self) -> int:
        return max(0, self.rdma - self.own)


@dataclass
class TrafficWindow:
    """Samples of one rail's (kernel bytes, RDMA reading), oldest first, spanning `window`;
    the RDMA amounts are in `unit` (B or packets)."""

    window: float
    samples: deque[tuple[float, int, RDMAReading]] = field(default_factory=deque)
    unit: str = "B"

    def add(self, now: float, counters: RailCounters) -> None:
        kernel = _sum(counters.netdev_tx_bytes, counters.netdev_rx_bytes)
        reading = rdma_reading(counters)
        if kernel is None or reading is None:
            self.samples.clear()  # unreadable: no verdict from a gap
            return
        if reading.unit != self.unit:
            self.samples.clear()  # another counter: the old samples do not compare
            self.unit = reading.unit
        if self.samples and (kernel < self.samples[-1][1]
                             or reading.total < self.samples[-1][2].total
                             or reading.own < self.samples[-1][2].own):
            self.samples.clear()  # counters reset (driver reload, device re-created)
        self.samples.append((now, kernel, reading))
        # Keep one sample at or before the window's start, so the deltas span it fully.
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.window:
            self.samples.popleft()

    def deltas(self, now: float) -> TrafficDeltas | None:
        """Over the last `window`, or None before a window is seen."""
        if len(self.samples) < 2 or self.samples[0][0] > now - self.window:
            return None
        (_, k0, r0), (_, k1, r1) = self.samples[0], self.samples[-1]
        return TrafficDeltas(k1 - k0, r1.total - r0.total, r1.own - r0.own, r1.slack)


def fabric_consumers(pods: Iterable[PodFacts], resources: Set[str]) -> list[str]:
    """Pods (namespace/name) that have not finished and request one of `resources`."""
    return [f"{p.namespace}/{p.name}" for p in pods
            if p.phase not in ("Succeeded", "Failed") and p.requests_any(resources)]


def _sum(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


@dataclass
class TrafficTracker:
    windows: dict[str, TrafficWindow] = field(default_factory=dict)

    def observe(self, now: float, window: float, counters: Mapping[str, RailCounters]) -> None:
        for rail, c in counters.items():
            w = self.windows.setdefault(rail, TrafficWindow(window))
            w.window = window
            w.add(now, c)


def traffic_finding(cfg: Config, tracker: TrafficTracker, now: float,
                    counters: Mapping[str, RailCounters], expected: bool | None,
                    why: str) -> Finding:
    """`expected`: whether fabric traffic is expected now (None: cannot tell), and why."""
    problems = Problems(FABRIC_TRAFFIC_ON_RDMA)
    ft = cfg.fabric_traffic
    if ft is None or not cfg.rails:
        return problems.finding("NotConfigured", "no fabric_traffic section (or no rails)")
    if expected is None:
        problems.unknown("ExpectationUnknown",
                         f"cannot tell whether fabric traffic is expected: {why}")
        return problems.folded()
    if not expected:
        return problems.finding("NoFabricTrafficExpected", why)
    measuring, fine = [], []
    for rail in cfg.rails:
        c = counters.get(rail.name)
        if c is None or c.rdma_device is None:
            problems.unknown("CountersUnreadable",
                             f"{rail.name} {rail.interface}: no RDMA device found")
            continue
        reading = rdma_reading(c)
        if None in (c.netdev_tx_bytes, c.netdev_rx_bytes) or reading is None:
            problems.unknown("CountersUnreadable",
                             f"{rail.name} {rail.interface}: counters unreadable")
            continue
        w = tracker.windows.get(rail.name)
        d = w.deltas(now) if w else None
        if w is None or d is None or w.unit != reading.unit:
            measuring.append(rail.name)
            continue
        flat = ft.flat_rdma_bytes if w.unit == "B" else ft.flat_rdma_packets
        probes = f" (the agent's probes: at most {d.own})" if d.own else ""
        if d.kernel > ft.min_kernel_bytes and d.beyond_probes <= flat + d.slack:
            problems.fail("TrafficNotOnFabric",
                          f"{rail.name} {rail.interface}: {d.kernel} bytes through the kernel "
                          f"stack and {d.rdma} {w.unit} over RDMA{probes} ({c.rdma_device} "
                          f"port {c.rdma_port}) in the last {ft.window:g}s: traffic is not "
                          "using the fabric")
        else:
            fine.append(f"{rail.name}: kernel {d.kernel} B, RDMA {d.rdma} {w.unit}{probes}")
    if measuring:
        problems.unknown("Measuring", f"less than {ft.window:g}s of samples for "
                                      f"{', '.join(measuring)}")
    return problems.finding("TrafficOnFabric", f"{why}; last {ft.window:g}s: " + "; ".join(fine))


def traffic_expectation(cfg: Config,
                        plugin: DevicePluginObservation | None) -> tuple[bool | None, str]:
    """Whether fabric traffic is expected now (None: cannot tell), and why: always, never,
    or (expect: pods) while a pod on the node requests a fabric resource."""
    ft = cfg.fabric_traffic
    if ft is None:
        return None, ""
    if ft.expect != "pods":
        return ft.expect == "always", f"fabric_traffic.expect is {ft.expect}"
    if plugin is None or plugin.error:
        return None, ("the node's pods are not known (expect: pods needs the kubernetes and "
                      "device_plugin sections)")
    resources = {*ft.pod_resources, *([cfg.device_plugin.resource] if cfg.device_plugin else [])}
    users = fabric_consumers(plugin.node_pods, resources)
    if not users:
        return False, "no pod here requests " + ", ".join(sorted(resources))
    return True, (f"pods here request {', '.join(sorted(resources))}: "
                  f"{', '.join(users[:5])}{' ...' if len(users) > 5 else ''}")
