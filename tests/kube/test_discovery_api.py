"""Peer discovery and the mesh view on the real API server, with deploy/'s RBAC and
admission policies: an agent's card and verdicts on its own Lease (written when they
change, not more), an agent identity listing its ring group, stale agents left out, and
`nodeagent fleet mesh` / the PEERS column over what the agents published."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from nodeagent.cli.main import main
from nodeagent.config import Kubernetes
from nodeagent.kube.api import Counters, call
from nodeagent.kube.peercard import CARD, MESH, card_annotation, card_labels, parse_card
from nodeagent.model.conditions import Finding
from nodeagent.model.peers import CardRail, PeerCard, PeerOutcome, PeerProbe, PeerStats
from nodeagent.model.status import RailStatus, Report, Status
from nodeagent.publish.kube import NodeWriter
from nodeagent.publish.publisher import Publisher
from nodeagent.run.discovery import discover, lease_lister
from tests.kit.apiserver import ApiServer
from tests.kit.helpers import wait_for

LEASES = "nodeagent-system"
PATH = f"/apis/coordination.k8s.io/v1/namespaces/{LEASES}/leases"
N = 120  # other agents


def micro(offset: float = 0.0) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(time.time() + offset))


def card(name: str, i: int, net: int = 10) -> PeerCard:
    return PeerCard(name, 18600, (CardRail("rail0", f"10.{net}.{i // 250}.{i % 250 + 1}",
                                           f"10.{net}.0.0/16"),))


OWN = PeerCard("node-a", 18600, (CardRail("rail0", "10.10.9.9", "10.10.0.0/16"),))


def put_lease(admin: Any, c: PeerCard, renewed: float = -2.0,
              mesh: dict[str, Any] | None = None) -> None:
    """Another agent's Lease, as publish/kube.py writes it (created as the admin: the
    admission policy lets an agent write only its own)."""
    annotations = {CARD: card_annotation(c)}
    if mesh is not None:
        annotations[MESH] = json.dumps(mesh)
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": f"nodeagent-{c.node}", "labels": card_labels(c),
                         "annotations": annotations},
            "spec": {"holderIdentity": c.node, "leaseDurationSeconds": 180,
                     "renewTime": micro(renewed)}}
    try:
        call(admin, Counters(), "DELETE", f"{PATH}/nodeagent-{c.node}")
    except ApiException as exc:
        if exc.status != 404:
            raise
    call(admin, Counters(), "POST", PATH, body)


@pytest.fixture(scope="module")
def agents(apiserver: ApiServer) -> Iterator[list[PeerCard]]:
    """N live agents on rail network 10.10.0.0/16, every third one stale (its Lease an
    hour old), and 20 on another network."""
    admin = apiserver.client("admin")
    live = []
    for i in range(N):
        c = card(f"disc-{i:03d}", i)
        put_lease(admin, c, renewed=-3600.0 if i % 3 == 2 else -2.0)
        if i % 3 != 2:
            live.append(c)
    for i in range(20):
        put_lease(admin, card(f"disc-other-{i:02d}", i, net=20))
    yield live


def test_an_agent_identity_finds_live_peers_on_its_network_in_its_ring_group(
        apiserver: ApiServer, agents: list[PeerCard]) -> None:
    counters = Counters()
    lister = lease_lister(apiserver.client("agent-node-a"), counters, LEASES)
    got = discover(OWN, lister, 4, time.time())
    live = {c.node: c.rails[0].address for c in agents}
    assert len(got.peers["rail0"]) == 4
    for peer in got.peers["rail0"]:
        assert peer.node in live and live[peer.node] == peer.address  # live, this network
    assert got.requests == counters.requests <= 4 and counters.errors == 0
    assert got.leases < N  # a group, not the namespace


def test_a_stranger_cannot_list_the_agents_leases(apiserver: ApiServer) -> None:
    with pytest.raises(ApiException) as got:
        lease_lister(apiserver.client("stranger"), Counters(), LEASES)("ring.nodeagent.io/p1")
    assert got.value.status == 403


def status_with(card: PeerCard, outcomes: dict[str, PeerOutcome]) -> Status:
    peers = tuple(PeerStats(a, None, PeerProbe("rail0", a, None, o), 0 if o == PeerOutcome.OK
                            else 2, 5, 0, failing=o != PeerOutcome.OK)
                  for a, o in outcomes.items())
    fabric = Finding("FabricReady", "True", "AllConditionsPassed", "ok")
    return Status(Report("node-a", [fabric], rails=[RailStatus("rail0", "r0", peers=peers)]),
                  peer_card=card)


@pytest.fixture
def publisher(apiserver: ApiServer, fresh_node: Callable[..., str]) -> Iterator[Publisher]:
    fresh_node("node-a")
    conf = Kubernetes(clear_after=0.5, lease_period=3600.0)  # no renewals in the way
    pub = Publisher(conf, lambda: NodeWriter(apiserver.client("agent-node-a"), "node-a", conf))
    pub.mesh_gap = 1.0
    pub.start()
    yield pub
    pub.stop()


def own_lease(apiserver: ApiServer) -> dict[str, Any]:
    """node-a's Lease, {} until the publisher has written it."""
    try:
        return call(apiserver.client("admin"), Counters(), "GET", f"{PATH}/nodeagent-node-a")
    except ApiException as exc:
        if exc.status != 404:
            raise
        return {}


def mesh_of(lease: dict[str, Any]) -> dict[str, Any]:
    annotations = lease.get("metadata", {}).get("annotations") or {}
    return json.loads(annotations.get(MESH, "{}"))


def test_the_card_and_verdicts_reach_the_agents_own_lease_when_they_change_only(
        apiserver: ApiServer, publisher: Publisher) -> None:
    ok = {"10.10.0.1": PeerOutcome.OK, "10.10.0.2": PeerOutcome.OK}
    publisher.submit(status_with(OWN, ok))
    lease = wait_for(lambda: mesh_of(own_lease(apiserver)) and own_lease(apiserver), 20,
                     "the card on the Lease")
    assert parse_card(lease) == OWN
    assert lease["metadata"]["labels"]["net.nodeagent.io/10.10.0.0-16"] == ""
    assert mesh_of(lease) == {"rail0": {"10.10.0.1": "ok", "10.10.0.2": "ok"}}
    version = lease["metadata"]["resourceVersion"]
    for _ in range(5):  # the same verdicts again, past the 1 s gap: nothing to write
        publisher.submit(status_with(OWN, ok))
        time.sleep(0.4)
    assert own_lease(apiserver)["metadata"]["resourceVersion"] == version
    publisher.submit(status_with(OWN, {**ok, "10.10.0.2": PeerOutcome.ROCE_FAILED}))
    wait_for(lambda: mesh_of(own_lease(apiserver)) == {
        "rail0": {"10.10.0.1": "ok", "10.10.0.2": "roce"}}, 20, "the new verdict")


def test_fleet_mesh_draws_what_the_agents_published(apiserver: ApiServer, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Four agents probing each other over one rail; every probe of mesh-2 fails over RoCE:
    the grid shows it, json lists it, and the PEERS column flags mesh-2 as suspect."""
    admin = apiserver.client("admin")
    core = k8s.CoreV1Api(admin)
    cards = [card(f"mesh-{i}", 200 + i, net=30) for i in range(4)]
    for c in cards:
        peers = {t.rails[0].address: "roce" if t.node == "mesh-2" else "ok"
                 for t in cards if t is not c}
        put_lease(admin, c, mesh={"rail0": peers})
        try:
            core.create_node({"metadata": {"name": c.node,  # type: ignore[arg-type]
                                           "labels": {"mesh": "true"}}})
        except ApiException as exc:
            if exc.status != 409:
                raise
    kc = str(apiserver.kubeconfig("admin", tmp_path / "admin.kubeconfig"))
    assert main(["fleet", "mesh", "--kubeconfig", kc, "--rail", "rail0"]) == 0
    grid = capsys.readouterr().out
    # A row: its number, the prober, then one letter a probed target (blanks split away).
    rows = {line.split()[1]: line.split()[2:] for line in grid.splitlines()[2:]
            if len(line.split()) > 1 and line.split()[0].isdigit()}
    assert sorted(rows["mesh-0"]) == ["X", "o", "o"]
    assert rows["mesh-2"] == ["o", "o", "o"]  # its own probes pass
    assert main(["fleet", "mesh", "--kubeconfig", kc, "--rail", "rail0", "-o", "json"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert {"rail": "rail0", "prober": "mesh-0", "target": "mesh-2", "verdict": "roce"} in items
    assert main(["fleet", "--kubeconfig", kc, "-l", "mesh=true", "-o", "json"]) == 0
    listed = {r["node"]: r for r in json.loads(capsys.readouterr().out)["items"]}
    assert "peer-suspect" in listed["mesh-2"]["flags"]
    assert not any("peer-suspect" in listed[n]["flags"] for n in ("mesh-0", "mesh-1", "mesh-3"))
    assert listed["mesh-0"]["peers"] == {"rail0": {"passing": 2, "probed": 3}}
    assert main(["fleet", "--kubeconfig", kc, "-l", "mesh=true"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[-2:] == ["PEERS", "FLAGS"]
    assert any(line.split()[0] == "mesh-0" and "2/3" in line.split() for line in table)
    assert main(["fleet", "mesh", "--kubeconfig", kc, "-o", "name"]) == 2
