"""A GID that moves with no netlink event: time to the taint on a real apiserver.

The daemon runs in a namespace with two veth rails whose GID tables are fixture trees;
each round rewrites rail1's table in place (its IPv4 RoCE v2 GID from index 3 to 7, the
way the kernel's asynchronous GID work or a driver can change it without any netlink
message), then puts it back. Measured: the in-place change -> the taint seen by a watching
client (p50/p99), and back -> the taint lifted (clear_after 0). resync_interval is an hour,
so only the GID slot watcher can see it.

Usage: sudo .venv/bin/python bench/gid_shift.py [--count 50]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import netns_rails, summary
from kube_publish import TaintWatcher, start_server

from tests.kit.helpers import (
    LoopbackBridge,
    make_gid_tree,
    new_netns,
    read_status,
    roce_entries,
    stop_daemon,
    wait_for,
    write_config,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=50)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nodeagent-bench-gid-"))
    server = start_server(["node-a"])
    ns = new_netns()
    try:
        watcher = TaintWatcher(server)
        watcher.start()
        watcher.ready.wait()
        sysfs = tmp / "sys"
        rails = netns_rails(ns, sysfs)
        cfg = write_config(tmp / "c.yaml", {
            "node_name": "node-a", "paths": {"sysfs": str(sysfs)},
            "state_dir": str(tmp / "state"), "runtime_dir": str(tmp / "run"),
            "resync_interval": "1h", "gid_repin": "never", "rails": rails,
            "kubernetes": {"kubeconfig": str(server.kubeconfig("agent-node-a",
                                                               tmp / "kubeconfig")),
                           "clear_after": "0s", "event_rate": 1000, "event_burst": 1000}})
        bridge = LoopbackBridge(ns.name, server.port)
        proc = ns.start_daemon(cfg)
        watcher.wait("node-a", False, 0, timeout=60)
        wait_for(lambda: (read_status(tmp / "run") or {}).get("ok"), timeout=30)
        to_taint, to_lift = [], []
        for _ in range(args.count):
            time.sleep(0.3)
            t0 = time.monotonic()
            make_gid_tree(sysfs, "mlx5_1", roce_entries("r1", "10.11.0.5", ipv4_index=6))
            to_taint.append(1000 * (watcher.wait("node-a", True, t0) - t0))
            time.sleep(0.3)
            t1 = time.monotonic()
            make_gid_tree(sysfs, "mlx5_1", roce_entries("r1", "10.11.0.5"))
            to_lift.append(1000 * (watcher.wait("node-a", False, t1) - t1))
        status = read_status(tmp / "run") or {}
        print(f"{args.count} in-place GID moves, no netlink event, resync 1h "
              f"(daemon passes {status.get('daemon', {}).get('passes')})")
        print(summary("GID moved -> taint", to_taint))
        print(summary("GID back -> taint lifted", to_lift))
        stop_daemon(proc)
        bridge.close()
    finally:
        ns.delete()
        server.stop()


if __name__ == "__main__":
    main()
