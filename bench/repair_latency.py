"""Repair latency: delete a rail's address, rule or route while the daemon runs.

For each kind, N deletions (default 200); the time from issuing the deletion (netlink,
in-process) to the kernel announcing it restored (a netlink event on our own monitor
socket). Prints p50/p99/max. Goal p99 <= 20 ms.
Usage: sudo .venv/bin/python bench/repair_latency.py [--count N]
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from common import make_rails, reexec_in_netns, summary
from pyroute2 import IPRoute
from pyroute2.netlink.rtnl import RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE, RTMGRP_IPV4_RULE


def wait_event(mon: Any, match: Callable[[Any], bool], timeout: float = 5.0) -> float:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        for msg in mon.get():
            if match(msg):
                return time.perf_counter()
    raise SystemExit("bench: repair not seen within 5 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=200)
    args = ap.parse_args()
    reexec_in_netns()
    tmp = Path(tempfile.mkdtemp(prefix="nodeagent-bench-"))
    data = make_rails(1, tmp)
    data["resync_interval"] = "1h"  # repairs must come from events
    data["repair_guard"] = {"max_repairs": 1_000_000}  # the bench is a deliberate fight
    (tmp / "c.yaml").write_text(yaml.safe_dump(data))
    log = open(tmp / "daemon.log", "w")  # noqa: SIM115
    daemon = subprocess.Popen([sys.executable, "-m", "nodeagent", "run", "--config",
                               str(tmp / "c.yaml"), "--log-level", "WARNING"],
                              stdout=log, stderr=subprocess.STDOUT)
    status = tmp / "run" / "status.json"
    while not (status.exists() and json.loads(status.read_text())["ok"]):
        time.sleep(0.01)
    rail = data["rails"][0]
    ip_, plen = rail["address"].split("/")
    results: dict[str, list[float]] = {"address": [], "rule": [], "default route": []}
    with IPRoute() as ipr, IPRoute() as mon:
        mon.bind(groups=RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_RULE | RTMGRP_IPV4_ROUTE)
        idx = ipr.link_lookup(ifname=rail["interface"])[0]
        for _ in range(args.count):
            for kind in results:
                time.sleep(0.01)  # let the previous repair's own events settle
                t0 = time.perf_counter()
                if kind == "address":
                    ipr.addr("del", index=idx, address=ip_, prefixlen=int(plen))
                    done = wait_event(mon, lambda m: m["event"] == "RTM_NEWADDR"
                                      and m.get("address") == ip_)
                elif kind == "rule":
                    ipr.rule("del", priority=rail["rule_priority"], family=socket.AF_INET)
                    done = wait_event(mon, lambda m: m["event"] == "RTM_NEWRULE"
                                      and m.get("priority") == rail["rule_priority"])
                else:
                    ipr.route("del", dst="0.0.0.0/0", table=rail["table"])
                    done = wait_event(mon, lambda m: m["event"] == "RTM_NEWROUTE"
                                      and m.get("table") == rail["table"]
                                      and m["dst_len"] == 0)
                results[kind].append(1000 * (done - t0))
    daemon.send_signal(signal.SIGTERM)
    print(f"daemon exit: {daemon.wait(timeout=20)}")
    print(f"repair latency: deletion -> restored (netlink event), {args.count} each")
    for kind, ms in results.items():
        print(summary(kind, ms))


if __name__ == "__main__":
    main()
