"""Daemon idle cost: RSS and CPU of `nodeagent run` with 8 healthy rails over a quiet period.

Includes its periodic resyncs (resync_interval, default 30 s). Local-only by default; with
--kubernetes the daemon also publishes to the real test apiserver (started here, in the
bench's namespace) and the API writes it makes while idle are counted too.
With --peers N each rail also has N static peers (a peers section, probed every second):
the namespace has no RDMA device, so each round ends at this node's device open, and what
is measured is the loop's share (a round delivered, judged and written every second), not
the verbs' (measure those in the lab).
Goals: local-only <= 45 MB; with kubernetes <= 60 MB; CPU <= 0.2 % of a core; peers add
<= 0.1 % of a core.
Usage: sudo .venv/bin/python bench/idle.py [--seconds 60] [--kubernetes] [--peers 4]
       [--other-devices 16] [--resync 3600]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import make_rails, reexec_in_netns

from tests.kit.helpers import make_gid_tree, roce_entries


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rails", type=int, default=8)
    ap.add_argument("--kubernetes", action="store_true",
                    help="publish to a real apiserver as well (conditions, taint, Lease)")
    ap.add_argument("--peers", type=int, default=0, help="static peers per rail")
    ap.add_argument("--other-devices", type=int, default=0,
                    help="RDMA devices no rail uses (a node's VFs lent to pods, a storage HCA), "
                         "each with a full GID table")
    ap.add_argument("--resync", type=float, default=None,
                    help="resync_interval in seconds (default: the daemon's 30 s); a long one "
                         "leaves the resync's share out of the figure")
    args = ap.parse_args()
    reexec_in_netns()
    tmp = Path(tempfile.mkdtemp(prefix="nodeagent-bench-"))
    data = make_rails(args.rails, tmp)
    for j in range(args.other_devices):
        make_gid_tree(tmp / "sys", f"mlx5_{args.rails + j}",
                      roce_entries(f"vf{j}", f"10.200.{j}.5"), slots=255)
    if args.resync is not None:
        data["resync_interval"] = args.resync
    server = None
    if args.peers:
        data["peers"] = {"static": {r["name"]: [
            {"address": str(ipaddress.IPv4Interface(r["address"]).network[100 + i])}
            for i in range(args.peers)] for r in data["rails"]}}
    if args.kubernetes:
        from kubernetes import client as k8s

        from tests.kit.apiserver import start_apiserver

        server = start_apiserver(tmp / "apiserver")
        k8s.CoreV1Api(server.client("admin")).create_node(
            {"metadata": {"name": "node-a"}})  # type: ignore[arg-type]
        data["node_name"] = "node-a"
        data["kubernetes"] = {"kubeconfig": str(server.kubeconfig("agent-node-a",
                                                                    tmp / "kubeconfig"))}
    (tmp / "c.yaml").write_text(yaml.safe_dump(data))
    daemon = subprocess.Popen([sys.executable, "-m", "nodeagent", "run", "--config",
                               str(tmp / "c.yaml")], stderr=subprocess.DEVNULL)
    status = tmp / "run" / "status.json"
    while not (status.exists() and json.loads(status.read_text())["ok"]):
        time.sleep(0.05)
    time.sleep(5.0)  # let start-up settle (IPv6 DAD on the rails ends ~2 s after link up)
    if args.kubernetes:  # and the boot taint lifted (after clear_after): steady state
        while (json.loads(status.read_text()).get("kubernetes") or {}).get("tainted", True):
            time.sleep(0.2)
        time.sleep(2.0)
    first = json.loads(status.read_text())
    passes0 = first["daemon"]["passes"]
    writes0 = (first.get("kubernetes") or {}).get("writes", 0)
    cpu0, t0 = cpu_seconds(daemon.pid), time.monotonic()
    peak = 0.0
    while time.monotonic() - t0 < args.seconds:
        peak = max(peak, rss_mb(daemon.pid))
        time.sleep(1.0)
    cpu1, t1 = cpu_seconds(daemon.pid), time.monotonic()
    last = json.loads(status.read_text())
    passes = last["daemon"]["passes"] - passes0
    writes = (last.get("kubernetes") or {}).get("writes", 0) - writes0
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(timeout=20)
    if server is not None:
        server.stop()
    kind = "with a kubernetes section" if args.kubernetes else "local-only"
    if args.peers:
        kind += f", {args.peers} peers per rail"
    if args.other_devices:
        kind += f", {args.other_devices} RDMA devices no rail uses"
    print(f"idle daemon ({kind}), {args.rails} healthy rails, {t1 - t0:.0f} s, resync every "
          f"{data.get('resync_interval', 30)} s, {passes} passes while measured")
    print(f"RSS {rss_mb_str(peak)} peak; CPU {100 * (cpu1 - cpu0) / (t1 - t0):.3f} % of a "
          f"core ({cpu1 - cpu0:.2f} s CPU)")
    if args.kubernetes:
        print(f"API writes {writes} in {t1 - t0:.0f} s: {writes * 3600 / (t1 - t0):.0f} per "
              f"node-hour")


def rss_mb_str(mb: float) -> str:
    return f"{mb:.1f} MB"


if __name__ == "__main__":
    main()
