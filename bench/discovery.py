"""Peer discovery's API cost on the real kube-apiserver, per agent and for the fleet, at
N agents: N Leases carrying peer cards (two rail networks shared by all), as the agents
write them. For a sample of agents, one discovery each (run/discovery.py, the daemon's
code): requests, Leases and bytes read, and the time to a full peer set. Beside it the
bare reference: one list of every agent's Lease, what a design that lists the fleet would
read per agent. Nodes are not created: discovery never reads them.
With --per-switch K every rail hears a leaf over LLDP, K agents per leaf (rail-optimised:
one leaf per rail per group of K), so discovery also lists the agents under the rail's
leaf; the share of peers found under the same leaf is printed (half the sample wanted).

Usage: .venv/bin/python bench/discovery.py [--agents 1000] [--sample 50] [--peers 4]
                                           [--per-switch 32]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import summary

from nodeagent.kube.api import Counters, call
from nodeagent.kube.peercard import CARD, card_annotation, card_labels
from nodeagent.model.peers import CardRail, PeerCard
from nodeagent.run.discovery import discover, lease_lister
from tests.kit.apiserver import ApiServer, start_apiserver

NS = "nodeagent-system"
PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
INTERVAL = 600.0  # peers.discover_interval's default
LEASE_PERIOD = 60.0  # kubernetes.lease_period's default


def card(i: int, per_switch: int = 0) -> PeerCard:
    return PeerCard(f"gpu-{i:05d}", 18600, tuple(
        CardRail(f"rail{r}", f"10.{10 + r}.{i // 250}.{i % 250 + 1}", f"10.{10 + r}.0.0/16",
                 switch=f"leaf-{i // per_switch:04d}-r{r}" if per_switch else None)
        for r in range(2)))


def populate(server: ApiServer, n: int, per_switch: int) -> None:
    admin = server.client("admin")
    micro = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())

    def one(i: int) -> None:
        c = card(i, per_switch)
        call(admin, Counters(), "POST", PATH, {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": f"nodeagent-{c.node}", "labels": card_labels(c),
                         "annotations": {CARD: card_annotation(c)}},
            "spec": {"holderIdentity": c.node, "renewTime": micro,
                     "leaseDurationSeconds": 3600}})

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(n)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--sample", type=int, default=50, help="agents that discover, measured")
    p.add_argument("--peers", type=int, default=4, help="peers.sample")
    p.add_argument("--per-switch", type=int, default=0,
                   help="agents under each leaf (0: no LLDP, no switches known)")
    args = p.parse_args()
    server = start_apiserver(Path(tempfile.mkdtemp(prefix="nodeagent-bench-disc-")) /
                             "apiserver")
    try:
        t = time.perf_counter()
        populate(server, args.agents, args.per_switch)
        print(f"populated {args.agents} agent Leases in {time.perf_counter() - t:.1f} s")
        api = server.client("agent-node-a")  # an agent's identity: deploy/'s RBAC applies
        times, requests, leases, sizes, near = [], [], [], [], []
        for i in random.Random(7).sample(range(args.agents), min(args.sample, args.agents)):
            counters = Counters()
            t = time.perf_counter()
            own = card(i, args.per_switch)
            got = discover(own, lease_lister(api, counters, NS), args.peers, time.time())
            times.append((time.perf_counter() - t) * 1000)
            assert all(len(v) == args.peers for v in got.peers.values()), got
            if args.per_switch:  # the share of each rail's peers under its own leaf
                near.extend(sum(int((p.node or "")[4:]) // args.per_switch
                                == i // args.per_switch for p in peers) / len(peers)
                            for peers in got.peers.values())
            requests.append(got.requests)
            leases.append(got.leases)
            sizes.append(counters.bytes_in)
        bare, bare_times = Counters(), []
        for _ in range(3):
            t = time.perf_counter()
            call(api, bare, "GET", PATH, query=[("resourceVersion", "0")])
            bare_times.append((time.perf_counter() - t) * 1000)
        per_agent = statistics.fmean(requests)
        leaves = f" under leaves of {args.per_switch}" if args.per_switch else ""
        print(summary(f"discovery, {args.agents} agents{leaves}", times))
        if near:
            print(f"  peers under the rail's own leaf: {statistics.fmean(near):.0%} "
                  f"(min {min(near):.0%}; half the sample wanted, rounded down)")
        print(f"  per discovery: {per_agent:.2f} requests (max {max(requests)}), "
              f"{statistics.fmean(leases):.0f} Leases (max {max(leases)}), "
              f"{statistics.fmean(sizes) / 1024:.1f} KiB (max {max(sizes) / 1024:.1f})")
        print(f"  bare reference, every Lease listed: {args.agents} Leases, "
              f"{bare.bytes_in / 3 / 1024:.0f} KiB, p50 {sorted(bare_times)[1]:.0f} ms; "
              f"ratio {statistics.fmean(sizes) / (bare.bytes_in / 3):.4f} of its bytes")
        print(f"  on the apiserver, the whole fleet: {args.agents * per_agent / INTERVAL:.2f} "
              f"discovery lists/s (every {INTERVAL:.0f} s) beside "
              f"{args.agents / LEASE_PERIOD:.1f} Lease renewals/s (every {LEASE_PERIOD:.0f} s)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
