"""`nodeagent fleet` for a large fleet on the real kube-apiserver: the time one view takes
and the API requests it makes, with N Node objects (with the agent's conditions) and their
Leases.

Usage: .venv/bin/python bench/fleet.py [--nodes 1000] [--runs 10]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import summary

from nodeagent.checks.conditions import CONDITION_TYPES
from nodeagent.cli.fleet import FleetSource, fleet_rows, render
from nodeagent.kube.api import Counters, call
from tests.kit.apiserver import ApiServer, start_apiserver


def populate(server: ApiServer, n: int) -> None:
    admin = server.client("admin")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    micro = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())

    def one(i: int) -> None:
        name = f"gpu-{i:04d}"
        c = Counters()
        call(admin, c, "POST", "/api/v1/nodes",
             {"metadata": {"name": name, "labels": {"fabric": "true"}}})
        call(admin, c, "PATCH", f"/api/v1/nodes/{name}/status", {"status": {
            "capacity": {"rdma/rdma_shared_device_a": "8"},
            "allocatable": {"rdma/rdma_shared_device_a": "8"},
            "conditions": [{"type": t, "status": "True", "reason": "Fine",
                            "message": "all rails configured and pinned",
                            "lastTransitionTime": stamp, "lastHeartbeatTime": stamp}
                           for t in CONDITION_TYPES]}}, "application/merge-patch+json")
        call(admin, c, "POST", "/apis/coordination.k8s.io/v1/namespaces/nodeagent-system/leases",
             {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
              "metadata": {"name": f"nodeagent-{name}"},
              "spec": {"holderIdentity": name, "renewTime": micro}})

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(n)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args()
    server = start_apiserver(Path(tempfile.mkdtemp(prefix="nodeagent-bench-fleet-")) /
                             "apiserver")
    try:
        t = time.perf_counter()
        populate(server, args.nodes)
        print(f"populated {args.nodes} nodes and leases in {time.perf_counter() - t:.1f} s")
        times, sizes = [], []
        source = FleetSource(server.client("admin"), "fabric=true", "nodeagent-system")
        for _ in range(args.runs):
            t = time.perf_counter()
            nodes, leases = source.list_once()
            now = time.time()
            text = render(fleet_rows(nodes, leases, "rdma/rdma_shared_device_a",
                                     "nodeagent.io/fabric-unready", now, 120, 1800),
                          "table", now, False)
            times.append((time.perf_counter() - t) * 1000)
            sizes.append(len(text.splitlines()) - 1)
        print(summary(f"fleet view, {args.nodes} nodes", times),
              f" {source.counters.requests / args.runs:.0f} API requests per view,"
              f" {sizes[0]} rows")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
