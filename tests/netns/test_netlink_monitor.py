"""The netlink source on the real kernel, overflowed on purpose (a 4 KiB receive buffer,
hundreds of addresses added at once): no change made after a resync is queued may be
missed, and an overflow leaves nothing behind."""

from __future__ import annotations

import json

from tests.kit.helpers import PYTHON, Netns

# Run inside the namespace (the monitor listens in the namespace of its process). The
# monitor is held in its callback while hundreds of addresses are added, so its buffer
# overflows every round. Each time it says events were lost, the script makes one change
# at once, from the callback: the resync that EventsLost queues reads the state only later,
# so a change made now is known to the daemon only if it comes as an event.
SCRIPT = r"""
import json, os, subprocess, sys, threading, time
from nodeagent.run.netlink import NetlinkMonitor
from nodeagent.run.work import EventsLost, NetlinkEvent

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
        subprocess.run(["ip", "addr", "add", f"{mark}/32", "dev", "r0"], check=True)
    elif isinstance(item, NetlinkEvent) and item.msg.get("event") == "RTM_NEWADDR":
        seen.add(item.msg.get_attr("IFA_ADDRESS"))

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
