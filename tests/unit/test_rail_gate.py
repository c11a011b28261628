"""One bad rail gated alone (dra.device_taints): which faults are one rail's (the judges
say so through Problems.about), the per-rail dwell, and the DeviceTaintRule's name and
shape (k8s.io/api resource/v1alpha3 types.go: deviceSelector {driver, pool, device},
taint {key, value, effect})."""

from __future__ import annotations

import pytest

from nodeagent.checks.fabric import fabric_finding
from nodeagent.checks.network import network_finding
from nodeagent.config import ConfigError, DeviceTaints, parse_config
from nodeagent.model.conditions import (
    FABRIC_READY,
    ROCE_GID_STABLE,
    ROCE_NETWORK_READY,
    Finding,
    Problems,
)
from nodeagent.model.kube import DeviceRef
from nodeagent.model.status import RailStatus
from nodeagent.publish.device_taints import ALONE, RailGate, RailTaint, rule_body, rule_name
from tests.conftest import RAILS


def rails() -> list[RailStatus]:
    """Two rails, each with its device in dranet's pool for node-a."""
    return [RailStatus(name, iface, dra_device=DeviceRef("dra.net", "node-a", f"pci-{name}"))
            for name, iface in (("rail0", "r0"), ("rail1", "r1"))]


def test_problems_about_a_rail_say_so_and_a_node_wide_one_does_not() -> None:
    p = Problems(ROCE_GID_STABLE)
    with p.about("rail1"):
        p.fail("GIDMissing", "rail1 r1: no GID")
    got = p.folded()
    assert dict(got.rails) == {"rail1": "GIDMissing"} and not got.whole_node
    with p.about("rail0"):
        p.unknown("GIDTableUnreadable", "the table", node=True)
    got = p.folded()
    # Unknowns do not set a False condition's rails; the failure still does.
    assert (got.status, dict(got.rails), got.whole_node) == ("False", {"rail1": "GIDMissing"},
                                                             False)
    q = Problems(ROCE_GID_STABLE)
    with q.about("rail0"):
        q.unknown("GIDTableUnreadable", "the table", node=True)
    assert q.folded().whole_node and not q.folded().rails


def test_the_network_judge_names_the_rail_of_each_drift() -> None:
    cfg = parse_config({"node_name": "node-a", "rails": [dict(r) for r in RAILS]})
    got = network_finding(cfg, {}, {"rail1": ("NoCarrier", "rail1 r1: no carrier")})
    assert (got.status, dict(got.rails), got.whole_node) == ("False", {"rail1": "NoCarrier"},
                                                             False)


def test_fabric_ready_is_owed_to_the_rails_of_the_conditions_that_set_it() -> None:
    net = Finding(ROCE_NETWORK_READY, "False", "NoCarrier", "x", rails={"rail1": "NoCarrier"})
    unknown = Finding(ROCE_GID_STABLE, "Unknown", "GIDTableUnreadable", "y", whole_node=True)
    got = fabric_finding([net, unknown])
    assert (got.status, dict(got.rails), got.whole_node) == ("False", {"rail1": "NoCarrier"},
                                                             False)
    # A failing condition built without Problems (no rails) is the node's.
    bare = Finding(ROCE_GID_STABLE, "False", "Custom", "z")
    assert fabric_finding([net, bare]).whole_node


def fabric(rails_at_fault: dict[str, str] | None, whole_node: bool = False) -> Finding:
    if rails_at_fault is None:
        return Finding(FABRIC_READY, "True", "AllConditionsPassed", "ok")
    return Finding(FABRIC_READY, "False", next(iter(rails_at_fault.values()), "X"), "m",
                   rails=rails_at_fault, whole_node=whole_node)


def test_one_rail_at_fault_is_gated_alone_and_the_node_stays_schedulable() -> None:
    gate = RailGate(clear_after=30.0)
    got = gate.feed(0.0, fabric({"rail1": "NoCarrier"}), rails())
    assert (got.status, got.reason) == ("True", ALONE)
    assert "rail1 (NoCarrier)" in got.message
    assert gate.wanted() == (RailTaint("rail1", DeviceRef("dra.net", "node-a", "pci-rail1"),
                                       "NoCarrier"),)


@pytest.mark.parametrize("case", ["every rail", "node-wide", "no device"])
def test_what_is_not_one_rails_keeps_the_node_taint(case: str) -> None:
    gate = RailGate(clear_after=30.0)
    statuses = rails()
    if case == "every rail":
        failing = fabric({"rail0": "NoCarrier", "rail1": "NoCarrier"})
    elif case == "node-wide":
        failing = fabric({"rail1": "NoCarrier"}, whole_node=True)
    else:
        failing = fabric({"rail1": "NoCarrier"})
        statuses[1] = RailStatus("rail1", "r1")  # not in the slices: nothing to taint
    assert gate.feed(0.0, failing, statuses) is failing
    # The rails that have a device still get their rule (harmless beside the node's).
    expected = {"every rail": {"rail0", "rail1"}, "node-wide": {"rail1"}, "no device": set()}
    assert {w.rail for w in gate.wanted()} == expected[case]


def test_a_rails_rule_comes_off_clear_after_it_passes_and_a_relapse_restarts_the_dwell() -> None:
    gate = RailGate(clear_after=30.0)
    gate.feed(0.0, fabric({"rail1": "NoCarrier"}), rails())
    assert gate.lifts_at() is None
    gate.feed(10.0, fabric(None), rails())
    assert gate.lifts_at() == 40.0 and gate.wanted()
    gate.feed(20.0, fabric({"rail1": "PortNotActive"}), rails())  # back at fault: reset
    assert gate.lifts_at() is None and gate.wanted()[0].reason == "PortNotActive"
    gate.feed(25.0, fabric(None), rails())
    gate.feed(54.0, fabric(None), rails())
    assert gate.wanted()
    gate.feed(55.0, fabric(None), rails())
    assert gate.wanted() == () and gate.lifts_at() is None


def test_rule_names_are_object_names_and_distinct_per_rail() -> None:
    assert rule_name("gpu-07", "rail1") == "nodeagent-gpu-07-rail1"
    upper, lower = rule_name("gpu-07", "Rail_1"), rule_name("gpu-07", "rail-1")
    assert upper != lower and upper.startswith("nodeagent-gpu-07-rail-1-")
    assert all(c.islower() or c.isdigit() or c in ".-" for c in upper)


def test_a_rule_name_cut_to_fit_keeps_its_hash_so_long_rails_stay_apart() -> None:
    """Cut at 253 characters after the hash was added, two long rail names sharing their
    first 230 characters named one rule: the second rail's taint overwrote the first's."""
    node = "gpu-07." + "x" * 60
    first, second = "r" * 230 + "-a", "r" * 230 + "-b"
    a, b = rule_name(node, first), rule_name(node, second)
    assert a != b and len(a) == len(b) == 253, (len(a), len(b))
    assert a.startswith(f"nodeagent-{node}-rrr") and a[-7] == "-"  # the hash's 6 digits
    assert rule_name(node, "rail1") == f"nodeagent-{node}-rail1"  # fits: as it was


def test_the_rule_selects_one_device_and_carries_the_reason() -> None:
    want = RailTaint("rail1", DeviceRef("dra.net", "node-a", "pci-0000-11-00-0"),
                     "AllPeersUnreachable")
    body = rule_body("v1alpha3", "node-a", want, DeviceTaints())
    assert body["apiVersion"] == "resource.k8s.io/v1alpha3"
    assert body["metadata"]["labels"]["nodeagent.io/node"] == "node-a"
    assert body["spec"] == {
        "deviceSelector": {"driver": "dra.net", "pool": "node-a", "device": "pci-0000-11-00-0"},
        "taint": {"key": "nodeagent.io/rail-unhealthy", "value": "AllPeersUnreachable",
                  "effect": "NoSchedule"}}


def test_device_taints_config() -> None:
    base = {"node_name": "node-a", "rails": [dict(r) for r in RAILS]}
    on = parse_config({**base, "kubernetes": {}, "dra": {"device_taints": True}})
    assert on.dra is not None and on.dra.device_taints == DeviceTaints()
    off = parse_config({**base, "kubernetes": {}, "dra": {"device_taints": False}})
    assert off.dra is not None and off.dra.device_taints is None
    with pytest.raises(ConfigError) as err:
        parse_config({**base, "dra": {"device_taints": True}})
    assert "dra.device_taints: needs a kubernetes section" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_config({**base, "kubernetes": {}, "dra": {"device_taints": {"effect": "Maybe"}}})
    assert "dra.device_taints.effect" in str(err.value)
