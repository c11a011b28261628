"""DaemonSet mode: deploy/daemonset (kustomize) and charts/nodeagent (Helm), rendered by the
real tools (built from their Go modules), the same objects both ways, accepted by the real
API server (server-side dry run: schema, defaults, admission), and the identity they give a
pod: a token bound to a pod on node-a may write node-a only (the project's admission
policy)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.kit.apiserver import ApiServer
from tests.kit.deploytools import build_tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "nodeagent"
STRATEGIC = "application/strategic-merge-patch+json"


def run(*argv: str) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    kustomize = docs(run(str(build_tool("kustomize")), "build", str(ROOT / "deploy" /
                                                                      "daemonset")))
    helm = str(build_tool("helm"))
    lint = run(helm, "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in lint, lint
    chart = docs(run(helm, "template", "nodeagent", str(CHART)))
    return {"kustomize": kustomize, "helm": chart}


def test_chart_and_kustomization_render_the_same_objects(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    k, h = by_kind(rendered["kustomize"]), by_kind(rendered["helm"])
    assert sorted(k) == sorted(h) == ["ConfigMap", "DaemonSet", "ServiceAccount"]
    # Helm adds a checksum of the config to the pod template (a config change rolls the
    # pods); Helm's toYaml sorts the config's keys. Otherwise the objects are the same.
    h["DaemonSet"]["spec"]["template"]["metadata"].pop("annotations")
    configs = [yaml.safe_load(side["ConfigMap"]["data"].pop("config.yaml")) for side in (k, h)]
    assert configs[0] == configs[1]
    for kind in k:
        assert k[kind] == h[kind], kind


def test_the_daemonset_asks_only_for_what_the_agent_needs(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    ds = by_kind(rendered["helm"])["DaemonSet"]["spec"]["template"]["spec"]
    container = ds["containers"][0]
    assert ds["hostNetwork"] is True and ds["automountServiceAccountToken"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"],
                                                            "add": ["NET_ADMIN"]}
    assert container["securityContext"]["privileged"] is False
    assert {"key": "nodeagent.io/fabric-unready", "operator": "Exists"} in ds["tolerations"]
    token = next(v for v in ds["volumes"] if v["name"] == "token")
    assert token["projected"]["sources"][0]["serviceAccountToken"]["path"] == "token"


def test_the_api_server_accepts_both_renders(apiserver: ApiServer,
                                             rendered: dict[str, list[dict[str, Any]]]) -> None:
    admin = apiserver.client("admin")
    for objects in rendered.values():
        for obj in objects:
            kind, ns = obj["kind"], obj["metadata"]["namespace"]
            create = {"ServiceAccount": k8s.CoreV1Api(admin).create_namespaced_service_account,
                      "ConfigMap": k8s.CoreV1Api(admin).create_namespaced_config_map,
                      "DaemonSet": k8s.AppsV1Api(admin).create_namespaced_daemon_set}[kind]
            create(ns, obj, dry_run="All")  # schema, defaulting and admission, no write


def test_a_token_bound_to_a_pod_on_node_a_may_write_node_a_only(
        apiserver: ApiServer, rendered: dict[str, list[dict[str, Any]]],
        fresh_node: Any) -> None:
    """The DaemonSet's pods authenticate with a token bound to the pod: the API server adds
    the pod's node name, and the admission policy holds the agent to that Node."""
    admin = apiserver.client("admin")
    core = k8s.CoreV1Api(admin)
    for node in ("node-a", "node-b"):
        fresh_node(node)
    sa = by_kind(rendered["helm"])["ServiceAccount"]
    try:
        core.create_namespaced_service_account("nodeagent-system", sa)
    except ApiException as exc:
        if exc.status != 409:
            raise
    pod = core.create_namespaced_pod("nodeagent-system", {  # type: ignore[arg-type]
        "metadata": {"generateName": "nodeagent-"},
        "spec": {"nodeName": "node-a", "serviceAccountName": "nodeagent",
                 "automountServiceAccountToken": False,
                 "containers": [{"name": "a", "image": "nodeagent"}]}})
    token = core.create_namespaced_service_account_token("nodeagent", "nodeagent-system", {
        "spec": {"audiences": [], "expirationSeconds": 600, "boundObjectRef": {
            "kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name,
            "uid": pod.metadata.uid}}}).status.token  # type: ignore[arg-type]
    conf = apiserver.configuration("admin")
    conf.api_key = {"authorization": token}
    agent = k8s.CoreV1Api(k8s.ApiClient(conf))
    condition = {"status": {"conditions": [{"type": "FabricReady", "status": "True",
                                            "reason": "AllConditionsPassed", "message": "x"}]}}
    agent.patch_node_status("node-a", condition, _content_type=STRATEGIC)
    with pytest.raises(ApiException) as refused:
        agent.patch_node_status("node-b", condition, _content_type=STRATEGIC)
    assert refused.value.status in (403, 422) and "own Node" in str(refused.value.body)
    core.delete_namespaced_pod(pod.metadata.name, "nodeagent-system", grace_period_seconds=0)
