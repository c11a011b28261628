"""Each rail's congestion counters: pause frames, congestion notifications, ECN marks and
retransmissions. Read-only.

The RDMA port's counters come from sysfs (`class/infiniband/<dev>/ports/<n>/counters/` and
`hw_counters/`: mlx5's out_of_sequence, local_ack_timeout_err, roce_slow_restart and, on a
RoCE port, its cong_cnts np_cnp_sent, rp_cnp_handled, np_ecn_marked_roce_packets). The
per-priority PFC counters are the netdev's (mlx5e: rx_prio3_pause, tx_prio3_pause), read
with ETHTOOL_GSTATS through pyroute2; they are read only for names the port lacks.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from pathlib import Path

from nodeagent.io.bounded import Where
from nodeagent.model.rdma import CongestionSample
from nodeagent.probes.port import read_named_counters


def ethtool_stats(interface: str) -> dict[str, int]:
    """The netdev's ethtool statistics by name (OSError when it has none or is gone)."""
    from pyroute2.ethtool.ioctl import IoctlEthtool, NoSuchDevice, NotSupportedError

    ethtool = IoctlEthtool(interface)
    try:
        return {str(name): int(value) for name, value in ethtool.get_statistics()}
    except NoSuchDevice:
        raise OSError(errno.ENODEV, "no such network device") from None
    except NotSupportedError:
        raise OSError(errno.EOPNOTSUPP, "no ethtool statistics") from None
    finally:
        ethtool.close()


def read_congestion(sysfs: Path, device: str, port: int, interface: str,
                    names: Iterable[str]) -> CongestionSample:
    names = list(names)
    unreadable: list[str] = []
    port_dir = sysfs / "class" / "infiniband" / device / "ports" / str(port)
    counters = read_named_counters(port_dir, names, Where(), unreadable)
    rest = [n for n in names if n not in counters]
    if rest:
        try:
            stats = ethtool_stats(interface)
        except OSError as exc:
            unreadable.append(f"{interface} ethtool statistics: {exc.strerror or exc}")
        else:
            counters.update({n: stats[n] for n in rest if 0 <= stats.get(n, -1) < 2**64})
    return CongestionSample(device, port, interface, counters, tuple(unreadable))
