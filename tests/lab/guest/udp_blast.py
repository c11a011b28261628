"""Runs in the lab guest: kernel-stack traffic on a rail, no RDMA. Sends UDP datagrams to an
address whose neighbour entry the test pinned to a MAC nobody has, so every frame leaves the
rail's netdev (its tx_bytes grow) and no host on the wire answers.

usage: udp_blast.py DEST SECONDS
"""

import contextlib
import socket
import sys
import time

dest, seconds = sys.argv[1], float(sys.argv[2])
payload = b"x" * 1400
deadline = time.monotonic() + seconds
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    while time.monotonic() < deadline:
        for _ in range(100):
            with contextlib.suppress(OSError):  # ENOBUFS when the queue is full: go on
                s.sendto(payload, (dest, 9))
