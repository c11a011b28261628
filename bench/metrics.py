"""Scrape of the agent's metrics endpoint with 8 rails: time per scrape (over HTTP on
loopback) and the size of the exposition.

Usage: .venv/bin/python bench/metrics.py [--scrapes 500]
"""

from __future__ import annotations

import argparse
import socket
import time
import urllib.request

from common import summary

from nodeagent.checks.conditions import CONDITION_TYPES
from nodeagent.model.conditions import Finding
from nodeagent.model.lustre import LustreProbeStatus
from nodeagent.model.rdma import RailCounters
from nodeagent.model.status import PublisherState, RailStatus, Report, Status
from nodeagent.publish.metrics import AgentMetrics, serve


def status(rails: int) -> Status:
    counters = RailCounters(speed_mbps=400000, netdev_tx_bytes=10**12, netdev_rx_bytes=10**12,
                            rdma_tx_bytes=10**15, rdma_rx_bytes=10**15)
    report = Report(
        node="bench",
        findings=[Finding(t, "True", "Fine", "ok") for t in CONDITION_TYPES],
        rails=[RailStatus(f"rail{i}", f"ens{i}f0", carrier=True, gid_index=3,
                          gid_index_pinned=3, counters=counters, carrier_losses_total=3,
                          carrier_losses_in_window=0) for i in range(rails)])
    return Status(
        report=report,
        since={t: time.time() - 60 for t in CONDITION_TYPES},
        kubernetes=PublisherState(requests=1000, writes=900, errors=1, conflicts=2),
        lustre=tuple(LustreProbeStatus(f"/lustre/fs{i}", 0.004, False) for i in range(4)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scrapes", type=int, default=500)
    p.add_argument("--rails", type=int, default=8)
    args = p.parse_args()
    metrics = AgentMetrics()
    metrics.update(status(args.rails))
    for probe in ("netlink", "gid", "counters", "pass"):
        for _ in range(100):
            metrics.observe_pass({probe: 0.004}, [])
    metrics.observe_pass({}, [(f"rail{i}", "AddressMissing") for i in range(args.rails)])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = serve(metrics, f"127.0.0.1:{port}")
    try:
        times, size = [], 0
        for _ in range(args.scrapes):
            t = time.perf_counter()
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read()
            times.append((time.perf_counter() - t) * 1000)
            size = len(body)
        samples = sum(1 for line in body.decode().splitlines() if not line.startswith("#"))
        print(summary(f"scrape, {args.rails} rails", times),
              f" {size} bytes, {samples} samples")
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
