"""Naming the switch, not N nodes: a fleet of 64 nodes under 4 leaves on one rail, each
node probing one peer under its own leaf and three under the others (the ToR-mesh and
inter-ToR shares). Leases carry what the real agent code writes (peer_stats over its
probes, the mesh annotation, the card, by lease_metadata); Nodes carry the switch label
as the agent sets it (switch_label, label_value). The fleet view names a leaf whose
uplinks fail once with its nodes, and a node failing alone under a good leaf stays
peer-suspect."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nodeagent.checks.peers import peer_stats
from nodeagent.cli.fleet import fleet_view, render_table
from nodeagent.cli.mesh import mesh_cells, suspects, switch_faults
from nodeagent.kube.peercard import lease_metadata
from nodeagent.model.kube import label_value, switch_label
from nodeagent.model.peers import CardRail, PeerCard, PeerOutcome, PeerProbe
from nodeagent.model.status import RailStatus

N, PER_LEAF = 64, 16


def name(i: int) -> str:
    return f"gpu-{i:05d}"


def address(i: int) -> str:
    return f"10.10.0.{i + 1}"


def leaf(i: int) -> str:
    return f"leaf-{i // PER_LEAF}-r0"


def peers_of(i: int) -> list[int]:
    """One under its own leaf, one under each other leaf."""
    base = i - i % PER_LEAF
    return [base + (i + 1) % PER_LEAF, (i + 16) % N, (i + 32) % N, (i + 48) % N]


def fleet(fails: Callable[[int, int], bool]) -> tuple[list[dict[str, Any]],
                                                      list[dict[str, Any]]]:
    """Nodes and Leases; `fails(prober, target)`: that pair's probes fail over RoCE."""
    nodes, leases = [], []
    for i in range(N):
        stats = []
        for j in peers_of(i):
            outcome = PeerOutcome.ROCE_FAILED if fails(i, j) else PeerOutcome.OK
            probes = [PeerProbe("rail0", address(j), name(j), outcome, at=float(t))
                      for t in range(3)]
            stats.append(peer_stats(probes, failures=2))
        card = PeerCard(name(i), 18600, (CardRail("rail0", address(i), "10.10.0.0/24"),))
        labels, annotations = lease_metadata(card, [RailStatus("rail0", "r0",
                                                               peers=tuple(stats))])
        leases.append({"metadata": {"name": f"nodeagent-{name(i)}", "labels": labels,
                                    "annotations": annotations},
                       "spec": {"holderIdentity": name(i), "leaseDurationSeconds": 180,
                                "renewTime": "2026-12-05T00:00:00.000000Z"}})
        key = switch_label("rail0")
        assert key is not None
        nodes.append({"metadata": {"name": name(i), "labels": {key: label_value(leaf(i))}},
                      "status": {"conditions": [{"type": "FabricReady", "status": "True",
                                                 "reason": "AllChecksPassed"}],
                                 "capacity": {"rdma/x": "1"}, "allocatable": {"rdma/x": "1"}}})
    return nodes, leases


def view(fails: Callable[[int, int], bool]):  # type: ignore[no-untyped-def]
    nodes, leases = fleet(fails)
    return fleet_view(nodes, leases, "rdma/x", "nodeagent.io/fabric-unready", 0.0, 1e9, 1e9)


def on_leaf_1(i: int) -> bool:
    return i // PER_LEAF == 1


def test_a_leaf_whose_uplinks_fail_is_named_once_with_its_nodes() -> None:
    rows, faults = view(lambda i, j: on_leaf_1(i) != on_leaf_1(j))
    assert [(f.rail, f.switch) for f in faults] == [("rail0", "leaf-1-r0")]
    f = faults[0]
    assert f.nodes == tuple(name(i) for i in range(16, 32))
    # 16 nodes x 3 outward probes each, and 3 x 16 probes into them from the other leaves.
    assert (f.outward.passing, f.outward.probed) == (0, 96)
    assert (f.among.passing, f.among.probed) == (16, 16)
    assert "16 of 16 among its nodes pass: its uplinks or its routes out" in f.words
    by_node = {r.node: r for r in rows}
    for i in range(16, 32):
        assert by_node[name(i)].flags == ["switch-suspect"], by_node[name(i)]
        assert by_node[name(i)].rails.switch_faults == {"rail0": "leaf-1-r0"}
    assert not any("peer-suspect" in r.flags for r in rows)
    table = render_table(rows, 0.0, faults=faults)
    assert table.count("switch leaf-1-r0 on rail0: 96 of 96 probes") == 1, table
    # Without the switches (no LLDP), the same mesh is 16 peer-suspect rows.
    _, leases = fleet(lambda i, j: on_leaf_1(i) != on_leaf_1(j))
    assert sorted(suspects(mesh_cells(leases))) == [name(i) for i in range(16, 32)]


def test_a_leaf_that_fails_everything_is_the_switch_itself() -> None:
    _, faults = view(lambda i, j: on_leaf_1(i) or on_leaf_1(j))
    assert [f.switch for f in faults] == ["leaf-1-r0"]
    assert "16 of 16 among its nodes fail too: the switch itself" in faults[0].words


def test_one_node_failing_under_a_good_leaf_stays_peer_suspect() -> None:
    bad = 40
    rows, faults = view(lambda i, j: bad in (i, j))
    assert faults == []
    flagged = {r.node: r.flags for r in rows if r.flags}
    assert flagged == {name(bad): ["peer-suspect"]}


def test_a_healthy_fleet_names_nothing_and_without_switches_nothing_is_named() -> None:
    rows, faults = view(lambda i, j: False)
    assert faults == [] and not any(r.flags for r in rows)
    _, leases = fleet(lambda i, j: on_leaf_1(i) != on_leaf_1(j))
    assert switch_faults(mesh_cells(leases), {}) == []  # no LLDP: no switch to name


def test_each_rails_switch_is_a_metric_the_alert_rules_join_on() -> None:
    from prometheus_client import generate_latest

    from nodeagent.model.network import Neighbour
    from nodeagent.model.status import Report, Status
    from nodeagent.publish.metrics import AgentMetrics

    metrics = AgentMetrics()
    metrics.update(Status(report=Report(node="gpu-00016", findings=[], rails=[
        RailStatus("rail0", "r0", switch=Neighbour("c0", "Eth1/1", 120, "leaf-1-r0")),
        RailStatus("rail1", "r1")])))
    text = generate_latest(metrics.registry).decode()
    assert ('nodeagent_rail_switch_info{node="gpu-00016",port="Eth1/1",rail="rail0",'
            'switch="leaf-1-r0"} 1.0') in text
    assert 'rail="rail1",switch=' not in text  # no LLDP heard: no series


def test_a_large_mesh_is_drawn_switch_by_switch_and_one_switch_drills_down(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import nodeagent.cli.fleet as fleet_cli

    nodes, leases = fleet(lambda i, j: on_leaf_1(i) != on_leaf_1(j))
    monkeypatch.setattr(fleet_cli, "GRID_MAX", 32)  # 64 nodes: more than a grid shows
    summary = fleet_cli.render_mesh(leases, "rail0", "table", False, nodes)
    lines = summary.splitlines()
    assert lines[0] == "rail rail0 by switch (rows probe columns)"
    assert lines[2].split() == ["0", "leaf-0-r0", "o", "X", "o", "o"]
    assert lines[3].split() == ["1", "leaf-1-r0", "X", "o", "X", "X"]
    assert "  leaf-1-r0 -> leaf-0-r0: 16 of 16 fail" in lines
    assert "X most fail" in summary
    # The drill-down: the grid of the probes from and to leaf-1's nodes.
    grid = fleet_cli.render_mesh(leases, "rail0", "table", False, nodes, switch="leaf-1-r0")
    assert grid.startswith("rail rail0 (rows probe columns)")
    assert "gpu-00016" in grid and "X RoCE fails" in grid
    assert fleet_cli.render_mesh(leases, None, "table", False, nodes, switch="leaf-9") == \
        "no peer results published for switch leaf-9\n"
    # Without switches known, a grid as before, however large.
    assert fleet_cli.render_mesh(leases, "rail0", "table", False).startswith(
        "rail rail0 (rows probe columns)")


def test_two_flaky_pairs_meeting_at_a_healthy_node_do_not_name_it() -> None:
    from nodeagent.cli.mesh import MeshCell
    from nodeagent.model.peers import MeshVerdict

    ok, roce = MeshVerdict.OK, MeshVerdict.ROCE

    def cells(own: MeshVerdict) -> list[MeshCell]:
        # t is probed by a, b (flaky pairs) and c; each prober passes with others.
        got = [MeshCell("rail0", "a", "t", roce), MeshCell("rail0", "b", "t", roce),
               MeshCell("rail0", "c", "t", ok)]
        for p in "abc":
            got += [MeshCell("rail0", p, f"{p}{k}", ok) for k in range(3)]
        # t's own probes of its peers.
        return got + [MeshCell("rail0", "t", f"t{k}", own) for k in range(4)]

    assert suspects(cells(ok)) == {}  # 2 of 3 probers, and its own probes pass
    assert suspects(cells(roce)) == {"t": ["rail0"]}  # its own probes fail too: its link


def test_more_switches_than_a_matrix_holds_are_listed_by_failing_pair(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import nodeagent.cli.fleet as fleet_cli
    import nodeagent.cli.mesh as mesh

    nodes, leases = fleet(lambda i, j: on_leaf_1(i) != on_leaf_1(j))
    monkeypatch.setattr(fleet_cli, "GRID_MAX", 2)
    monkeypatch.setattr(mesh, "GRID_MAX", 2)  # 4 leaves: more than a matrix of 2
    lines = fleet_cli.render_mesh(leases, "rail0", "table", False, nodes).splitlines()
    assert lines[0] == "rail rail0: 4 switches, 256 probes, 6 pairs of switches with failures"
    assert "  leaf-1-r0 -> leaf-2-r0: 16 of 16 fail" in lines
    assert not any("leaf-0-r0 -> leaf-2-r0" in line for line in lines)
