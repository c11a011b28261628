"""GID table readers (sysfs fixture trees, real pyverbs objects) and RoCEGIDStable."""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import Any

import pytest

from nodeagent.checks.gid import gid_finding
from nodeagent.config import parse_config
from nodeagent.model.network import DriftKind
from nodeagent.model.rdma import GidEntry, GidShift, GidTable, GidType, Pin
from nodeagent.probes.gid import (
    entry_from_pyverbs,
    gid_type_from_entry,
    gid_type_from_query,
    parse_gid,
    read_gid_table,
    read_sysfs,
)
from nodeagent.probes.qp import parse_qps, read_qps
from nodeagent.remedies.gid import plan_repin
from nodeagent.remedies.network import AddAddress, Addr, RemoveAddress
from tests.kit.helpers import gid_text, make_gid_tree, roce_entries


def cfg(**rail: object):  # type: ignore[no-untyped-def]
    base = {"name": "rail0", "interface": "ens1f0", "address": "10.10.0.5/24"}
    return parse_config({"rails": [{**base, **rail}]})


# ---------------------------------------------------------------- sysfs reader


def test_mlx5_like_table(tmp_path: Path) -> None:
    make_gid_tree(tmp_path, "mlx5_0", roce_entries("ens1f0", "10.10.0.5"), slots=255)
    table = read_sysfs(tmp_path)
    assert table.source == "sysfs" and table.errors == ()
    assert [(e.index, e.gid, e.gid_type, e.ndev) for e in table.entries] == [
        (0, "fe80::1", GidType.IB_ROCE_V1, "ens1f0"),
        (1, "fe80::1", GidType.ROCE_V2, "ens1f0"),
        (2, "::ffff:10.10.0.5", GidType.IB_ROCE_V1, "ens1f0"),
        (3, "::ffff:10.10.0.5", GidType.ROCE_V2, "ens1f0"),
    ]
    assert table.entries[3].ipv4 == "10.10.0.5"


def test_holes_and_all_zero_entries_are_skipped(tmp_path: Path) -> None:
    entries = [(0, "fe80::1", "RoCE v2", "eth0"), (7, "::ffff:10.0.0.7", "RoCE v2", "eth0")]
    make_gid_tree(tmp_path, "rxe0", entries, slots=1024)
    table = read_sysfs(tmp_path)
    assert [e.index for e in table.entries] == [0, 7]


def test_unreadable_type_and_ndev_files(tmp_path: Path) -> None:
    make_gid_tree(tmp_path, "mlx5_0", roce_entries("ens1f0", "10.10.0.5"))
    attrs = tmp_path / "class/infiniband/mlx5_0/ports/1/gid_attrs"
    # EINVAL-like: the attribute cannot be read at all.
    (attrs / "types/3").unlink()
    (attrs / "types/3").mkdir()
    (attrs / "ndevs/2").unlink()
    table = read_sysfs(tmp_path)
    by_index = {e.index: e for e in table.entries}
    assert by_index[3].gid_type is GidType.UNKNOWN
    assert by_index[2].ndev is None
    # An entry whose type cannot be read never counts as the pinned RoCE v2 GID.
    verdict = gid_finding(cfg(gid_index=3), table, {})
    assert verdict.finding.status == "False"
    assert verdict.finding.reason == "GIDMissing"


def test_garbage_and_truncated_content(tmp_path: Path) -> None:
    make_gid_tree(tmp_path, "mlx5_0", roce_entries("ens1f0", "10.10.0.5"))
    gids = tmp_path / "class/infiniband/mlx5_0/ports/1/gids"
    (gids / "0").write_text("not a gid at all\n")
    (gids / "1").write_text("fe80:0000:00")  # truncated
    (gids / "junk").write_text("ignored: not a slot number")
    types = tmp_path / "class/infiniband/mlx5_0/ports/1/gid_attrs/types"
    (types / "2").write_text("\x00\xff garbage")
    table = read_sysfs(tmp_path)
    assert [e.index for e in table.entries] == [2, 3]
    assert table.entries[0].gid_type is GidType.UNKNOWN
    assert len(table.errors) == 2
    assert str(table.errors[0]) == "mlx5_0 port 1 gid 0: unparsable 'not a gid at all'"
    assert table.errors[0].device == "mlx5_0"


def test_missing_ports_directory_is_an_error_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "class/infiniband/broken0").mkdir(parents=True)
    table = read_sysfs(tmp_path)
    assert table.entries == ()
    assert tuple(map(str, table.errors)) == (
        f"broken0: no ports readable under {tmp_path}/class/infiniband",)
    verdict = gid_finding(cfg(), table, {})
    assert (verdict.finding.status, verdict.finding.reason) == ("Unknown", "GIDTableUnreadable")


def test_no_rdma_devices(tmp_path: Path) -> None:
    table = read_gid_table("auto", tmp_path)
    assert table.source == "none"
    verdict = gid_finding(cfg(), table, {})
    assert (verdict.finding.status, verdict.finding.reason) == ("False", "RDMADeviceNotFound")
    assert verdict.finding.message == "rail0 ens1f0: no GIDs on ens1f0 from any RDMA device"


def test_auto_on_a_fixture_root_uses_sysfs(tmp_path: Path) -> None:
    make_gid_tree(tmp_path, "mlx5_0", roce_entries("ens1f0", "10.10.0.5"))
    assert read_gid_table("auto", tmp_path).source == "sysfs"
    assert read_gid_table("sysfs", tmp_path).source == "sysfs"


def test_parse_gid_spellings() -> None:
    assert parse_gid(gid_text("::ffff:10.1.2.3")) == "::ffff:10.1.2.3"
    assert parse_gid("0000:0000:0000:0000:0000:0000:0000:0000") is None
    assert parse_gid("fe80:0000:0000:0000:0202:c9ff:fe00:0001") == "fe80::202:c9ff:fe00:1"
    with pytest.raises(ValueError):
        parse_gid("zz")


# ---------------------------------------------------------------- pyverbs mapping


def test_pyverbs_is_importable() -> None:
    """The distro's pyverbs must be there (python3-pyverbs, venv --system-site-packages)."""
    import pyverbs.device  # noqa: F401


def pyverbs_entry(gid: str, index: int, gid_type: int, ifindex: int, port: int = 1):  # type: ignore[no-untyped-def]
    import pyverbs.device as pvd

    subnet, iface = struct.unpack("=QQ", socket.inet_pton(socket.AF_INET6, gid))
    return pvd.GIDEntry(subnet, iface, index, port, gid_type, ifindex)


def test_pyverbs_entries_map_to_the_same_model_as_sysfs(tmp_path: Path) -> None:
    names = {7: "ens1f0"}
    raw = [
        pyverbs_entry("fe80::1", 0, 1, 7),  # IBV_GID_TYPE_ROCE_V1
        pyverbs_entry("fe80::1", 1, 2, 7),  # IBV_GID_TYPE_ROCE_V2
        pyverbs_entry("::ffff:10.10.0.5", 2, 1, 7),
        pyverbs_entry("::ffff:10.10.0.5", 3, 2, 7),
    ]
    mapped = [entry_from_pyverbs("mlx5_0", e, names.get) for e in raw]
    make_gid_tree(tmp_path, "mlx5_0", roce_entries("ens1f0", "10.10.0.5"))
    assert tuple(mapped) == read_sysfs(tmp_path).entries


def test_pyverbs_empty_slot_and_unknown_ifindex() -> None:
    assert entry_from_pyverbs("rxe0", pyverbs_entry("::", 5, 2, 0), {}.get) is None
    entry = entry_from_pyverbs("rxe0", pyverbs_entry("::ffff:10.0.0.1", 1, 2, 99), {}.get)
    assert entry is not None and entry.ndev is None and entry.gid_type is GidType.ROCE_V2


def test_both_pyverbs_numberings_map_to_one_enum() -> None:
    # query_gid_table numbers RoCE v2 as 2, query_gid_type as 1.
    import pyverbs.enums as e

    assert gid_type_from_entry(e.IBV_GID_TYPE_ROCE_V2) is GidType.ROCE_V2
    assert gid_type_from_entry(e.IBV_GID_TYPE_ROCE_V1) is GidType.IB_ROCE_V1
    assert gid_type_from_entry(e.IBV_GID_TYPE_IB) is GidType.IB_ROCE_V1
    assert gid_type_from_query(e.IBV_GID_TYPE_SYSFS_ROCE_V2) is GidType.ROCE_V2
    assert gid_type_from_query(e.IBV_GID_TYPE_SYSFS_IB_ROCE_V1) is GidType.IB_ROCE_V1
    assert gid_type_from_entry(42) is GidType.UNKNOWN


def test_pyverbs_configured_but_device_missing_reports_errors(tmp_path: Path) -> None:
    table = read_gid_table("pyverbs", tmp_path, devices=["nosuchdev0"])
    assert table.source == "pyverbs" and table.entries == ()
    assert table.errors and str(table.errors[0]).startswith("nosuchdev0: pyverbs cannot read")


# ---------------------------------------------------------------- RoCEGIDStable


def table_with(index: int, ip: str = "10.10.0.5", ndev: str = "ens1f0") -> GidTable:
    return GidTable(source="sysfs", entries=(
        GidEntry("mlx5_0", 1, 0, "fe80::1", GidType.IB_ROCE_V1, ndev),
        GidEntry("mlx5_0", 1, 1, "fe80::1", GidType.ROCE_V2, ndev),
        GidEntry("mlx5_0", 1, index - 1, f"::ffff:{ip}", GidType.IB_ROCE_V1, ndev),
        GidEntry("mlx5_0", 1, index, f"::ffff:{ip}", GidType.ROCE_V2, ndev),
    ))


def test_configured_pin_holds() -> None:
    verdict = gid_finding(cfg(gid_index=3), table_with(3), {})
    assert (verdict.finding.status, verdict.finding.reason) == ("True", "GIDsPinned")
    assert verdict.learned == {} and verdict.observed == {"rail0": 3}


def test_shifted_gid() -> None:
    verdict = gid_finding(cfg(gid_index=3), table_with(5), {})
    assert (verdict.finding.status, verdict.finding.reason) == ("False", "GIDIndexShifted")
    assert verdict.finding.message == (
        "rail0 ens1f0: IPv4 RoCE v2 GID at index 5, pinned 3 (mlx5_0 port 1); "
        "re-pin waits: QPs not looked at yet")
    assert verdict.shifts == {"rail0": GidShift("mlx5_0", 1, 5, 3, None)}
    assert verdict.repin == ()


# Output of `rdma -j res show qp` (iproute2 6.1) in the lab guest: ib_core's GSI QPs of
# two soft-RoCE devices, and a live user RC QP pair on rxe0.
QPS_GSI_ONLY = (
    '[{"ifindex":0,"ifname":"rxe0","port":1,"lqpn":1,"type":"GSI","state":"RTS",'
    '"sq-psn":0,"comm":"ib_core"},{"ifindex":1,"ifname":"rxe1","port":1,"lqpn":1,'
    '"type":"GSI","state":"RTS","sq-psn":0,"comm":"ib_core"}]')
QPS_USER = QPS_GSI_ONLY[:-1] + (
    ',{"ifindex":0,"ifname":"rxe0","port":1,"lqpn":17,"rqpn":18,"type":"RC","state":"RTS",'
    '"sq-psn":0,"rq-psn":0,"path-mig-state":"MIGRATED","pid":412,"comm":"python3"}'
    ',{"ifindex":0,"ifname":"rxe0","port":1,"lqpn":18,"rqpn":17,"type":"RC","state":"RTS",'
    '"sq-psn":0,"rq-psn":0,"path-mig-state":"MIGRATED","pid":412,"comm":"python3"}]')


def rxe_table(index: int, pinned_slot: str | None = None) -> GidTable:
    entries = [GidEntry("rxe0", 1, 0, "fe80::5054:ff:fe00:101", GidType.ROCE_V2, "ens4"),
               GidEntry("rxe0", 1, index, "::ffff:10.10.0.5", GidType.ROCE_V2, "ens4")]
    if pinned_slot:
        entries.append(GidEntry("rxe0", 1, 1, pinned_slot, GidType.ROCE_V2, "ens4"))
    return GidTable(source="sysfs", entries=tuple(entries))


def rxe_cfg(**top: object):  # type: ignore[no-untyped-def]
    return parse_config({"rails": [{"name": "rail0", "interface": "ens4",
                                    "address": "10.10.0.5/24", "gid_index": 1}], **top})


def test_parse_qps_tells_user_from_kernel_qps() -> None:
    qps = parse_qps(QPS_USER)
    assert qps.error is None and len(qps.qps) == 4
    assert [q.describe() for q in qps.using("rxe0", 1)] == [
        "QP 17 RC RTS (pid 412 python3)", "QP 18 RC RTS (pid 412 python3)"]
    assert qps.using("rxe1", 1) == [], "GSI (QP1) never holds a RoCE GID"
    assert parse_qps(QPS_GSI_ONLY).using("rxe0", 1) == []
    assert parse_qps("").qps == ()


@pytest.mark.parametrize("text", ["not json", '{"ifname": "rxe0"}', '[{"lqpn": 3}]', "[1]"])
def test_parse_qps_refuses_what_it_cannot_read(text: str) -> None:
    """'No QP' allows a re-pin, so output that cannot be read is an error, never empty."""
    qps = parse_qps(text)
    assert qps.error is not None and qps.error.startswith("rdma res show qp: ")


def test_read_qps_tool_missing_or_failing(tmp_path: Path) -> None:
    assert "rdma res show qp:" in (read_qps(str(tmp_path / "nosuch")).error or "")
    tool = tmp_path / "rdma"
    tool.write_text("#!/bin/sh\necho 'error: netlink says no' >&2\nexit 1\n")
    tool.chmod(0o755)
    assert read_qps(str(tool)).error == "rdma res show qp: error: netlink says no"
    tool.write_text(f"#!/bin/sh\ncat <<'EOF'\n{QPS_USER}\nEOF\n")
    assert len(read_qps(str(tool)).qps) == 4


def test_shift_under_a_live_qp_waits_and_names_it() -> None:
    verdict = gid_finding(rxe_cfg(), rxe_table(2), {}, parse_qps(QPS_USER))
    assert verdict.finding.reason == "GIDIndexShifted" and verdict.repin == ()
    assert verdict.finding.message == (
        "rail0 ens4: IPv4 RoCE v2 GID at index 2, pinned 1 (rxe0 port 1); re-pin waits for "
        "2 QP(s) on rxe0 port 1: QP 17 RC RTS (pid 412 python3), QP 18 RC RTS "
        "(pid 412 python3)")


def test_shift_with_no_qp_left_may_be_repinned() -> None:
    verdict = gid_finding(rxe_cfg(), rxe_table(2), {}, parse_qps(QPS_GSI_ONLY))
    assert verdict.finding.status == "False", "still shifted until the re-pin is seen"
    assert verdict.repin == ("rail0",)
    assert verdict.finding.message.endswith("; re-pinning: no QP uses the port")


def test_shift_is_only_reported_when_repinning_is_off_or_impossible() -> None:
    never = gid_finding(rxe_cfg(gid_repin="never"), rxe_table(2), {}, parse_qps(QPS_GSI_ONLY))
    assert never.repin == () and never.finding.message.endswith(
        "re-pinning is off (gid_repin: never)")
    taken = gid_finding(rxe_cfg(), rxe_table(2, pinned_slot="::ffff:10.99.0.1"), {},
                        parse_qps(QPS_GSI_ONLY))
    assert taken.repin == () and taken.finding.message.endswith(
        "index 1 now holds ::ffff:10.99.0.1: re-pin cannot land there")
    unknown = gid_finding(rxe_cfg(), rxe_table(2), {}, parse_qps("garbage"))
    assert unknown.repin == () and "re-pin waits: QPs unknown (rdma res show qp:" in (
        unknown.finding.message)


def test_repin_plan_deletes_then_adds_the_rails_address() -> None:
    rail = rxe_cfg().rails[0]
    actions = plan_repin(rail, 7, GidShift("rxe0", 1, 2, 1, None))
    assert [(type(a), a.kind) for a in actions] == [(RemoveAddress, DriftKind.GID_SHIFTED),
                                                    (AddAddress, DriftKind.GID_SHIFTED)]
    assert isinstance(actions[0], RemoveAddress) and isinstance(actions[1], AddAddress)
    assert actions[0].addr == actions[1].addr == Addr(7, "10.10.0.5", 24, socket.AF_INET)
    assert "GID index 2 back to 1 on rxe0 port 1" in actions[0].text
    assert plan_repin(rail, None, GidShift("rxe0", 1, 2, 1, None)) == []


def test_first_pass_learns_and_later_pass_uses_learned_pin() -> None:
    first = gid_finding(cfg(), table_with(3), {})
    assert first.finding.status == "True"
    assert first.learned == {"rail0": Pin(index=3, device="mlx5_0", port=1, learned=True)}
    later = gid_finding(cfg(), table_with(5), first.learned)
    assert later.finding.reason == "GIDIndexShifted"
    assert later.learned == {}


def test_pin_learned_on_other_hardware_is_relearned() -> None:
    old = {"rail0": Pin(index=9, device="mlx5_7", port=1, learned=True)}
    verdict = gid_finding(cfg(), table_with(3), old)
    assert verdict.finding.status == "True"
    assert verdict.learned["rail0"].index == 3


def test_gid_missing_when_address_gone() -> None:
    table = GidTable(source="sysfs", entries=table_with(3).entries[:2])
    verdict = gid_finding(cfg(gid_index=3), table, {})
    assert (verdict.finding.status, verdict.finding.reason) == ("False", "GIDMissing")


def test_rdma_device_filter() -> None:
    verdict = gid_finding(cfg(rdma_device="mlx5_1"), table_with(3), {})
    assert verdict.finding.reason == "RDMADeviceNotFound"
    assert "from mlx5_1" in verdict.finding.message


def test_no_rails_is_not_configured() -> None:
    verdict = gid_finding(parse_config({}), GidTable(source="none"), {})
    assert (verdict.finding.status, verdict.finding.reason) == ("True", "NotConfigured")


def test_only_the_rails_devices_are_read_until_a_rail_moves(tmp_path: Path,
                                                            monkeypatch: Any) -> None:
    """The table is read only when something says it may have changed, and then only the
    rails' devices, at a resync as in an event-driven pass: a device no rail uses (a VF, a
    storage HCA) costs no pass anything, not even its stuck driver. Every device is read
    while a rail's device is not known, and at once in the pass that finds a rail's GIDs
    gone from its device (they moved: found there, not a resync later)."""
    import nodeagent.run.evaluate as evaluate

    sysfs = tmp_path / "sys"
    make_gid_tree(sysfs, "mlx5_0", roce_entries("r0", "10.10.0.5"))
    make_gid_tree(sysfs, "mlx5_9", roce_entries("other", "10.99.0.5"))
    cfg = parse_config({"paths": {"sysfs": str(sysfs)}, "gid_source": "sysfs",
                        "state_dir": str(tmp_path / "state"),
                        "rails": [{"name": "rail0", "interface": "r0",
                                   "address": "10.10.0.5/24"}]})
    seen: list[list[str] | None] = []
    real = evaluate.read_gid_table

    def spy(source: Any, root: Any, devices: Any = None, reads: Any = None) -> Any:
        seen.append(None if devices is None else list(devices))
        return real(source, root, devices, reads=reads)

    monkeypatch.setattr(evaluate, "read_gid_table", spy)
    ev = evaluate.Evaluator(cfg, ipr=None, persist_pins=False)
    ev.observe_facts(full=False)  # the rail's device is not known yet: everything is read
    ev.observe_facts(full=False)  # nothing said the table changed: nothing is read
    ev.mark_gid_stale()  # an address event, a repair or a watched slot
    ev.observe_facts(full=False)
    ev.observe_facts(full=True)  # a full pass with nothing stale reads nothing either
    ev.mark_gid_stale()  # the resync timer, an overflow
    ev.observe_facts(full=True)
    assert seen == [None, ["mlx5_0"], ["mlx5_0"]]
    assert {e.device for e in ev.store.gid_table.entries} == {"mlx5_0"}

    # The rail's netdev now on another device (a reset that renamed it): its old device
    # is read, the rail is not there, so every device is read in the same pass.
    make_gid_tree(sysfs, "mlx5_0", roce_entries("gone", None))
    make_gid_tree(sysfs, "mlx5_5", roce_entries("r0", "10.10.0.5"))
    ev.mark_gid_stale()
    ev.observe_facts(full=False)
    assert ev.store.rail_seen["rail0"] == ("mlx5_5", 1)
    ev.mark_gid_stale()
    ev.observe_facts(full=True)
    assert seen == [None, ["mlx5_0"], ["mlx5_0"], ["mlx5_0"], None, ["mlx5_5"]]
