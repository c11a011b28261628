"""DaemonSet mode end to end: the agent's own image (tools/imagebuild.py, from Debian
packages) pushed to the real registry; deploy/daemonset rendered by the real kustomize and
created on an API server of its own, where the real controller manager makes the
DaemonSet's pod and the real scheduler binds it to node-a; containerd pulls the image from
the registry; the agent in it, authenticated by its pod-bound token, publishes its
conditions on node-a and lifts the boot taint the kubelet registered the node with. The
test device plugin runs as its own DaemonSet's pod beside it, and the agent judges it
through the runtime's directories the DaemonSet mounts (the image containerd pulled).
The job gate on the same node: `nodeagent preflight` as a training pod's init container,
and Kueue (tests/kit/kueue.py) with waitForPodsReady over gangs it holds off a tainted node
or whose preflight fails.

Changed from deploy/daemonset, for this machine only: the image reference, the API server's
address (no kube-proxy here to reach the `kubernetes` Service's cluster IP), the hostPath
directories (the test's and this node's, not the host's), the metrics port, and a
`device_plugin` section in the config."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils

from tests.kit.apiserver import ApiServer, start_apiserver, wait_policy_enforced
from tests.kit.control_plane import ControlPlane, start_control_plane
from tests.kit.deploytools import build_tool
from tests.kit.helpers import free_port, wait_for
from tests.kit.kubelet import Node
from tests.kit.kueue import Kueue
from tests.kit.rdma_plugin import BOOT, DEVICES, DS, KEY, RESOURCE, start_plugin_node
from tests.kit.rdma_plugin import NS as PLUGIN_NS
from tests.kit.registry_env import Registry
from tools.imagebuild import Image

ROOT = Path(__file__).resolve().parents[2]
NS = "nodeagent-system"
LABEL = "app.kubernetes.io/name=nodeagent"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer,
                                                                        ControlPlane]]:
    """An API server of this module's own (a controller manager acts on every DaemonSet it
    sees: the session's holds other tests' objects), deploy/ applied, with a control plane."""
    server = start_apiserver(tmp_path_factory.mktemp("cluster"))
    try:
        wait_policy_enforced(server)
        # The policy's probe Node would get a DaemonSet pod of its own: gone before any.
        k8s.CoreV1Api(server.client("admin")).delete_node("policy-probe")
        plane = start_control_plane(server, server.workdir / "control-plane", NS)
        try:
            yield server, plane
        finally:
            plane.stop()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def agent_node(cluster: tuple[ApiServer, ControlPlane], registry: Registry,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """node-a, registered with the fabric taint (fail closed), pulling from the registry;
    the test device plugin's DaemonSet created (its controller makes the pod)."""
    server, _ = cluster
    n = Node(server, tmp_path_factory.mktemp("node"), "node-a", taint=BOOT,
             registries={registry.host: registry.ca})
    # What the RDMA plugin hands a container, /dev/infiniband/uverbs0, from a character
    # device of this host's (it has no RDMA device): /dev/null's numbers, which open. The
    # runtime makes the node in the container from the plugin's DeviceSpec and lets its
    # device cgroup open it, as for a real uverbs node.
    # Two of them: a node with two rails.
    hca = tmp_path_factory.mktemp("hca")
    for name in ("uverbs0", "uverbs1"):
        os.mknod(hca / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    try:
        start_plugin_node(n, k8s.CoreV1Api(server.client("admin")),
                          devices={f"/dev/infiniband/{name}": hca / name
                                   for name in ("uverbs0", "uverbs1")})
        yield n
    finally:
        n.stop()


def rendered(image: str, server: ApiServer, node: Node, state: Path) -> list[dict[str, Any]]:
    out = subprocess.run([str(build_tool("kustomize")), "build", str(ROOT / "deploy" /
                                                                     "daemonset")],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    objects = [d for d in yaml.safe_load_all(out) if d]
    for obj in objects:
        if obj["kind"] == "ConfigMap":
            config = yaml.safe_load(obj["data"]["config.yaml"])
            config["metrics"]["listen"] = f"127.0.0.1:{free_port()}"
            config["kubernetes"]["clear_after"] = "1s"
            # The runtime's directories at their default paths (the DaemonSet mounts them).
            config["device_plugin"] = {"namespace": PLUGIN_NS, "daemonset": DS,
                                       "resource": RESOURCE, "min_allocatable": DEVICES,
                                       "registry": {"timeout": "2s"}}
            obj["data"]["config.yaml"] = yaml.safe_dump(config)
        if obj["kind"] == "DaemonSet":
            spec = obj["spec"]["template"]["spec"]
            spec["terminationGracePeriodSeconds"] = 5
            container = spec["containers"][0]
            container["image"] = image
            container["env"] += [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                                 {"name": "KUBERNETES_SERVICE_PORT", "value": str(server.port)}]
            paths = {"state": state / "state", "run": state / "run",
                     "containerd-content": node.content_root, "pod-logs": node.pod_logs}
            for volume in spec["volumes"]:
                if volume["name"] in paths:
                    volume["hostPath"]["path"] = str(paths[volume["name"]])
    return objects


def diagnosis(server: ApiServer, node: Node, plane: ControlPlane) -> str:
    core = k8s.CoreV1Api(server.client("admin"))
    pods = [p.to_dict() for p in core.list_namespaced_pod(NS).items]
    logs = sorted(node.pod_logs.rglob("*.log"))
    parts = [json.dumps([{"spec.nodeName": p["spec"].get("node_name"), "status": p["status"]}
                         for p in pods], default=str)[-3000:]]
    parts += [f"{log}:\n{log.read_text()[-3000:]}" for log in logs]
    parts += [f"{c.name}:\n{c.log.read_text()[-2000:]}" for c in plane.components]
    parts.append("containerd:\n" + (node.workdir / "containerd.log").read_text()[-2000:])
    return "\n".join(parts)


# Kueue's waitForPodsReady, short enough for a test: a gang not Ready 30 s after its
# admission is evicted whole and requeued once (1 s later), then deactivated.
PODS_READY = {"timeout": "30s", "blockAdmission": False,
              "requeuingStrategy": {"timestamp": "Eviction", "backoffLimitCount": 1,
                                    "backoffBaseSeconds": 1, "backoffMaxSeconds": 2}}
WORKLOADS = ("kueue.x-k8s.io", "v1beta2", "default", "workloads")


@pytest.fixture(scope="module")
def kueue(cluster: tuple[ApiServer, ControlPlane],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kueue]:
    """Kueue on this module's control plane, with one queue for `default`'s jobs (a
    ClusterQueue of CPU, its flavor, and a LocalQueue `training`)."""
    server, _ = cluster
    manager = Kueue(server, tmp_path_factory.mktemp("kueue"), PODS_READY)
    manager.start()
    try:
        custom = k8s.CustomObjectsApi(server.client("admin"))
        group = ("kueue.x-k8s.io", "v1beta2")
        custom.create_cluster_custom_object(*group, "resourceflavors", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
            "metadata": {"name": "any"}})
        custom.create_cluster_custom_object(*group, "clusterqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": "fabric"}, "spec": {
                "namespaceSelector": {}, "resourceGroups": [{
                    "coveredResources": ["cpu"],
                    "flavors": [{"name": "any", "resources": [
                        {"name": "cpu", "nominalQuota": "1"}]}]}]}})
        custom.create_namespaced_custom_object(*group, "default", "localqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "training"}, "spec": {"clusterQueue": "fabric"}})
        yield manager
    finally:
        manager.stop()


def gang_job(name: str, image: str, tolerations: list[dict[str, str]],
             run: Path | None = None) -> dict[str, Any]:
    """An Indexed Job of two pods in Kueue's `training` queue, the preflight its pods'
    init container (the agent's runtime directory `run` mounted where it reads the node's
    verdict), created unsuspended (Kueue's webhook suspends it until admission).
    The pods restart a failed init container in place (restartPolicy OnFailure), as a
    training job's do: the Job itself never fails; only Kueue's timeout ends it."""
    cpu = {"resources": {"requests": {"cpu": "10m"}}}
    # node-a keeps node.kubernetes.io/not-ready:NoSchedule from its registration: the node
    # lifecycle controller that lifts it from a Ready node does not run here. Tolerated, so
    # that only the agent's taint decides.
    not_ready = {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "effect": "NoSchedule"}
    spec = {"restartPolicy": "OnFailure", "hostNetwork": True,
            "tolerations": [not_ready, *tolerations],
            "terminationGracePeriodSeconds": 1,
            "initContainers": [{"name": "nodeagent-preflight", "image": image, **cpu,
                                "args": ["preflight", "--resource", RESOURCE]}],
            "containers": [{"name": "trainer", "image": image, "args": ["--version"], **cpu}]}
    if run is not None:
        spec["initContainers"][0]["volumeMounts"] = [  # type: ignore[index]
            {"name": "run", "mountPath": "/run/nodeagent", "readOnly": True}]
        spec["volumes"] = [{"name": "run", "hostPath": {"path": str(run),
                                                        "type": "Directory"}}]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
                "name": name, "labels": {"kueue.x-k8s.io/queue-name": "training"}},
            "spec": {"completionMode": "Indexed", "completions": 2, "parallelism": 2,
                     "backoffLimit": 6, "template": {"spec": spec}}}


class Gang:
    """What a test sees of a queued Job: its Workload (Kueue's), its pods, and what they
    ever did (polled)."""

    def __init__(self, server: ApiServer, name: str) -> None:
        admin = server.client("admin")
        self.name = name
        self.core = k8s.CoreV1Api(admin)
        self.batch = k8s.BatchV1Api(admin)
        self.custom = k8s.CustomObjectsApi(admin)
        self.trainer_started: list[str] = []  # pods whose trainer ever ran
        self.preflight_said: set[str] = set()  # the termination messages seen

    def pods(self) -> list[Any]:
        pods = self.core.list_namespaced_pod("default", label_selector=f"job-name={self.name}")
        for pod in pods.items:
            for status in pod.status.container_statuses or []:
                if status.state.running or status.state.terminated:
                    self.trainer_started.append(pod.metadata.name)
            for status in pod.status.init_container_statuses or []:
                for state in (status.state, status.last_state):
                    if state and state.terminated and state.terminated.message:
                        self.preflight_said.add(state.terminated.message)
        return list(pods.items)

    def workload(self) -> dict[str, Any] | None:
        got = self.custom.list_namespaced_custom_object(*WORKLOADS)["items"]
        return next((w for w in got if any(o["name"] == self.name for o in
                                           w["metadata"].get("ownerReferences", []))), None)

    def condition(self, ctype: str) -> dict[str, Any] | None:
        self.pods()  # every poll also looks at the pods
        wl = self.workload() or {}
        return next((c for c in wl.get("status", {}).get("conditions", [])
                     if c["type"] == ctype and c["status"] == "True"), None)

    def suspended(self) -> bool:
        return bool(self.batch.read_namespaced_job(self.name, "default").spec.suspend)

    def story(self) -> str:
        """The Job's status, its Workload's conditions and the namespace's events: what a
        failed case prints."""
        wl = self.workload() or {}
        events = self.core.list_namespaced_event("default").items
        taints = self.core.read_node("node-a").spec.taints
        job = self.batch.read_namespaced_job(self.name, "default")
        return "\n".join([
            f"node-a's taints: {taints}",
            f"job: {job.status}",
            f"its pods' tolerations: {job.spec.template.spec.tolerations}",
            f"workload: {wl.get('spec', {}).get('active')} "
            f"{json.dumps(wl.get('status', {}), default=str)[:3000]}",
            *[f"event {e.involved_object.kind}/{e.involved_object.name}: {e.reason}: "
              f"{e.message}" for e in events]])

    def delete(self) -> None:
        with contextlib.suppress(k8s.ApiException):
            self.batch.delete_namespaced_job(self.name, "default",
                                             propagation_policy="Background")


@contextlib.contextmanager
def explained(gang: Gang, kueue: Kueue, server: ApiServer, node: Node,
              plane: ControlPlane) -> Iterator[None]:
    """A failed case's message says what the Job, its Workload, Kueue and the node did;
    the Job is deleted either way."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{gang.story()}\n{kueue.log.read_text()[-3000:]}\n"
                             f"{diagnosis(server, node, plane)}") from exc
    finally:
        gang.delete()


def test_kueue_holds_a_gang_off_a_node_the_agent_keeps_tainted(
        cluster: tuple[ApiServer, ControlPlane], agent_node: Node, kueue: Kueue,
        pushed_image: str) -> None:
    """node-a as its kubelet registered it, with the agent's taint (fail closed until the
    agent's first verdict): Kueue admits the gang, the scheduler places neither pod, and
    Kueue's waitForPodsReady evicts the whole gang and suspends its Job again."""
    server, plane = cluster
    assert any(t.key == KEY for t in k8s.CoreV1Api(server.client("admin")).read_node(
        "node-a").spec.taints or []), "this case needs the boot taint still on node-a"
    gang = Gang(server, "held")
    with explained(gang, kueue, server, agent_node, plane):
        job = gang.batch.create_namespaced_job(
            "default", gang_job("held", pushed_image, []))  # type: ignore[arg-type]
        assert job.spec.suspend is True, "Kueue's webhook suspends a queued Job"
        wait_for(lambda: gang.condition("Admitted"), 60, "the gang admitted")
        evicted = wait_for(lambda: gang.condition("Evicted"), 120,
                           "the gang evicted for not being Ready")
        assert evicted["reason"] == "PodsReadyTimeout", evicted
        # Suspended until its requeue 1 s later, and for good once deactivated 30 s after.
        wait_for(gang.suspended, 90, "the Job suspended again")
        wait_for(lambda: not gang.pods(), 60, "the gang's pods gone")
        assert gang.trainer_started == [] and gang.preflight_said == set()
        # held off by the agent's taint (the only one the pods do not tolerate)
        unscheduled = [e for e in gang.core.list_namespaced_event("default").items
                       if e.reason == "FailedScheduling"
                       and e.involved_object.name.startswith("held-")]
        assert unscheduled and all("untolerated taint" in e.message for e in unscheduled)


def test_the_agent_image_runs_as_the_daemonsets_pod_and_lifts_the_boot_taint(
        cluster: tuple[ApiServer, ControlPlane], agent_node: Node, registry: Registry,
        pushed_image: str, agent_image: Image, tmp_path: Path) -> None:
    server, plane = cluster
    admin = server.client("admin")
    core = k8s.CoreV1Api(admin)
    assert any(t.key == KEY for t in core.read_node("node-a").spec.taints or [])
    for obj in rendered(pushed_image, server, agent_node, tmp_path):
        k8s_utils.create_from_dict(admin, obj)

    def running() -> Any:
        for pod in core.list_namespaced_pod(NS, label_selector=LABEL).items:
            statuses = pod.status.container_statuses or []
            if pod.spec.node_name == "node-a" and statuses and statuses[0].state.running:
                return pod
        return None
    try:
        pod = wait_for(running, 180, "the DaemonSet's agent pod running on node-a")

        def published() -> Any:
            node = core.read_node("node-a")
            ready = {c.type: c for c in node.status.conditions or []}.get("FabricReady")
            untainted = not any(t.key == KEY for t in node.spec.taints or [])
            return node if ready is not None and ready.status == "True" and untainted \
                else None
        node = wait_for(published, 120, "the agent's conditions on node-a, the taint lifted")
    except Exception as exc:
        raise AssertionError(f"{exc}\n{diagnosis(server, agent_node, plane)}") from exc

    # Made by the DaemonSet controller, bound by the scheduler, pulled from the registry.
    (owner,) = pod.metadata.owner_references
    assert (owner.kind, owner.name, owner.controller) == ("DaemonSet", "nodeagent", True)
    assert pod.spec.affinity.node_affinity is not None, "the controller's node affinity"
    assert pod.status.container_statuses[0].image_id == \
        f"{registry.host}/public/nodeagent@{agent_image.index_digest}"
    assert pod.spec.service_account_name == "nodeagent"
    # What the agent published, as `kubectl describe node` shows it.
    conditions = {c.type: (c.status, c.reason) for c in node.status.conditions}
    assert conditions["FabricReady"] == ("True", "AllConditionsPassed")
    assert conditions["RoCENetworkReady"] == ("True", "NotConfigured")  # no rails here
    assert conditions["RDMADevicePluginReady"] == ("True", "PluginReady")
    plugin = next(c for c in node.status.conditions if c.type == "RDMADevicePluginReady")
    # read through the DaemonSet's mount of containerd's content store
    assert "pulled image linux/amd64 verified by the runtime" in plugin.message
    assert conditions["Ready"][0] == "True", "the kubelet's own condition stays beside them"


@contextlib.contextmanager
def status_writer(run: Path, data: dict[str, Any]) -> Iterator[None]:
    """The agent's status file in `run` as the daemon keeps it: written by its own writer
    every few seconds, its lock held."""
    from nodeagent.publish.status import DaemonLock, write_status

    lock = DaemonLock(run)
    lock.acquire()
    done = threading.Event()

    def passes() -> None:
        while not done.is_set():
            write_status(run, data, {"state": "running", "resync_interval": 30})
            done.wait(5)
    writer = threading.Thread(target=passes, daemon=True)
    writer.start()
    try:
        yield
    finally:
        done.set()
        writer.join()
        lock.release()


def fabric_sysfs(tmp_path: Path, rails: dict[str, str]) -> Path:
    """What a container's /sys shows of soft-RoCE rails (this host's own /sys has none):
    /sys/class/infiniband_verbs/uverbsN/ibdev naming each device
    (drivers/infiniband/core/uverbs_main.c, ibdev_show), and each device's port 1 as rxe
    shows it (ACTIVE, Ethernet, no PCI function; GIDs fe80 v1/v2 at 0/1, the rail's IPv4
    pair at 2/3: drivers/infiniband/core/sysfs.c and roce_gid_mgmt.c)."""
    from tests.kit.helpers import make_gid_tree, make_port_tree, roce_entries

    sysfs = tmp_path / "sys"
    for n, (device, address) in enumerate(rails.items()):
        verbs = sysfs / "class" / "infiniband_verbs" / f"uverbs{n}"
        verbs.mkdir(parents=True)
        (verbs / "ibdev").write_text(f"{device}\n")
        make_gid_tree(sysfs, device, roce_entries(f"ens{n + 4}", address))
        make_port_tree(sysfs, device, rate="10 Gb/sec (1X QDR)", hca_type="", pcie=None)
    return sysfs


def test_preflight_passes_with_the_device_the_plugin_hands_and_the_trainer_runs(
        cluster: tuple[ApiServer, ControlPlane], agent_node: Node, pushed_image: str,
        tmp_path: Path) -> None:
    """The positive path on the real kubelet: the pod requests the RDMA resource, the test
    device plugin's allocation hands its init container /dev/infiniband/uverbs0 (a real
    DeviceSpec through containerd and runc), the node's agent says FabricReady=True with a
    rail on rxe0 pinned at index 3, and the NCCL settings name that device and index. The
    preflight opens the device and exits 0, and the trainer runs to completion."""
    from nodeagent.model.conditions import FABRIC_READY, Finding
    from nodeagent.model.status import Report

    server, plane = cluster
    core = k8s.CoreV1Api(server.client("admin"))
    run = tmp_path / "run"
    sysfs = fabric_sysfs(tmp_path, {"rxe0": "10.10.0.5"})
    report = Report("node-a", [Finding(FABRIC_READY, "True", "AllConditionsPassed",
                                       "every fabric condition passes")]).as_dict()
    report["rails"] = [{"name": "rail0", "address": "10.10.0.5/24", "rdma_device": "rxe0",
                        "rdma_port": 1, "gid_index_pinned": 3}]
    limits = {"resources": {"limits": {RESOURCE: "1"}}}
    nccl = [{"name": "NCCL_IB_HCA", "value": "=rxe0:1"},
            {"name": "NCCL_IB_GID_INDEX", "value": "3"}]
    spec = {
        "nodeName": "node-a", "restartPolicy": "Never", "hostNetwork": True,
        "tolerations": [{"operator": "Exists"}],
        "initContainers": [{
            "name": "nodeagent-preflight", "image": pushed_image, **limits, "env": nccl,
            "args": ["preflight", "--resource", RESOURCE, "--sysfs", "/fabric-sys"],
            "volumeMounts": [
                {"name": "run", "mountPath": "/run/nodeagent", "readOnly": True},
                {"name": "sys", "mountPath": "/fabric-sys", "readOnly": True}]}],
        "containers": [{"name": "trainer", "image": pushed_image, "args": ["--version"],
                        **limits, "env": nccl}],
        "volumes": [{"name": "run", "hostPath": {"path": str(run), "type": "Directory"}},
                    {"name": "sys", "hostPath": {"path": str(sysfs), "type": "Directory"}}]}
    pod = {"metadata": {"name": "train-fit"}, "spec": spec}
    with contextlib.ExitStack() as stack:
        stack.enter_context(status_writer(run, report))
        core.create_namespaced_pod("default", pod)  # type: ignore[arg-type]

        def delete_pod() -> None:
            with contextlib.suppress(k8s.ApiException):
                core.delete_namespaced_pod("train-fit", "default", grace_period_seconds=0)
        stack.callback(delete_pod)

        def ended() -> Any:
            got = core.read_namespaced_pod("train-fit", "default").status
            return got if got.phase in ("Succeeded", "Failed") else None
        try:
            status = wait_for(ended, 180, "the pod to end")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnosis(server, agent_node, plane)}") from exc
        init = status.init_container_statuses[0].state.terminated
        assert (init.exit_code, init.message) == (
            0, "preflight: fit (NCCL: IB on rxe0:1 GID 3; TC 0, SL 0)\n"), init
        assert status.phase == "Succeeded", status
        trainer = status.container_statuses[0].state.terminated
        assert trainer is not None and trainer.exit_code == 0, trainer


def test_preflight_refuses_a_job_whose_nccl_settings_use_one_of_two_rails(
        cluster: tuple[ApiServer, ControlPlane], agent_node: Node, pushed_image: str,
        tmp_path: Path) -> None:
    """Two rails (rxe0, rxe1), both devices handed by the plugin, the node FabricReady;
    the job's NCCL_IB_HCA=rxe0 selects one of them, which NCCL would run on at half the
    bandwidth without an error. The init container exits 1 with the line (Init:Error, the
    trainer never starts); the same pod with --allow-partial-rails passes."""
    from nodeagent.model.conditions import FABRIC_READY, Finding
    from nodeagent.model.status import Report

    server, plane = cluster
    core = k8s.CoreV1Api(server.client("admin"))
    run = tmp_path / "run"
    sysfs = fabric_sysfs(tmp_path, {"rxe0": "10.10.0.5", "rxe1": "10.11.0.5"})
    report = Report("node-a", [Finding(FABRIC_READY, "True", "AllConditionsPassed",
                                       "every fabric condition passes")]).as_dict()
    report["rails"] = [{"name": f"rail{n}", "address": f"10.1{n}.0.5/24",
                        "rdma_device": f"rxe{n}", "rdma_port": 1, "gid_index_pinned": 3}
                       for n in (0, 1)]
    limits = {"resources": {"limits": {RESOURCE: "1"}}}
    nccl = [{"name": "NCCL_IB_HCA", "value": "rxe0"}]

    def pod(name: str, *extra: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {
            "nodeName": "node-a", "restartPolicy": "Never", "hostNetwork": True,
            "tolerations": [{"operator": "Exists"}],
            "initContainers": [{
                "name": "nodeagent-preflight", "image": pushed_image, **limits, "env": nccl,
                "args": ["preflight", "--resource", RESOURCE, "--sysfs", "/fabric-sys",
                         *extra],
                "volumeMounts": [
                    {"name": "run", "mountPath": "/run/nodeagent", "readOnly": True},
                    {"name": "sys", "mountPath": "/fabric-sys", "readOnly": True}]}],
            "containers": [{"name": "trainer", "image": pushed_image, "args": ["--version"],
                            **limits, "env": nccl}],
            "volumes": [
                {"name": "run", "hostPath": {"path": str(run), "type": "Directory"}},
                {"name": "sys", "hostPath": {"path": str(sysfs), "type": "Directory"}}]}}
    names = ("train-one-rail", "train-one-rail-allowed")
    with contextlib.ExitStack() as stack:
        stack.enter_context(status_writer(run, report))
        for name, extra in zip(names, ((), ("--allow-partial-rails",)), strict=True):
            core.create_namespaced_pod("default", pod(name, *extra))  # type: ignore[arg-type]

        def delete_pods() -> None:
            for name in names:
                with contextlib.suppress(k8s.ApiException):
                    core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        stack.callback(delete_pods)

        def ended() -> Any:
            got = [core.read_namespaced_pod(n, "default").status for n in names]
            return got if all(g.phase in ("Succeeded", "Failed") for g in got) else None
        try:
            refused, allowed = wait_for(ended, 180, "both pods to end")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnosis(server, agent_node, plane)}") from exc
        init = refused.init_container_statuses[0].state.terminated
        assert (init.exit_code, init.reason, init.message) == (
            1, "Error", "preflight: nccl: NCCL would use 1 of 2 rails, not rail1 (rxe1:1) "
            "(rxe1:1 is not in NCCL_IB_HCA=rxe0): the job trains at a fraction of the "
            "bandwidth; select every rail, or pass --allow-partial-rails\n"), init
        trainer = refused.container_statuses[0].state
        assert trainer.running is None and trainer.terminated is None, trainer
        assert refused.phase == "Failed", refused
        init = allowed.init_container_statuses[0].state.terminated
        assert (init.exit_code, init.message) == (
            0, "preflight: fit (NCCL: IB on rxe0:1 GID 3; TC 0, SL 0)\n"), init
        assert allowed.phase == "Succeeded", allowed


def test_preflight_in_an_init_container_keeps_the_trainer_from_starting(
        cluster: tuple[ApiServer, ControlPlane], agent_node: Node, pushed_image: str,
        tmp_path: Path) -> None:
    """`nodeagent preflight` from the agent's image as the init container of an Indexed
    Job's pod on the real kubelet: no RDMA device in the container (the pod does not
    request the resource), a node whose agent says FabricReady=False (its status file,
    written by the agent's own writer and its lock held as the daemon holds it, mounted
    read-only) and an NCCL variable that forces sockets. It exits 1, the termination
    message names each with its fix, the trainer never starts, and the Job fails whole
    (backoffLimit 0: the real job controller sees the pod fail)."""
    from nodeagent.model.conditions import FABRIC_READY, Finding
    from nodeagent.model.status import Report

    server, plane = cluster
    core = k8s.CoreV1Api(server.client("admin"))
    run = tmp_path / "run"
    report = Report("node-a", [Finding(FABRIC_READY, "False", "RuleMissing",
                                       "RoCENetworkReady=False (RuleMissing)")])
    batch = k8s.BatchV1Api(server.client("admin"))

    def delete_job() -> None:
        with contextlib.suppress(k8s.ApiException):
            batch.delete_namespaced_job("train", "default", propagation_policy="Background")
    with status_writer(run, report.as_dict()), contextlib.ExitStack() as cleanup:
        cleanup.callback(delete_job)
        spec = {
            # The host's network, as a RoCE training pod has it (and the only one this node
            # gives: its CNI is loopback alone).
            "nodeName": "node-a", "restartPolicy": "Never", "hostNetwork": True,
            "tolerations": [{"operator": "Exists"}],
            "initContainers": [{
                "name": "nodeagent-preflight", "image": pushed_image,
                "args": ["preflight", "--resource", RESOURCE],
                "env": [{"name": "NCCL_NET", "value": "Socket"}],
                "volumeMounts": [{"name": "run", "mountPath": "/run/nodeagent",
                                  "readOnly": True}]}],
            "containers": [{"name": "trainer", "image": pushed_image, "args": ["--version"]}],
            "volumes": [{"name": "run", "hostPath": {"path": str(run), "type": "Directory"}}]}
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
               "spec": {"completionMode": "Indexed", "completions": 1, "parallelism": 1,
                        "backoffLimit": 0, "template": {"spec": spec}}}
        batch.create_namespaced_job("default", job)  # type: ignore[arg-type]

        def finished() -> Any:
            pods = core.list_namespaced_pod("default", label_selector="job-name=train").items
            got = pods[0].status if pods else None
            init = ((got.init_container_statuses or [None])[0]) if got else None
            return got if init is not None and init.state.terminated else None
        try:
            status = wait_for(finished, 180, "the preflight init container to finish")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnosis(server, agent_node, plane)}") from exc
        done = status.init_container_statuses[0].state.terminated
        assert done.exit_code == 1, done
        lines = done.message.splitlines()
        assert lines == [
            f"preflight: devices: no RDMA device in this container: request {RESOURCE} in "
            "resources.limits",
            "preflight: node: node node-a is not fabric-ready: FabricReady (RuleMissing): "
            "RoCENetworkReady=False (RuleMissing)",
            "preflight: nccl: NCCL would use TCP sockets, not the rails: NCCL_NET=Socket forces "
            "TCP sockets: remove it, or set NCCL_NET=IB"], done
        trainer = status.container_statuses[0]
        assert trainer.state.running is None and trainer.state.terminated is None, trainer

        def pod_failed() -> bool:  # the kubelet reports the phase a moment later
            pods = core.list_namespaced_pod("default", label_selector="job-name=train").items
            return bool(pods) and pods[0].status.phase == "Failed"
        wait_for(pod_failed, 60, "the pod Failed")

        def job_failed() -> Any:
            got = batch.read_namespaced_job("train", "default").status
            return next((c for c in got.conditions or [] if c.type == "Failed"
                         and c.status == "True"), None)
        failed = wait_for(job_failed, 120, "the Job failed")
        assert failed.reason == "BackoffLimitExceeded", failed
        assert batch.read_namespaced_job("train", "default").status.succeeded in (None, 0)


def test_kueue_evicts_and_requeues_a_gang_whose_preflight_fails_never_half_running(
        cluster: tuple[ApiServer, ControlPlane], agent_node: Node, kueue: Kueue,
        pushed_image: str, tmp_path: Path) -> None:
    """Both pods of a queued gang placed on node-a (they tolerate the agent's taint: this
    case is about the preflight), whose agent says FabricReady=True, neither pod requesting
    the RDMA resource: each pod's preflight exits 1 naming it, again and again
    (restartPolicy OnFailure), so no pod ever becomes Ready and no trainer ever starts.
    Kueue evicts the whole gang (PodsReadyTimeout), its pods are deleted, it is requeued and
    admitted again once, then deactivated (requeuing limit 1): never half-running."""
    from nodeagent.model.conditions import FABRIC_READY, Finding
    from nodeagent.model.status import Report

    server, plane = cluster
    gang = Gang(server, "gated")
    run = tmp_path / "run"
    healthy = Report("node-a", [Finding(FABRIC_READY, "True", "AllConditionsPassed",
                                        "every fabric condition passes")]).as_dict()
    with status_writer(run, healthy), explained(gang, kueue, server, agent_node, plane):
        gang.batch.create_namespaced_job("default", gang_job(  # type: ignore[arg-type]
            "gated", pushed_image, [{"key": KEY, "operator": "Exists"}], run))
        wait_for(lambda: gang.condition("Admitted"), 60, "the gang admitted")
        wait_for(lambda: gang.pods() and gang.preflight_said, 120,
                 "a preflight's verdict in its pod's termination message")
        assert gang.preflight_said == {
            f"preflight: devices: no RDMA device in this container: request {RESOURCE} in "
            "resources.limits\npreflight: nccl: NCCL would use TCP sockets, not the rails: no "
            "ACTIVE RDMA port here: NCCL falls back to TCP sockets without an error; request "
            "the RDMA resource\n"}, \
            gang.preflight_said

        def requeued() -> Any:
            wl = gang.workload() or {}
            count = wl.get("status", {}).get("requeueState", {}).get("count", 0)
            return count >= 1 and gang.condition("Admitted")
        wait_for(requeued, 120, "the gang evicted, requeued and admitted again")

        def deactivated() -> Any:
            wl = gang.workload() or {}
            return wl.get("spec", {}).get("active") is False and gang.condition("Evicted")
        evicted = wait_for(deactivated, 120, "the gang deactivated after its second eviction")
        assert evicted["reason"] == "DeactivatedDueToRequeuingLimitExceeded", evicted
        wait_for(gang.suspended, 30, "the Job suspended")
        wait_for(lambda: not gang.pods(), 60, "the gang's pods gone")
        assert gang.trainer_started == [], f"trainers ran: {gang.trainer_started}"
