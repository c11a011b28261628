"""Runs in a lab guest (bench/peers_cpu.py): the agent's own peer responder answering on
several addresses at once, each as if it were another node's rail, so that one guest plays
several peers. Arguments: the prober's addresses (comma-separated), then device:address
pairs. Prints "ready" once every address has its IPv4 RoCE v2 GID, then serves until
killed; on SIGUSR1 prints the QPs answered so far."""

import signal
import sys
import time
from pathlib import Path

from nodeagent.model.peers import RailEndpoint
from nodeagent.model.rdma import GidType
from nodeagent.probes.gid import read_sysfs
from nodeagent.run.responder import Responder, Served


def ipv4_gid_index(device: str, address: str) -> int | None:
    """The index of `address`'s RoCE v2 GID in the device's table (the agent's reader)."""
    for entry in read_sysfs(Path("/sys"), [device]).entries:
        if entry.ipv4 == address and entry.gid_type == GidType.ROCE_V2:
            return entry.index
    return None


def main() -> None:
    probers = frozenset(sys.argv[1].split(","))
    ends = [arg.split(":") for arg in sys.argv[2:]]
    deadline = time.monotonic() + 30
    rails: dict[str, Served] = {}
    while len(rails) < len(ends):
        for device, address in ends:
            index = ipv4_gid_index(device, address)
            if index is not None:
                rails[address] = Served(RailEndpoint(device, 1, index, address), probers)
        if time.monotonic() > deadline:
            sys.exit(f"no RoCE v2 GID for {sorted(a for _, a in ends if a not in rails)}")
        time.sleep(0.2)
    responder = Responder(18600, hold=3.0)
    responder.start()
    responder.serve(rails)
    signal.signal(signal.SIGUSR1, lambda *_: print(
        "answered", sum(responder.counts.answered.values()), flush=True))
    print("ready", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
