"""RDMAResourceSlicesReady on the real API server (resource.k8s.io/v1, served by default
since 1.34): ResourceSlices in the shape dranet publishes (its
examples/aws_eks_examples/gpu-efa/resourceslice-dranet.yaml: `dra.net/ifName`,
`dra.net/rdma`, `dra.net/rdmaDevice`, `dra.net/mtu`, `resource.kubernetes.io/pcieRoot`;
with the spec fields the API requires, which the example's listing leaves out: driver,
nodeName, pool), created as an admin, read with the agent's own identity (deploy/rbac.yaml:
list, nothing more) and judged."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from nodeagent.checks.dra import slices_finding
from nodeagent.config import Config, parse_config
from nodeagent.kube.api import Counters
from nodeagent.run.dra import read_slices, slice_lister
from tests.conftest import RAILS
from tests.kit.apiserver import ApiServer
from tests.kit.helpers import free_port

KUBE: dict[str, Any] = {}  # the judge needs the section; the lister is the test's


def nic(name: str, ifname: str, rdma: bool, mtu: int = 4200) -> dict[str, Any]:
    return {"name": name, "attributes": {
        "dra.net/ifName": {"string": ifname}, "dra.net/rdma": {"bool": rdma},
        "dra.net/rdmaDevice": {"string": f"mlx5_{ifname[-1]}"}, "dra.net/mtu": {"int": mtu},
        "dra.net/pciAddress": {"string": f"0000:1{ifname[-1]}:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:1{ifname[-1]}"}}}


def resource_slice(name: str, devices: list[dict[str, Any]], node: str = "node-a",
                   driver: str = "dra.net", generation: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "devices": devices,
                     "pool": {"name": node, "generation": generation,
                              "resourceSliceCount": 1}}}


@pytest.fixture
def slices(apiserver: ApiServer) -> Iterator[k8s.ResourceV1Api]:
    api = k8s.ResourceV1Api(apiserver.client("admin"))
    try:
        yield api
    finally:
        for s in api.list_resource_slice().items:
            api.delete_resource_slice(s.metadata.name)


def config() -> Config:
    return parse_config({"node_name": "node-a", "rails": [dict(r) for r in RAILS],
                         "kubernetes": KUBE, "dra": {}})


def judged(apiserver: ApiServer) -> tuple[str, str, str]:
    cfg = config()
    lister = slice_lister(apiserver.client("agent-node-a"), Counters())
    got = slices_finding(cfg, read_slices(cfg, lister))
    return got.status, got.reason, got.message


def test_each_rails_nic_published_with_rdma_is_ready(apiserver: ApiServer,
                                                    slices: k8s.ResourceV1Api) -> None:
    slices.create_resource_slice(resource_slice("node-a-dra.net-x1", [
        nic("pci-0000-10-00-0", "r0", True), nic("pci-0000-11-00-0", "r1", True)]))
    # Another node's and another driver's slices are not this node's.
    slices.create_resource_slice(resource_slice("node-b-dra.net-x1", [
        nic("pci-0000-10-00-0", "r0", False)], node="node-b"))
    slices.create_resource_slice(resource_slice("node-a-gpu", [
        {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
        driver="gpu.nvidia.com"))
    assert judged(apiserver) == ("True", "RailsPublished",
                                 "dra.net: rail0: pci-0000-10-00-0; rail1: pci-0000-11-00-0")


def test_a_rail_published_without_rdma_or_missing_or_nothing_at_all(
        apiserver: ApiServer, slices: k8s.ResourceV1Api) -> None:
    assert judged(apiserver)[:2] == ("False", "NoSlices")
    slices.create_resource_slice(resource_slice("node-a-dra.net-x1", [
        nic("pci-0000-10-00-0", "r0", True), nic("pci-0000-11-00-0", "r1", False)]))
    status, reason, message = judged(apiserver)
    assert (status, reason) == ("False", "RDMANotPublished"), message
    assert message == ("rail1 r1: dra.net device pci-0000-11-00-0 (slice node-a-dra.net-x1) "
                       "is published with rdma False: a claim for an RDMA NIC will not get it")
    # A newer generation of the pool replaces the old one (the driver republished): only r0.
    slices.create_resource_slice(resource_slice("node-a-dra.net-x2", [
        nic("pci-0000-10-00-0", "r0", True)], generation=2))
    status, reason, message = judged(apiserver)
    assert (status, reason) == ("False", "RailNotInSlices"), message
    assert "rail1 r1: no device of dra.net on node-a names r1" in message


def test_the_api_not_answering_is_unknown(apiserver: ApiServer) -> None:
    cfg = config()
    gone = apiserver.configuration("agent-node-a")
    gone.host = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    lister = slice_lister(k8s.ApiClient(gone), Counters())
    got = slices_finding(cfg, read_slices(cfg, lister))
    assert (got.status, got.reason) == ("Unknown", "SlicesUnreadable"), got
