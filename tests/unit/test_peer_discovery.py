"""Peer discovery's pure parts: the card on a Lease and what any other shape reads as, the
ring sample (no self, same network, each node probed by about `sample` others), the cost
of a discovery as the fleet grows (a label-selecting lister over in-memory Leases: the
API server's own answer is in tests/kube/test_discovery_api.py), the listing the prober
and the responder get, the condition before and without peers, and the fleet's mesh view.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.checks.conditions import judge_all
from nodeagent.checks.facts import Facts, PeersSeen
from nodeagent.checks.peers import peers_finding
from nodeagent.cli.mesh import mesh_cells, mesh_document, peer_counts, render_grid, suspects
from nodeagent.config import ConfigError, parse_config
from nodeagent.kube.peercard import (
    CARD,
    MESH,
    card_annotation,
    card_labels,
    lease_live,
    lease_metadata,
    parse_card,
    parse_mesh,
)
from nodeagent.model.conditions import FABRIC_READY, RDMA_PEERS_REACHABLE
from nodeagent.model.peers import (
    CardRail,
    MeshVerdict,
    PeerCard,
    PeerOutcome,
    PeerProbe,
    PeerRef,
    PeerStats,
    RailEndpoint,
    Targets,
)
from nodeagent.model.status import RailStatus
from nodeagent.run.discovery import Discovered, choose, discover, own_card
from nodeagent.run.peers import merged_listing, served_rails

RAILS = [{"name": "rail0", "interface": "r0", "address": "10.10.0.5/24"},
         {"name": "rail1", "interface": "r1", "address": "10.11.0.5/24"}]
KUBE = {"kubeconfig": "/etc/nodeagent/kubeconfig"}
CFG = parse_config({"node_name": "gpu-05", "rails": RAILS, "kubernetes": KUBE,
                    "peers": {"discover": True, "sample": 3, "gate": True}})


def micro(offset: float = 0.0) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(time.time() + offset))


def lease_of(card: PeerCard, renewed: float = -5.0, mesh: str | None = None) -> dict[str, Any]:
    """A Lease as an agent writes it (publish/kube.py renew_lease with lease_metadata)."""
    annotations = {CARD: card_annotation(card)}
    if mesh is not None:
        annotations[MESH] = mesh
    return {"metadata": {"name": f"nodeagent-{card.node}", "labels": card_labels(card),
                         "annotations": annotations},
            "spec": {"holderIdentity": card.node, "leaseDurationSeconds": 180,
                     "renewTime": micro(renewed)}}


def card(i: int, nets: tuple[int, ...] = (10, 11)) -> PeerCard:
    return PeerCard(f"gpu-{i:05d}", 18600, tuple(
        CardRail(f"rail{n - 10}", f"10.{n}.{i // 250}.{i % 250 + 1}", f"10.{n}.0.0/16")
        for n in nets))


# ---------------------------------------------------------------- the card


def test_the_card_reads_back_as_it_was_written() -> None:
    mine = own_card(CFG)
    assert mine == PeerCard("gpu-05", 18600, (CardRail("rail0", "10.10.0.5", "10.10.0.0/24"),
                                              CardRail("rail1", "10.11.0.5", "10.11.0.0/24")))
    assert parse_card(lease_of(mine)) == mine
    labels = card_labels(mine)
    assert labels["net.nodeagent.io/10.10.0.0-24"] == ""
    assert len(labels["ring.nodeagent.io/p3"]) == 3
    assert labels["ring.nodeagent.io/p3"].startswith(labels["ring.nodeagent.io/p2"])


def test_no_card_without_kubernetes_or_peers() -> None:
    assert own_card(parse_config({"rails": RAILS, "peers": {}})) is None
    assert own_card(parse_config({"rails": RAILS, "kubernetes": KUBE})) is None
    assert lease_metadata(None, []) == ({}, {})


@pytest.mark.parametrize("annotation", [
    None, "", "{", "[]", '{"port": "18600", "rails": {"rail0": "10.10.0.6/24"}}',
    '{"port": true, "rails": {"rail0": "10.10.0.6/24"}}',
    '{"port": 70000, "rails": {"rail0": "10.10.0.6/24"}}',
    '{"port": 18600, "rails": {"rail0": "127.0.0.1/8"}}',
    '{"port": 18600, "rails": {"rail0": "0.0.0.0/0"}}',
    '{"port": 18600, "rails": {"rail0": "10.10.0.6/33"}}',
    # the subnet's broadcast and network addresses: no host's (accepted before)
    '{"port": 18600, "rails": {"rail0": "10.10.0.255/24"}}',
    '{"port": 18600, "rails": {"rail0": "10.10.0.0/24"}}',
    '{"port": 18600, "rails": {"bad name!": "10.10.0.6/24"}}',
    '{"port": 18600, "rails": []}', '{"port": 18600, "rails": {"rail0": 7}}',
    json.dumps({"port": 18600, "rails": {"rail0": "10.10.0.6/24"}, "x": "y" * 70_000}),
    # Nested 20,000 deep in 40 KiB: json.loads raised RecursionError (not a ValueError),
    # a traceback in fleet and a discovery that failed every round.
    "[" * 20_000 + "]" * 20_000, '{"port": 18600, "rails": ' + "[" * 20_000,
])
def test_a_card_that_does_not_parse_is_no_card(annotation: str | None) -> None:
    lease = {"metadata": {"name": "nodeagent-gpu-06",
                          "annotations": {CARD: annotation} if annotation is not None else {}}}
    assert parse_card(lease) is None


def test_a_lease_that_is_not_an_agents_has_no_card() -> None:
    good = lease_of(card(1))
    for name in ("kube-scheduler", "nodeagent-", "nodeagent-UPPER", 7):
        assert parse_card({**good, "metadata": {**good["metadata"], "name": name}}) is None


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                           max_leaves=20)


@given(lease=json_values, card_doc=json_values, mesh_doc=json_values)
@settings(max_examples=300, deadline=None)
def test_any_shape_of_lease_reads_as_a_card_or_none_never_an_error(
        lease: Any, card_doc: Any, mesh_doc: Any) -> None:
    shaped = {"metadata": {"name": "nodeagent-gpu-06", "annotations": {
        CARD: json.dumps(card_doc), MESH: json.dumps(mesh_doc)}}, "spec": lease}
    for candidate in (lease, shaped):
        got = parse_card(candidate)
        assert got is None or isinstance(got, PeerCard)
        assert isinstance(parse_mesh(candidate), dict)
        assert isinstance(lease_live(candidate, time.time()), bool)
        assert isinstance(mesh_cells([candidate, candidate]), list)


def test_a_lease_past_its_duration_is_not_live() -> None:
    now = time.time()
    assert lease_live(lease_of(card(1), renewed=-5), now)
    assert not lease_live(lease_of(card(1), renewed=-600), now)
    assert not lease_live({"spec": {"renewTime": micro(), "leaseDurationSeconds": 0}}, now)
    assert not lease_live({"spec": {"renewTime": "yesterday", "leaseDurationSeconds": 9}}, now)
    # Renewed in the future: a clock a minute ahead still counts; a Lease dated an hour or
    # years ahead (forged, or a node's clock gone wrong) never went stale before.
    assert lease_live(lease_of(card(1), renewed=60), now)
    assert not lease_live(lease_of(card(1), renewed=3600), now)
    assert not lease_live({"spec": {"renewTime": "9999-12-31T23:59:59.000000Z",
                                    "leaseDurationSeconds": 180}}, now)


# ---------------------------------------------------------------- the ring sample


def test_the_sample_is_on_the_rails_network_never_itself_one_address_a_node() -> None:
    mine = card(0)
    others = [card(i) for i in range(1, 30)] + [card(i, nets=(12,)) for i in range(30, 40)]
    twice = PeerCard("gpu-00077", 18600, (CardRail("rail0", "10.10.0.200", "10.10.0.0/16"),
                                          CardRail("rail9", "10.10.0.201", "10.10.0.0/16")))
    got = choose(mine, [mine, twice, *others], 4)
    assert set(got) == {"rail0", "rail1"}
    for rail, peers in got.items():
        assert len(peers) == 4 and len({p.node for p in peers}) == 4
        assert "gpu-00000" not in {p.node for p in peers}
        net = "10.10." if rail == "rail0" else "10.11."
        assert all(p.address.startswith(net) for p in peers)
    assert [p.node for p in got["rail0"]] == [p.node for p in got["rail1"]] or any(
        p.node == "gpu-00077" for p in got["rail0"])


@given(n=st.integers(2, 120), sample=st.integers(1, 6))
@settings(max_examples=60, deadline=None)
def test_over_a_whole_fleet_every_node_is_probed_by_sample_others(n: int, sample: int) -> None:
    """Ring successors: each node probes min(sample, n-1) others, and is probed by exactly
    as many (no node is everyone's peer)."""
    cards = [card(i) for i in range(n)]
    probed_by: Counter[str] = Counter()
    for c in cards:
        peers = choose(c, cards, sample)["rail0"]
        assert len(peers) == min(sample, n - 1)
        probed_by.update(p.node for p in peers)
    assert set(probed_by.values()) == {min(sample, n - 1)}


class Fleet:
    """Leases in memory, selected as the API server selects labels (`key=value` and
    `key` exists, comma-separated and all of them)."""

    def __init__(self, leases: list[dict[str, Any]]) -> None:
        self.leases = leases
        self.requests = 0

    def list(self, selector: str) -> list[Any]:
        self.requests += 1
        terms = [t.split("=", 1) if "=" in t else [t, None] for t in selector.split(",")]
        return [lease for lease in self.leases
                if all(k in lease["metadata"]["labels"]
                       and (v is None or lease["metadata"]["labels"][k] == v)
                       for k, v in terms)]


@pytest.mark.parametrize("n", [10, 100, 1000, 10_000])
def test_a_discovery_reads_a_bounded_group_whatever_the_fleet_size(n: int) -> None:
    """1 to 4 requests, and at most about 16 x (sample + 1) Leases read, at 10 or 10,000
    agents: the finest ring group that fills every rail."""
    leases = [lease_of(card(i)) for i in range(n)]
    reads = []
    for i in range(0, n, max(1, n // 50)):
        fleet = Fleet(leases)
        got = discover(card(i), fleet.list, 4, time.time())
        assert all(len(p) == min(4, n - 1) for p in got.peers.values())
        assert got.requests == fleet.requests <= 4
        reads.append(got.leases)
    assert max(reads) <= max(n * 4, 16 * 5 * 4)  # a small fleet: at most every level whole
    if n >= 1000:
        assert sum(reads) / len(reads) < 16 * 5 * 2


def test_stale_agents_and_cards_from_other_networks_are_never_chosen() -> None:
    leases = [lease_of(card(i), renewed=-3600 if i % 2 else -5) for i in range(1, 12)]
    leases += [lease_of(card(i, nets=(12,))) for i in range(20, 30)]
    got = discover(card(0), Fleet(leases).list, 4, time.time())
    nodes = {p.node for peers in got.peers.values() for p in peers}
    assert nodes and all(int(n[-2:]) % 2 == 0 and int(n[-2:]) < 20 for n in nodes)


def test_a_rail_network_with_too_few_agents_says_how_many_it_found() -> None:
    leases = [lease_of(card(i)) for i in range(1, 3)]
    got = discover(card(0), Fleet(leases).list, 4, time.time())
    assert got.short == {"rail0": "2 live agents on 10.10.0.0/16 besides this one",
                         "rail1": "2 live agents on 10.11.0.0/16 besides this one"}
    assert got.group == "network" and got.requests == 5  # 3 ring levels, then each network
    # (still short after the first network list, so the second is listed too)


# ---------------------------------------------------------------- listing and serving


def test_static_peers_come_first_and_discovered_ones_are_added_once() -> None:
    cfg = parse_config({"node_name": "gpu-05", "rails": RAILS, "kubernetes": KUBE,
                        "peers": {"discover": True, "static": {
                            "rail0": [{"address": "10.10.0.6", "node": "gpu-06"}]}}})
    found = Discovered({"rail0": (PeerRef("10.10.0.6", "gpu-06"), PeerRef("10.10.0.9", "g9")),
                        "rail1": (PeerRef("10.11.0.9", "g9"),)})
    assert cfg.peers is not None
    assert merged_listing(cfg.peers, found) == {
        "rail0": (PeerRef("10.10.0.6", "gpu-06"), PeerRef("10.10.0.9", "g9")),
        "rail1": (PeerRef("10.11.0.9", "g9"),)}
    assert merged_listing(cfg.peers, None) == {"rail0": (PeerRef("10.10.0.6", "gpu-06"),)}


def test_with_discovery_the_responder_answers_its_rails_network_and_nothing_else() -> None:
    t = RailEndpoint("rxe0", 1, 1, "10.10.0.5")
    served = served_rails(CFG, {}, Targets({"rail0": t}, {"rail1": "GID off its pin"}))
    assert served.keys() == {"rail0"}  # a rail with no peers of its own is still served
    assert served["rail0"].answers("10.10.0.77")
    for stranger in ("10.11.0.77", "10.10.1.1", "192.0.2.1", "not an address"):
        assert not served["rail0"].answers(stranger)
    static = parse_config({"rails": RAILS, "peers": {"static": {
        "rail0": [{"address": "10.10.0.6"}]}}})
    only = served_rails(static, {"rail0": (PeerRef("10.10.0.6"),)}, Targets({"rail0": t}))
    assert only["rail0"].answers("10.10.0.6") and not only["rail0"].answers("10.10.0.77")


def test_discover_needs_a_kubernetes_section() -> None:
    with pytest.raises(ConfigError) as got:
        parse_config({"rails": RAILS, "peers": {"discover": True}})
    assert got.value.problems == ["peers.discover: needs a kubernetes section (the peers' "
                                  "cards are read from their Leases)"]


# ---------------------------------------------------------------- the condition


def facts(listed: dict[str, tuple[PeerRef, ...]], short: dict[str, str]) -> Facts:
    """A pass's facts after a discovery round that listed `listed`, short by `short`."""
    return Facts(now=100.0, seen={PeersSeen: PeersSeen({}, {}, listed=listed, short=short)})


def test_before_the_first_discovery_each_rail_is_discovering() -> None:
    f = peers_finding(CFG, {}, {}, 100.0, listing={})
    assert (f.status, f.reason) == ("Unknown", "PeersNotProbed")
    assert f.message == "rail0: discovering peers; rail1: discovering peers"


def test_no_peer_on_a_network_is_unknown_and_never_holds_fabric_ready() -> None:
    short = {"rail0": "0 live agents on 10.10.0.0/24 besides this one"}
    f = peers_finding(CFG, {}, {}, 100.0, listing={}, short=short)
    assert (f.status, f.reason) == ("Unknown", "NoPeersFound")
    assert "rail0: no peer to probe: 0 live agents on 10.10.0.0/24" in f.message
    only = {"rail0": "0 live agents", "rail1": "0 live agents"}
    out = {x.type: x for x in judge_all(CFG, facts(listed={}, short=only))}
    assert out[RDMA_PEERS_REACHABLE].reason == "NoPeersFound"
    assert "RDMAPeersReachable" not in out[FABRIC_READY].message  # gated, yet no taint


# ---------------------------------------------------------------- the mesh


def stats(address: str, outcome: PeerOutcome, failing: bool, ever_ok: bool = True
          ) -> PeerStats:
    last = PeerProbe("rail0", address, None, outcome)
    probes = 5
    return PeerStats(address, None, last, 0 if outcome == PeerOutcome.OK else (
        2 if ever_ok else probes), probes, 0, failing=failing)


def test_the_lease_carries_each_peers_verdict_as_the_condition_judged_it() -> None:
    rails = [RailStatus("rail0", "r0", peers=(
        stats("10.10.0.6", PeerOutcome.OK, False),
        stats("10.10.0.7", PeerOutcome.ROCE_FAILED, True),
        stats("10.10.0.8", PeerOutcome.MTU_FAILED, True),
        stats("10.10.0.9", PeerOutcome.NO_RESPONDER, True),
        stats("10.10.0.10", PeerOutcome.ROCE_FAILED, False),  # one failure: no verdict yet
        stats("10.10.0.11", PeerOutcome.ROCE_FAILED, False, ever_ok=False))),
        RailStatus("rail1", "r1")]
    _, annotations = lease_metadata(own_card(CFG), rails)
    assert json.loads(annotations[MESH]) == {"rail0": {
        "10.10.0.6": "ok", "10.10.0.7": "roce", "10.10.0.8": "mtu", "10.10.0.9": "silent",
        "10.10.0.10": "ok", "10.10.0.11": "pending"}}


def mesh_fleet(bad: str | None = None, n: int = 6) -> list[dict[str, Any]]:
    """n agents, each probing the next 3 on the ring of their names; every probe of `bad`
    fails over RoCE."""
    cards = [card(i, nets=(10,)) for i in range(n)]
    leases = []
    for i, c in enumerate(cards):
        targets = [cards[(i + k) % n] for k in (1, 2, 3)]
        mesh = {"rail0": {t.rails[0].address: "roce" if t.node == bad else "ok"
                          for t in targets}}
        leases.append(lease_of(c, mesh=json.dumps(mesh)))
    return leases


def test_a_node_most_of_whose_probers_fail_while_they_pass_elsewhere_is_suspect() -> None:
    cells = mesh_cells(mesh_fleet(bad="gpu-00003"))
    assert suspects(cells) == {"gpu-00003": ["rail0"]}
    counts = peer_counts(cells)
    assert str(counts["gpu-00000"]["rail0"]) == "2/3"  # it probes gpu-00003
    assert str(counts["gpu-00003"]["rail0"]) == "3/3"  # its own probes pass
    assert suspects(mesh_cells(mesh_fleet())) == {}


def test_a_prober_that_fails_everyone_makes_no_one_suspect() -> None:
    leases = mesh_fleet()
    doc = json.loads(leases[0]["metadata"]["annotations"][MESH])
    doc["rail0"] = dict.fromkeys(doc["rail0"], "roce")
    leases[0]["metadata"]["annotations"][MESH] = json.dumps(doc)
    assert suspects(mesh_cells(leases)) == {}


def test_the_grid_marks_each_probe_and_colours_only_when_asked() -> None:
    cells = mesh_cells(mesh_fleet(bad="gpu-00003"))
    plain = render_grid(cells, None, color=False)
    assert "\033[" not in plain
    lines = plain.splitlines()
    assert lines[0] == "rail rail0 (rows probe columns)"
    assert lines[1].split() == [str(i) for i in range(6)]
    assert lines[2].split() == ["0", "gpu-00000", "o", "o", "X"]  # probes 1, 2 and 3
    assert lines[5].split() == ["3", "gpu-00003", "o", "o", "o"]
    assert "X RoCE fails while TCP reaches the peer" in plain
    coloured = render_grid(cells, "rail0", color=True)
    assert "\033[1;31mX\033[0m" in coloured and "\033[32mo\033[0m" in coloured
    assert render_grid(cells, "rail7", color=False) == "no peer results published for rail rail7\n"
    doc = mesh_document(cells, "rail0")
    assert {"rail": "rail0", "prober": "gpu-00000", "target": "gpu-00003",
            "verdict": "roce"} in doc["items"]
    assert len(doc["items"]) == 18


def test_a_target_no_card_names_is_shown_by_its_address() -> None:
    leases = mesh_fleet()[:1]  # only gpu-00000's Lease: its targets have no card
    names = {c.target for c in mesh_cells(leases)}
    assert names == {"10.10.0.2", "10.10.0.3", "10.10.0.4"}
    assert all(c.verdict == MeshVerdict.OK for c in mesh_cells(leases))


# ---------------------------------------------------------------- the source


class FakeDiscovery:
    """Stands in for the discovery thread (its API side is tested on the real API server):
    records what the service asks of it."""

    def __init__(self, cfg: Any, found: Any) -> None:
        self.cfg, self.found = cfg, found
        self.calls: list[str] = []
        self.switches: dict[str, str] = {}

    def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")

    def wake(self) -> None:
        self.calls.append("wake")


def test_the_service_probes_nothing_until_discovery_answers_then_its_peers() -> None:
    from nodeagent.run.peers import PeerService

    service = PeerService(CFG, lambda item: None, discovery=FakeDiscovery)  # type: ignore[arg-type]
    service._sync_discovery(None)
    found = service.discovery
    assert isinstance(found, FakeDiscovery) and service.prober.listing == {}
    found.found(Discovered({"rail0": (PeerRef("10.10.0.9", "g9"),), "rail1": ()},
                           short={"rail1": "0 live agents on 10.11.0.0/24 besides this one"}))
    assert service.prober.listing == {"rail0": (PeerRef("10.10.0.9", "g9"),)}
    assert service.prober.short == {"rail1": "0 live agents on 10.11.0.0/24 besides this one"}
    # A reload that changes the peers section asks for a new discovery at once ...
    again = parse_config({"node_name": "gpu-05", "rails": RAILS, "kubernetes": KUBE,
                          "peers": {"discover": True, "sample": 5}})
    service.reconfigure(again)
    assert found.calls[-1] == "wake"
    # ... one that turns discovery off stops it and keeps only the static peers.
    static = parse_config({"node_name": "gpu-05", "rails": RAILS, "kubernetes": KUBE,
                           "peers": {"static": {"rail0": [{"address": "10.10.0.6"}]}}})
    service.reconfigure(static)
    assert found.calls[-1] == "stop" and service.discovery is None
    assert service.prober.listing == {"rail0": (PeerRef("10.10.0.6"),)}
    service.responder.stop()


def test_a_switch_first_heard_reaches_discovery_at_once_and_only_a_change_wakes_it() -> None:
    from nodeagent.model.peers import RailEndpoint
    from nodeagent.run.peers import PeerService

    service = PeerService(CFG, lambda item: None, discovery=FakeDiscovery)  # type: ignore[arg-type]
    service._sync_discovery(None)
    found = service.discovery
    assert isinstance(found, FakeDiscovery)
    ready = {"rail0": RailEndpoint("rxe0", 1, 1, "10.10.0.5")}
    service.retarget(Targets(ready))
    assert found.calls == []  # no switch heard: nothing new for discovery
    service.retarget(Targets(ready, switches={"rail0": "leaf-0-r0"}))
    assert found.switches == {"rail0": "leaf-0-r0"} and found.calls == ["wake"]
    service.retarget(Targets(ready, switches={"rail0": "leaf-0-r0"}))
    assert found.calls == ["wake"]  # every pass retargets; the same switch is no news
    service.responder.stop()


def test_static_peers_are_probed_while_discovery_has_not_answered() -> None:
    """An API that is down at start delays the discovered peers, never the static ones."""
    from nodeagent.run.peers import PeerService

    cfg = parse_config({"node_name": "gpu-05", "rails": RAILS, "kubernetes": KUBE,
                        "peers": {"discover": True, "static": {
                            "rail0": [{"address": "10.10.0.6", "node": "gpu-06"}]}}})
    service = PeerService(cfg, lambda item: None, discovery=FakeDiscovery)  # type: ignore[arg-type]
    service._sync_discovery(None)
    assert service.prober.listing == {"rail0": (PeerRef("10.10.0.6", "gpu-06"),)}
    f = peers_finding(cfg, {}, {}, 100.0, listing=service.prober.listing)
    assert "rail1: discovering peers" in f.message
    service.responder.stop()
