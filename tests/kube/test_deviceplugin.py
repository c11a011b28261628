"""RDMADevicePluginReady from real API objects, read with an agent identity.

No controllers run on the test API server: the DaemonSet, its pod on the node and their
status (through the status subresources) are written by the test, as a kubelet would.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from nodeagent.checks.deviceplugin import device_plugin_finding
from nodeagent.config import Config, parse_config
from nodeagent.kube.api import Counters
from nodeagent.kube.watch import WatchedCollection
from nodeagent.model.conditions import Finding
from nodeagent.probes.kube import KubeReader, WatchingReader
from nodeagent.run.deviceplugin import plugin_reader
from tests.kit.apiserver import ApiServer, node_json
from tests.kit.helpers import wait_for
from tests.kit.registry_env import Registry

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


def make_pod(plugin: dict[str, Any], status: dict[str, Any],
             image: str = "registry.example/rdma-dp:1.5") -> str:
    core: k8s.CoreV1Api = plugin["core"]
    pod = core.create_namespaced_pod(NS, {  # type: ignore[arg-type]
        "metadata": {"generateName": f"{DS}-", "labels": {"app": DS}, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": DS,
             "uid": plugin["ds_uid"], "controller": True}]},
        "spec": {"nodeName": "node-a", "automountServiceAccountToken": False,
                 "containers": [{"name": "dp", "image": image}]}})
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
    """The pod status a real kubelet writes when the pod sets `terminationMessagePolicy:
    FallbackToLogsOnError` (without it the message is empty: tests/kubelet shows that case,
    caught from the runtime's log instead). Shape from kubelet v1.34 + containerd 1.6 + runc
    1.1 running an arm64 binary on amd64 (exit code 1 there; a plugin may exit otherwise)."""
    digest = "registry.example/rdma-dp@sha256:" + "ab" * 32
    status = {"phase": "Running", "conditions": ready(False),
              "containerStatuses": [{
                  "name": "dp", "image": "registry.example/rdma-dp:1.5", "imageID": digest,
                  "ready": False, "restartCount": 7,
                  "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                  "lastState": {"terminated": {
                      "exitCode": 1, "reason": "Error",
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


# ---------------------------------------------------------------- fact 2: the image platform
# The plugin's images live in the real docker-registry (TLS, token auth); the agent reads
# the pod with its own identity and the registry with a pull secret, as on a host.


def full_judge(apiserver: ApiServer, tmp_path: Path, registry_section: dict[str, Any]) -> Finding:
    config = parse_config({
        "node_name": "node-a",
        "kubernetes": {"kubeconfig": str(apiserver.kubeconfig("agent-node-a",
                                                              tmp_path / "kubeconfig"))},
        "device_plugin": {"namespace": NS, "daemonset": DS, "resource": RESOURCE,
                          "registry": registry_section}})
    assert config.device_plugin is not None
    return device_plugin_finding(config, plugin_reader(config)(config.device_plugin))


def pull_secret(registry: Registry, tmp_path: Path) -> dict[str, Any]:
    return {"ca_bundle": str(registry.ca),
            "docker_config": str(registry.docker_config(tmp_path / "pull-secret.json"))}


def amd64_node(core: k8s.CoreV1Api) -> None:
    core.patch_node_status("node-a", {"status": {"nodeInfo": {
        "operatingSystem": "linux", "architecture": "amd64"}}}, _content_type=JSON_MERGE)


def runs(registry: Registry, name: str, is_ready: bool) -> tuple[dict[str, Any], str]:
    """A pod status that ran image `name` of the fixture registry, and its spec image."""
    image = f"{registry.host}/rdma/dp:{name}"
    image_id = f"{registry.host}/rdma/dp@{registry.images[name]}"
    status = {"phase": "Running", "conditions": ready(is_ready),
              "containerStatuses": [{"name": "dp", "image": image, "imageID": image_id,
                                     "ready": is_ready, "restartCount": 0 if is_ready else 9,
                                     "state": {"running": {}} if is_ready else
                                     {"waiting": {"reason": "CrashLoopBackOff"}}}]}
    return status, image


def test_registry_says_the_image_cannot_run_here(apiserver: ApiServer, plugin: dict[str, Any],
                                                 registry: Registry, tmp_path: Path) -> None:
    """The incident: a mirror resolved to an arm64-only manifest on amd64 nodes. The exec
    error message is not needed: the registry tells."""
    amd64_node(plugin["core"])
    make_pod(plugin, *runs(registry, "arm64", is_ready=False))
    f = full_judge(apiserver, tmp_path, pull_secret(registry, tmp_path))
    assert (f.status, f.reason) == ("False", "PluginNeverReady")
    assert (f"image {registry.host}/rdma/dp@{registry.images['arm64']} "
            f"({registry.images['arm64']}) is built for linux/arm64; this node is "
            "linux/amd64: it cannot run here") in f.message


def test_index_without_the_node_platform(apiserver: ApiServer, plugin: dict[str, Any],
                                        registry: Registry, tmp_path: Path) -> None:
    amd64_node(plugin["core"])
    make_pod(plugin, *runs(registry, "no-amd64", is_ready=False))
    f = full_judge(apiserver, tmp_path, pull_secret(registry, tmp_path))
    assert "is built for linux/arm64/v8, linux/ppc64le; this node is linux/amd64" in f.message


def test_multi_arch_image_is_verified(apiserver: ApiServer, plugin: dict[str, Any],
                                      registry: Registry, tmp_path: Path) -> None:
    amd64_node(plugin["core"])
    make_pod(plugin, *runs(registry, "multi", is_ready=True))
    f = full_judge(apiserver, tmp_path, pull_secret(registry, tmp_path))
    assert (f.status, f.reason) == ("True", "PluginReady")
    assert f"image linux/amd64 verified ({registry.images['multi'][:19]})" in f.message


def test_mismatch_alone_fails_the_condition(apiserver: ApiServer, plugin: dict[str, Any],
                                            registry: Registry, tmp_path: Path) -> None:
    """A Ready pod on the wrong platform (emulation, or a lying node) is still reported."""
    amd64_node(plugin["core"])
    make_pod(plugin, *runs(registry, "arm64", is_ready=True))
    f = full_judge(apiserver, tmp_path, pull_secret(registry, tmp_path))
    assert (f.status, f.reason) == ("False", "ImageArchMismatch")


def test_without_a_pod_the_daemonset_image_is_checked(apiserver: ApiServer,
                                                       plugin: dict[str, Any],
                                                       registry: Registry,
                                                       tmp_path: Path) -> None:
    amd64_node(plugin["core"])
    plugin["apps"].patch_namespaced_daemon_set(DS, NS, {"spec": {"template": {"spec": {
        "containers": [{"name": "dp", "image": f"{registry.host}/rdma/dp:arm64"}]}}}},
        _content_type="application/strategic-merge-patch+json")
    f = full_judge(apiserver, tmp_path, pull_secret(registry, tmp_path))
    assert f.reason == "PluginPodMissing"
    assert "is built for linux/arm64; this node is linux/amd64" in f.message


@pytest.mark.parametrize("broken", ["wrong password", "no CA", "registry down"])
def test_registry_trouble_is_unknown_not_a_false_alarm(apiserver: ApiServer,
                                                       plugin: dict[str, Any],
                                                       registry: Registry, tmp_path: Path,
                                                       broken: str) -> None:
    amd64_node(plugin["core"])
    status, image = runs(registry, "multi", is_ready=True)
    section = pull_secret(registry, tmp_path)
    if broken == "wrong password":
        section["docker_config"] = str(registry.docker_config(tmp_path / "bad.json", "puller",
                                                              password="wrong"))
    elif broken == "no CA":
        del section["ca_bundle"]
    else:
        from tests.kit.helpers import free_port

        down = f"127.0.0.1:{free_port()}"
        for cs in status["containerStatuses"]:
            cs["imageID"] = cs["imageID"].replace(registry.host, down)
    make_pod(plugin, status, image)
    f = full_judge(apiserver, tmp_path, section)
    assert (f.status, f.reason) == ("True", "PluginReady")
    assert "image platform not verified" in f.message


# ---------------------------------------------------------------- the daemon's watching reader


def test_watching_reader_costs_no_request_in_steady_state(apiserver: ApiServer,
                                                          plugin: dict[str, Any]) -> None:
    changed = threading.Event()
    dp = cfg().device_plugin
    assert dp is not None
    reader = WatchingReader(apiserver.client("agent-node-a"), "node-a", dp, changed.set)
    try:
        name = make_pod(plugin, {"phase": "Running", "conditions": ready(False)})
        first = reader.device_plugin(dp)
        wait_for(lambda: len(reader.device_plugin(dp).pods) == 1, what="the pod in the cache")
        assert first.error is None and first.daemonset is not None and first.node is not None
        # Three lists, then three watches that stay open.
        wait_for(lambda: reader.counters.requests == 6, what="three lists and three watches")
        for _ in range(50):
            reader.device_plugin(dp)
        assert reader.counters.requests == 6, "an observation from the cache is free"
        # A change arrives through the watch, and says so.
        changed.clear()
        plugin["core"].patch_namespaced_pod_status(
            name, NS, {"status": {"conditions": ready(True)}}, _content_type=JSON_MERGE)
        assert changed.wait(10), "on_change after the pod's status changed"
        wait_for(lambda: device_plugin_finding(cfg(), reader.device_plugin(dp)).status
                 == "True", what="Ready seen through the watch")
        advertise(plugin["core"], 0)
        wait_for(lambda: device_plugin_finding(cfg(), reader.device_plugin(dp)).reason
                 == "ResourceNotAdvertised", what="the node's change seen through the watch")
        assert reader.counters.requests == 6, "changes cost no request either"
    finally:
        reader.stop()


def test_the_daemons_reader_follows_the_publishers_node_watch(
    apiserver: ApiServer, plugin: dict[str, Any],
) -> None:
    """One watch of the agent's own Node in the daemon: the publisher's. The plugin's reader
    opens two watches (its DaemonSet, the pods here), takes the Node from the shared one and
    is woken by it; stopped, it is no longer called."""
    api = apiserver.client("agent-node-a")
    shared_counters = Counters()
    published = WatchedCollection(api, shared_counters, "/api/v1/nodes",
                                  [("fieldSelector", "metadata.name=node-a")], lambda: None)
    changed = threading.Event()
    dp = cfg().device_plugin
    assert dp is not None
    ready_watch: list[WatchedCollection] = []  # the publisher makes its watch a while later
    reader = WatchingReader(api, "node-a", dp, changed.set,
                            node_watch=lambda: ready_watch[0] if ready_watch else None)
    try:
        make_pod(plugin, {"phase": "Running", "conditions": ready(True)})
        assert reader.device_plugin(dp).error == "no answer from the API server yet"
        published.start()
        ready_watch.append(published)
        wait_for(lambda: device_plugin_finding(cfg(), reader.device_plugin(dp)).status
                 == "True", what="the plugin Ready, the Node from the shared watch")
        wait_for(lambda: reader.counters.requests == 4, what="two lists and two watches")
        changed.clear()
        advertise(plugin["core"], 0)
        assert changed.wait(10), "woken by the shared watch"
        wait_for(lambda: device_plugin_finding(cfg(), reader.device_plugin(dp)).reason
                 == "ResourceNotAdvertised", what="the node's change seen")
        assert reader.counters.requests == 4, "the reader made no request of its own"
        reader.stop()
        for own in reader.collections:  # their streams closed: they say so as they end
            own.join(10)
        changed.clear()
        advertise(plugin["core"], 2)
        wait_for(lambda: (n := published.snapshot()[0]) and n[0]["status"].get(
            "allocatable", {}).get(RESOURCE) == "2", what="the change in the shared watch")
        assert not changed.is_set(), "a stopped reader is no longer called"
    finally:
        reader.stop()
        published.stop()


def test_watching_reader_follows_deletes(apiserver: ApiServer, plugin: dict[str, Any]) -> None:
    dp = cfg().device_plugin
    assert dp is not None
    reader = WatchingReader(apiserver.client("agent-node-a"), "node-a", dp, lambda: None)
    try:
        name = make_pod(plugin, {"phase": "Running", "conditions": ready(True)})
        wait_for(lambda: len(reader.device_plugin(dp).pods) == 1, what="the pod")
        plugin["core"].delete_namespaced_pod(name, NS, grace_period_seconds=0)
        wait_for(lambda: device_plugin_finding(cfg(), reader.device_plugin(dp)).reason
                 == "PluginPodMissing", what="the pod's deletion")
        plugin["apps"].delete_namespaced_daemon_set(DS, NS)
        wait_for(lambda: reader.device_plugin(dp).daemonset is None, what="the DaemonSet gone")
    finally:
        reader.stop()


def test_watching_reader_without_permission_is_unknown(apiserver: ApiServer,
                                                       plugin: dict[str, Any]) -> None:
    dp = cfg().device_plugin
    assert dp is not None
    reader = WatchingReader(apiserver.client("stranger"), "node-a", dp, lambda: None)
    try:
        f = device_plugin_finding(cfg(), reader.device_plugin(dp))
        assert (f.status, f.reason) == ("Unknown", "APIUnreachable") and "HTTP 403" in f.message
    finally:
        reader.stop()
