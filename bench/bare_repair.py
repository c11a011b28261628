"""The reference for bench/repair_latency.py: a bare pyroute2 loop that only re-adds a rail's
deleted address (and its table's routes), rule and default route. No probe, no checks, no
status: the floor an event-driven repair can reach with the same library in Python.

Usage (repair_latency.py starts it): bare_repair.py IFNAME ADDRESS/PREFIX TABLE PRIORITY GATEWAY
"""

from __future__ import annotations

import ipaddress
import socket
import sys

from pyroute2 import IPRoute
from pyroute2.netlink.rtnl import RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE, RTMGRP_IPV4_RULE


def main() -> None:
    ifname, address, table_s, prio_s, gateway = sys.argv[1:6]
    iface = ipaddress.IPv4Interface(address)
    ip, plen, table, prio = str(iface.ip), iface.network.prefixlen, int(table_s), int(prio_s)
    with IPRoute() as ipr, IPRoute() as mon:
        mon.bind(groups=RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_RULE | RTMGRP_IPV4_ROUTE)
        idx = ipr.link_lookup(ifname=ifname)[0]

        def routes() -> None:
            ipr.route("replace", dst=str(iface.network), oif=idx, table=table, prefsrc=ip,
                      scope=253)
            ipr.route("replace", dst="0.0.0.0/0", gateway=gateway, oif=idx, table=table)

        print("ready", flush=True)
        while True:
            for m in mon.get():
                event = m["event"]
                if event == "RTM_DELADDR" and m.get("address") == ip:
                    ipr.addr("add", index=idx, address=ip, prefixlen=plen)
                    routes()
                elif event == "RTM_DELRULE" and m.get("priority") == prio:
                    ipr.rule("add", src=ip, src_len=32, table=table, priority=prio,
                             family=socket.AF_INET)
                elif (event == "RTM_DELROUTE" and m.get("table") == table
                      and m["dst_len"] == 0):
                    ipr.route("replace", dst="0.0.0.0/0", gateway=gateway, oif=idx,
                              table=table)


if __name__ == "__main__":
    main()
