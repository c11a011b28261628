"""`nodeagent fleet` for a large fleet on the real kube-apiserver: the time one view takes
and the API requests it makes, with N Node objects (with the agent's conditions) and their
Leases. With `--rails R` each agent's Lease carries what the agent writes with a peers
section (its card with each rail's switch, and its verdicts on 4 peers a rail: half under
its leaf of 32, as discovery picks them) and each Node its switch labels, so the view also
joins the mesh, looks for suspects and names switches; the mesh view (switch x switch at
that size) is timed too.

Usage: .venv/bin/python bench/fleet.py [--nodes 1000] [--runs 10] [--rails 0]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import summary

from nodeagent.checks.conditions import CONDITION_TYPES
from nodeagent.checks.peers import peer_stats
from nodeagent.cli.fleet import FleetSource, fleet_rows, render, render_mesh
from nodeagent.kube.api import Counters, call
from nodeagent.kube.peercard import lease_metadata
from nodeagent.model.kube import switch_label
from nodeagent.model.network import Neighbour
from nodeagent.model.peers import CardRail, PeerCard, PeerOutcome, PeerProbe
from nodeagent.model.status import RailStatus
from tests.kit.apiserver import ApiServer, start_apiserver

LEAF = 32


def agent_metadata(i: int, n: int, rails: int) -> tuple[dict[str, str], dict[str, str],
                                                        dict[str, str]]:
    """The Lease's labels and annotations as the agent's own code writes them, and the
    Node's switch labels."""
    def address(j: int, r: int) -> str:
        return f"10.{r}.{j // 250}.{j % 250 + 1}"

    leaf = i // LEAF
    card = PeerCard(f"gpu-{i:04d}", 18600, tuple(
        CardRail(f"rail{r}", address(i, r), f"10.{r}.0.0/16") for r in range(rails)))
    peers = [leaf * LEAF + (i + 1) % LEAF, leaf * LEAF + (i + 2) % LEAF,
             (i + LEAF) % n, (i + 2 * LEAF) % n]
    status = []
    for r in range(rails):
        stats = tuple(peer_stats([PeerProbe(f"rail{r}", address(j, r), f"gpu-{j:04d}",
                                            PeerOutcome.OK, rtt_us=(20.0,), at=float(t))
                                  for t in range(3)], failures=2) for j in peers)
        status.append(RailStatus(f"rail{r}", f"r{r}", peers=stats, switch=Neighbour(
            f"c{leaf}", f"Ethernet{i % LEAF}", 120, f"leaf-{leaf}-r{r}")))
    labels, annotations = lease_metadata(card, status)
    node_labels = {}
    for r in range(rails):
        key = switch_label(f"rail{r}")
        if key is not None:
            node_labels[key] = f"leaf-{leaf}-r{r}"
    return labels, annotations, node_labels


def populate(server: ApiServer, n: int, rails: int = 0) -> None:
    admin = server.client("admin")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    micro = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())

    def one(i: int) -> None:
        name = f"gpu-{i:04d}"
        c = Counters()
        labels, annotations, switches = agent_metadata(i, n, rails) if rails else ({}, {}, {})
        call(admin, c, "POST", "/api/v1/nodes",
             {"metadata": {"name": name, "labels": {"fabric": "true", **switches}}})
        call(admin, c, "PATCH", f"/api/v1/nodes/{name}/status", {"status": {
            "capacity": {"rdma/rdma_shared_device_a": "8"},
            "allocatable": {"rdma/rdma_shared_device_a": "8"},
            "conditions": [{"type": t, "status": "True", "reason": "Fine",
                            "message": "all rails configured and pinned",
                            "lastTransitionTime": stamp, "lastHeartbeatTime": stamp}
                           for t in CONDITION_TYPES]}}, "application/merge-patch+json")
        call(admin, c, "POST", "/apis/coordination.k8s.io/v1/namespaces/nodeagent-system/leases",
             {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
              "metadata": {"name": f"nodeagent-{name}", "labels": labels,
                           "annotations": annotations},
              "spec": {"holderIdentity": name, "renewTime": micro}})

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(n)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--rails", type=int, default=0)
    args = p.parse_args()
    server = start_apiserver(Path(tempfile.mkdtemp(prefix="nodeagent-bench-fleet-")) /
                             "apiserver")
    try:
        t = time.perf_counter()
        populate(server, args.nodes, args.rails)
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
        if args.rails:
            times = []
            for _ in range(args.runs):
                t = time.perf_counter()
                nodes, leases = source.list_once()
                text = render_mesh(leases, None, "table", False, nodes)
                times.append((time.perf_counter() - t) * 1000)
            print(summary(f"mesh view, {args.nodes} nodes x {args.rails} rails", times),
                  f" {len(text.splitlines())} lines")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
