"""The netlink source on the real kernel, overflowed on purpose (a 4 KiB receive buffer,
hundreds of addresses added at once): no change made after a resync is queued may be
missed, and an overflow leaves nothing behind."""

from __future__ import annotations

import json
from typing import Any

from tests.kit.helpers import PYTHON, Netns

# Run inside the namespace (the monitor listens in the namespace of its process). The
# monitor is held in its callback while hundreds of addresses are added, so its buffer
# overflows every round. Each time it says events were lost, the script makes one change
# at once, from the callback: the resync that EventsLost queues reads the state only later,
# so a change made now is known to the daemon only if it comes as an event. (The change is
# an address deleted: a deletion event carries the address.)
SCRIPT = r"""
import json, os, subprocess, sys, threading, time
from nodeagent.run.netlink import NetlinkMonitor
from nodeagent.run.work import EventsLost, NetlinkEvent

for i in range(1, 40):
    subprocess.run(["ip", "addr", "add", f"192.0.2.{i}/32", "dev", "r0"], check=True)

lost, marks, seen = [], [], set()
lock = threading.Lock()
running = threading.Event()  # cleared: the monitor is held in its callback

def deliver(item):
    running.wait()
    if isinstance(item, EventsLost):
        monitor.resync_pending.clear()  # as the daemon's loop does when it takes one
        with lock:
            lost.append(time.monotonic())
            mark = f"192.0.2.{len(lost)}"
            marks.append(mark)
        subprocess.run(["ip", "addr", "del", f"{mark}/32", "dev", "r0"], check=True)
    elif isinstance(item, NetlinkEvent) and item.event.deletion is not None:
        gone = item.event.deletion.address
        if gone is not None:
            seen.add(gone.address)

def fds():
    return len(os.listdir("/proc/self/fd"))

running.set()
monitor = NetlinkMonitor(deliver, rcvbuf=4096)
monitor.start()
monitor.ready.wait(5)
before = fds()
for round in range(5):
    batch = "".join(f"addr add 172.{16 + round}.{i // 250}.{i % 250 + 1}/32 dev noise0\n"
                    for i in range(1000))
    overflows = len(lost)
    running.clear()
    subprocess.run(["ip", "-batch", "-"], input=batch, text=True, check=True)
    running.set()  # the batch is done: nothing else overflows the next socket this round
    deadline = time.monotonic() + 10  # a hang guard: this round's mark seen, or give up
    while time.monotonic() < deadline and not (len(lost) > overflows and marks[-1] in seen):
        time.sleep(0.05)
    if not (len(lost) > overflows and marks[-1] in seen):
        break
time.sleep(0.5)  # any reopen under way is done
with lock:
    # A mark whose event was lost is covered by the resync of a later loss; the last one
    # has no later loss to cover it.
    print(json.dumps({"lost": len(lost), "marks": marks,
                      "missed": [m for m in marks[-1:] if m not in seen],
                      "covered": [m for m in marks[:-1] if m not in seen],
                      "fds_before": before, "fds_after": fds()}))
monitor.stop()
"""


def test_a_change_right_after_an_overflow_is_delivered_and_nothing_leaks(
    rails_ns: Netns,
) -> None:
    rails_ns.veth("noise0", "noise1")
    rails_ns.ip("link", "set", "r0", "up")
    out = rails_ns.exec(PYTHON, "-c", SCRIPT, check=False)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["lost"] >= 5, result  # every round overflowed the 4 KiB buffer
    # The change made as each resync was queued came as an event: the resync was queued
    # once a socket listened (before, it was queued while the overflowed one was still
    # open, and the change went with that socket).
    assert result["missed"] == [], result
    # Before, each overflow left the closed socket's event loop and socket open: 4
    # descriptors per overflow.
    assert result["fds_after"] <= result["fds_before"], result
    assert "netlink monitor failed" not in out.stderr, out.stderr


# The kernel's own messages for each kind the agent follows, decoded as the netlink thread
# decodes them (the shapes come from this kernel, not from a fixture). The script stops
# at the veth it adds last; alarm() ends it if that never comes.
DECODE = r"""
import dataclasses, json, signal, subprocess
from pyroute2 import IPRoute
from nodeagent.probes.netlink import kernel_event
from nodeagent.run.netlink import GROUPS

signal.alarm(20)
ipr = IPRoute()
ipr.bind(groups=GROUPS)
for args in (["addr", "add", "10.10.0.5/24", "dev", "r0"],
             ["route", "add", "10.20.0.0/24", "dev", "r0", "table", "300", "src", "10.10.0.5"],
             ["rule", "add", "from", "10.10.0.5", "lookup", "300", "priority", "1000"],
             ["rule", "del", "priority", "1000"],
             ["route", "del", "10.20.0.0/24", "table", "300"],
             ["addr", "del", "10.10.0.5/24", "dev", "r0"],
             ["link", "set", "r0", "down"],
             ["link", "del", "r1"],
             ["link", "add", "sentinel", "type", "veth", "peer", "name", "sentinel1"]):
    subprocess.run(["ip", *args], check=True)
events = []
while not any(e["ifname"] == "sentinel" for e in events):
    for msg in ipr.get():
        event = kernel_event(msg)
        if event is not None:
            events.append({**dataclasses.asdict(event), "kind": str(event.kind),
                           "deleted": msg["event"].startswith("RTM_DEL")})
print(json.dumps(events))
"""


def test_the_kernels_messages_decode_into_typed_events(rails_ns: Netns) -> None:
    rails_ns.ip("link", "set", "r0", "up")
    r0 = rails_ns.link("r0")["ifindex"]
    out = rails_ns.exec(PYTHON, "-c", DECODE, check=False)
    assert out.returncode == 0, out.stderr
    events = json.loads(out.stdout.strip().splitlines()[-1])

    def one(kind: str, deleted: bool, **match: object) -> dict[str, Any]:
        found = [e for e in events if e["kind"] == kind and e["deleted"] == deleted
                 and all(e[k] == v for k, v in match.items())]
        assert found, (kind, deleted, match, events)
        return found[0]

    # A table past 255: the message header says 252 (RT_TABLE_COMPAT), RTA_TABLE says 300.
    added = one("route", False, table=300)
    assert added["index"] == r0 and added["src"] == "10.10.0.5" and added["deletion"] is None
    gone = one("route", True, table=300)["deletion"]["route"]
    assert gone["dst"] == "10.20.0.0/24" and gone["table"] == 300 and gone["oif"] == r0
    rule = one("rule", True, table=300)
    assert rule["src"] == "10.10.0.5" and rule["deletion"]["rule"]["priority"] == 1000
    address = one("address", True, index=r0)["deletion"]
    assert address["ifindex"] == r0 and address["address"] == {
        "address": "10.10.0.5", "prefixlen": 24, "family": 2}
    down = [e for e in events if e["kind"] == "link" and e["ifname"] == "r0"
            and e["link"] and not e["link"]["admin_up"]]
    assert down and down[-1]["index"] == r0, events
    # A deleted link: named, but its last state is no observation of a rail.
    assert one("link", True, ifname="r1")["link"] is None
