"""API objects parsed once into typed facts (kube/objects.py). The pod's metadata is the
device-plugin pod the kubelet tier ran (tests/unit/test_runtime_facts.py); its status fields
are corev1.ContainerStatus as the API serves it (k8s.io/api core/v1 types.go: restartCount,
state.waiting.reason, lastState.terminated.exitCode). The real reads are tests/kube."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeagent.kube.objects import parse_daemonset, parse_node, parse_pod, plugin_observation

POD: dict[str, Any] = {
    "metadata": {"namespace": "kube-system", "name": "rdma-dp-x7k2p",
                 "uid": "f8d47397-5ade-4eab-aab6-fa00af6b77a9",
                 "creationTimestamp": "2026-12-01T14:05:04Z",
                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                      "name": "rdma-dp", "controller": True}]},
    "spec": {"containers": [{"name": "dp", "image": "reg/dp:1",
                             "resources": {"limits": {"memory": "64Mi"}}}],
             "initContainers": [{"name": "wait", "image": "reg/wait:1",
                                 "resources": {"requests": {"rdma/hca": "1"}}}]},
    "status": {"phase": "Running",
               "conditions": [{"type": "Ready", "status": "False",
                               "lastTransitionTime": "2026-12-01T14:05:04Z"}],
               "containerStatuses": [{
                   "name": "dp", "image": "reg/dp:1", "ready": False, "restartCount": 3,
                   "imageID": "reg/dp@sha256:" + "a" * 64,
                   "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                   "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                                "finishedAt": "2026-12-01T14:06:00Z"}}}]}}


def test_a_pod_is_read_field_by_field() -> None:
    pod = parse_pod(POD)
    assert str(pod) == "pod kube-system/rdma-dp-x7k2p"
    assert (pod.phase, pod.ready, pod.created) == ("Running", False, "2026-12-01T14:05:04Z")
    assert pod.owners == (("DaemonSet", "rdma-dp"),)
    (dp,) = pod.containers
    assert (dp.spec_image, dp.reported, dp.restarts, dp.waiting) == (
        "reg/dp:1", True, 3, "CrashLoopBackOff")
    assert dp.last_terminated is not None and dp.last_terminated.exit_code == "1"
    assert pod.requests_any({"rdma/hca"}) and not pod.requests_any({"nvidia.com/gpu"})


def test_the_plugins_pods_are_picked_by_owner_and_namespace() -> None:
    leaving = {**POD, "metadata": {**POD["metadata"], "name": "old",
                                   "deletionTimestamp": "2026-12-01T14:07:00Z"}}
    other = {**POD, "metadata": {**POD["metadata"], "namespace": "default", "name": "x"}}
    obs = plugin_observation(None, None, [POD, leaving, other], "kube-system", "rdma-dp")
    assert [p.name for p in obs.pods] == ["rdma-dp-x7k2p"]
    assert len(obs.node_pods) == 3


def test_node_and_daemonset() -> None:
    node = parse_node({"metadata": {"name": "n1"}, "status": {
        "nodeInfo": {"operatingSystem": "linux", "architecture": "arm64"},
        "allocatable": {"rdma/hca": "4"}, "capacity": {"rdma/hca": "4"}}})
    assert (node.name, node.architecture, node.allocatable["rdma/hca"]) == ("n1", "arm64", "4")
    ds = parse_daemonset({"metadata": {"namespace": "kube-system", "name": "rdma-dp"},
                          "spec": {"template": {"spec": {
                              "tolerations": [{"operator": "Exists"}],
                              "containers": [{"image": "reg/dp:1"}, {"image": "reg/dp:1"}]}}}})
    assert ds.images == ("reg/dp:1",)
    assert ds.tolerations[0].operator == "Exists" and ds.tolerations[0].key == ""


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["metadata", "spec", "status", "containers", "containerStatuses",
                         "conditions", "name", "image", "restartCount", "state", "lastState",
                         "terminated", "waiting", "resources", "limits", "ownerReferences",
                         "nodeInfo", "allocatable", "template", "tolerations", "x"]),
        inner, max_size=5),
    max_leaves=25)


@given(_json)
def test_any_shape_parses_or_reads_as_absent(obj: Any) -> None:
    """A proxy or a fake API may send anything: a field of the wrong type reads as absent,
    never an exception in the checks' thread."""
    if isinstance(obj, dict):
        parse_pod(obj)
        parse_node(obj)
        parse_daemonset(obj)
        plugin_observation(obj, obj, [obj, 1], "ns", "ds")
