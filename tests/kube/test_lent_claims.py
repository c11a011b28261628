"""A rail lent to a pod, named by its claim, on the real API server with the daemon running
in a network namespace: the rail's device in dranet's slices (shape as in test_dra_slices),
a Pod on the node naming a ResourceClaim whose allocation holds that device (the
allocation written as the scheduler writes it: status.allocation.devices.results and
status.reservedFor, k8s.io/api v0.34 resource/v1), the netdev moved into the pod's
namespace the way dranet does. The status, RoCENetworkReady's message, the Lease and the
fleet view name the pod and claim; the pod deleted and the netdev not back within
dra.return_within is LentRailNotReturned, with the node tainted; back, all clear."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from test_publisher import BOOT, our_taint

from nodeagent.cli.fleet import FleetSource, fleet_rows
from nodeagent.kube.peercard import ASIDE
from tests.kit.apiserver import ApiServer
from tests.kit.helpers import LoopbackBridge, Netns, stop_daemon, wait_for, write_config
from tests.kube.test_dra_slices import nic, resource_slice
from tests.kube.test_job_policy import namespace
from tests.netns.test_daemon import cond
from tests.netns.test_lent_rail import pod_ns, rail_row  # noqa: F401 (pod_ns: a fixture)

NODE, NS = "node-c", "lent"  # node-c: an identity the test API server has


@pytest.fixture
def holder(apiserver: ApiServer, core: k8s.CoreV1Api) -> Iterator[dict[str, Any]]:
    """dranet's slice for NODE, and pod lent/train-0 holding rail1's NIC by a claim."""
    admin = apiserver.client("admin")
    resource = k8s.ResourceV1Api(admin)
    namespace(core, NS, {})
    resource.create_resource_slice(resource_slice(  # type: ignore[arg-type]
        f"{NODE}-dra.net", [nic("pci-r0", "r0", True), nic("pci-r1", "r1", True)], node=NODE))
    pod = core.create_namespaced_pod(NS, {  # type: ignore[arg-type]
        "metadata": {"name": "train-0"},
        "spec": {"nodeName": NODE, "automountServiceAccountToken": False,
                 "resourceClaims": [{"name": "nic", "resourceClaimName": "train-0-nic"}],
                 "containers": [{"name": "train", "image": "registry.example/train:1",
                                 "resources": {"claims": [{"name": "nic"}]}}]}})
    resource.create_namespaced_resource_claim(NS, {  # type: ignore[arg-type]
        "metadata": {"name": "train-0-nic"},
        "spec": {"devices": {"requests": [
            {"name": "nic", "exactly": {"deviceClassName": "dranet", "count": 1}}]}}})
    claim = resource.read_namespaced_resource_claim("train-0-nic", NS)
    resource.replace_namespaced_resource_claim_status("train-0-nic", NS, {  # type: ignore[arg-type]
        "metadata": {"name": "train-0-nic", "resourceVersion": claim.metadata.resource_version},
        "spec": {"devices": {"requests": [
            {"name": "nic", "exactly": {"deviceClassName": "dranet", "count": 1}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "nic", "driver": "dra.net", "pool": NODE, "device": "pci-r1"}]}},
            "reservedFor": [{"resource": "pods", "name": "train-0",
                             "uid": pod.metadata.uid}]}})
    try:
        yield {"core": core, "resource": resource}
    finally:
        for delete in (lambda: core.delete_namespaced_pod("train-0", NS, grace_period_seconds=0),
                       lambda: resource.delete_namespaced_resource_claim("train-0-nic", NS),
                       lambda: resource.delete_resource_slice(f"{NODE}-dra.net")):
            try:
                delete()
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise


def test_a_lent_rail_names_its_pod_and_claim_and_fails_if_not_back_after_the_pod(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
    rails_ns: Netns, agent_config: dict[str, Any], pod_ns: Netns,  # noqa: F811
    holder: dict[str, Any], tmp_path: Path,
) -> None:
    node = fresh_node(NODE, [BOOT])  # tainted from the start: untainted means the agent lifted it
    agent_config["node_name"] = node
    agent_config["resync_interval"] = "1h"
    agent_config["kubernetes"] = {
        "kubeconfig": str(apiserver.kubeconfig(f"agent-{NODE}", tmp_path / "kubeconfig")),
        "clear_after": "1s", "lease_period": "2s"}
    agent_config["dra"] = {"interval": "1s", "return_within": "3s"}
    cfg = write_config(tmp_path / "c.yaml", agent_config)
    rails_ns.ip("link", "set", "lo", "up")
    bridge = LoopbackBridge(rails_ns.name, apiserver.port)
    proc = rails_ns.start_daemon(cfg)
    try:
        wait_for(lambda: (cond(agent_config, "FabricReady") or ("",))[0] == "True"
                 and our_taint(core, node) is None, 30, "healthy and untainted first")

        rails_ns.ip("link", "set", "r1", "netns", pod_ns.name)  # dranet, at sandbox creation
        holding = "rail1 r1 lent to pod lent/train-0 (claim lent/train-0-nic)"
        wait_for(lambda: holding in (cond(agent_config, "RoCENetworkReady") or ("", "", ""))[2],
                 15, "the lent rail named with its pod and claim")
        assert rail_row(agent_config, "rail1")["lent_to"] == "pod lent/train-0 (claim " \
                                                             "lent/train-0-nic)"
        assert (cond(agent_config, "FabricReady") or ("",))[0] == "True"
        assert our_taint(core, node) is None

        def aside() -> dict[str, Any]:
            lease = k8s.CoordinationV1Api(apiserver.client("admin")).read_namespaced_lease(
                f"nodeagent-{node}", "nodeagent-system")
            return json.loads((lease.metadata.annotations or {}).get(ASIDE, "{}"))

        wait_for(lambda: aside().get("lent", {}).get("rail1", "").startswith("pod lent/train-0"),
                 10, "the Lease saying rail1 is lent")
        nodes, leases = FleetSource(apiserver.client("admin"), "", "nodeagent-system").list_once()
        row = next(r for r in fleet_rows(nodes, leases, "rdma/x", "k", 0.0, 1e12, 1800)
                   if r.node == node)
        assert row.rails.lent == {"rail1": "pod lent/train-0 (claim lent/train-0-nic)"}, row

        # The job ends, and the netdev does not come back (a leaked namespace holds it).
        core.delete_namespaced_pod("train-0", NS, grace_period_seconds=0)
        got = wait_for(lambda: (c := cond(agent_config, "RoCENetworkReady")) and c[1] ==
                       "LentRailNotReturned" and c, 20, "the rail failed for not coming back")
        assert got[0] == "False"
        assert "rail1 r1 lent to a pod: its netdev is not back" in got[2], got
        assert "after pod lent/train-0 (claim lent/train-0-nic) ended (bound 3 s)" in got[2]
        wait_for(lambda: (our_taint(core, node) or {}).get("value") == "LentRailNotReturned",
                 10, "the node tainted for it")

        pod_ns.ip("link", "set", "r1", "netns", rails_ns.name)  # back at last: repaired
        wait_for(lambda: (cond(agent_config, "FabricReady") or ("",))[0] == "True", 20,
                 "healthy once back")
        wait_for(lambda: our_taint(core, node) is None, 10, "the taint lifted")
        assert "lent_to" not in rail_row(agent_config, "rail1")
        wait_for(lambda: not aside(), 10, "the Lease no longer says anything is aside")
    finally:
        code, out = stop_daemon(proc)
        bridge.close()
    assert code == 0, out
