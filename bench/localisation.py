"""Localisation, measured: the fleet's real verdict code over a simulated fleet with one
injected fault of known place per trial.

The fleet: N nodes, R rails, L nodes per leaf (rail r of node i hangs off leaf-(i//L)-r<r>).
Each node's peers per rail are what discovery really picks: its card and every other on
Leases written by the agent's own code (card_labels, card_annotation with the switches),
listed by label as the API server selects them, chosen by run/discovery.discover (half the
sample under the same leaf, the rest under others). Each probe's outcome follows from the
fault; each (prober, peer) pair's probes go through peer_stats and mesh_verdict (the word
the agent publishes; two classes through mesh_annotation), and the fleet's aggregation
(cli/mesh.suspects, switch_faults) names what it names.

Faults: a node's NIC or cable on one rail (truth: that node); a leaf dead (truth: the
leaf); a leaf's uplinks down, its nodes passing among themselves (the leaf); the lossless
class dropped on a leaf's ports while class 0 passes (the leaf); a responder host stalled
(its agent answers nothing: not a fabric fault, nothing should be named).

Background noise (`--noise`, default 0.002): that share of the probed pairs fail over
RoCE in every trial besides the fault (a flaky pair, a bad cable between two ports that
no one else uses), which nothing should be named for.

Printed per kind: trials, correct (the truth named and nothing else), precision (names
that were the truth, of all names), nodes flagged for a switch's fault, and the time to
the verdict from the agent's settings (peers.failures rounds of round_period, then the
Lease's early renewal).

Usage: .venv/bin/python bench/localisation.py [--nodes 10000] [--rails 8] [--leaf 32]
       [--sample 4] [--trials 5] [--noise 0.002] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from nodeagent.checks.peers import peer_stats
from nodeagent.cli.mesh import MeshCell, suspects, switch_faults
from nodeagent.config import parse_config
from nodeagent.kube.peercard import card_annotation, card_labels, mesh_annotation, mesh_verdict
from nodeagent.model.peers import CardRail, MeshVerdict, PeerCard, PeerOutcome, PeerProbe
from nodeagent.model.status import RailStatus
from nodeagent.run.discovery import discover
from nodeagent.run.peers import round_period

Outcome = Callable[[int, int, int], tuple[PeerOutcome, PeerOutcome]]  # class 0, class 104


def leaf_of(i: int, args: argparse.Namespace) -> int:
    return i // args.leaf


def card(i: int, args: argparse.Namespace) -> PeerCard:
    return PeerCard(f"gpu-{i:05d}", 18600, tuple(
        CardRail(f"rail{r}", f"10.{r}.{i // 250}.{i % 250 + 1}", f"10.{r}.0.0/16",
                 f"leaf-{leaf_of(i, args)}-r{r}") for r in range(args.rails)))


def sampled_peers(args: argparse.Namespace) -> dict[tuple[int, int], list[int]]:
    """(node, rail) -> its peers, as discovery picks them from the Leases."""
    renew = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    by_label: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for i in range(args.nodes):
        c = card(i, args)
        lease = {"metadata": {"name": f"nodeagent-{c.node}", "labels": card_labels(c),
                              "annotations": {"nodeagent.io/peer-card": card_annotation(c)}},
                 "spec": {"holderIdentity": c.node, "leaseDurationSeconds": 180,
                          "renewTime": renew}}
        for k, v in lease["metadata"]["labels"].items():
            by_label[f"{k}={v}"].append(lease)
            by_label[k].append(lease)
    now = time.time()
    out: dict[tuple[int, int], list[int]] = {}
    requests = leases = 0
    for i in range(args.nodes):
        got = discover(card(i, args), lambda sel: by_label.get(sel, []), args.sample, now)
        requests, leases = requests + got.requests, leases + got.leases
        for rail, peers in got.peers.items():
            out[(i, int(rail[4:]))] = [int((p.node or "")[4:]) for p in peers]
    print(f"discovery: {requests / args.nodes:.1f} requests and {leases / args.nodes:.0f} "
          f"Leases per agent")
    return out


def verdict(got: tuple[PeerOutcome, PeerOutcome], classes: bool) -> MeshVerdict:
    """What the prober publishes for one peer: its probes (3 a class) through the agent's
    own peer_stats and mesh word; in two classes, through the Lease's fold."""
    stats = [peer_stats([PeerProbe("rail0", "10.0.0.1", None, outcome, at=float(t),
                                   traffic_class=tc) for t in range(3)], failures=2)
             for tc, outcome in zip((0, 104), got, strict=True)]
    if not classes:
        return mesh_verdict(stats[0])
    doc = json.loads(mesh_annotation([RailStatus("rail0", "r0", peers=tuple(stats))]))
    return MeshVerdict(doc["rail0"]["10.0.0.1"])


def cells_for(peers: dict[tuple[int, int], list[int]], outcome: Outcome,
              classes: bool) -> list[MeshCell]:
    healthy = verdict((PeerOutcome.OK, PeerOutcome.OK), classes)
    memo: dict[tuple[PeerOutcome, PeerOutcome], MeshVerdict] = {}
    cells = []
    for (i, rail), targets in peers.items():
        for j in targets:
            got = outcome(i, j, rail)
            v = healthy if got == (PeerOutcome.OK, PeerOutcome.OK) else \
                memo.setdefault(got, verdict(got, classes))
            cells.append(MeshCell(f"rail{rail}", f"gpu-{i:05d}", f"gpu-{j:05d}", v))
    return cells


OK2 = (PeerOutcome.OK, PeerOutcome.OK)
ROCE2 = (PeerOutcome.ROCE_FAILED, PeerOutcome.ROCE_FAILED)


def faults(args: argparse.Namespace, rng: random.Random) -> list[tuple[str, Outcome, Any]]:
    """(kind, outcome of (prober, target, rail), the truth: ('node', name, rail) or
    ('switch', name, rail) or None)."""
    out: list[tuple[str, Outcome, Any]] = []
    leaves = args.nodes // args.leaf
    for _ in range(args.trials):
        n, r, k = rng.randrange(args.nodes), rng.randrange(args.rails), rng.randrange(leaves)
        out.append(("nic or cable", lambda i, j, rail, n=n, r=r:
                    ROCE2 if rail == r and n in (i, j) else OK2, ("node", f"gpu-{n:05d}", r)))
        out.append(("leaf dead", lambda i, j, rail, k=k, r=r:
                    ROCE2 if rail == r and k in (leaf_of(i, args), leaf_of(j, args)) else OK2,
                    ("switch", f"leaf-{k}-r{r}", r)))
        out.append(("leaf uplinks", lambda i, j, rail, k=k, r=r:
                    ROCE2 if rail == r and (leaf_of(i, args) == k) != (leaf_of(j, args) == k)
                    else OK2, ("switch", f"leaf-{k}-r{r}", r)))
        out.append(("class 104 dropped on a leaf", lambda i, j, rail, k=k, r=r:
                    (PeerOutcome.OK, PeerOutcome.ROCE_FAILED)
                    if rail == r and k in (leaf_of(i, args), leaf_of(j, args)) else OK2,
                    ("switch", f"leaf-{k}-r{r}", r)))
        out.append(("responder host stalled", lambda i, j, rail, n=n:
                    (PeerOutcome.NO_RESPONDER, PeerOutcome.NO_RESPONDER) if j == n else OK2,
                    None))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--rails", type=int, default=8)
    p.add_argument("--leaf", type=int, default=32)
    p.add_argument("--sample", type=int, default=4)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--noise", type=float, default=0.002)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    peers = sampled_peers(args)
    print(f"fleet: {args.nodes} nodes, {args.rails} rails, {args.leaf} per leaf, "
          f"{sum(map(len, peers.values()))} probed pairs ({time.perf_counter() - t0:.0f} s "
          "to build)")
    switch_of = {(f"gpu-{i:05d}", f"rail{r}"): f"leaf-{leaf_of(i, args)}-r{r}"
                 for i in range(args.nodes) for r in range(args.rails)}
    score: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    took: list[float] = []
    for kind, fault, truth in faults(args, rng):
        t = time.perf_counter()
        flaky = {(i, j, r) for (i, r), targets in peers.items() for j in targets
                 if rng.random() < args.noise}

        def outcome(i: int, j: int, rail: int, fault: Outcome = fault,
                    flaky: set[tuple[int, int, int]] = flaky) -> tuple[PeerOutcome, PeerOutcome]:
            return ROCE2 if (i, j, rail) in flaky else fault(i, j, rail)

        cells = cells_for(peers, outcome, classes=kind.startswith("class"))
        found = switch_faults(cells, switch_of)
        named_switches = {(f.switch, int(f.rail[4:])) for f in found}
        under = {(n, int(f.rail[4:])) for f in found for n in f.nodes}
        named_nodes = {(n, int(r[4:])) for n, rails in suspects(cells).items() for r in rails
                       if (n, int(r[4:])) not in under}
        took.append(time.perf_counter() - t)
        names = {("switch", *s) for s in named_switches} | {("node", *n) for n in named_nodes}
        s = score[kind]
        s[0] += 1
        s[1] += names == ({truth} if truth else set())
        s[2] += sum(1 for x in names if x == truth)
        s[3] += len(names)
        s[4] += len(named_nodes) if truth and truth[0] == "switch" else 0
    cfg = parse_config({"rails": [{"name": "rail0", "interface": "r0",
                                   "address": "10.0.0.1/16"}],
                        "peers": {"classes": [0, 104]}})
    assert cfg.peers is not None
    listing = {"rail0": tuple(range(args.sample))}
    period = round_period(cfg.peers, listing)  # type: ignore[arg-type]
    print(f"aggregation: {sum(took) / len(took):.1f} s per fleet view (suspects and switches "
          f"over every published verdict)")
    print(f"{'fault':30} {'trials':>6} {'correct':>8} {'precision':>9} {'nodes flagged':>13}")
    total = [0, 0, 0, 0]
    for kind, (n, correct, right, named, flagged) in score.items():
        precision = f"{right / named:.1%}" if named else "-"
        print(f"{kind:30} {n:6d} {correct / n:8.1%} {precision:>9} {flagged:13d}")
        total = [total[0] + n, total[1] + correct, total[2] + right, total[3] + named]
    print(f"{'all':30} {total[0]:6d} {total[1] / total[0]:8.1%} "
          f"{(total[2] / total[3] if total[3] else 1):9.1%}")
    print(f"time to the verdict: {cfg.peers.failures} failed rounds of {period:.1f} s (2 classes "
          f"x {args.sample} peers at <= 10 probes/s), then the Lease's early renewal: about "
          f"{cfg.peers.failures * period + cfg.peers.timeout:.0f}-"
          f"{cfg.peers.failures * period + cfg.peers.timeout + 10:.0f} s to the fleet view")


if __name__ == "__main__":
    main()
