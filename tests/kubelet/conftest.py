"""The kubelet tier: a real kubelet, containerd and runc against the test apiserver, the test
device plugin as the plugin DaemonSet's pod, and the agent as a daemon in a netns with rails.

In the device-plugin story no scheduler or controller-manager runs: the tests create the
DaemonSet's pods themselves (with `nodeName` and an ownerReference), as the DaemonSet
controller would. test_agent_pod.py runs both, against an API server of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.kit.apiserver import ApiServer
from tests.kit.kubelet import Node
from tests.kit.rdma_plugin import (
    BOOT,
    DEVICES,
    DS,
    NS,
    RESOURCE,
    start_plugin_node,
)

METRICS_PORT = 9464


@pytest.fixture(scope="session")
def core(apiserver: ApiServer) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(apiserver.client("admin"))


@pytest.fixture(scope="module")
def node(apiserver: ApiServer, core: k8s.CoreV1Api,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """node-a, registered by its kubelet with the fabric taint (fail closed), the plugin's
    images imported and its DaemonSet created (no pod yet). Module-scoped: the kubelet's
    sysctls and processes are gone before the next tiers run."""
    n = Node(apiserver, tmp_path_factory.mktemp("node"), "node-a", taint=BOOT)
    try:
        start_plugin_node(n, core)
        yield n
    finally:
        n.stop()


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
