"""Pure Node-publishing logic: condition merging, taint lists, hysteresis, cordon, tolerations."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nodeagent.checks.deviceplugin import tolerates_taint, toleration_problem
from nodeagent.kube.nodeview import read_node
from nodeagent.kube.objects import parse_daemonset
from nodeagent.kube.objects import parse_tolerations as T
from nodeagent.model.conditions import Finding
from nodeagent.publish.node import (
    CORDON_ANNOTATION,
    STARTING,
    TaintGate,
    condition_updates,
    cordon_patch,
    desired_taints,
    rfc3339,
    taint_value,
)

KEY, EFFECT = "nodeagent.io/fabric-unready", "NoSchedule"
A = {"key": "a.example/x", "value": "1", "effect": "NoSchedule"}
B = {"key": "b.example/y", "effect": "NoExecute"}


def test_taint_added_at_the_end_and_others_kept_in_order() -> None:
    assert desired_taints([A, B], KEY, EFFECT, "NoCarrier") == [
        A, B, {"key": KEY, "value": "NoCarrier", "effect": EFFECT}]


def test_taint_value_updated_in_place() -> None:
    ours = {"key": KEY, "value": "Old", "effect": EFFECT, "timeAdded": "2026-01-01T00:00:00Z"}
    assert desired_taints([A, ours, B], KEY, EFFECT, "New") == [
        A, {"key": KEY, "value": "New", "effect": EFFECT, "timeAdded": "2026-01-01T00:00:00Z"}, B]
    assert desired_taints([A, ours, B], KEY, EFFECT, "Old") is None  # already right


def test_a_boot_taint_is_kept_as_registered_while_the_agent_starts() -> None:
    """Registered by a kubelet or an autoscaler, often without a value: while the agent has
    seen no failure it is left as it is, so a healthy start removes it in one write."""
    boot = {"key": KEY, "effect": EFFECT}  # Karpenter's startupTaints carry no value
    assert desired_taints([A, boot], KEY, EFFECT, STARTING) is None
    assert desired_taints([A], KEY, EFFECT, STARTING) == [
        A, {"key": KEY, "value": STARTING, "effect": EFFECT}]  # none there: fail closed
    assert desired_taints([A, boot], KEY, EFFECT, "NoCarrier") == [
        A, {"key": KEY, "value": "NoCarrier", "effect": EFFECT}]  # a failure says which
    assert desired_taints([A, boot], KEY, EFFECT, None) == [A]  # healthy: one write


def test_removing_our_duplicates_keeps_everything_else() -> None:
    # The incident: a JSON patch removing index 2 then index 3 of a shifted array. Here the
    # whole list is rebuilt by key, so two of ours go and the rest stays, in order.
    ours = {"key": KEY, "value": "x", "effect": EFFECT}
    got = desired_taints([ours, A, dict(ours), B], KEY, EFFECT, None)
    assert got == [A, B]
    assert desired_taints([A, B], KEY, EFFECT, None) is None
    # Our key with another effect is not ours to touch.
    other_effect = {"key": KEY, "effect": "NoExecute"}
    assert desired_taints([other_effect], KEY, EFFECT, None) is None


def test_taint_value_is_label_safe() -> None:
    assert taint_value("AddressMissing") == "AddressMissing"
    assert taint_value("bad value/with:chars") == "bad-value-with-chars"
    assert len(taint_value("X" * 100)) == 63
    assert taint_value("---") == "FabricNotReady"


def test_condition_updates_only_what_changed_and_keeps_transition_times() -> None:
    existing = read_node({"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"},
        {"type": "RoCENetworkReady", "status": "True", "reason": "RailsConfigured",
         "message": "2 rails", "lastTransitionTime": "2026-01-01T00:00:00Z"},
    ]}}).conditions
    same = Finding("RoCENetworkReady", "True", "RailsConfigured", "2 rails")
    assert condition_updates(existing, [same], 1000.0) == []
    reworded = Finding("RoCENetworkReady", "True", "RailsConfigured", "3 rails")
    [update] = condition_updates(existing, [reworded], 1000.0)
    assert update["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    flipped = Finding("RoCENetworkReady", "False", "NoCarrier", "down")
    [update] = condition_updates(existing, [flipped], 1000.0)
    assert update["lastTransitionTime"] == rfc3339(1000.0)
    # The agent's own record of when the status began wins over the time of the write.
    [update] = condition_updates(existing, [flipped], 1000.0, {"RoCENetworkReady": 940.0})
    assert update["lastTransitionTime"] == rfc3339(940.0)
    assert update["lastHeartbeatTime"] == rfc3339(1000.0)
    assert condition_updates(existing, [Finding("Ready", "False", "X", "y")], 1.0) == []


def test_gate_starts_tainted_taints_at_once_and_lifts_after_dwell() -> None:
    ok = Finding("FabricReady", "True", "AllConditionsPassed", "")
    bad = Finding("FabricReady", "False", "NoCarrier", "")
    gate = TaintGate(clear_after=30)
    assert gate.feed(0, ok) is True and gate.lifts_at() == 30
    assert gate.feed(29.9, ok) is True
    assert gate.feed(30, ok) is False
    assert gate.feed(31, bad) is True and gate.reason == "NoCarrier"
    assert gate.feed(40, ok) is True  # the dwell starts again
    assert gate.feed(69, ok) is True and gate.feed(70, ok) is False


def test_cordon_never_lifts_someone_elses() -> None:
    assert cordon_patch(True, {}, want_cordon=True, reason="X") is None
    assert cordon_patch(True, {}, want_cordon=False, reason="X") is None
    set_ = cordon_patch(False, {}, want_cordon=True, reason="NoCarrier")
    assert set_ == {"spec": {"unschedulable": True},
                    "metadata": {"annotations": {CORDON_ANNOTATION: "NoCarrier"}}}
    lift = cordon_patch(True, {CORDON_ANNOTATION: "NoCarrier"}, want_cordon=False, reason="")
    assert lift == {"spec": {"unschedulable": False},
                    "metadata": {"annotations": {CORDON_ANNOTATION: None}}}


def test_tolerations() -> None:
    assert tolerates_taint(T([{"operator": "Exists"}]), KEY, EFFECT)
    assert tolerates_taint(T([{"key": KEY, "operator": "Exists", "effect": EFFECT}]), KEY, EFFECT)
    assert not tolerates_taint(T([{"key": KEY, "operator": "Equal", "value": "NoCarrier"}],
                               ), KEY, EFFECT)
    assert not tolerates_taint(T([{"key": KEY, "operator": "Exists", "effect": "NoExecute"}],
                               ), KEY, EFFECT)
    assert not tolerates_taint(T([{"key": "node.kubernetes.io/unschedulable",
                                 "operator": "Exists"}]), KEY, EFFECT)
    ds = {"metadata": {"namespace": "kube-system", "name": "rdma-dp"},
          "spec": {"template": {"spec": {"tolerations": []}}}}
    problem = toleration_problem(parse_daemonset(ds), KEY, EFFECT)
    assert problem is not None and problem.startswith(
        "daemonset kube-system/rdma-dp does not tolerate the fabric taint")


def test_fleet_staleness_follows_each_agents_lease_duration() -> None:
    """An agent is stale once its Lease is older than the duration it renewed it for (the
    default 60 s period and 180 s duration, or whatever its config says), unless the
    operator gives --stale-after."""
    from nodeagent.cli.fleet import fleet_rows

    now = 1_000_000.0

    def lease(node: str, age: float, duration: Any) -> dict[str, Any]:
        stamp = datetime.fromtimestamp(now - age, tz=timezone.utc)
        return {"metadata": {"name": f"nodeagent-{node}"},
                "spec": {"renewTime": stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                         "leaseDurationSeconds": duration}}

    nodes = [{"metadata": {"name": n}} for n in ("a", "b", "c", "d")]
    leases = [lease("a", 150, 180), lease("b", 150, 60), lease("c", 150, "x"),
              lease("d", 200, None)]

    def stale(after: float | None) -> dict[str, bool]:
        rows = fleet_rows(nodes, leases, "rdma/x", "k", now, after, 1800)
        return {r.node: "agent-stale" in r.flags for r in rows}

    assert stale(None) == {"a": False, "b": True, "c": False, "d": True}
    assert stale(100.0) == {"a": True, "b": True, "c": True, "d": True}



def test_kubeconfig_is_found_in_kubectls_order(tmp_path: Path) -> None:
    from nodeagent.kube.api import kubectl_kubeconfig

    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    a, b = tmp_path / "a", tmp_path / "b"
    b.write_text("{}")
    env = {"KUBECONFIG": f"{a}:{b}"}
    assert kubectl_kubeconfig("/x/flag", env, home) == Path("/x/flag")  # the flag first
    assert kubectl_kubeconfig(None, env, home) == b  # then $KUBECONFIG's first existing
    assert kubectl_kubeconfig(None, {}, home) is None  # nothing: in-cluster
    (home / ".kube" / "config").write_text("{}")
    assert kubectl_kubeconfig(None, {"KUBECONFIG": str(a)}, home) == home / ".kube" / "config"
