"""Each rail's switch on the agent's Lease, and discovery's two shares: half a rail's
sample under its own switch (listed by the switch label: a leaf's agents, whatever the
fleet), the rest under others, so the fleet can tell a switch's fault from a node's."""

from __future__ import annotations

import json
import time
from dataclasses import replace

from nodeagent.kube.peercard import CARD, lease_metadata, parse_card
from nodeagent.model.network import Neighbour
from nodeagent.model.peers import CardRail, PeerCard
from nodeagent.model.status import RailStatus
from nodeagent.run.discovery import choose, discover
from tests.unit.test_peer_discovery import Fleet, lease_of

PER_LEAF = 32


def leaf(i: int, rail: int) -> str:
    return f"leaf-{i // PER_LEAF}-r{rail}"


def card(i: int, switches: bool = True) -> PeerCard:
    return PeerCard(f"gpu-{i:05d}", 18600, tuple(
        CardRail(f"rail{n}", f"10.{10 + n}.{i // 250}.{i % 250 + 1}", f"10.{10 + n}.0.0/16",
                 leaf(i, n) if switches else None)
        for n in (0, 1)))


def test_the_switch_each_rail_hears_goes_on_the_card_and_a_label() -> None:
    plain = replace(card(7), rails=tuple(replace(r, switch=None) for r in card(7).rails))
    heard = [RailStatus("rail0", "r0", switch=Neighbour("c0", "Eth1/7", 120, "leaf 0/r0!")),
             RailStatus("rail1", "r1")]
    labels, annotations = lease_metadata(plain, heard)
    # The name as a label carries it; a rail that hears nothing has neither.
    assert labels["switch.nodeagent.io/rail0"] == "leaf-0-r0"
    assert "switch.nodeagent.io/rail1" not in labels
    assert json.loads(annotations[CARD])["switches"] == {"rail0": "leaf-0-r0"}
    lease = {"metadata": {"name": "nodeagent-gpu-00007", "labels": labels,
                          "annotations": annotations}}
    got = parse_card(lease)
    assert got is not None and [r.switch for r in got.rails] == ["leaf-0-r0", None]


def test_a_switch_that_is_not_label_safe_text_reads_as_unknown() -> None:
    for switch in ("leaf 0", 7, "", ["x"], "a" * 64):
        doc = {"port": 18600, "rails": {"rail0": "10.10.0.6/24"}, "switches": {"rail0": switch}}
        got = parse_card({"metadata": {"name": "nodeagent-gpu-06",
                                       "annotations": {CARD: json.dumps(doc)}}})
        assert got is not None and got.rails[0].switch is None, switch


def test_half_the_sample_comes_from_under_the_same_switch_at_ten_thousand_agents() -> None:
    n = 10_000
    fleet = Fleet([lease_of(card(i)) for i in range(n)])
    for i in (0, 17, 4321, 9999):
        fleet.requests = 0
        got = discover(card(i), fleet.list, 4, time.time())
        for rail in (0, 1):
            peers = got.peers[f"rail{rail}"]
            under = [int((p.node or "")[4:]) for p in peers]
            same = [j for j in under if leaf(j, rail) == leaf(i, rail)]
            assert len(peers) == 4 and len(same) == 2, (i, rail, under)
        # One switch list (rail-optimised: rail 0's leaf-mates are rail 1's too), then the
        # ring group that fills the other share.
        assert got.requests == fleet.requests <= 1 + 3
        assert got.leases <= PER_LEAF + 16 * 5 * 4


def test_a_share_short_of_agents_is_filled_from_the_other() -> None:
    alone = [card(0), card(PER_LEAF), card(2 * PER_LEAF), card(3 * PER_LEAF)]
    peers = choose(card(0), [*alone, card(1)], 4)["rail0"]
    assert [p.node for p in peers].count("gpu-00001") == 1 and len(peers) == 4
    crowd = [card(i) for i in range(6)]  # all under leaf 0: nothing outside it
    assert len(choose(card(0), crowd, 4)["rail0"]) == 4


def test_without_switches_the_sample_is_the_ring_as_before() -> None:
    cards = [card(i, switches=False) for i in range(100)]
    mixed = [card(i) for i in range(100)]
    mine = card(0, switches=False)
    assert choose(mine, cards, 4) == choose(mine, mixed, 4)
