"""Generated sysfs and procfs fixture trees: whatever a driver (or a broken one) shows, the
readers end in a table, counters or health verdict with one-line errors, never a crash."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeagent.checks.gid import gid_finding
from nodeagent.config import parse_config
from nodeagent.probes.counters import read_rail_counters
from nodeagent.probes.gid import read_sysfs
from nodeagent.probes.lustre import read_health
from nodeagent.probes.sysctl import read_rail_sysctls

# What a file in the tree can be: text, bytes, a FIFO (a wedged attribute stand-in: must be
# refused, not waited on), a directory where a file should be, a dangling symlink.
_content = st.one_of(
    st.sampled_from(["0000:0000:0000:0000:0000:ffff:0a0a:0005", "fe80::1", "RoCE v2",
                     "IB/RoCE v1", "r0", "", "\n", "-1", "18446744073709551616", "9" * 4000,
                     "NOT HEALTHY", "healthy", "LBUG", "device x reported unhealthy"]),
    st.text(max_size=60), st.binary(max_size=60).map(lambda b: ("bytes", b)),
    st.just(("fifo", None)), st.just(("dir", None)), st.just(("link", None)),
    st.just(("big", None)))


def _put(path: Path, what: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    kind, value = what if isinstance(what, tuple) else ("text", what)
    if kind == "text":
        path.write_text(value, errors="surrogatepass")
    elif kind == "bytes":
        path.write_bytes(value)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "link":
        path.symlink_to(path.parent / "nowhere")
    else:
        path.write_bytes(b"1" * (1 << 20))


@given(st.dictionaries(st.integers(0, 40), st.tuples(_content, _content, _content),
                       max_size=8),
       st.dictionaries(st.sampled_from(["port_xmit_data", "port_rcv_data",
                                        "port_xmit_packets", "port_rcv_packets"]), _content),
       st.dictionaries(st.sampled_from(["arp_ignore", "rp_filter"]), _content),
       _content)
def test_generated_trees(tmp_path_factory: Any, slots: dict[int, tuple[Any, Any, Any]],
                         counters: dict[str, Any], sysctls: dict[str, Any],
                         health: Any) -> None:
    root = tmp_path_factory.mktemp("sys")
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    for i, (gid, gtype, ndev) in slots.items():
        _put(port / "gids" / str(i), gid)
        _put(port / "gid_attrs" / "types" / str(i), gtype)
        _put(port / "gid_attrs" / "ndevs" / str(i), ndev)
    (port / "gids").mkdir(parents=True, exist_ok=True)
    for name, value in counters.items():
        _put(port / "counters" / name, value)
    for key, value in sysctls.items():
        _put(root / "proc" / "sys" / "net" / "ipv4" / "conf" / "r0" / key, value)
    _put(root / "fs" / "lustre" / "health_check", health)

    table = read_sysfs(root)
    assert all("\n" not in str(e) for e in table.errors)
    cfg = parse_config({"rails": [{"name": "rail0", "interface": "r0",
                                   "address": "10.10.0.5/24"}]})
    verdict = gid_finding(cfg, table, {})
    assert verdict.finding.status in ("True", "False", "Unknown")
    got = read_rail_counters(root, "r0", "mlx5_0", 1)
    for value in (got.rdma_tx_bytes, got.rdma_rx_bytes, got.rdma_tx_packets):
        assert value is None or isinstance(value, int)
    values = read_rail_sysctls(root / "proc", "r0", ["arp_ignore", "rp_filter"])
    assert all(v is None or isinstance(v, str) for v in values.values())
    assert read_health(root, root / "proc").state in (
        "healthy", "unhealthy", "lbug", "unreadable", "absent")


def test_a_gid_slot_that_is_not_a_file_is_an_error_not_an_empty_slot(tmp_path: Path) -> None:
    """A FIFO where the rail's GID sits: before, read as an empty slot, so the verdict was
    GIDMissing (False) with an empty errors list: a missing GID, said with no reason. Now
    the slot is an error naming it, and the verdict is Unknown with it (GIDTableUnreadable,
    as for a port whose whole table cannot be read)."""
    port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    _put(port / "gids" / "0", "fe80:0000:0000:0000:0000:0000:0000:0001")
    _put(port / "gid_attrs" / "types" / "0", "RoCE v2")
    _put(port / "gid_attrs" / "ndevs" / "0", "r0")
    _put(port / "gids" / "1", ("fifo", None))
    table = read_sysfs(tmp_path)
    assert [e.text for e in table.errors] == [
        "mlx5_0 port 1 gid 1: a FIFO, not a regular file"], table.errors
    cfg = parse_config({"rails": [{"name": "rail0", "interface": "r0",
                                   "address": "10.10.0.5/24"}]})
    verdict = gid_finding(cfg, table, {}).finding
    assert (verdict.status, verdict.reason, verdict.message) == (
        "Unknown", "GIDTableUnreadable", "rail0 r0: GID table unreadable (mlx5_0 port 1 gid "
        "1: a FIFO, not a regular file)"), verdict
