"""RDMADevicePluginReady from real API objects, read with an agent identity.

No controllers run on the test API server: the DaemonSet, its pod on the node and their
status (through the status subresources) are written by the test, as a kubelet would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from apiserver import ApiServer, node_json
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from nodeagent.checks.deviceplugin import device_plugin_finding
from nodeagent.config import Config, parse_config
from nodeagent.model import Finding
from nodeagent.probes.kube import KubeReader

NS, DS, RESOURCE = "kube-system", "rdma-shared-dp-ds", "rdma/rdma_shared_device_a"
TOLERATE = [{"key": "nodeagent.io/fabric-unready", "operator": "Exists",
             "effect": "NoSchedule"}]
JSON_MERGE = "application/merge-patch+json"


def cfg() -> Config:
    return parse_config({"node_name": "node-a", "kubernetes": {},
                         "device_plugin": {"namespace": NS, "daemonset": DS,
                                           "resource": RESOURCE, "min_allocatable": 1}})


def stamp(offset: float = 0.0) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + offset))


@pytest.fixture
def plugin(apiserver: ApiServer, fresh_node: Callable[..., str]) -> Iterator[dict[str, Any]]:
    """A DaemonSet (tolerating the taint), node-a advertising 8 devices, no pod yet."""
    admin = apiserver.client("admin")
    core, apps = k8s.CoreV1Api(admin), k8s.AppsV1Api(admin)
    fresh_node("node-a")
    for delete in (lambda: apps.delete_namespaced_daemon_set(DS, NS),
                   # no kubelet here to confirm a graceful delete: delete at once
                   lambda: core.delete_collection_namespaced_pod(NS, grace_period_seconds=0)):
        try:
            delete()
        except ApiException as exc:
            if exc.status != 404:
                raise
    try:
        core.create_namespaced_service_account(NS, {"metadata": {"name": "default"}})  # type: ignore[arg-type]
    except ApiException as exc:
        if exc.status != 409:
            raise
    labels = {"app": DS}
    ds = apps.create_namespaced_daemon_set(NS, {  # type: ignore[arg-type]
        "metadata": {"name": DS},
        "spec": {"selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"tolerations": TOLERATE, "containers": [
                {"name": "dp", "image": "registry.example/rdma-dp:1.5"}]}}}})
    advertise(core, 8)
    yield {"core": core, "apps": apps, "ds_uid": ds.metadata.uid}


def advertise(core: k8s.CoreV1Api, count: int) -> None:
    core.patch_node_status("node-a", {"status": {"capacity": {RESOURCE: str(count)},
                                                 "allocatable": {RESOURCE: str(count)}}},
                           _content_type=JSON_MERGE)


def make_pod(plugin: dict[str, Any], status: dict[str, Any]) -> str:
    core: k8s.CoreV1Api = plugin["core"]
    pod = core.create_namespaced_pod(NS, {  # type: ignore[arg-type]
        "metadata": {"generateName": f"{DS}-", "labels": {"app": DS}, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": DS,
             "uid": plugin["ds_uid"], "controller": True}]},
        "spec": {"nodeName": "node-a", "automountServiceAccountToken": False,
                 "containers": [{"name": "dp", "image": "registry.example/rdma-dp:1.5"}]}})
    core.patch_namespaced_pod_status(pod.metadata.name, NS, {"status": status},
                                     _content_type=JSON_MERGE)
    return str(pod.metadata.name)


def judge(apiserver: ApiServer, seen: frozenset[str] = frozenset(),
          identity: str = "agent-node-a") -> Finding:
    reader = KubeReader(apiserver.client(identity), "node-a")
    return device_plugin_finding(cfg(), reader.device_plugin(cfg().device_plugin), seen)  # type: ignore[arg-type]


def ready(flag: bool, since: float = 5.0) -> list[dict[str, Any]]:
    return [{"type": "Ready", "status": "True" if flag else "False",
             "lastTransitionTime": stamp(since)}]


def test_ready_plugin_and_advertised_resource(apiserver: ApiServer, plugin: dict[str, Any]) -> None:
    make_pod(plugin, {"phase": "Running", "conditions": ready(True)})
    f = judge(apiserver)
    assert (f.status, f.reason) == ("True", "PluginReady")
    assert f"{RESOURCE} allocatable 8" in f.message


def test_missing_pod_and_missing_daemonset(apiserver: ApiServer, plugin: dict[str, Any]) -> None:
    f = judge(apiserver)
    assert (f.status, f.reason) == ("False", "PluginPodMissing")
    plugin["apps"].delete_namespaced_daemon_set(DS, NS)
    assert judge(apiserver).reason == "DaemonSetMissing"


def test_never_ready_versus_broke_later(apiserver: ApiServer, plugin: dict[str, Any]) -> None:
    waiting = [{"name": "dp", "image": "registry.example/rdma-dp:1.5", "imageID": "",
                "ready": False, "restartCount": 4013,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                             "finishedAt": stamp()}}}]
    name = make_pod(plugin, {"phase": "Running", "conditions": ready(False, since=2),
                             "containerStatuses": waiting})
    f = judge(apiserver)
    assert (f.status, f.reason) == ("False", "PluginNeverReady")
    assert "has never been Ready" in f.message and "4013 restarts" in f.message
    # The same state, but the agent once saw this pod Ready: it broke later.
    uid = plugin["core"].read_namespaced_pod(name, NS).metadata.uid
    assert judge(apiserver, frozenset({uid})).reason == "PluginCrashLooping"


def test_crash_loop_long_after_creation(apiserver: ApiServer, plugin: dict[str, Any]) -> None:
    status = {"phase": "Running", "conditions": ready(False, since=86400),
              "containerStatuses": [{"name": "dp", "image": "x", "imageID": "", "ready": False,
                                     "restartCount": 3,
                                     "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
    make_pod(plugin, status)
    f = judge(apiserver)
    assert (f.reason, f.message.split(" is ")[1]) == ("PluginCrashLooping",
                                                      "crash-looping (3 restarts)")


def test_exec_format_error_is_the_arch_mismatch(apiserver: ApiServer,
                                                plugin: dict[str, Any]) -> None:
    digest = "registry.example/rdma-dp@sha256:" + "ab" * 32
    status = {"phase": "Running", "conditions": ready(False),
              "containerStatuses": [{
                  "name": "dp", "image": "registry.example/rdma-dp:1.5", "imageID": digest,
                  "ready": False, "restartCount": 7,
                  "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                  "lastState": {"terminated": {
                      "exitCode": 255, "reason": "Error",
                      "message": "exec /bin/k8s-rdma-shared-dp: exec format error"}}}]}
    make_pod(plugin, status)
    f = judge(apiserver)
    assert (f.status, f.reason) == ("False", "ImageArchMismatch")
    assert digest in f.message


def test_resource_follows_a_kubelet_restart(apiserver: ApiServer, plugin: dict[str, Any]) -> None:
    make_pod(plugin, {"phase": "Running", "conditions": ready(True)})
    advertise(plugin["core"], 0)  # kubelet restarted: the plugin must re-register
    f = judge(apiserver)
    assert (f.status, f.reason) == ("False", "ResourceNotAdvertised")
    assert f.message == f"{RESOURCE}: allocatable 0, capacity 0, want at least 1"
    advertise(plugin["core"], 8)
    assert judge(apiserver).status == "True"


def test_daemonset_without_toleration(apiserver: ApiServer, plugin: dict[str, Any]) -> None:
    make_pod(plugin, {"phase": "Running", "conditions": ready(True)})
    plugin["apps"].patch_namespaced_daemon_set(
        DS, NS, {"spec": {"template": {"spec": {"tolerations": None}}}},
        _content_type=JSON_MERGE)
    f = judge(apiserver)
    assert (f.status, f.reason) == ("False", "PluginDoesNotTolerateFabricTaint")
    assert "can never recover" in f.message


def test_unreadable_api_is_unknown_not_a_false_alarm(apiserver: ApiServer,
                                                     plugin: dict[str, Any]) -> None:
    f = judge(apiserver, identity="stranger")
    assert (f.status, f.reason) == ("Unknown", "APIUnreachable")
    assert "HTTP 403" in f.message
    assert json.dumps(node_json(plugin["core"], "node-a"))  # the node itself is untouched
