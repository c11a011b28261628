"""The RDMA device plugin on a real node: its images (the test device plugin built for amd64,
for arm64, and for arm64 but labelled amd64), its DaemonSet, and its pods made the way the
DaemonSet controller would (no controller-manager runs in the tests). Shared by tests/kubelet
and bench/kubelet_incident.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.kit.apiserver import ApiServer
from tests.kit.helpers import wait_for
from tests.kit.kubelet import Node

KEY = "nodeagent.io/fabric-unready"
BOOT = {"key": KEY, "value": "AgentStarting", "effect": "NoSchedule"}
NS, DS, RESOURCE, DEVICES = "kube-system", "rdma-dp", "rdma/hca", 4
GOOD, ARM64, MISLABELED = ("nodeagent.test/rdma-dp:good", "nodeagent.test/rdma-dp:arm64",
                           "nodeagent.test/rdma-dp:arm64-says-amd64")


def start_plugin_node(n: Node, core: k8s.CoreV1Api,
                      devices: dict[str, Path] | None = None) -> None:
    """Start the node, import the plugin's images, create the plugin's DaemonSet (no pod).
    With `devices` (container path: host node), each allocation hands the container those
    device nodes, as the RDMA shared device plugin hands /dev/infiniband/uverbsN."""
    n.start()
    # A plugin that takes 3 s to register again after a kubelet restart, so the restart's
    # gap in the resource is long enough to be seen.
    args = ["/app", "-resource", RESOURCE, "-count", str(DEVICES), "-reregister-delay", "3s"]
    args += [a for path, host in (devices or {}).items() for a in ("-device", f"{host}={path}")]
    n.import_image(GOOD, "deviceplugin", entrypoint=args)
    n.import_image(ARM64, "deviceplugin", goarch="arm64", entrypoint=args)
    # The image someone built on an arm64 laptop and labelled by hand: only the runtime's log
    # says what happened.
    n.import_image(MISLABELED, "deviceplugin", goarch="arm64", entrypoint=args,
                   label_arch="amd64")
    n.wait_registered(core)
    ensure_default_service_account(core, NS)
    labels = {"app": DS}
    k8s.AppsV1Api(core.api_client).create_namespaced_daemon_set(NS, {  # type: ignore[arg-type]
        "metadata": {"name": DS},
        "spec": {"selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": plugin_spec(GOOD)}}})


def ensure_default_service_account(core: k8s.CoreV1Api, namespace: str) -> None:
    """What the controller-manager would have made (none runs here): pods need it."""
    try:
        core.create_namespaced_service_account(
            namespace, {"metadata": {"name": "default"}})  # type: ignore[arg-type]
    except ApiException as exc:
        if exc.status != 409:
            raise


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
    """Delete this DaemonSet's pods (others in the namespace are other tests') and wait
    until the kubelet has confirmed it."""
    def mine() -> list[Any]:
        return list(core.list_namespaced_pod(NS, label_selector=f"app={DS}").items)
    for pod in mine():
        try:
            core.delete_namespaced_pod(pod.metadata.name, NS)
        except ApiException as exc:
            if exc.status != 404:
                raise
    wait_for(lambda: not mine(), 60, "the kubelet to confirm the plugin pods' deletion")


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
