"""Runs in the lab guest, against the running agent: deletes a rail's address N times and
times each deletion -> the kernel announcing the address again (RTM_NEWADDR)."""

import statistics
import sys
import time

from pyroute2 import IPRoute

ifname, address, prefix, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ms = []
with IPRoute() as ipr, IPRoute() as events:
    events.bind()
    index = ipr.link_lookup(ifname=ifname)[0]
    for _ in range(count):
        start = time.perf_counter()
        ipr.addr("del", index=index, address=address, prefixlen=prefix)
        done = False
        while not done:
            if time.perf_counter() - start > 10:
                sys.exit(f"{address} not restored within 10 s")
            for msg in events.get():
                if (msg.get("event") == "RTM_NEWADDR" and msg.get("index") == index
                        and msg.get_attr("IFA_ADDRESS") == address):
                    done = True
        ms.append((time.perf_counter() - start) * 1000)
        time.sleep(0.2)
ms.sort()
p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
print(f"address restore in the guest, n={len(ms)}: p50={statistics.median(ms):.1f} ms "
      f"p99={p99:.1f} ms max={ms[-1]:.1f} ms")
