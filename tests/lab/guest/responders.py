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
from nodeagent.run.responder import Responder, Served


def ipv4_gid_index(device: str, address: str) -> int | None:
    """The index of `address`'s RoCE v2 GID (::ffff:a.b.c.d) in the device's table."""
    want = "0000:0000:0000:0000:0000:ffff:" + "".join(
        f"{int(o):02x}" for o in address.split("."))
    want = want[:-4] + ":" + want[-4:]
    port = Path(f"/sys/class/infiniband/{device}/ports/1")
    for gid in sorted((port / "gids").iterdir(), key=lambda p: int(p.name)):
        try:
            if (gid.read_text().strip() == want and (port / "gid_attrs" / "types" / gid.name)
                    .read_text().strip() == "RoCE v2"):
                return int(gid.name)
        except OSError:
            continue
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
