"""The agent's Prometheus metrics, and the endpoint that serves them (loopback by default).

Fed from the loop after every pass (the same figures go to the status file); read at scrape
time from a snapshot, so a scrape never waits for a pass and a pass never waits for a scrape.
Names follow Prometheus conventions and node_exporter's habits, so series join with
`node_network_*`/`node_infiniband_*`: `nodeagent_` prefix, base units (bytes, seconds),
`_total` counters, times as Unix timestamps, the netdev in a `device` label, a
`nodeagent_build_info`, the process collector, no `_created` series.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import socket
import sys
import threading
from collections.abc import Iterable, Mapping
from http.server import ThreadingHTTPServer
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import MetricsHandler
from prometheus_client.registry import Collector

from nodeagent.model.lustre import LustreProbeStatus
from nodeagent.model.rdma import PhysState, PortState
from nodeagent.model.status import PublisherState, RailStatus, Status

log = logging.getLogger(__name__)
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
STATUSES = ("True", "False", "Unknown")


def _build_info() -> GaugeMetricFamily:
    from nodeagent import __version__

    info = GaugeMetricFamily("nodeagent_build_info", "Always 1: the agent's version and the "
                             "Python it runs on.", labels=["version", "python"])
    info.add_metric([__version__, platform.python_version()], 1.0)
    return info


BUILD_INFO = _build_info()
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # no _created


class AgentMetrics(Collector):
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)  # process_* (RSS, CPU, open fds)
        self.probe_seconds = Histogram(
            "nodeagent_probe_duration_seconds", "Time one probe took within a check pass.",
            ["probe"], buckets=BUCKETS, registry=self.registry)
        self.repairs = Counter(
            "nodeagent_rail_repairs", "Repairs the agent made on a rail, by kind.",
            ["rail", "kind"], registry=self.registry)
        self._lock = threading.Lock()
        self._status: Status | None = None
        self.registry.register(self)

    def observe_pass(self, timings: Mapping[str, float],
                     repairs: Iterable[tuple[str, str]]) -> None:
        for probe, seconds in timings.items():
            self.probe_seconds.labels(probe).observe(seconds)
        for rail, kind in repairs:
            self.repairs.labels(rail, kind).inc()

    def update(self, status: Status) -> None:
        """The snapshot of the latest pass (the status file's, too)."""
        with self._lock:
            self._status = status

    def describe(self) -> Iterable[Metric]:
        return []  # collected from a snapshot: nothing to describe up front

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            status = self._status
        if status is None:
            return
        cond = GaugeMetricFamily("nodeagent_condition", "1 for the condition's current "
                                 "status, 0 for the others.", labels=["condition", "status"])
        reason = GaugeMetricFamily("nodeagent_condition_reason", "Always 1: the condition's "
                                   "current reason (one series per condition).",
                                   labels=["condition", "reason"])
        changed = GaugeMetricFamily("nodeagent_condition_last_transition_timestamp_seconds",
                                    "When the condition last changed status (Unix time).",
                                    labels=["condition"])
        for f in status.findings:
            for s in STATUSES:
                cond.add_metric([f.type, s], 1.0 if f.status == s else 0.0)
            reason.add_metric([f.type, f.reason], 1.0)
            if f.type in status.since:
                changed.add_metric([f.type], status.since[f.type])
        yield cond
        yield reason
        yield changed
        yield BUILD_INFO
        yield from _rails(status.report.rails)
        yield from _switches(status.report.node, status.report.rails)
        yield from _ports(status.report.rails)
        yield from _kube(status.kubernetes)
        yield from _lustre(status.lustre or ())


def _rails(rails: Iterable[RailStatus]) -> Iterable[Metric]:
    def gauge(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=["rail", "device"])

    def counter(name: str, doc: str) -> CounterMetricFamily:
        return CounterMetricFamily(name, doc, labels=["rail", "device"])

    carrier = counter("nodeagent_rail_carrier_losses", "Carrier losses seen since start.")
    gid = gauge("nodeagent_rail_gid_index", "Index of the rail's IPv4 RoCE v2 GID now.")
    pinned = gauge("nodeagent_rail_gid_index_pinned", "Index the rail's GID is pinned to.")
    speed = gauge("nodeagent_rail_link_speed_bytes",
                  "Link speed of the netdev in bytes per second (as node_network_speed_bytes).")
    families: dict[str, CounterMetricFamily] = {
        "netdev_tx_bytes": counter("nodeagent_rail_netdev_transmit_bytes",
                                   "Bytes the kernel stack sent on the rail (TCP etc.)."),
        "netdev_rx_bytes": counter("nodeagent_rail_netdev_receive_bytes",
                                   "Bytes the kernel stack received on the rail."),
        "rdma_tx_bytes": counter("nodeagent_rail_rdma_transmit_bytes",
                                 "RDMA bytes sent by the rail's port (port_xmit_data x 4)."),
        "rdma_rx_bytes": counter("nodeagent_rail_rdma_receive_bytes",
                                 "RDMA bytes received by the rail's port (port_rcv_data x 4)."),
        "rdma_tx_packets": counter("nodeagent_rail_rdma_transmit_packets",
                                   "RDMA packets sent by the rail's port."),
        "rdma_rx_packets": counter("nodeagent_rail_rdma_receive_packets",
                                   "RDMA packets received by the rail's port."),
    }
    for r in rails:
        labels = [r.name, r.interface]
        if r.history is not None and r.history.carrier_losses_total is not None:
            carrier.add_metric(labels, r.history.carrier_losses_total)
        if r.roce.gid_index is not None:
            gid.add_metric(labels, r.roce.gid_index)
        if r.roce.gid_index_pinned is not None:
            pinned.add_metric(labels, r.roce.gid_index_pinned)
        c = r.counters
        if c is None:
            continue
        if c.speed_mbps:
            speed.add_metric(labels, c.speed_mbps * 1e6 / 8)
        for key, family in families.items():
            value = getattr(c, key)
            if value is not None:
                family.add_metric(labels, value)
    yield from (carrier, gid, pinned, speed, *families.values())


def _ports(rails: Iterable[RailStatus]) -> Iterable[Metric]:
    """Each rail's RDMA port (with a hardware section): every error counter read, the
    rate, the PCIe link."""
    errors = CounterMetricFamily("nodeagent_rdma_port_errors", "The port's error counters "
                                 "(counters/ and hw_counters/), as the driver counts them.",
                                 labels=["rail", "device", "port", "counter"])
    rate = GaugeMetricFamily("nodeagent_rdma_port_rate_gbps", "The port's rate in Gb/s.",
                             labels=["rail", "device", "port"])
    active = GaugeMetricFamily("nodeagent_rdma_port_active", "1 while the port is ACTIVE "
                               "with its physical link up.", labels=["rail", "device", "port"])
    pcie = GaugeMetricFamily("nodeagent_rdma_pcie_link", "The HCA's PCIe link: speed in "
                             "GT/s and width in lanes, as trained (current) and at most (max).",
                             labels=["rail", "device", "what"])
    for r in rails:
        p = r.port
        if p is None:
            continue
        labels = [r.name, p.device, str(p.port)]
        for name, value in sorted(p.counters.items()):
            errors.add_metric([*labels, name], value)
        if p.rate_gbps is not None:
            rate.add_metric(labels, p.rate_gbps)
        if p.state is not None and p.phys_state is not None:
            active.add_metric(labels, float(p.state is PortState.ACTIVE
                                                  and p.phys_state is PhysState.LINK_UP))
        if p.pcie is not None:
            link: dict[str, float | None] = {
                "current_speed": p.pcie.speed, "current_width": p.pcie.width,
                "max_speed": p.pcie.max_speed, "max_width": p.pcie.max_width}
            for what, got in link.items():
                if got is not None:
                    pcie.add_metric([r.name, p.device, what], float(got))
    yield from (errors, rate, active, pcie)
    yield from _transport(rails)


def _transport(rails: Iterable[RailStatus]) -> Iterable[Metric]:
    """Each rail's latest active probe (with a transport section)."""
    ok = GaugeMetricFamily("nodeagent_rdma_transport_ok", "1 when the latest probe of the "
                           "rail's RC QP pair exchanged every message.", labels=["rail"])
    latency = GaugeMetricFamily("nodeagent_rdma_transport_latency_seconds", "The latest "
                                "probe's send-to-completion latency.",
                                labels=["rail", "quantile"])
    bandwidth = GaugeMetricFamily("nodeagent_rdma_transport_bandwidth_bits_per_second",
                                  "The latest probe's short bandwidth sample.", labels=["rail"])
    for r in rails:
        t = r.transport
        if t is None:
            continue
        ok.add_metric([r.name], 1.0 if t.ok else 0.0)
        for q, value in (("0.5", t.latency_p50_us), ("0.99", t.latency_p99_us)):
            if value is not None:
                latency.add_metric([r.name, q], value / 1e6)
        if t.bandwidth_gbps is not None:
            bandwidth.add_metric([r.name], t.bandwidth_gbps * 1e9)
    yield from (ok, latency, bandwidth)
    yield from _peers(rails)


def _switches(node: str, rails: Iterable[RailStatus]) -> Iterable[Metric]:
    """Each rail's switch while its LLDP holds, with this node's name (as the peer
    metrics' `node` names a probed node): what the alert rules join the peer verdicts on,
    to name a switch once rather than each node under it."""
    info = GaugeMetricFamily("nodeagent_rail_switch_info", "The switch at the far end of "
                             "the rail, from LLDP (1 while its TTL holds).",
                             labels=["node", "rail", "switch", "port"])
    for r in rails:
        if r.switch is not None:
            info.add_metric([node, r.name, r.switch.switch, r.switch.port], 1.0)
    yield info


def _peers(rails: Iterable[RailStatus]) -> Iterable[Metric]:
    """Each rail's peers (with a peers section), in each traffic class probed: cardinality
    bounded by the peer count times the classes (at most 4)."""
    labels = ["rail", "peer", "node", "traffic_class"]
    rtt = GaugeMetricFamily("nodeagent_rdma_peer_rtt_seconds", "RDMA read round trip to the "
                            "peer over the probe window.", labels=[*labels, "quantile"])
    loss = GaugeMetricFamily("nodeagent_rdma_peer_loss_ratio", "Probes of the peer that did "
                             "not end OK, over the probe window.", labels=labels)
    up = GaugeMetricFamily("nodeagent_rdma_peer_reachable", "1 unless the peer's latest "
                           "probes failed in a row (peers.failures).", labels=labels)
    probes = CounterMetricFamily("nodeagent_rdma_peer_probes", "Probes of the peer since the "
                                 "agent started, by result.", labels=[*labels, "result"])
    bandwidth = GaugeMetricFamily("nodeagent_rdma_peer_bandwidth_bits_per_second",
                                  "The latest bandwidth sample to the peer (128 KiB of RDMA "
                                  "reads, 4 in flight): a sanity figure, not capacity.",
                                  labels=labels)
    for r in rails:
        for p in r.peers or ():
            who = [r.name, p.address, p.node or "", str(p.traffic_class)]
            for q, value in (("0.5", p.rtt_p50_us), ("0.99", p.rtt_p99_us)):
                if value is not None:
                    rtt.add_metric([*who, q], value / 1e6)
            loss.add_metric(who, p.loss)
            up.add_metric(who, 0.0 if p.failing else 1.0)
            for result, n in sorted(p.totals.items()):
                probes.add_metric([*who, result], float(n))
            if p.bandwidth_gbps is not None:
                bandwidth.add_metric(who, p.bandwidth_gbps * 1e9)
    yield from (rtt, loss, up, probes, bandwidth)


def _kube(kube: PublisherState | None) -> Iterable[Metric]:
    if kube is None:
        return
    for key, value, doc in (
            ("requests", kube.requests, "Requests made to the API server."),
            ("writes", kube.writes, "Writes (non-GET requests) made to the API server."),
            ("errors", kube.errors, "API requests that failed (refused, timed out, non-2xx)."),
            ("conflicts", kube.conflicts, "API writes refused with 409 Conflict.")):
        yield CounterMetricFamily(f"nodeagent_kube_{key}", doc, value=value)
    yield GaugeMetricFamily("nodeagent_tainted", "1 while the agent keeps its taint on the "
                            "Node.", value=1.0 if kube.tainted else 0.0)


def _lustre(mounts: Iterable[LustreProbeStatus]) -> Iterable[Metric]:
    mounts = list(mounts)
    if not mounts:
        return
    latency = GaugeMetricFamily("nodeagent_lustre_probe_seconds", "How long the last statfs "
                                "probe took (or has been stuck).", labels=["mountpoint"])
    hung = GaugeMetricFamily("nodeagent_lustre_probe_hung", "1 while the mount's probe has "
                             "not answered within its timeout.", labels=["mountpoint"])
    for m in mounts:
        latency.add_metric([m.mountpoint], m.probe_seconds)
        hung.add_metric([m.mountpoint], 1.0 if m.hung else 0.0)
    yield latency
    yield hung


MAX_CONNECTIONS = 16  # scrapers are few; more at once are closed on accept
MAX_PER_ADDRESS = 4  # from one address: one client cannot hold every slot
IDLE_TIMEOUT = 5.0  # seconds a connection may sit without sending its request
REQUEST_DEADLINE = 10.0  # seconds a whole connection may last: a trickle is cut too


class _Handler(MetricsHandler):
    timeout = IDLE_TIMEOUT  # StreamRequestHandler: a socket timeout for every read and write


class BoundedMetricsServer(ThreadingHTTPServer):
    """prometheus_client's handler behind a server with limits: at most MAX_CONNECTIONS
    handled at once and MAX_PER_ADDRESS from one address (each further one is closed as
    soon as it is accepted, so it holds a descriptor for microseconds, not forever), an
    idle/read timeout on every read and REQUEST_DEADLINE on the whole connection (a byte
    every few seconds resets a read timeout, not the deadline), and a peer that resets or
    times out costs a debug line, not a traceback."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry,
                 family: socket.AddressFamily = socket.AF_INET) -> None:
        self.address_family = family
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._lock = threading.Lock()
        self._by_address: dict[str, int] = {}
        self.refused = 0
        self.cut = 0  # connections ended at REQUEST_DEADLINE
        super().__init__(address, type("Handler", (_Handler,), {"registry": registry}))

    def process_request(self, request: Any, client_address: Any) -> None:
        address = str(client_address[0])
        with self._lock:
            crowded = self._by_address.get(address, 0) >= MAX_PER_ADDRESS
            if not crowded:
                self._by_address[address] = self._by_address.get(address, 0) + 1
        if crowded or not self._slots.acquire(blocking=False):
            if not crowded:
                self._release(address, slot=False)
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(address)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        deadline = threading.Timer(REQUEST_DEADLINE, self._cut, (request,))
        deadline.daemon = True
        deadline.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            deadline.cancel()
            self._release(str(client_address[0]))

    def _cut(self, request: socket.socket) -> None:
        """The deadline: the handler's blocked read or write fails, and it ends."""
        self.cut += 1
        with contextlib.suppress(OSError):
            request.shutdown(socket.SHUT_RDWR)

    def _release(self, address: str, slot: bool = True) -> None:
        with self._lock:
            left = self._by_address.get(address, 0) - 1
            if left > 0:
                self._by_address[address] = left
            else:
                self._by_address.pop(address, None)
        if slot:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("metrics connection from %s failed: %s", client_address, sys.exc_info()[1])


def serve(metrics: AgentMetrics, listen: str) -> BoundedMetricsServer:
    """Starts the endpoint on a daemon thread; returns the server (for shutdown)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server = BoundedMetricsServer((host, int(port)), metrics.registry, family)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
