"""Peers found from the API (`peers.discover`), at a cost per agent that does not grow with
the fleet: no agent watches or lists every Node.

Every agent publishes a card on its own Lease (kube/peercard.py: its rails and responder
port, labelled with its group on a hash ring and its rail networks). To find peers an agent
lists only its own group, finest first: the Leases whose `ring.nodeagent.io/p3` label
(the first 3 hex digits of sha256 of the node name, about 1/4096 of the fleet) is its own,
then p2 (1/256), then p1 (1/16), stopping at the first that gives every rail `peers.sample`
live peers on the same rail network. A rail still short after p1 lists its whole network
(`net.nodeagent.io/<network>`), which only happens when that network is small. A group
one level coarser is 16 times larger, so the list that fills the rails returns between
`sample` and about 16x `sample` Leases whatever the fleet's size, and a full peer set
costs 1 to 4 requests (usually one more with switches known), each with
`resourceVersion=0` (served from the API server's watch cache, not from etcd), repeated
every `peers.discover_interval` (default 10 min).

Within what it listed, a rail takes the `sample` agents that follow this node on the ring
(sha256 of node names), so each agent is probed by about `sample` others, not by all.

With the rail's switch known (LLDP), half its sample (rounded down) comes from under the
same switch, found by one more list (`switch.nodeagent.io/<rail>=<switch>`: a leaf's
agents, a few dozen whatever the fleet; on a rail-optimised fabric the first rail's list
serves every rail), the rest from under other switches: the
ToR-mesh and inter-ToR shares of R-Pingmesh, so `fleet` can tell a switch's fault (its
nodes fail outward, pass among themselves) from a node's. A share short of agents is
filled from the other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from nodeagent.config import MAX_PEERS, Config
from nodeagent.io.periodic import Periodic
from nodeagent.kube.peercard import (
    RING_LEVELS,
    lease_live,
    net_label,
    parse_card,
    ring_hash,
    ring_label,
    switch_key,
)
from nodeagent.model.peers import CardRail, PeerCard, PeerRef

log = logging.getLogger(__name__)

PAGE = 500  # Leases per page of one list
MAX_PAGES = 20  # a list longer than 10,000 Leases is cut (and said so in the log)
RETRY = 30.0  # seconds after a failed discovery (API down): the last peers are kept
RING = 1 << 256


def own_card(cfg: Config) -> PeerCard | None:
    """This agent's card: every managed rail, with a peers and a kubernetes section."""
    if cfg.peers is None or cfg.kubernetes is None:
        return None
    rails = tuple(CardRail(r.name, r.ip, r.network) for r in cfg.rails if cfg.manages(r))
    return PeerCard(cfg.resolved_node_name(), cfg.peers.port, rails) if rails else None


def choose(own: PeerCard, cards: Iterable[PeerCard], sample: int,
           fill: bool = True) -> dict[str, tuple[PeerRef, ...]]:
    """Per rail of `own`: the `sample` agents on its network that follow this node on the
    ring, one address each, nearest first; with the rail's switch known, half of them
    (rounded down) under the same switch and the rest under others, the other-switch
    share filled from the same switch when short only with `fill` (discovery lists a
    coarser group first)."""
    mine = int(ring_hash(own.node), 16)
    unique = {c.node: c for c in cards}  # one listed twice (its switch, its ring group)
    others = sorted(((int(ring_hash(c.node), 16) - mine) % RING, c.node, c)
                    for c in unique.values() if c.node != own.node)
    out: dict[str, tuple[PeerRef, ...]] = {}
    for rail in own.rails:
        same: list[PeerRef] = []
        apart: list[PeerRef] = []
        for _, node, card in others:
            match = next((r for r in card.rails if r.network == rail.network
                          and r.address != rail.address), None)
            if match is not None:
                under = rail.switch is not None and match.switch == rail.switch
                (same if under else apart).append(PeerRef(match.address, node))
        want = sample // 2 if rail.switch is not None else 0
        take = min(len(same), max(want, sample - len(apart)) if fill else want)
        out[rail.name] = (*same[:take], *apart[:sample - take])
    return out


@dataclass(frozen=True)
class Discovered:
    """One discovery: each rail's peers, and what it cost."""

    peers: dict[str, tuple[PeerRef, ...]]
    requests: int = 0
    leases: int = 0  # Leases read
    group: str = ""  # the label the peers were found by: ring.nodeagent.io/p2=ab, ...
    short: dict[str, str] = field(default_factory=dict)  # rail -> why it has fewer


ListLeases = Callable[[str], list[Any]]  # a label selector -> the Leases it selects


def discover(own: PeerCard, list_leases: ListLeases, sample: int, now: float) -> Discovered:
    """The finest ring group that fills every rail, else the rail networks whole."""
    h = ring_hash(own.node)
    requests = leases = 0
    chosen: dict[str, tuple[PeerRef, ...]] = {}
    group = ""
    near: dict[str, PeerCard] = {}  # the agents under this node's switches
    for rail in own.rails:
        # On a rail-optimised fabric a unit's nodes share a leaf on every rail: the first
        # rail's list usually holds every rail's share, and the others are not listed.
        under = sum(1 for c in near.values() for r in c.rails
                    if r.switch == rail.switch and r.network == rail.network)
        if rail.switch is None or under >= sample // 2:
            continue
        items = list_leases(f"{switch_key(rail.name)}={rail.switch}")
        requests, leases = requests + 1, leases + len(items)
        near.update((c.node, c) for c in _live_cards(items, now) if c.node != own.node)
    for level in RING_LEVELS:
        group = f"{ring_label(level)}={h[:level]}"
        items = list_leases(group)
        requests, leases = requests + 1, leases + len(items)
        chosen = choose(own, [*near.values(), *_live_cards(items, now)], sample, fill=False)
        if all(len(chosen[r.name]) >= sample for r in own.rails):
            return Discovered(chosen, requests, leases, group)
    # A rail network too small for the coarsest group: listed whole. The agents on one
    # rail network are usually on the others too, so each list serves every short rail.
    cards: dict[str, PeerCard] = {}
    for rail in own.rails:
        if len(chosen[rail.name]) >= sample:
            continue
        items = list_leases(net_label(rail.network))
        requests, leases = requests + 1, leases + len(items)
        cards.update((c.node, c) for c in _live_cards(items, now))
        wider = choose(own, [*near.values(), *cards.values()], sample)
        chosen.update({r: p for r, p in wider.items() if len(p) > len(chosen[r])})
    short = {r.name: f"{len(chosen[r.name])} live agents on {r.network} besides this one"
             for r in own.rails if len(chosen[r.name]) < sample}
    return Discovered(chosen, requests, leases, "network", short)


def _live_cards(items: Iterable[Any], now: float) -> list[PeerCard]:
    cards = (parse_card(i) for i in items if lease_live(i, now))
    return [c for c in cards if c is not None]


def lease_lister(api: Any, counters: Any, namespace: str) -> ListLeases:
    """Lists a namespace's Leases by label selector from the API server's watch cache
    (resourceVersion=0), a page at a time."""
    from nodeagent.kube.api import call

    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def list_leases(selector: str) -> list[Any]:
        items: list[Any] = []
        query = [("labelSelector", selector), ("limit", str(PAGE)), ("resourceVersion", "0")]
        for _ in range(MAX_PAGES):
            got = call(api, counters, "GET", path, query=query)
            page = got.get("items")
            items.extend(page if isinstance(page, list) else [])
            token = (got.get("metadata") or {}).get("continue")
            if not isinstance(token, str) or not token:
                return items
            query = [("labelSelector", selector), ("limit", str(PAGE)), ("continue", token)]
        log.warning("peer discovery: %s selects more than %d Leases; the rest is not read",
                    selector, PAGE * MAX_PAGES)
        return items

    return list_leases


class PeerDiscovery(Periodic):
    """The discovery thread: at start and every `peers.discover_interval` (at once when
    woken by a reload), the peers of every rail, handed to `found`."""

    def __init__(self, cfg: Config, found: Callable[[Discovered], None],
                 lister: Callable[[Config], ListLeases] | None = None) -> None:
        super().__init__("peer-discovery")
        self.cfg = cfg
        self.found = found
        self._lister_for = lister or _api_lister
        self._lister: ListLeases | None = None
        self.last: Discovered | None = None
        self.switches: Mapping[str, str] = {}  # rail -> the switch it hears (the loop's)

    def turn(self) -> float:
        peers, card = self.cfg.peers, own_card(self.cfg)
        if peers is None or card is None:
            return 5.0
        card = replace(card, rails=tuple(replace(r, switch=self.switches.get(r.name))
                                         for r in card.rails))
        if self._lister is None:
            self._lister = self._lister_for(self.cfg)
        got = discover(card, self._lister, min(peers.sample, MAX_PEERS), time.time())
        self.last = got
        if not self.halted:
            self.found(got)
        log.info("peer discovery: %s, %d requests, %d Leases read (%s)",
                 ", ".join(f"{r}: {len(p)} peers" for r, p in got.peers.items()),
                 got.requests, got.leases, got.group)
        return peers.discover_interval

    def after_failure(self) -> float:
        return RETRY


def _api_lister(cfg: Config) -> ListLeases:
    from nodeagent.kube.api import Counters, api_client

    kcfg = cfg.kubernetes
    assert kcfg is not None
    return lease_lister(api_client(kcfg, kcfg.request_timeout), Counters(),
                        kcfg.lease_namespace)
