"""A sysfs attribute kept open (io.files.KeptAttribute, how the GID-slot source reads its
slots) on a real kernel's sysfs: each read is the attribute's value now, and a removed
device's attribute fails the read (ENODEV) instead of answering its last value."""

from __future__ import annotations

import json
import sys

from tests.kit.helpers import Netns

SCRIPT = """
import json, os, subprocess
from nodeagent.io.files import KeptAttribute

kept = KeptAttribute("/sys/class/net/k0/mtu")
seen = [kept.read()]
subprocess.run(["ip", "link", "set", "k0", "mtu", "4200"], check=True)
seen.append(kept.read())
fd = kept._fd
subprocess.run(["ip", "link", "del", "k0"], check=True)
try:
    seen.append(kept.read())
except OSError as exc:
    seen.append(exc.errno)
closed = not os.path.exists(f"/proc/self/fd/{fd}")
print(json.dumps({"seen": seen, "kept_fd": fd is not None, "closed": closed}))
"""


def test_a_kept_sysfs_attribute_reads_the_kernels_value_each_time(netns: Netns) -> None:
    netns.veth("k0", "k1")
    # `ip netns exec` mounts a sysfs of the namespace: /sys/class/net is its links
    got = json.loads(netns.exec(sys.executable, "-c", SCRIPT).stdout)
    assert got["seen"][:2] == ["1500", "4200"], "the second read is the new MTU, not the first"
    assert got["kept_fd"], "the first read kept its descriptor"
    # The device gone: the kept descriptor answers ENODEV, the path no longer opens
    # (ENOENT); either way no stale "4200", and the descriptor is closed.
    assert got["seen"][2] in (2, 19), got
    assert got["closed"]
