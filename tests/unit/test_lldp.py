"""LLDP frames parsed: the switch port at a rail's far end, from hostile input too."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.checks.cabling import cabling_finding, heard_now
from nodeagent.config import parse_config
from nodeagent.model.network import Neighbour
from nodeagent.probes.lldp import parse_frame, parse_lldpdu

# A whole frame as an AF_PACKET socket received it on a veth whose far end ran Debian's
# lldpd 1.0.16 (`configure system hostname leaf-07-r0`, `configure lldp portidsubtype
# ifname`, tx-interval 1): chassis ID a MAC (subtype 4), port ID an interface name
# (subtype 5), TTL 4, port description, system name, system description, capabilities,
# management address, 802.1/802.3 organisational TLVs, end.
LLDPD_FRAME = bytes.fromhex(
    "0180c200000e4635f945b06788cc0207044635f945b0670403057030060200040a0a6c6561662d30372d"
    "72300c5644656269616e20474e552f4c696e75782031322028626f6f6b776f726d29204c696e757820"
    "362e31382e34342d66632d763132353220233120534d5020505245454d50545f44594e414d49432040"
    "30207838365f36340e04009c008010181102fe800000000000004435f9fffe45b06702000000020008"
    "027030fe0900120f030100000000fe0900120f0100800000360000")


def tlv(kind: int, value: bytes) -> bytes:
    return ((kind << 9) | len(value)).to_bytes(2, "big") + value


def lldpdu(*extra: bytes, chassis: bytes = b"\x07leaf-01", port: bytes = b"\x05Eth1/7",
           ttl: bytes = b"\x00\x78") -> bytes:
    return tlv(1, chassis) + tlv(2, port) + tlv(3, ttl) + b"".join(extra) + tlv(0, b"")


def test_the_frame_real_lldpd_sends() -> None:
    assert parse_frame(LLDPD_FRAME) == Neighbour(
        "46:35:f9:45:b0:67", "p0", 4, "leaf-07-r0", "p0")


def test_ids_as_their_subtypes_word_them() -> None:
    got = parse_lldpdu(lldpdu(tlv(5, b"leaf-02"), tlv(4, b"Ethernet7"),
                              chassis=b"\x04\x00\x11\x22\x33\x44\x55",
                              port=b"\x04\x01\x0a\x00\x00\x07"))
    assert got == Neighbour("00:11:22:33:44:55", "10.0.0.7", 120, "leaf-02", "Ethernet7")
    assert (got.switch, got.port) == ("leaf-02", "Ethernet7")
    bare = parse_lldpdu(lldpdu())
    assert bare is not None and (bare.switch, bare.port) == ("leaf-01", "Eth1/7")


def test_a_vlan_tagged_frame_is_read_and_other_ethertypes_are_not() -> None:
    header = bytes.fromhex("0180c200000e001122334455")
    assert parse_frame(header + b"\x81\x00\x00\x05\x88\xcc" + lldpdu()) is not None
    assert parse_frame(header + b"\x08\x00" + lldpdu()) is None


def test_malformed_lldpdus_are_none() -> None:
    assert parse_lldpdu(lldpdu()[:-5]) is None  # cut short inside a TLV
    assert parse_lldpdu(tlv(1, b"\x07x") + tlv(3, b"\x00\x10")) is None  # no port ID
    assert parse_lldpdu(lldpdu(chassis=b"\x04\x00\x11")) is None  # a 2-byte MAC
    assert parse_lldpdu(lldpdu(ttl=b"\x01")) is None
    assert parse_lldpdu(lldpdu(port=b"\x04\x09\x01\x02")) is None  # an unknown family
    name = parse_lldpdu(lldpdu(tlv(5, b"leaf\x1b[31m\xff" + b"x" * 400)))
    assert name is not None and name.system_name is not None
    assert name.system_name.startswith("leaf?[31m\ufffd") and len(name.system_name) <= 255


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_from_the_wire_parse_or_are_none(data: bytes) -> None:
    for frame in (data, bytes.fromhex("0180c200000e001122334455") + b"\x88\xcc" + data):
        got = parse_frame(frame)
        assert got is None or isinstance(got, Neighbour)


def cfg(**lldp: Any) -> Any:
    return parse_config({"rails": [
        {"name": "rail0", "interface": "r0", "address": "10.10.0.5/24"},
        {"name": "rail1", "interface": "r1", "address": "10.11.0.5/24"}], "lldp": lldp})


def test_cabling_judged_against_the_pattern() -> None:
    heard = {"rail0": (Neighbour("c0", "Eth1/1", 120, "leaf-07-r0"), 100.0),
             "rail1": (Neighbour("c1", "Eth1/2", 120, "leaf-07-r0"), 100.0)}
    f = cabling_finding(cfg(switch_name="*-r{n}"), heard, 110.0)
    assert (f.status, f.reason) == ("False", "RailMiscabled")
    assert f.message == "rail1 r1: leaf-07-r0 port Eth1/2, expected a switch matching *-r1"
    heard["rail1"] = (Neighbour("c1", "Eth1/2", 120, "leaf-07-r1"), 100.0)
    f = cabling_finding(cfg(switch_name="*-r{n}"), heard, 110.0)
    assert (f.status, f.reason) == ("True", "CablingAsExpected")
    f = cabling_finding(cfg(), heard, 110.0)
    assert (f.status, f.reason) == ("True", "SwitchesSeen")
    assert f.message == "rail0 r0: leaf-07-r0 port Eth1/1; rail1 r1: leaf-07-r1 port Eth1/2"


def test_no_lldp_or_lldp_past_its_ttl_is_unknown_never_a_failure() -> None:
    heard = {"rail0": (Neighbour("c0", "Eth1/1", 4, "leaf-07-r0"), 100.0)}
    assert heard_now(heard, 104.0) and not heard_now(heard, 104.5)
    f = cabling_finding(cfg(switch_name="*-r{n}"), heard, 200.0)
    assert (f.status, f.reason) == ("Unknown", "NoLLDPSeen")
    assert "rail0 r0: no LLDP seen" in f.message and "rail1 r1: no LLDP seen" in f.message


def test_switch_names_as_node_labels() -> None:
    from nodeagent.model.kube import label_value, switch_label, switches_of

    assert label_value("leaf-07-r0") == "leaf-07-r0"
    assert label_value("leaf 07/r0 (Arista)") == "leaf-07-r0-Arista"
    assert label_value("\x1b[31m") == "31m" and label_value("///") is None
    assert len(label_value("x" * 300) or "") == 63
    assert switch_label("rail0") == "nodeagent.io/switch-rail0"
    assert switch_label("rail/0") is None
    assert switches_of({"nodeagent.io/switch-rail0": "leaf-07-r0", "team": "ml"}) == {
        "rail0": "leaf-07-r0"}


def test_a_stale_switch_label_is_removed_and_others_are_kept() -> None:
    from nodeagent.kube.nodeview import read_node
    from nodeagent.publish.node import spec_changes

    node = read_node({"metadata": {"name": "n", "labels": {
        "nodeagent.io/switch-rail0": "leaf-07-r0", "nodeagent.io/switch-rail9": "old",
        "nodeagent.io/pool": "a"}}})
    changes = spec_changes(node, None, None, False, False, "", {
        "nodeagent.io/switch-rail0": "leaf-07-r0", "nodeagent.io/switch-rail1": "leaf-07-r1"})
    assert changes.labels == {"nodeagent.io/switch-rail1": "leaf-07-r1",
                              "nodeagent.io/switch-rail9": None}


def test_fleet_wide_shows_each_rails_switch_from_the_nodes_labels() -> None:
    from nodeagent.cli.fleet import fleet_rows, render_table

    node = {"metadata": {"name": "gpu-01", "labels": {
        "nodeagent.io/switch-rail1": "leaf-07-r1", "nodeagent.io/switch-rail0": "leaf-07-r0"}},
        "status": {"conditions": [{"type": "FabricReady", "status": "True"}]}}
    rows = fleet_rows([node], [], "rdma/x", "k", 0.0, 1.0, 1.0)
    head, line = render_table(rows, 0.0, wide=True).splitlines()
    assert "SWITCHES" in head.split()
    assert "rail0=leaf-07-r0,rail1=leaf-07-r1" in line.split()
    assert "SWITCHES" not in render_table(rows, 0.0).split()
