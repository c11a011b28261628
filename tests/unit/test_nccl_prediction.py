"""NCCL's choices predicted (checks/nccl.py) against GID tables from real reports, every
NCCL_IB_HCA form, and NCCL's integer parsing checked against glibc's own strtoll.

Each table cites where it was seen (show_gids or ibv_devinfo output in a public report);
the sysfs tree is written as the kernel lays it out (tests/kit/helpers.make_gid_tree) and
read back by the container reader preflight uses."""

from __future__ import annotations

import ctypes
import ipaddress
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.checks.conditions import judge_pass
from nodeagent.checks.facts import Facts
from nodeagent.checks.nccl import (
    NONZERO_INT_RE,
    IfList,
    NcclEnv,
    c_atoi,
    choose_gid,
    nccl_problems,
    predict,
    strtoll0,
    with_conf_files,
)
from nodeagent.config import Config, parse_config
from nodeagent.model.conditions import FABRIC_READY, NCCL_DEFAULT_GID_PINNED
from nodeagent.model.jobs import GidSlot, NodeRail, PortView
from nodeagent.model.rdma import GidEntry, GidTable, GidType, Pin
from nodeagent.probes.container import read_port_views
from nodeagent.probes.gid import read_sysfs
from tests.kit.helpers import make_gid_tree, make_port_tree, roce_entries

V1, V2 = "IB/RoCE v1", "RoCE v2"


def port(tmp_path: Path, device: str, entries: list[tuple[int, str, str]], *,
         slots: int = 16, state: str = "4: ACTIVE", portnum: int = 1) -> PortView:
    root = tmp_path / "sys"
    make_gid_tree(root, device, [(i, g, t, "eth0") for i, g, t in entries], port=portnum,
                  slots=slots)
    make_port_tree(root, device, portnum, state=state, pcie=None)
    return next(p for p in read_port_views(root) if (p.device, p.port) == (device, portnum))


def slot(index: int, gid: str, version: int | None) -> GidSlot:
    return GidSlot(index, ipaddress.IPv6Address(gid), version)


def view(device: str, *slots: GidSlot, active: bool = True, portnum: int = 1) -> PortView:
    return PortView(device, portnum, active, True, slots, "ACTIVE" if active else "DOWN")


def standard(device: str, ipv4: str, at: int = 2) -> PortView:
    """The 4-entry mlx5 table (fe80 v1/v2, then the IPv4 pair)."""
    return view(device, slot(0, "fe80::a288:c2ff:fe5b:3ec", 1),
                slot(1, "fe80::a288:c2ff:fe5b:3ec", 2),
                slot(at, f"::ffff:{ipv4}", 1), slot(at + 1, f"::ffff:{ipv4}", 2))


def chosen(p: PortView, env: dict[str, str] | None = None) -> int | None:
    return choose_gid(p, NcclEnv.read(env or {})).index


# ---------------------------------------------------------------- the GID NCCL picks


def test_the_standard_mlx5_table_gives_the_ipv4_v2_gid(tmp_path: Path) -> None:
    """NVIDIA/nccl-tests#192 (show_gids on mlx5_0, 11.0.0.72 at 2/3)."""
    p = port(tmp_path, "mlx5_0", [(0, "fe80::a288:c2ff:fe5b:3ec", V1),
                                  (1, "fe80::a288:c2ff:fe5b:3ec", V2),
                                  (2, "::ffff:11.0.0.72", V1), (3, "::ffff:11.0.0.72", V2)])
    assert chosen(p) == 3
    assert choose_gid(p, NcclEnv.read({})).describe() == "GID 3 (IPv4 11.0.0.72, RoCE v2)"


def test_a_roce_lag_bond_device_is_read_the_same(tmp_path: Path) -> None:
    """NVIDIA/nccl#769 (ibv_devinfo -d mlx5_bond_0: 200.0.209.6 at 2/3)."""
    p = port(tmp_path, "mlx5_bond_0", [(0, "fe80::ac0:ebff:feda:1cfb", V1),
                                       (1, "fe80::ac0:ebff:feda:1cfb", V2),
                                       (2, "::ffff:200.0.209.6", V1),
                                       (3, "::ffff:200.0.209.6", V2)])
    assert chosen(p) == 3
    assert IfList.parse("mlx5").selects("mlx5_bond_0", 1)  # a prefix selects the bond


@pytest.mark.parametrize(("entries", "want"), [
    # multus-cni#1100: two pods on one NIC, macvlan children at 4/5 and 6/7; the slots
    # of the other pods read as zeros with EINVAL types in the pod (NVIDIA/nccl#1573).
    ([(4, "::ffff:172.20.1.1", V1), (5, "::ffff:172.20.1.1", V2)], 5),
    ([(6, "::ffff:172.20.1.2", V1), (7, "::ffff:172.20.1.2", V2)], 7),
    # NVIDIA/nccl#1573: the pod's fe80 pair at 4/5 and its IPv4 pair at 6/7.
    ([(4, "fe80::a4ed:ccff:fe8b:1994", V1), (5, "fe80::a4ed:ccff:fe8b:1994", V2),
      (6, "::ffff:10.152.0.12", V1), (7, "::ffff:10.152.0.12", V2)], 7),
    # NVIDIA/nccl#1587: a sparse table, the IPv4 pair below the link-local one.
    ([(6, "::ffff:11.0.4.1", V1), (7, "::ffff:11.0.4.1", V2),
      (8, "fe80::e4ea:71ff:feb9:4970", V1), (9, "fe80::e4ea:71ff:feb9:4970", V2)], 7),
])
def test_pod_tables_with_einval_slots(tmp_path: Path, entries: list[tuple[int, str, str]],
                                      want: int) -> None:
    assert chosen(port(tmp_path, "mlx5_4", entries)) == want


def test_an_ipv6_only_table_keeps_the_link_local_index_0(tmp_path: Path) -> None:
    """uccl-project/uccl#803: bnxt_re with fe80 and ULA (fd93::) GIDs only; NCCL's default
    family is IPv4, nothing matches, index 0 stays (retry exceeded on every QP)."""
    p = port(tmp_path, "bnxt_re0", [(0, "fe80::5e6f:69ff:fe01:2", V1),
                                    (1, "fe80::5e6f:69ff:fe01:2", V2),
                                    (2, "fd93:16d3:59b6:1::10", V1),
                                    (3, "fd93:16d3:59b6:1::10", V2)])
    assert chosen(p) == 0
    assert chosen(p, {"NCCL_IB_ADDR_FAMILY": "AF_INET6"}) == 3
    assert chosen(p, {"NCCL_IB_ADDR_FAMILY": "af_inet6"}) == 0  # exact strings only
    rail = NodeRail("rail0", None, "bnxt_re0", 1, None)
    plan = predict(NcclEnv.read({}), [p])
    assert [u.line() for u in nccl_problems(plan, [rail], [p])] == [
        "nccl: NCCL would use GID 0 (link-local fe80::5e6f:69ff:fe01:2, RoCE v1) on "
        "bnxt_re0:1 (rail0), not an IPv4 RoCE v2 GID: bnxt_re0:1 has no IPv4 RoCE v2 GID "
        "here: give the rail's port its IPv4 address"]


def test_a_vip_below_the_pin_is_what_nccl_picks() -> None:
    """A second IPv4 address on the rail (a VIP) added first takes the lower free slots
    (ib_cache_gid_add fills the first free one: NVIDIA/nccl#2157): NCCL's default picks it,
    not the pinned rail address; NCCL_IB_ADDR_RANGE around the rail's address fixes it."""
    p = view("mlx5_0", slot(0, "fe80::1", 1), slot(1, "fe80::1", 2),
             slot(2, "::ffff:10.0.0.100", 1), slot(3, "::ffff:10.0.0.100", 2),
             slot(4, "::ffff:10.0.0.5", 1), slot(5, "::ffff:10.0.0.5", 2))
    assert chosen(p) == 3
    assert chosen(p, {"NCCL_IB_ADDR_RANGE": "10.0.0.5/32"}) == 5
    assert chosen(p, {"NCCL_IB_ADDR_RANGE": "10.0.0.5"}) == 3  # no '/': ignored
    assert chosen(p, {"NCCL_IB_ADDR_RANGE": "10.0.0.5/33"}) == 3  # bad mask: ignored
    assert chosen(p, {"NCCL_IB_ADDR_RANGE": "10.0.0.5/-1"}) == 0  # matches nothing
    rail = NodeRail("rail0", "10.0.0.5", "mlx5_0", 1, 5)
    lines = [u.line() for u in nccl_problems(predict(NcclEnv.read({}), [p]), [rail], [p])]
    assert lines == [
        "nccl: NCCL would use GID 3 (IPv4 10.0.0.100, RoCE v2) on mlx5_0:1, not rail0's IPv4 "
        "RoCE v2 GID 5 (host view): another IPv4 address (10.0.0.100) sits below it: set "
        "NCCL_IB_ADDR_RANGE to the rail's subnet, or NCCL_IB_GID_INDEX=5"]


def test_without_an_ipv4_v2_entry_a_v1_one_wins() -> None:
    """A RoCE v1-only port (ConnectX-3, mlx4 without roce_mode 2) or a v2 slot whose type
    is unreadable: the first branch takes the IPv4 v1 GID without looking at its version."""
    p = view("mlx4_0", slot(0, "fe80::1", 1), slot(1, "::ffff:10.0.0.5", 1))
    assert chosen(p) == 1
    einval = view("mlx5_0", slot(0, "fe80::1", 1), slot(1, "fe80::1", 2),
                  slot(2, "::ffff:10.0.0.5", 1), slot(3, "::ffff:10.0.0.5", None))
    assert chosen(einval) == 2
    rail = NodeRail("rail0", "10.0.0.5", "mlx5_0", 1, 3)
    lines = [u.line() for u in nccl_problems(predict(NcclEnv.read({}), [einval]), [rail],
                                             [einval])]
    assert lines == ["nccl: NCCL would use GID 2 (IPv4 10.0.0.5, RoCE v1) on mlx5_0:1, not "
                     "rail0's IPv4 RoCE v2 GID 3 (host view): no IPv4 RoCE v2 GID NCCL can "
                     "pick on mlx5_0:1: set NCCL_IB_GID_INDEX=3, or give the rail's port "
                     "its IPv4 address"]


def test_roce_version_1_asked_for_picks_the_v1_gid() -> None:
    p = standard("mlx5_0", "10.0.0.5")
    assert chosen(p, {"NCCL_IB_ROCE_VERSION_NUM": "1"}) == 2
    assert chosen(p, {"NCCL_IB_ROCE_VERSION_NUM": "01"}) == 2  # octal 1
    assert chosen(p, {"NCCL_IB_ROCE_VERSION_NUM": "2abc"}) == 3


def test_a_types_file_that_does_not_open_fails_nccl() -> None:
    p = view("mlx5_0", slot(0, "fe80::1", 1), slot(1, "fe80::1", 2),
             slot(2, "::ffff:10.0.0.5", 1), GidSlot(3, ipaddress.IPv6Address("::ffff:10.0.0.5"),
                                                    None, missing=True))
    plan = predict(NcclEnv.read({}), [p])
    assert plan.network == "fails" and "gid_attrs/types/3 does not open" in plan.why


@pytest.mark.parametrize(("value", "index"), [
    ("-1", 3),  # NCCL's own default: it picks
    ("03", 3), ("3abc", 3), ("0x3", 3), ("", 3), ("three", 0), ("1", 1),
])
def test_a_forced_index_as_nccl_reads_it(value: str, index: int) -> None:
    assert chosen(standard("mlx5_0", "10.0.0.5"), {"NCCL_IB_GID_INDEX": value}) == index


def test_a_forced_index_past_the_table_fails() -> None:
    plan = predict(NcclEnv.read({"NCCL_IB_GID_INDEX": "99"}), [standard("mlx5_0", "10.0.0.5")])
    assert plan.network == "fails"
    assert "NCCL_IB_GID_INDEX=99 is past the table's 4 slots" in plan.why


# ---------------------------------------------------------------- which ports


RAILS = [NodeRail("rail0", "10.0.0.5", "mlx5_0", 1, 3),
         NodeRail("rail1", "10.0.1.5", "mlx5_1", 1, 3)]
PORTS = [standard("mlx5_0", "10.0.0.5"), standard("mlx5_1", "10.0.1.5")]
# A storage NIC beside the rails (mlx5_10, as on a host with a storage bond): NCCL opens
# every ACTIVE port it is not told to leave.
WITH_STORAGE = [*PORTS, standard("mlx5_10", "10.0.10.5")]


def problems(env: dict[str, str], *, ports: list[PortView] = PORTS,
             allow_partial: bool = False, interfaces: list[str] | None = None) -> list[str]:
    plan = predict(NcclEnv.read(env), ports, interfaces)
    return [u.line() for u in nccl_problems(plan, RAILS, ports, allow_partial=allow_partial)]


@pytest.mark.parametrize(("spec", "device", "port_num", "selected"), [
    ("mlx5_1", "mlx5_10", 1, True),  # a prefix
    ("=mlx5_1", "mlx5_10", 1, False),
    ("mlx5_0:2", "mlx5_0", 1, False),
    ("mlx5_0:", "mlx5_0", 1, True),  # an empty port is any port
    ("mlx5_0:x", "mlx5_0", 1, False),  # atoi: port 0
    (" mlx5_0", "mlx5_0", 1, False),  # the blank is part of the name
    ("^", "mlx5_0", 1, False),  # the empty list, excluded
    ("", "mlx5_0", 1, True),  # the empty list: every port
    ("^=mlx5_0", "mlx5_0", 1, False), ("^=mlx5", "mlx5_0", 1, True),
    ("=^mlx5_0", "mlx5_0", 1, False),  # '=' first: '^' is part of the name
    (",,mlx5_0,,", "mlx5_0", 1, True),
    ("mlx5_0:1:0:0", "mlx5_0", 1, True),  # rail and plane fields
])
def test_nccl_ib_hca_forms(spec: str, device: str, port_num: int, selected: bool) -> None:
    assert IfList.parse(spec).selects(device, port_num) is selected


def test_a_list_that_selects_one_of_two_rails_is_refused_unless_allowed() -> None:
    assert problems({"NCCL_IB_HCA": "=mlx5_0"}) == [
        "nccl: NCCL would use 1 of 2 rails, not rail1 (mlx5_1:1) (mlx5_1:1 is not in "
        "NCCL_IB_HCA==mlx5_0): the job trains at a fraction of the bandwidth; select every "
        "rail, or pass --allow-partial-rails"]
    assert problems({"NCCL_IB_HCA": "=mlx5_0"}, allow_partial=True) == []
    assert problems({"NCCL_IB_HCA": "mlx5_0:2,mlx5_1"})[0].startswith(
        "nccl: NCCL would use 1 of 2 rails, not rail0 (mlx5_0:1)")


def test_a_rail_whose_port_is_down_is_not_used() -> None:
    down = [view("mlx5_0", *standard("mlx5_0", "10.0.0.5").slots, active=False),
            PORTS[1]]
    assert problems({}, ports=down) == [
        "nccl: NCCL would use 1 of 2 rails, not rail0 (mlx5_0:1) (mlx5_0:1 is DOWN): the "
        "job trains at a fraction of the bandwidth; select every rail, or pass "
        "--allow-partial-rails"]


@pytest.mark.parametrize(("env", "line"), [
    ({"NCCL_IB_HCA": "^"}, "nccl: NCCL would use TCP sockets, not the rails: NET/IB opens "
     "no port"),
    ({"NCCL_IB_HCA": " mlx5_0"}, "nccl: NCCL would use TCP sockets"),
    ({"NCCL_IB_DISABLE": "010"}, "nccl: NCCL would use TCP sockets, not the rails: "
     "NCCL_IB_DISABLE=010 turns NET/IB off (NCCL reads it as 8)"),
    ({"NCCL_IB_DISABLE": "1abc"}, "NCCL_IB_DISABLE=1abc turns NET/IB off"),
    ({"NCCL_IB_DISABLE": "1e3"}, "(NCCL reads it as 1)"),
    ({"NCCL_IB_DISABLE": "-1"}, "turns NET/IB off"),
    ({"NCCL_NET": "Socket"}, "nccl: NCCL would use TCP sockets, not the rails: "
     "NCCL_NET=Socket forces TCP sockets"),
    ({"NCCL_NET": "SOCKET"}, "forces TCP sockets"),
    ({"NCCL_NET": ""}, "nccl: NCCL would fail at init: NCCL_NET is set but empty"),
    ({"NCCL_NET": "IB", "NCCL_IB_HCA": "mlx5_9"}, "nccl: NCCL would fail at init: NET/IB "
     "opens no port"),
    ({"NCCL_NET": "IB", "NCCL_IB_DISABLE": "1"}, "NCCL_NET=IB then fails"),
])
def test_the_fabric_turned_off_or_away(env: dict[str, str], line: str) -> None:
    got = problems(env)
    assert len(got) == 1 and got[0].startswith(line) if line.startswith("nccl:") else \
        line in got[0], got


@pytest.mark.parametrize("env", [
    {}, {"NCCL_IB_DISABLE": "0"}, {"NCCL_IB_DISABLE": "true"}, {"NCCL_IB_DISABLE": "00"},
    {"NCCL_IB_DISABLE": "0x0"}, {"NCCL_IB_DISABLE": ""},
    {"NCCL_IB_DISABLE": "99999999999999999999"},  # ERANGE: NCCL takes its default, 0
    {"NCCL_NET": "IB"}, {"NCCL_NET": "ib"},
    {"NCCL_NET": "IBext_v8"},  # a plugin's network: not predicted, not refused
    {"NCCL_IB_HCA": ""}, {"NCCL_IB_HCA": "mlx5"}, {"NCCL_IB_HCA": "^mlx5_10"},
    {"NCCL_IB_HCA": "mlx5_0,mlx5_1"},
    {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}, {"NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1"},
    {"NCCL_IB_GID_INDEX": "-1"}, {"NCCL_IB_GID_INDEX": "03"}, {"NCCL_IB_GID_INDEX": "3"},
    {"NCCL_IB_ROCE_VERSION_NUM": "2"}, {"NCCL_IB_ROCE_VERSION_NUM": "02"},
    {"NCCL_SOCKET_IFNAME": "e"},  # one character: NCCL ignores it
    {"NCCL_SOCKET_IFNAME": "eth"}, {"NCCL_SOCKET_IFNAME": "^lo,docker"},
])
def test_fit_values_pass(env: dict[str, str]) -> None:
    assert problems(env, interfaces=["lo", "eth0"]) == []


@pytest.mark.parametrize(("env", "fit"), [
    ({}, False), ({"NCCL_IB_HCA": "mlx5_0,mlx5_1"}, False),  # mlx5_1 selects mlx5_10
    ({"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}, True), ({"NCCL_IB_HCA": "^mlx5_10"}, True),
    ({"NCCL_IB_HCA": "^=mlx5_10"}, True),
])
def test_a_port_that_is_not_a_rail(env: dict[str, str], fit: bool) -> None:
    got = problems(env, ports=WITH_STORAGE)
    assert got == ([] if fit else [
        "nccl: NCCL would also use mlx5_10:1, not a rail: its traffic leaves the fabric; "
        "set NCCL_IB_HCA==mlx5_0,mlx5_1"])


def test_a_socket_ifname_the_pod_lacks_fails_nccl() -> None:
    assert problems({"NCCL_SOCKET_IFNAME": "ens9f0np0"}, interfaces=["lo", "eth0"]) == [
        "nccl: NCCL would fail at init: NCCL_SOCKET_IFNAME=ens9f0np0 matches no running "
        "interface with an address here (NCCL's bootstrap and NET/IB need one)"]


def test_the_pods_own_address_sets_the_expected_gid() -> None:
    """A macvlan child in the pod (multus-cni#1100): its own IPv4 GID is at 7 while the
    host pins the rail's at 3; NCCL picks 7 by itself, and a forced 3 (copied from the host)
    is refused, naming the pod's view."""
    p = view("mlx5_0", slot(0, "fe80::1", 1), slot(1, "fe80::1", 2),
             slot(2, "::ffff:10.0.0.5", 1), slot(3, "::ffff:10.0.0.5", 2),
             slot(6, "::ffff:10.0.0.77", 1), slot(7, "::ffff:10.0.0.77", 2))
    rail = NodeRail("rail0", "10.0.0.5", "mlx5_0", 1, 3)
    forced = predict(NcclEnv.read({"NCCL_IB_GID_INDEX": "3"}), [p])
    assert [u.line() for u in nccl_problems(forced, [rail], [p], ["10.0.0.77"])] == [
        "nccl: NCCL would use GID 3 (IPv4 10.0.0.5, RoCE v2) on mlx5_0:1, not rail0's IPv4 "
        "RoCE v2 GID 7 (pod view, the pod's own address 10.0.0.77): set "
        "NCCL_IB_GID_INDEX=7, or unset it (NCCL then picks it itself)"]
    # The pod that shares the host's network: the pin is what counts.
    assert nccl_problems(forced, [rail], [p], ["10.0.0.5"]) == []


def test_the_traffic_class_is_reported() -> None:
    plan = predict(NcclEnv.read({"NCCL_IB_TC": "106", "NCCL_IB_SL": "3"}), PORTS[:2])
    assert plan.summary() == "NCCL: IB on mlx5_0:1 GID 3, mlx5_1:1 GID 3; TC 106, SL 3"


def test_conf_files_fill_what_the_environment_does_not_set() -> None:
    env = with_conf_files({"NCCL_IB_HCA": "mlx5"}, [
        "# a comment\nNCCL_IB_DISABLE=1\r\nNCCL_IB_HCA=mlx5_9\nnot a line\n"])
    assert env == {"NCCL_IB_HCA": "mlx5", "NCCL_IB_DISABLE": "1"}


# ---------------------------------------------------------------- NCCL's parsing, vs glibc

_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_libc.strtoll.restype = ctypes.c_longlong
_libc.strtoll.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int]
_libc.atoi.restype = ctypes.c_int
_libc.atoi.argtypes = [ctypes.c_char_p]


def glibc_strtoll(text: str) -> tuple[int, bool]:
    ctypes.set_errno(0)
    value = _libc.strtoll(text.encode(), None, 0)
    return value, ctypes.get_errno() != 0


@pytest.mark.parametrize(("text", "value"), [
    ("010", 8), ("1abc", 1), ("1e3", 1), ("true", 0), ("0x10", 16), ("08", 0), (" 1", 1),
    ("-1", -1), ("+5", 5), ("0x", 0), ("- 1", 0), ("\v7", 7),
])
def test_strtoll_cases(text: str, value: int) -> None:
    assert strtoll0(text) == (value, False) == glibc_strtoll(text)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=" \t\v+-0123456789abcdefxXABCDEFg8", max_size=24))
def test_strtoll_agrees_with_glibc(text: str) -> None:
    assert strtoll0(text) == glibc_strtoll(text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=" \t+-0123456789x", max_size=8))
def test_port_numbers_as_atoi_reads_them(text: str) -> None:
    assert c_atoi(text) == _libc.atoi(text.encode())


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["NCCL_NET", "NCCL_IB_HCA", "NCCL_IB_DISABLE",
                                        "NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_RANGE",
                                        "NCCL_IB_ADDR_FAMILY", "NCCL_IB_ROCE_VERSION_NUM",
                                        "NCCL_SOCKET_IFNAME", "NCCL_IB_TC"]),
                       st.text(max_size=40)))
def test_any_environment_gives_a_plan_never_an_exception(env: dict[str, str]) -> None:
    plan = predict(NcclEnv.read(env), WITH_STORAGE, ["lo", "eth0"])
    nccl_problems(plan, RAILS, WITH_STORAGE)
    assert plan.network in ("IB", "Socket", "fails") or plan.network == env.get("NCCL_NET")


# ---------------------------------------------------------------- the daemon's view


def rail_config(root: Path, gate: bool) -> Config:
    return parse_config({"paths": {"sysfs": str(root)}, "gid_source": "sysfs",
                         "nccl": {"gate": gate}, "rails": [
                             {"name": "rail0", "interface": "r0", "address": "10.10.0.5/24",
                              "rdma_device": "mlx5_0"}]})


def test_the_daemon_says_what_nccls_default_picks_and_names_a_vip_below_the_pin(
        tmp_path: Path) -> None:
    """The rail's GIDs read from sysfs by the agent's own reader: with a VIP's pair below
    the rail's, NCCL's default is 3 while the pin is 5; the condition says so with the fix,
    gates FabricReady only with nccl.gate, and each rail's status carries the index."""
    make_gid_tree(tmp_path, "mlx5_0", [*roce_entries("r0", "10.10.0.100"),
                                       (4, "::ffff:10.10.0.5", V1, "r0"),
                                       (5, "::ffff:10.10.0.5", V2, "r0")])
    facts = Facts(now=0.0, gid_table=read_sysfs(tmp_path),
                  pins={"rail0": Pin(5, "mlx5_0", 1, learned=True)})
    for gate in (False, True):
        report = judge_pass(rail_config(tmp_path, gate), facts)
        got = {f.type: f for f in report.findings}
        nccl = got[NCCL_DEFAULT_GID_PINNED]
        assert (nccl.status, nccl.reason, nccl.message) == (
            "False", "NCCLDefaultNotPinned",
            "rail0: NCCL with default settings would use mlx5_0:1 GID 3 (IPv4 10.10.0.100, "
            "RoCE v2), not the pinned GID 5 (10.10.0.5): jobs must set NCCL_IB_GID_INDEX=5 "
            "or NCCL_IB_ADDR_RANGE=10.10.0.0/24")
        assert report.rails[0].as_dict()["nccl_default_gid_index"] == 3
        assert (got[FABRIC_READY].reason == "NCCLDefaultNotPinned") is gate
    make_gid_tree(tmp_path, "mlx5_0", roce_entries("r0", "10.10.0.5"))
    facts = Facts(now=0.0, gid_table=read_sysfs(tmp_path),
                  pins={"rail0": Pin(3, "mlx5_0", 1, learned=True)})
    nccl = next(f for f in judge_pass(rail_config(tmp_path, True), facts).findings
                if f.type == NCCL_DEFAULT_GID_PINNED)
    assert (nccl.status, nccl.reason, nccl.message) == (
        "True", "NCCLDefaultIsPinned",
        "NCCL with default settings uses each rail's pinned GID: rail0 mlx5_0:1 GID 3")
    unpinned = judge_pass(rail_config(tmp_path, True), Facts(now=0.0, gid_table=read_sysfs(
        tmp_path)))
    assert next(f for f in unpinned.findings if f.type == NCCL_DEFAULT_GID_PINNED).status \
        in ("True", "Unknown")


def test_without_the_section_no_condition_but_the_status_still_says() -> None:
    cfg = parse_config({"rails": [{"name": "rail0", "interface": "r0",
                                   "address": "10.10.0.5/24"}]})
    table = GidTable("sysfs", tuple(
        GidEntry("mlx5_0", 1, i, g, t, "r0") for i, g, t in (
            (0, "fe80::1", GidType.IB_ROCE_V1), (1, "fe80::1", GidType.ROCE_V2),
            (2, "::ffff:10.10.0.5", GidType.IB_ROCE_V1),
            (3, "::ffff:10.10.0.5", GidType.ROCE_V2))))
    report = judge_pass(cfg, Facts(now=0.0, gid_table=table))
    assert NCCL_DEFAULT_GID_PINNED not in {f.type for f in report.findings}
    assert report.rails[0].roce.nccl_default_gid_index == 3


def test_check_notes_a_rail_whose_nccl_default_is_not_its_pin(
        capsys: pytest.CaptureFixture[str]) -> None:
    from nodeagent.cli.main import _print_report
    from nodeagent.publish.status import StatusDocument

    rails = [{"name": "rail0", "gid_index_pinned": 5, "nccl_default_gid_index": 3},
             {"name": "rail1", "gid_index_pinned": 3, "nccl_default_gid_index": 3}]
    _print_report(StatusDocument.parse({"node": "gpu-05", "ok": True, "conditions": [],
                                        "rails": rails}, written=False))
    assert capsys.readouterr().out.splitlines()[1:] == [
        "note: rail0: NCCL with default settings would pick GID 3, not the pinned 5: jobs "
        "must set NCCL_IB_GID_INDEX=5 (or NCCL_IB_ADDR_RANGE)"]


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=" \t\v+-0123456789abcdefxXABCDEFg8", max_size=16))
def test_the_admission_policys_pattern_is_strtolls_nonzero(text: str) -> None:
    """deploy/job-policy.yaml refuses NCCL_IB_DISABLE by this pattern (rendered from it)."""
    value, out_of_range = strtoll0(text)
    if not out_of_range:
        assert (re.match(NONZERO_INT_RE, text) is not None) == (value != 0), text
