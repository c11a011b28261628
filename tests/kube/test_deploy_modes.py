"""The manifests `nodeagent deploy` renders, on a real API server: a non-default taint key
(an autoscaler's ignore prefix, say) is the only taint an agent may write, and in
conditions-only mode (kubernetes.taint: null, a node-readiness-controller rule owns the
taint) an agent may write no taint and no cordon at all, while its conditions go on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from test_publisher import MERGE, kcfg, report

from nodeagent.cli.deploy import render
from nodeagent.config import parse_config
from nodeagent.publish.kube import NodeWriter
from nodeagent.publish.publisher import Publisher
from tests.kit.apiserver import ApiServer, node_json
from tests.kit.helpers import wait_for

STRATEGIC = "application/strategic-merge-patch+json"
OTHER = "ignore-taint.cluster-autoscaler.kubernetes.io/fabric"
FOREIGN = {"key": "example.com/gpu", "value": "x", "effect": "NoSchedule"}


def apply_policies(server: ApiServer, config: dict[str, Any]) -> None:
    """The admission policies rendered for `config`, in place of those applied."""
    adm = k8s.AdmissionregistrationV1Api(server.client("admin"))
    text = render(parse_config(config))["admission-policy.yaml"]
    for doc in yaml.safe_load_all(text):
        if doc and doc["kind"] == "ValidatingAdmissionPolicy":
            adm.patch_validating_admission_policy(doc["metadata"]["name"],
                                                  {"spec": doc["spec"]}, _content_type=MERGE)


def refusal(call: Callable[[], Any]) -> str | None:
    """The API server's refusal message, or None when the call went through."""
    try:
        call()
    except ApiException as exc:
        if exc.status in (403, 422):
            return str(exc.body)
        raise
    return None


def test_rendered_policies_enforce_the_configured_taint_or_none(
    own_apiserver: ApiServer,
) -> None:
    core = k8s.CoreV1Api(own_apiserver.client("admin"))
    core.create_node({"metadata": {"name": "node-a"},  # type: ignore[arg-type]
                      "spec": {"taints": [FOREIGN]}})
    agent = k8s.CoreV1Api(own_apiserver.client("agent-node-a"))

    def add_taint(key: str, dry: bool = False) -> Callable[[], Any]:
        def call() -> Any:
            taints = node_json(core, "node-a")["spec"].get("taints") or []
            new = [*taints, {"key": key, "value": "NoCarrier", "effect": "NoSchedule"}]
            return agent.patch_node("node-a", {"spec": {"taints": new}}, _content_type=MERGE,
                                    **({"dry_run": "All"} if dry else {}))
        return call

    def drop_taint(key: str) -> None:
        taints = [t for t in node_json(core, "node-a")["spec"].get("taints") or []
                  if t["key"] != key]
        core.patch_node("node-a", {"spec": {"taints": taints}}, _content_type=MERGE)

    # A non-default key: that key and no other, nodeagent.io's included.
    # (Probes run as dry runs: admission decides, nothing is stored.)
    # A refusal that names the new key is the sign the new policy is in force (a request
    # let through proves nothing: one can pass while the policy is being replaced).
    apply_policies(own_apiserver, {"kubernetes": {"taint": {"key": OTHER}}})
    wait_for(lambda: OTHER in (refusal(add_taint("nodeagent.io/fabric-unready", dry=True))
                               or ""), timeout=30,
             what="the policy for the non-default key enforced")
    message = refusal(add_taint("nodeagent.io/fabric-unready"))
    assert message and f"may only add, change or remove its taint {OTHER}" in message
    assert refusal(add_taint(OTHER)) is None
    keys = [t["key"] for t in node_json(core, "node-a")["spec"]["taints"]]
    assert OTHER in keys and FOREIGN["key"] in keys and "nodeagent.io/fabric-unready" not in keys
    drop_taint(OTHER)

    # Conditions only: no taint, no cordon; conditions, labels and Events as before.
    apply_policies(own_apiserver, {"kubernetes": {"taint": None}})
    wait_for(lambda: "conditions-only mode" in (refusal(add_taint(OTHER, dry=True)) or ""),
             timeout=30, what="the conditions-only policy enforced")
    assert refusal(add_taint(OTHER))
    message = refusal(add_taint("nodeagent.io/fabric-unready"))
    assert message and "may not change taints in conditions-only mode" in message
    message = refusal(lambda: agent.patch_node("node-a", {"spec": {"unschedulable": True}},
                                               _content_type=MERGE))
    assert message and "may not cordon or uncordon in conditions-only mode" in message
    before = node_json(core, "node-a")["spec"]["taints"]
    pub = Publisher(kcfg(taint=None), lambda: NodeWriter(
        own_apiserver.client("agent-node-a"), "node-a", kcfg(taint=None)))
    pub.start()
    try:
        pub.submit(report("node-a", failing="NoCarrier"))
        wait_for(lambda: next((c["status"] for c in node_json(core, "node-a")["status"]
                               .get("conditions") or [] if c["type"] == "FabricReady"), None)
                 == "False", what="FabricReady=False published")
        wait_for(lambda: pub.state.synced and pub.state.taint_reason == "NoCarrier",
                 what="the failing pass synced: nothing it tried was refused")
        assert pub.state.last_error is None and pub.status().tainted is False
        assert node_json(core, "node-a")["spec"]["taints"] == before
        assert not node_json(core, "node-a")["spec"].get("unschedulable")
    finally:
        pub.stop()
