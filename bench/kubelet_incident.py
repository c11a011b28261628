"""The wrong-architecture incident on a real kubelet, timed: plugin pod created -> the agent's
ImageArchMismatch on the Node, and a kubelet restart -> resource gone -> back, as a timeline.

Starts the test apiserver, containerd and a kubelet (tests/kit/kubelet.py), the test device
plugin as the DaemonSet's pod, and the agent in a netns with two veth rails. Each round puts a
good plugin pod in place, waits for a healthy node, then replaces it with the arm64 one and
times pod creation -> ImageArchMismatch on the Node (as a client polling the Node sees it).

Usage: sudo .venv/bin/python bench/kubelet_incident.py [--count 10]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import netns_rails, summary
from kubernetes import client as k8s

from tests.kit.apiserver import start_apiserver, wait_policy_enforced
from tests.kit.helpers import (
    LoopbackBridge,
    new_netns,
    stop_daemon,
    wait_for,
    write_config,
)
from tests.kit.kubelet import Node
from tests.kit.rdma_plugin import (
    ARM64,
    BOOT,
    DEVICES,
    DS,
    GOOD,
    NS,
    RESOURCE,
    allocatable,
    condition,
    delete_plugin_pods,
    our_taint,
    run_plugin,
    start_plugin_node,
)

PLUGIN = "RDMADevicePluginReady"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=10)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nodeagent-bench-kubelet-"))
    server = start_apiserver(tmp / "api")
    node = Node(server, tmp / "node", "node-a", taint=BOOT)
    ns = new_netns()
    try:
        wait_policy_enforced(server)
        core = k8s.CoreV1Api(server.client("admin"))
        t0 = time.monotonic()
        start_plugin_node(node, core)
        print(f"node up (containerd, images, kubelet registered): {time.monotonic() - t0:.1f} s")
        sysfs = tmp / "sys"
        rails = netns_rails(ns, sysfs)
        ns.ip("link", "set", "lo", "up")
        cfg = write_config(tmp / "c.yaml", {
            "node_name": "node-a", "paths": {"sysfs": str(sysfs)},
            "state_dir": str(tmp / "state"), "runtime_dir": str(tmp / "run"),
            "resync_interval": "1h", "rails": rails,
            "kubernetes": {"kubeconfig": str(server.kubeconfig("agent-node-a",
                                                               tmp / "kubeconfig")),
                           "clear_after": "1s", "lease_period": "2s"},
            "device_plugin": {"namespace": NS, "daemonset": DS, "resource": RESOURCE,
                              "min_allocatable": DEVICES, "registry": {"timeout": "2s"},
                              "runtime": {"content_store": str(node.content_root),
                                          "pod_logs": str(node.pod_logs)}}})
        bridge = LoopbackBridge(ns.name, server.port)
        proc = ns.start_daemon(cfg)
        to_mismatch = []
        for _ in range(args.count):
            run_plugin(server, GOOD)
            wait_for(lambda: our_taint(core) is None
                     and condition(core, PLUGIN).get("reason") == "PluginReady", 90, "healthy")
            delete_plugin_pods(core)  # the rollout's deletion is not the agent's time
            t = time.monotonic()
            run_plugin(server, ARM64)
            wait_for(lambda: condition(core, PLUGIN).get("reason") == "ImageArchMismatch", 90,
                     "ImageArchMismatch")
            to_mismatch.append(1000 * (time.monotonic() - t))
        print(summary("arm64 plugin pod created -> ImageArchMismatch on the Node", to_mismatch))

        run_plugin(server, GOOD)
        wait_for(lambda: our_taint(core) is None and allocatable(core) == DEVICES, 90, "healthy")
        timeline: list[tuple[float, str, int, bool]] = []
        t = time.monotonic()
        node.stop_kubelet()
        node.start_kubelet()
        while time.monotonic() - t < 30:
            row = (round(time.monotonic() - t, 2), str(condition(core, PLUGIN).get("reason")),
                   allocatable(core), our_taint(core) is not None)
            if not timeline or row[1:] != timeline[-1][1:]:
                timeline.append(row)
            if len(timeline) > 1 and row[1:] == ("PluginReady", DEVICES, False):
                break
            time.sleep(0.05)
        print("kubelet restart (plugin re-registers 3 s after the kubelet's socket returns), "
              "clear_after 1s:")
        for s, reason, alloc, tainted in timeline:
            print(f"  +{s:5.2f} s  {reason:24} allocatable {alloc}  "
                  f"{'tainted' if tainted else 'untainted'}")
        stop_daemon(proc)
        bridge.close()
    finally:
        ns.delete()
        node.stop()
        server.stop()


if __name__ == "__main__":
    main()
