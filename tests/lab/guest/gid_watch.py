"""Runs in the lab guest during the soak: watches each rail's pinned GID slot (and nothing
else: soft-RoCE has 1024 slots) every 20 ms and writes a line whenever what it holds differs
from the rail's IPv4 GID. An empty log after the soak means the GID never moved or vanished.

usage: gid_watch.py OUT DEVICE:INDEX:IPV4 [DEVICE:INDEX:IPV4 ...]
"""

import sys
import time

watched = []
for spec in sys.argv[2:]:
    device, index, ip = spec.split(":")
    hexes = "".join(f"{int(o):02x}" for o in ip.split("."))
    want = f"0000:0000:0000:0000:0000:ffff:{hexes[:4]}:{hexes[4:]}"
    watched.append((f"/sys/class/infiniband/{device}/ports/1/gids/{index}", want, spec))
with open(sys.argv[1], "w", buffering=1) as out:
    print("watching", flush=True)
    while True:
        for path, want, spec in watched:
            try:
                with open(path) as f:
                    have = f.read().strip()
            except OSError as exc:
                have = f"unreadable: {exc}"
            if have != want:
                out.write(f"{time.time():.3f} {spec}: slot holds {have}\n")
        time.sleep(0.02)
