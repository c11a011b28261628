"""Repair latency: delete a rail's address, rule or route while the daemon runs.

For each kind, N deletions (default 200); the time from issuing the deletion (netlink,
in-process) to the kernel announcing it restored (a netlink event on our own monitor
socket). The same driver then runs against bench/bare_repair.py, a bare pyroute2 loop that
only re-adds what was deleted: both are printed, with the agent/bare ratio of p50 and p99.
Goals: p99 <= 20 ms; agent within 1.5x of the bare loop.
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
from common import make_rails, pct, reexec_in_netns, summary
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
    data["repair_guard"] = {"max_repairs": 100_000}  # the bench is a deliberate fight
    (tmp / "c.yaml").write_text(yaml.safe_dump(data))
    log = open(tmp / "daemon.log", "w")  # noqa: SIM115
    daemon = subprocess.Popen([sys.executable, "-m", "nodeagent", "run", "--config",
                               str(tmp / "c.yaml"), "--log-level", "WARNING"],
                              stdout=log, stderr=subprocess.STDOUT)
    status = tmp / "run" / "status.json"
    while not (status.exists() and json.loads(status.read_text())["ok"]):
        if daemon.poll() is not None:
            raise SystemExit(f"bench: the daemon exited: {(tmp / 'daemon.log').read_text()}")
        time.sleep(0.01)
    rail = data["rails"][0]
    agent = drive(rail, args.count)
    daemon.send_signal(signal.SIGTERM)
    print(f"daemon exit: {daemon.wait(timeout=20)}")
    bare = subprocess.Popen([sys.executable, str(Path(__file__).parent / "bare_repair.py"),
                             rail["interface"], rail["address"], str(rail["table"]),
                             str(rail["rule_priority"]), rail["gateway"]],
                            stdout=subprocess.PIPE, text=True)
    assert bare.stdout is not None and bare.stdout.readline().strip() == "ready"
    reference = drive(rail, args.count)
    bare.kill()
    bare.wait()
    print(f"repair latency: deletion -> restored (netlink event), {args.count} each")
    for kind in agent:
        a, b = agent[kind], reference[kind]
        print(summary(f"{kind} agent", a))
        print(summary(f"{kind} bare loop", b))
        print(f"{'':28} agent/bare: p50 {pct(a, 50) / pct(b, 50):.2f}x, "
              f"p99 {pct(a, 99) / pct(b, 99):.2f}x")


def drive(rail: dict[str, Any], count: int) -> dict[str, list[float]]:
    """Deletes the rail's address, rule and default route in turn, `count` times each,
    and times each until the kernel announces it back."""
    ip_, plen = rail["address"].split("/")
    results: dict[str, list[float]] = {"address": [], "rule": [], "default route": []}
    with IPRoute() as ipr, IPRoute() as mon:
        mon.bind(groups=RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_RULE | RTMGRP_IPV4_ROUTE)
        idx = ipr.link_lookup(ifname=rail["interface"])[0]
        for _ in range(count):
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
        time.sleep(0.2)  # the last repair's routes
    return results


if __name__ == "__main__":
    main()
