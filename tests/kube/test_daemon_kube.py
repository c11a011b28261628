"""The whole daemon: a real kernel (netns rails) and a real API server together."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from test_publisher import BOOT, KEY, our_taint

from tests.kit.apiserver import ApiServer, node_json
from tests.kit.helpers import (
    LoopbackBridge,
    Netns,
    read_status,
    stop_daemon,
    wait_for,
    write_config,
)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (the daemon runs under `ip netns
    exec`, which execs it: the pid is the daemon's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_daemon_publishes_taints_on_faults_and_survives_restarts(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path,
) -> None:
    node = fresh_node("node-c", [BOOT])  # kubelet registerWithTaints: fail closed
    agent_config["node_name"] = node
    agent_config["resync_interval"] = "1h"
    agent_config["kubernetes"] = {
        "kubeconfig": str(apiserver.kubeconfig("agent-node-c", tmp_path / "kubeconfig")),
        "clear_after": "1s", "lease_period": "2s"}
    cfg = write_config(tmp_path / "c.yaml", agent_config)
    runtime = Path(agent_config["runtime_dir"])
    rails_ns.ip("link", "set", "lo", "up")
    bridge = LoopbackBridge(rails_ns.name, apiserver.port)  # the daemon lives in the netns

    time.sleep(1.5)  # no agent running: nothing lifts the boot taint
    assert our_taint(core, node) is not None

    proc = rails_ns.start_daemon(cfg)
    wait_for(lambda: our_taint(core, node) is None, timeout=30, what="first healthy pass + dwell")
    conds = {c["type"]: c for c in node_json(core, node)["status"]["conditions"]}
    assert conds["FabricReady"]["status"] == "True"
    # Healthy and quiet: the daemon sleeps. (A status rewrite that resubmitted itself to the
    # publisher once spun a whole core here, forever, with every test still green.)
    time.sleep(1.0)
    cpu_before = cpu_seconds(proc.pid)
    time.sleep(3.0)
    busy = cpu_seconds(proc.pid) - cpu_before
    assert busy < 1.0, f"an idle daemon used {busy:.2f} s of CPU in 3 s"

    rails_ns.ip("link", "set", "p0", "down")  # carrier loss: not repairable, so a fault
    wait_for(lambda: (our_taint(core, node) or {}).get("value") == "NoCarrier", what="taint")

    def transitions() -> tuple[str | None, str | None]:
        """RoCENetworkReady=False: since when, says the status file; and the Node."""
        local = next((c.get("since") for c in (read_status(runtime) or {}).get("conditions", [])
                      if c["type"] == "RoCENetworkReady" and c["status"] == "False"), None)
        remote = next((c.get("lastTransitionTime") for c in node_json(core, node)["status"]
                       ["conditions"] if c["type"] == "RoCENetworkReady"
                       and c["status"] == "False"), None)
        return local, remote

    # One record of transition times: the Node says what the status file says.
    local, remote = wait_for(lambda: (t := transitions())[0] and t[1] and t,
                             what="RoCENetworkReady False in the status file and on the Node")
    assert local == remote

    proc.kill()  # crash while tainted
    proc.wait()
    time.sleep(1.5)
    assert (our_taint(core, node) or {}).get("value") == "NoCarrier"
    proc = rails_ns.start_daemon(cfg)
    wait_for(lambda: (read_status(runtime) or {}).get("daemon", {}).get("passes", 0) >= 1
             and (read_status(runtime) or {}).get("daemon", {}).get("pid") == proc.pid,
             timeout=20, what="restarted daemon's first pass")
    time.sleep(1.5)
    assert (our_taint(core, node) or {}).get("value") == "NoCarrier"  # no flap on restart

    rails_ns.ip("link", "set", "p0", "up")
    wait_for(lambda: our_taint(core, node) is None, what="lifted after healthy + dwell")
    # The status file follows the Kubernetes side shortly after (no pass needed).
    wait_for(lambda: (read_status(runtime) or {}).get("kubernetes", {}).get("tainted") is False,
             what="status file shows the taint lifted")
    status = read_status(runtime)
    assert status is not None and status["kubernetes"]["synced"] is True
    code, out = stop_daemon(proc)
    assert code == 0, out
    lease = k8s.CoordinationV1Api(apiserver.client("admin")).read_namespaced_lease(
        f"nodeagent-{node}", "nodeagent-system")
    assert lease.spec.holder_identity == node
    assert json.loads(json.dumps(status))["ok"] is True
    assert KEY not in [t["key"] for t in node_json(core, node)["spec"].get("taints") or []]
    bridge.close()


def test_daemon_reads_the_device_plugin_off_the_loop(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path,
) -> None:
    node = fresh_node("node-c", [BOOT])
    agent_config["node_name"] = node
    agent_config["resync_interval"] = "1h"
    agent_config["device_plugin"] = {"daemonset": "no-such-plugin", "interval": "0.5s"}
    agent_config["kubernetes"] = {
        "kubeconfig": str(apiserver.kubeconfig("agent-node-c", tmp_path / "kubeconfig")),
        "clear_after": "1s"}
    runtime = Path(agent_config["runtime_dir"])
    rails_ns.ip("link", "set", "lo", "up")
    bridge = LoopbackBridge(rails_ns.name, apiserver.port)
    proc = rails_ns.start_daemon(write_config(tmp_path / "c.yaml", agent_config))

    def plugin() -> str:
        conds = (read_status(runtime) or {}).get("conditions") or []
        return next((c["reason"] for c in conds if c["type"] == "RDMADevicePluginReady"), "")

    wait_for(lambda: plugin() == "DaemonSetMissing", timeout=20, what="the plugin's verdict")
    wait_for(lambda: (our_taint(core, node) or {}).get("value") == "DaemonSetMissing",
             what="the node tainted with it")
    assert rails_ns.addresses("r0") == ["10.10.0.5/24"]  # the rails were repaired meanwhile
    code, out = stop_daemon(proc)
    assert code == 0, out
    bridge.close()


def test_a_gid_moved_without_any_event_taints_the_node(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path,
) -> None:
    """The GID table changes in place, with no netlink traffic at all: the slot watcher sees
    it (not the resync, set to an hour here), the condition turns and the taint follows."""
    from tests.kit.helpers import make_gid_tree, roce_entries

    node = fresh_node("node-c", [BOOT])
    agent_config["node_name"] = node
    agent_config["resync_interval"] = "1h"
    agent_config["gid_repin"] = "never"
    agent_config["kubernetes"] = {
        "kubeconfig": str(apiserver.kubeconfig("agent-node-c", tmp_path / "kubeconfig")),
        "clear_after": "1s"}
    cfg = write_config(tmp_path / "c.yaml", agent_config)
    runtime = Path(agent_config["runtime_dir"])
    rails_ns.ip("link", "set", "lo", "up")
    bridge = LoopbackBridge(rails_ns.name, apiserver.port)
    proc = rails_ns.start_daemon(cfg)
    wait_for(lambda: our_taint(core, node) is None, timeout=30, what="healthy and untainted")
    passes = read_status(runtime)["daemon"]["passes"]  # type: ignore[index]

    make_gid_tree(Path(agent_config["paths"]["sysfs"]), "mlx5_1",
                  roce_entries("r1", "10.11.0.5", ipv4_index=6))  # rail1: index 3 -> 7
    wait_for(lambda: (our_taint(core, node) or {}).get("value") == "GIDIndexShifted",
             timeout=10, what="the taint for a GID that moved with no event")
    # The condition follows the taint (the taint is written first: it keeps pods off).
    gid = wait_for(lambda: next((c for c in node_json(core, node)["status"]["conditions"]
                                 if c["type"] == "RoCEGIDStable"
                                 and c["reason"] == "GIDIndexShifted"), None),
                   what="RoCEGIDStable GIDIndexShifted on the Node")
    assert "index 7, pinned 3" in gid["message"]
    status = read_status(runtime)
    assert status is not None and status["daemon"]["passes"] > passes

    make_gid_tree(Path(agent_config["paths"]["sysfs"]), "mlx5_1",
                  roce_entries("r1", "10.11.0.5"))  # back on its pin
    wait_for(lambda: our_taint(core, node) is None, timeout=10, what="lifted once back")
    code, out = stop_daemon(proc)
    assert code == 0, out
    bridge.close()
