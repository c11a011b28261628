"""One bad rail gated alone on the real API server (1.34, DRADeviceTaints on:
DeviceTaintRule in resource.k8s.io/v1alpha3): the failing rail's device gets the agent's
rule and the Node no taint; the rule comes off after clear_after; a node-wide fault taints
the Node; and the admission policy keeps an agent to its own node's rules."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from nodeagent.checks.conditions import CONDITION_TYPES
from nodeagent.config import DeviceTaints
from nodeagent.kube.api import Counters, call
from nodeagent.model.conditions import FABRIC_READY, ROCE_NETWORK_READY, Finding
from nodeagent.model.kube import DeviceRef
from nodeagent.model.status import RailStatus, Report, Status
from nodeagent.publish.device_taints import DeviceTaintWriter, RailTaint, rule_body
from nodeagent.publish.kube import NodeWriter
from nodeagent.publish.publisher import Publisher
from tests.kit.apiserver import ApiServer
from tests.kit.helpers import wait_for
from tests.kube.test_publisher import events, kcfg, our_taint

PATH = "/apis/resource.k8s.io/v1alpha3/devicetaintrules"


def report(node: str, failing: dict[str, str] | None, whole_node: bool = False) -> Status:
    """A pass with two rails in dranet's pool for `node`; `failing`: rail -> reason, as
    the network judge attributes them."""
    findings = []
    for ctype in CONDITION_TYPES:
        if ctype in (FABRIC_READY, ROCE_NETWORK_READY):
            continue
        findings.append(Finding(ctype, "True", "Fine", "all good"))
    if failing:
        reason = next(iter(failing.values()))
        net = Finding(ROCE_NETWORK_READY, "False", reason, "rail down", rails=failing,
                      whole_node=whole_node)
        fabric = Finding(FABRIC_READY, "False", reason, "RoCENetworkReady=False",
                         rails=failing, whole_node=whole_node)
    else:
        net = Finding(ROCE_NETWORK_READY, "True", "RailsConfigured", "ok")
        fabric = Finding(FABRIC_READY, "True", "AllConditionsPassed", "ok")
    rails = [RailStatus(n, i, dra_device=DeviceRef("dra.net", node, f"pci-{n}"))
             for n, i in (("rail0", "r0"), ("rail1", "r1"))]
    return Status(Report(node=node, findings=[*findings, net, fabric], rails=rails))


def rules(apiserver: ApiServer) -> dict[str, dict[str, Any]]:
    got = call(apiserver.client("admin"), Counters(), "GET", PATH)
    return {r["metadata"]["name"]: r for r in got["items"]}


@pytest.fixture
def clean(apiserver: ApiServer) -> Iterator[None]:
    yield
    for name in rules(apiserver):
        call(apiserver.client("admin"), Counters(), "DELETE", f"{PATH}/{name}")


def test_one_rail_gated_by_its_device_and_lifted_after_clear_after(
        apiserver: ApiServer, clean: None, fresh_node: Callable[..., str]) -> None:
    fresh_node("node-a")
    core = k8s.CoreV1Api(apiserver.client("admin"))
    conf = kcfg(clear_after=0.5)
    pub = Publisher(conf, lambda: NodeWriter(apiserver.client("agent-node-a"), "node-a", conf),
                    device_taints=DeviceTaints())
    pub.submit(report("node-a", {"rail1": "NoCarrier"}))
    pub.sync_once()
    got = rules(apiserver)
    assert list(got) == ["nodeagent-node-a-rail1"]
    spec = got["nodeagent-node-a-rail1"]["spec"]
    assert spec["deviceSelector"] == {"driver": "dra.net", "pool": "node-a",
                                      "device": "pci-rail1"}
    assert (spec["taint"]["key"], spec["taint"]["value"], spec["taint"]["effect"]) == (
        "nodeagent.io/rail-unhealthy", "NoCarrier", "NoSchedule")
    # The node itself: schedulable once its own dwell is over (it starts tainted).
    pub.submit(report("node-a", {"rail1": "NoCarrier"}))
    wait_for(lambda: (pub.sync_once(), our_taint(core, "node-a") is None)[1], timeout=10)
    assert pub.status().device_taints == ("rail1",)
    # Every rail: the Node is tainted (the rails' rules stay beside it).
    pub.submit(report("node-a", {"rail0": "NoCarrier", "rail1": "NoCarrier"}))
    pub.sync_once()
    assert our_taint(core, "node-a") is not None
    assert set(rules(apiserver)) == {"nodeagent-node-a-rail0", "nodeagent-node-a-rail1"}
    # Healthy again: the rules come off after clear_after, the node taint too.
    pub.submit(report("node-a", None))
    pub.sync_once()
    assert rules(apiserver)  # not before the dwell

    def lifted() -> bool:
        pub.submit(report("node-a", None))
        pub.sync_once()
        return not rules(apiserver) and our_taint(core, "node-a") is None
    wait_for(lifted, timeout=10)
    assert pub.status().device_taints == () and pub.status().device_taints_error is None
    # Each change an Event: a rule on is a Warning, a rule off Normal (typed, not read from
    # the line: a rail named "lifted" once made its rule's Event Normal).
    said = {(e.reason, e.type, e.message) for e in events(core, "node-a")
            if e.reason == "DeviceTaint"}
    assert ("DeviceTaint", "Warning", "device taint on rail1 (dra.net/node-a/pci-rail1): "
            "NoCarrier") in said, said
    assert ("DeviceTaint", "Normal", "device taint nodeagent-node-a-rail1 lifted") in said


def test_a_node_wide_fault_taints_the_node(apiserver: ApiServer, clean: None,
                                           fresh_node: Callable[..., str]) -> None:
    fresh_node("node-b")
    core = k8s.CoreV1Api(apiserver.client("admin"))
    conf = kcfg(clear_after=0.0)
    pub = Publisher(conf, lambda: NodeWriter(apiserver.client("agent-node-b"), "node-b", conf),
                    device_taints=DeviceTaints())
    pub.submit(report("node-b", {"rail1": "GIDMissing"}, whole_node=True))
    pub.sync_once()
    assert our_taint(core, "node-b") is not None


def test_the_policy_keeps_an_agent_to_its_own_nodes_rules(apiserver: ApiServer,
                                                          clean: None) -> None:
    own = DeviceTaintWriter(apiserver.client("agent-node-a"), Counters(), "node-a",
                            DeviceTaints())
    other = RailTaint("rail0", DeviceRef("dra.net", "node-b", "pci-rail0"), "NoCarrier")
    # Another node's rule name, and its own name over another node's pool: both refused.
    for name_node, pool in (("node-b", "node-b"), ("node-a", "node-b")):
        body = rule_body("v1alpha3", name_node, other, DeviceTaints())
        body["spec"]["deviceSelector"]["pool"] = pool
        with pytest.raises(ApiException) as err:
            call(apiserver.client("agent-node-a"), Counters(), "POST", PATH, body)
        # A ValidatingAdmissionPolicy's denial without a reason is 422 Invalid.
        assert err.value.status == 422, err.value.body
        assert "nodeagent-own-device-taints" in err.value.body
    # Another node's rule, made by its agent: node-a's sync neither sees nor deletes it.
    DeviceTaintWriter(apiserver.client("agent-node-b"), Counters(), "node-b",
                      DeviceTaints()).sync([other])
    assert own.sync([]) == [] and own.version == "v1alpha3"
    assert list(rules(apiserver)) == ["nodeagent-node-b-rail0"]
    with pytest.raises(ApiException) as err:
        call(apiserver.client("agent-node-a"), Counters(), "DELETE",
             f"{PATH}/nodeagent-node-b-rail0")
    assert err.value.status == 422 and "nodeagent-own-device-taints" in err.value.body
    assert list(rules(apiserver)) == ["nodeagent-node-b-rail0"]
