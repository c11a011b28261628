"""`nodeagent preflight --claims` on the real API server: the pod reads its own Pod, the
ResourceClaims it names and this node's ResourceSlices with its own identity (refused
without the nodeagent-preflight ClusterRole, read with it), and the devices it holds are
judged: its NIC (dranet's slice, as in test_dra_slices) fits, a GPU (NVIDIA's driver
`gpu.nvidia.com`, with the standard `resource.kubernetes.io/pcieRoot` attribute) on
another PCIe root than the NIC is refused with the fix."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from nodeagent.checks.preflight import PreflightFacts, judge_preflight
from nodeagent.cli.preflight import allocation_from_api
from nodeagent.model.jobs import GidSlot, NodeRail, NodeVerdict, PortView, VerbsDevice
from nodeagent.model.kube import DeviceRef
from tests.kit.apiserver import ApiServer
from tests.kit.helpers import wait_for
from tests.kube.test_dra_slices import resource_slice
from tests.kube.test_lent_claims import NODE, NS, holder  # noqa: F401 (a fixture)

BINDING = "nodeagent-preflight-test"


def allocate(resource: k8s.ResourceV1Api, name: str, driver: str, device: str) -> None:
    """A claim allocated as the scheduler writes it (status.allocation)."""
    spec = {"devices": {"requests": [
        {"name": "r", "exactly": {"deviceClassName": "any", "count": 1}}]}}
    resource.create_namespaced_resource_claim(NS, {  # type: ignore[arg-type]
        "metadata": {"name": name}, "spec": spec})
    got = resource.read_namespaced_resource_claim(name, NS)
    resource.replace_namespaced_resource_claim_status(name, NS, {  # type: ignore[arg-type]
        "metadata": {"name": name, "resourceVersion": got.metadata.resource_version},
        "spec": spec, "status": {"allocation": {"devices": {"results": [
            {"request": "r", "driver": driver, "pool": NODE, "device": device}]}}}})


@pytest.fixture
def gpu_pod(holder: dict[str, Any], apiserver: ApiServer) -> Iterator[None]:  # noqa: F811
    """Pod train-1 holding rail1's NIC (train-0-nic) and a GPU on another PCIe root."""
    core: k8s.CoreV1Api = holder["core"]
    resource: k8s.ResourceV1Api = holder["resource"]
    resource.create_resource_slice(resource_slice(  # type: ignore[arg-type]
        f"{NODE}-gpu", [{"name": "gpu-0", "attributes": {
            "gpu.nvidia.com/productName": {"string": "NVIDIA H100 80GB HBM3"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:10"}}}],
        node=NODE, driver="gpu.nvidia.com"))
    allocate(resource, "train-1-gpu", "gpu.nvidia.com", "gpu-0")
    core.create_namespaced_pod(NS, {  # type: ignore[arg-type]
        "metadata": {"name": "train-1"},
        "spec": {"nodeName": NODE, "automountServiceAccountToken": False,
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": "train-1-gpu"},
                                    {"name": "nic", "resourceClaimName": "train-0-nic"}],
                 "containers": [{"name": "train", "image": "registry.example/train:1"}]}})
    try:
        yield
    finally:
        rbac = k8s.RbacAuthorizationV1Api(apiserver.client("admin"))
        for delete in (lambda: core.delete_namespaced_pod("train-1", NS, grace_period_seconds=0),
                       lambda: resource.delete_namespaced_resource_claim("train-1-gpu", NS),
                       lambda: resource.delete_resource_slice(f"{NODE}-gpu"),
                       lambda: rbac.delete_cluster_role_binding(BINDING)):
            try:
                delete()
            except ApiException as exc:
                if exc.status != 404:
                    raise


def test_preflight_reads_its_pods_claims_with_its_own_identity_and_judges_them(
        apiserver: ApiServer, gpu_pod: None) -> None:
    pod = apiserver.client("stranger")  # a job's identity: no rights of its own
    refused = allocation_from_api(NS, "train-1", NODE, pod)
    assert refused.problem is not None and refused.problem.startswith("HTTP 403"), refused
    k8s.RbacAuthorizationV1Api(apiserver.client("admin")).create_cluster_role_binding({
        "metadata": {"name": BINDING},  # the binding deploy/job-policy.yaml's comment shows
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "nodeagent-preflight"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": "someone"}]})  # type: ignore[arg-type]
    got = wait_for(lambda: (a := allocation_from_api(NS, "train-1", NODE, pod)).problem is None
                   and a, 10, "read once the ClusterRole is bound")
    held = {d.device: d for d in got.devices}
    assert set(held) == {DeviceRef("gpu.nvidia.com", NODE, "gpu-0"),
                         DeviceRef("dra.net", NODE, "pci-r1")}
    nic = held[DeviceRef("dra.net", NODE, "pci-r1")]
    assert (nic.claim, nic.get("ifName"), nic.get("rdma"), nic.get("rdmaDevice")) == (
        f"{NS}/train-0-nic", "r1", True, "mlx5_1")

    # Judged from inside the pod: it sees r1 and mlx5_1 alone (dranet's exclusive mode).
    slots = tuple(GidSlot(i, ipaddress.IPv6Address(g), v) for i, g, v in (
        (0, "fe80::1", 1), (1, "fe80::1", 2), (2, "::ffff:10.11.0.5", 1),
        (3, "::ffff:10.11.0.5", 2)))
    facts = PreflightFacts(
        NodeVerdict(NODE, True, "AllConditionsPassed", "ok", (
            NodeRail("rail0", "10.10.0.5", "mlx5_0", 1, 3),
            NodeRail("rail1", "10.11.0.5", "mlx5_1", 1, 3))),
        (VerbsDevice("uverbs1", "mlx5_1", True),), {"NCCL_IB_GID_INDEX": "3"},
        ports=(PortView("mlx5_1", 1, True, True, slots, "ACTIVE"),), interfaces=("eth0", "r1"),
        allocation=got)
    assert [u.line() for u in judge_preflight(facts)] == [
        f"alignment: GPU gpu-0 of claim {NS}/train-1-gpu is on PCIe root pci0000:10, its NICs "
        "on pci0000:11: every transfer crosses the CPU interconnect (about half the "
        "all-reduce bandwidth); constrain the claim with matchAttribute "
        "resource.kubernetes.io/pcieRoot, or pass --allow-unaligned"]
