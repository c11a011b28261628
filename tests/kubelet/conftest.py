"""The kubelet tier: a real kubelet, containerd and runc against the test apiserver, the test
device plugin as the plugin DaemonSet's pod, and the agent as a daemon in a netns with rails.

No scheduler or controller-manager runs: the tests create the DaemonSet's pods themselves
(with `nodeName` and an ownerReference), as the DaemonSet controller would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.kit.apiserver import ApiServer, start_apiserver, wait_policy_enforced
from tests.kit.helpers import wait_for
from tests.kit.kubelet import Node

KEY = "nodeagent.io/fabric-unready"
BOOT = {"key": KEY, "value": "AgentStarting", "effect": "NoSchedule"}
NS, DS, RESOURCE, DEVICES = "kube-system", "rdma-dp", "rdma/hca", 4
METRICS_PORT = 9464
GOOD, ARM64, MISLABELED = ("nodeagent.test/rdma-dp:good", "nodeagent.test/rdma-dp:arm64",
                           "nodeagent.test/rdma-dp:arm64-says-amd64")


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    server = start_apiserver(tmp_path_factory.mktemp("apiserver"))
    try:
        wait_policy_enforced(server)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def core(apiserver: ApiServer) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(apiserver.client("admin"))


@pytest.fixture(scope="session")
def node(apiserver: ApiServer, core: k8s.CoreV1Api,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """node-a, registered by its kubelet with the fabric taint (fail closed), the plugin's
    images imported and its DaemonSet created (no pod yet)."""
    n = Node(apiserver, tmp_path_factory.mktemp("node"), "node-a", taint=BOOT)
    try:
        n.start()
        # A plugin that takes 3 s to register again after a kubelet restart, so the
        # restart's gap in the resource is long enough to be seen.
        args = ["/app", "-resource", RESOURCE, "-count", str(DEVICES),
                "-reregister-delay", "3s"]
        n.import_image(GOOD, "deviceplugin", entrypoint=args)
        n.import_image(ARM64, "deviceplugin", goarch="arm64", entrypoint=args)
        # The image someone built on an arm64 laptop and labelled by hand: only the runtime's
        # log says what happened.
        n.import_image(MISLABELED, "deviceplugin", goarch="arm64", entrypoint=args,
                       label_arch="amd64")
        n.wait_registered(core)
        core.create_namespaced_service_account(NS, {"metadata": {"name": "default"}})  # type: ignore[arg-type]
        apps = k8s.AppsV1Api(apiserver.client("admin"))
        labels = {"app": DS}
        apps.create_namespaced_daemon_set(NS, {  # type: ignore[arg-type]
            "metadata": {"name": DS},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": plugin_spec(GOOD)}}})
        yield n
    finally:
        n.stop()


def plugin_spec(image: str) -> dict[str, Any]:
    """The pod spec of an RDMA device plugin DaemonSet (hostNetwork, the kubelet's plugin
    directory mounted, tolerating the fabric taint)."""
    return {"hostNetwork": True, "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"key": KEY, "operator": "Exists", "effect": "NoSchedule"},
                            {"operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "dp", "image": image, "imagePullPolicy": "Never",
                            "volumeMounts": [{"name": "plugins",
                                              "mountPath": "/var/lib/kubelet/device-plugins"}]}],
            "volumes": [{"name": "plugins",
                         "hostPath": {"path": "/var/lib/kubelet/device-plugins"}}]}


def run_plugin(apiserver: ApiServer, image: str) -> str:
    """Replace the plugin's pod on node-a with one running `image`, as the DaemonSet
    controller does on a rollout: the old pod is deleted (the kubelet confirms) first."""
    admin = apiserver.client("admin")
    core, apps = k8s.CoreV1Api(admin), k8s.AppsV1Api(admin)
    delete_plugin_pods(core)
    ds = apps.read_namespaced_daemon_set(DS, NS)
    pod = core.create_namespaced_pod(NS, {  # type: ignore[arg-type]
        "metadata": {"generateName": f"{DS}-", "labels": {"app": DS}, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": DS, "uid": ds.metadata.uid,
             "controller": True}]},
        "spec": {**plugin_spec(image), "nodeName": "node-a"}})
    return str(pod.metadata.name)


def delete_plugin_pods(core: k8s.CoreV1Api) -> None:
    for pod in core.list_namespaced_pod(NS).items:
        try:
            core.delete_namespaced_pod(pod.metadata.name, NS)
        except ApiException as exc:
            if exc.status != 404:
                raise
    wait_for(lambda: not core.list_namespaced_pod(NS).items, 60,
             "the kubelet to confirm the plugin pods' deletion")


def node_json(core: k8s.CoreV1Api) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(core.read_node("node-a", _preload_content=False).data)
    return data


def condition(core: k8s.CoreV1Api, ctype: str) -> dict[str, Any]:
    return next((c for c in node_json(core)["status"].get("conditions") or []
                 if c["type"] == ctype), {})


def our_taint(core: k8s.CoreV1Api) -> dict[str, Any] | None:
    return next((t for t in node_json(core)["spec"].get("taints") or [] if t["key"] == KEY),
                None)


def allocatable(core: k8s.CoreV1Api) -> int:
    return int((node_json(core)["status"].get("allocatable") or {}).get(RESOURCE, "0"))


@pytest.fixture
def agent_settings(apiserver: ApiServer, node: Node, agent_config: dict[str, Any],
                   tmp_path: Path) -> dict[str, Any]:
    """The agent's config for node-a: rails in a netns, the device plugin on the real
    kubelet, its runtime facts from this node's containerd and kubelet."""
    agent_config["resync_interval"] = "1h"
    agent_config["kubernetes"] = {
        "kubeconfig": str(apiserver.kubeconfig("agent-node-a", tmp_path / "kubeconfig")),
        "clear_after": "1s", "lease_period": "2s"}
    agent_config["device_plugin"] = {
        "namespace": NS, "daemonset": DS, "resource": RESOURCE, "min_allocatable": DEVICES,
        # No registry serves nodeagent.test: the runtime alone must name the architecture.
        "registry": {"timeout": "2s"},
        "runtime": {"content_store": str(node.content_root), "pod_logs": str(node.pod_logs)}}
    agent_config["metrics"] = {"listen": f"127.0.0.1:{METRICS_PORT}"}  # in the agent's netns
    return agent_config
