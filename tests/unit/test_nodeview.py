"""The Node, read once into typed fields: every field of the wrong shape reads as absent
(the Node is every writer's data), and what is there reads as the API wrote it."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeagent.kube.nodeview import NodeCondition, read_node
from nodeagent.kube.peercard import read_lease

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=12)
# A Node's own keys, so the shapes under them are tried too, not only unknown keys.
node_like = st.fixed_dictionaries({}, optional={
    "metadata": json_values | st.fixed_dictionaries({}, optional={
        k: json_values for k in ("name", "uid", "resourceVersion", "labels", "annotations")}),
    "spec": json_values | st.fixed_dictionaries({}, optional={
        "taints": json_values, "unschedulable": json_values}),
    "status": json_values | st.fixed_dictionaries({}, optional={
        k: json_values for k in ("conditions", "capacity", "allocatable")})})


@given(json_values | node_like)
def test_any_json_reads_as_a_node_never_raises(raw: Any) -> None:
    node = read_node(raw)
    assert isinstance(node.name, str) and all(isinstance(t, dict) for t in node.taints)
    assert all(isinstance(v, int) for v in node.capacity.values())


def test_a_status_that_is_a_string_or_a_list_has_no_conditions() -> None:
    """preflight --verdict api walked status.conditions as JSON: a Node whose status was a
    string or a list was a traceback."""
    for status in ("Ready", ["x"], 3):
        node = read_node({"metadata": {"name": "gpu-05"}, "status": status})
        assert node.name == "gpu-05" and node.condition("FabricReady") is None


def test_a_node_reads_as_the_api_wrote_it() -> None:
    node = read_node({
        "metadata": {"name": "gpu-05", "uid": "u1", "resourceVersion": "42",
                     "labels": {"a": "b", "bad": 3}, "annotations": {"n": "v"}},
        "spec": {"unschedulable": True, "taints": [{"key": "k", "effect": "NoSchedule"}, "x"]},
        "status": {"capacity": {"rdma/x": "8", "cpu": "64", "memory": "1Gi"},
                   "allocatable": {"rdma/x": "7"},
                   "conditions": [{"type": "FabricReady", "status": "False", "reason": "R",
                                   "message": "m", "lastTransitionTime": "t1",
                                   "lastHeartbeatTime": "t2"}, {"status": "True"}]}})
    assert (node.name, node.uid, node.resource_version) == ("gpu-05", "u1", "42")
    assert node.labels == {"a": "b"} and node.annotations == {"n": "v"} and node.unschedulable
    assert node.taints == ({"key": "k", "effect": "NoSchedule"},)
    assert node.taint("k") == {"key": "k", "effect": "NoSchedule"} and node.taint("z") is None
    assert node.capacity == {"rdma/x": 8, "cpu": 64, "memory": 0}  # counts only
    assert node.allocatable == {"rdma/x": 7}
    assert node.conditions == (NodeCondition("FabricReady", "False", "R", "m", "t1", "t2"),)


def test_an_agent_lease_reads_typed_and_others_are_none() -> None:
    lease = {"metadata": {"name": "nodeagent-gpu-05"},
             "spec": {"renewTime": "2026-12-04T18:00:00.000000Z", "leaseDurationSeconds": 40}}
    got = read_lease(lease)
    assert got is not None and got.node == "gpu-05" and got.duration == 40.0
    assert got.renewed is not None and got.live(got.renewed + 40) and not got.live(
        got.renewed + 41)
    for bad in (True, 0, -5, "40", None):
        odd = read_lease({**lease, "spec": {**lease["spec"], "leaseDurationSeconds": bad}})
        assert odd is not None and odd.duration is None and not odd.live(0.0)
    assert read_lease({"metadata": {"name": "kube-scheduler"}}) is None
    assert read_lease("not a lease") is None
