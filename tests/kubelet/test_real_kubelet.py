"""The device-plugin story on a real kubelet, containerd and runc: boot fail-closed, the
wrong-architecture incident, the fix rolling out, a kubelet restart, and both writers of
`status.conditions` side by side. Every pod status, allocatable and log line here is the
real stack's, not the test's.

The tests share node-a (one kubelet) and run in file order, as the story does; each sets
the plugin pod it needs itself.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from tests.kit.apiserver import ApiServer
from tests.kit.helpers import (
    LoopbackBridge,
    Netns,
    read_status,
    stop_daemon,
    wait_for,
    write_config,
)
from tests.kit.kubelet import Node, host_traces
from tests.kit.rdma_plugin import (
    ARM64,
    DEVICES,
    GOOD,
    MISLABELED,
    RESOURCE,
    allocatable,
    condition,
    ensure_default_service_account,
    node_json,
    our_taint,
    run_plugin,
)
from tests.kubelet.conftest import METRICS_PORT

PLUGIN = "RDMADevicePluginReady"
RULES = Path(__file__).resolve().parents[2] / "deploy" / "alerts" / "nodeagent-rules.yaml"


@pytest.fixture
def agent(apiserver: ApiServer, node: Node, rails_ns: Netns, agent_settings: dict[str, Any],
          tmp_path: Path) -> Iterator[Any]:
    rails_ns.ip("link", "set", "lo", "up")
    bridge = LoopbackBridge(rails_ns.name, apiserver.port)
    proc = rails_ns.start_daemon(write_config(tmp_path / "agent.yaml", agent_settings))
    try:
        yield proc
    finally:
        code, out = stop_daemon(proc)
        bridge.close()
        assert code == 0, out


def plugin_reason(core: k8s.CoreV1Api) -> str | None:
    return condition(core, PLUGIN).get("reason")


def settled(agent_settings: dict[str, Any]) -> None:
    """Wait until this test's agent has judged the plugin and the Node says so: until then
    the Node shows what the previous test's agent left."""
    def done() -> bool:
        status = read_status(Path(agent_settings["runtime_dir"])) or {}
        plugin = next((c for c in status.get("conditions", []) if c["type"] == PLUGIN), {})
        return plugin.get("reason") not in (None, "NotYetChecked") and bool(
            status.get("kubernetes", {}).get("synced"))
    wait_for(done, 60, "the agent's first judgement of the plugin, published")


def test_a_node_leaves_nothing_on_the_host(apiserver: ApiServer, core: k8s.CoreV1Api,
                                           tmp_path: Path) -> None:
    """containerd, the kubelet and a running pod, then teardown: no process, mount, cgroup,
    sysctl change, plugin socket or log link left (compared with before). First in the file:
    node-a (the session's node) would share the host's cgroups and plugin directory."""
    other = Node(apiserver, tmp_path / "node", "node-b")
    before = host_traces(other.workdir)
    try:
        other.start()
        other.import_image("nodeagent.test/idle:1", "pause")
        other.wait_registered(core)
        ensure_default_service_account(core, "default")
        core.create_namespaced_pod("default", {  # type: ignore[arg-type]
            "metadata": {"name": "idle"},
            # hostNetwork: a loopback-only CNI gives a pod no address (containerd refuses it)
            "spec": {"nodeName": "node-b", "automountServiceAccountToken": False,
                     "hostNetwork": True,
                     "containers": [{"name": "idle", "image": "nodeagent.test/idle:1",
                                     "imagePullPolicy": "Never"}]}})
        wait_for(lambda: any(c.type == "Ready" and c.status == "True" for c in
                             core.read_namespaced_pod("idle", "default").status.conditions
                             or []), 60, "the pod running")
        during = host_traces(other.workdir)
        assert during["processes"] and during["mounts"]  # the comparison can fail
    finally:
        other.stop()
    assert host_traces(other.workdir) == before


def test_boot_fails_closed_until_rails_plugin_and_resource_hold(
        core: k8s.CoreV1Api, apiserver: ApiServer, node: Node, agent: Any) -> None:
    # The kubelet registered the node with the fabric taint; nothing has lifted it.
    assert (our_taint(core) or {}).get("value") == "AgentStarting"
    wait_for(lambda: plugin_reason(core) == "PluginPodMissing", 30,
             "the agent to say the plugin pod is missing")
    assert our_taint(core) is not None  # rails are fine, the plugin is not: still tainted

    seen: list[tuple[float, bool, int]] = []  # (time, tainted, allocatable) as watched

    def lifted() -> bool:
        tainted, alloc = our_taint(core) is not None, allocatable(core)
        seen.append((time.monotonic(), tainted, alloc))
        return not tainted

    run_plugin(apiserver, GOOD)
    wait_for(lifted, 60, "the taint lifted once the plugin is Ready and advertises")
    assert condition(core, PLUGIN)["status"] == "True"
    assert allocatable(core) >= DEVICES
    # Never untainted while the resource was not yet advertised.
    assert all(tainted or alloc >= DEVICES for _, tainted, alloc in seen)
    assert condition(core, "FabricReady")["status"] == "True"


def test_wrong_architecture_image_is_named_from_the_runtime(
        core: k8s.CoreV1Api, apiserver: ApiServer, node: Node, agent: Any,
        agent_settings: dict[str, Any], rails_ns: Netns) -> None:
    run_plugin(apiserver, GOOD)
    settled(agent_settings)
    wait_for(lambda: our_taint(core) is None, 60, "a healthy node first")
    started = time.monotonic()
    name = run_plugin(apiserver, ARM64)
    wait_for(lambda: plugin_reason(core) == "ImageArchMismatch", 60,
             "ImageArchMismatch on the Node")
    took = time.monotonic() - started
    # The log line can come before the container status names the pulled image's digest;
    # the runtime's platform follows with the next status.
    message = wait_for(lambda: "linux/arm64" in (m := condition(core, PLUGIN)["message"]) and m,
                       30, "the runtime's platform of the image in the message")
    # The image, what the runtime says it is built for, and the node's platform.
    assert f"{ARM64} (" in message and "linux/arm64" in message, message
    assert "linux/amd64" in message, message
    assert "exec format error" in message, message
    assert (our_taint(core) or {}).get("value") == "ImageArchMismatch"
    # The real stack's own shape of the incident: no message in the pod's status. The
    # agent can name it (from the log line) before the kubelet records the exit: wait for
    # the terminated state (CI once read the pod between the two).

    def terminated() -> list[Any] | None:
        pod = core.read_namespaced_pod(name, "kube-system")
        got = [cs.last_state.terminated or cs.state.terminated
               for cs in pod.status.container_statuses or []]
        return got if any(got) else None

    states = wait_for(terminated, 30, "the container's exit in the pod's status")
    assert all(not s.message for s in states if s), states
    print(f"pod created -> ImageArchMismatch on the Node: {took:.1f} s")
    alert_fires_on_the_agents_series(rails_ns, "ImageArchMismatch")


def scrape(ns: Netns) -> str:
    code = ("import urllib.request; print(urllib.request.urlopen("
            f"'http://127.0.0.1:{METRICS_PORT}/metrics', timeout=5).read().decode())")
    res = subprocess.run(["ip", "netns", "exec", ns.name, sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=30, check=True)
    return res.stdout


def alert_fires_on_the_agents_series(ns: Netns, reason: str) -> None:
    """promtool evaluates the generated rules over the series the agent exported just now
    (as a scrape would label them): the cannot-run alert fires after its window, not
    before."""
    instance = f"node-a:{METRICS_PORT}"
    samples = [s for fam in text_string_to_metric_families(scrape(ns))
               if fam.name == "nodeagent_condition_reason" for s in fam.samples]
    mine = [s for s in samples if s.labels["condition"] == PLUGIN]
    assert [s.labels["reason"] for s in mine] == [reason]
    series = [{"series": "nodeagent_condition_reason{" + ",".join(
        f'{k}="{v}"' for k, v in {**s.labels, "instance": instance, "job": "nodeagent"}.items())
        + "}", "values": f"{s.value:g}x10"} for s in samples]
    rule = next(r for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
                if r["alert"] == "RDMADevicePluginCannotRunOnNode")
    labels = {**mine[0].labels, "instance": instance, "job": "nodeagent", "severity": "critical"}
    fired = {"exp_labels": labels, "exp_annotations": {
        "summary": f"RDMA device plugin cannot run on {instance}: {reason}",
        "description": rule["annotations"]["description"]}}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "test.yaml"
        path.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m",
                                        "tests": [{"interval": "1m", "input_series": series,
                                                   "alert_rule_test": [
            {"eval_time": "4m", "alertname": rule["alert"], "exp_alerts": []},
            {"eval_time": "6m", "alertname": rule["alert"], "exp_alerts": [fired]}]}]}))
        res = subprocess.run([shutil.which("promtool") or "promtool", "test", "rules",
                              str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_mislabeled_image_is_caught_by_its_log(
        core: k8s.CoreV1Api, apiserver: ApiServer, node: Node, agent: Any) -> None:
    """Its config says linux/amd64 (the registry and the runtime agree it fits); its binary is
    arm64. Only the container's log line tells."""
    run_plugin(apiserver, MISLABELED)
    wait_for(lambda: plugin_reason(core) == "ImageArchMismatch"
             and MISLABELED in condition(core, PLUGIN)["message"], 60,
             "ImageArchMismatch for the mislabeled image")
    assert "exec format error" in condition(core, PLUGIN)["message"]


def test_the_fix_rolls_out_and_the_taint_is_lifted(
        core: k8s.CoreV1Api, apiserver: ApiServer, node: Node, agent: Any) -> None:
    run_plugin(apiserver, ARM64)
    wait_for(lambda: plugin_reason(core) == "ImageArchMismatch"
             and f"{ARM64} (" in condition(core, PLUGIN)["message"], 60, "the incident")
    run_plugin(apiserver, GOOD)
    wait_for(lambda: our_taint(core) is None, 60, "the taint lifted after the fix")
    assert plugin_reason(core) == "PluginReady"
    assert allocatable(core) == DEVICES


def test_kubelet_restart_drops_the_resource_until_the_plugin_registers_again(
        core: k8s.CoreV1Api, apiserver: ApiServer, node: Node, agent: Any,
        agent_settings: dict[str, Any]) -> None:
    """What a kubelet restart looks like to the agent: allocatable drops to 0 (the kubelet
    forgets every plugin), ResourceNotAdvertised, then back when the plugin re-registers.
    The agent taints at once on a failing condition and lifts only after `clear_after`: a
    restart taints the node for its length plus the dwell (documented in the README)."""
    run_plugin(apiserver, GOOD)
    settled(agent_settings)
    wait_for(lambda: our_taint(core) is None and allocatable(core) == DEVICES
             and plugin_reason(core) == "PluginReady", 60, "healthy")
    timeline: list[tuple[float, str, int, bool]] = []
    start = time.monotonic()

    def record() -> tuple[str, str, int, bool]:
        cond = condition(core, PLUGIN)
        alloc, tainted = allocatable(core), our_taint(core) is not None
        timeline.append((time.monotonic() - start, str(cond.get("reason")), alloc, tainted))
        return str(cond.get("status")), str(cond.get("message")), alloc, tainted

    def changes() -> list[tuple[float, str, int, bool]]:
        return [(round(t, 1), r, a, x) for i, (t, r, a, x) in enumerate(timeline)
                if i == 0 or (r, a, x) != timeline[i - 1][1:]]

    node.stop_kubelet()
    node.start_kubelet()
    try:
        # The reason is the first problem seen: the pod may also read not Ready for a moment
        # while the new kubelet syncs it; the missing resource is in the message either way.
        wait_for(lambda: (r := record())[0] == "False" and f"{RESOURCE}: allocatable 0" in r[1]
                 and r[3], 60, "the resource missing on the Node, and the node tainted")
        wait_for(lambda: (r := record())[0] == "True" and r[2:] == (DEVICES, False), 90,
                 "recovery after the plugin registered again")
    finally:
        print("kubelet restart timeline (s, reason, allocatable, tainted):", changes())
    # The kubelet's own node status kept flowing, and the agent's conditions stayed.
    assert condition(core, "Ready")["status"] == "True"


def test_agent_conditions_survive_the_kubelets_status_updates(
        core: k8s.CoreV1Api, apiserver: ApiServer, node: Node, agent: Any,
        agent_settings: dict[str, Any]) -> None:
    run_plugin(apiserver, GOOD)
    settled(agent_settings)
    wait_for(lambda: condition(core, "FabricReady").get("status") == "True", 60, "healthy")
    kubelet_beat = condition(core, "Ready")["lastHeartbeatTime"]
    # nodeStatusUpdateFrequency is 2 s here: wait for several kubelet writes.
    wait_for(lambda: condition(core, "Ready")["lastHeartbeatTime"] != kubelet_beat, 30,
             "a kubelet status update")
    time.sleep(5)
    types = {c["type"] for c in node_json(core)["status"]["conditions"]}
    assert {"Ready", "MemoryPressure", "FabricReady", PLUGIN, "RoCENetworkReady"} <= types
    assert condition(core, "Ready")["lastHeartbeatTime"] != kubelet_beat
