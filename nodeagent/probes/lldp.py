"""LLDP (IEEE 802.1AB) frames parsed: the switch port at the far end of a rail. Pure.

An LLDPDU is a list of TLVs, each a 16-bit header (7 bits of type, 9 of length) and its
value, ending with type 0. Chassis ID (1), port ID (2) and TTL (3) come first and are
mandatory; system name (5) and port description (4) are optional. A frame from the wire
is hostile input: anything malformed reads as None, never an exception.
"""

from __future__ import annotations

import ipaddress

from nodeagent.model.network import Neighbour

ETH_P_LLDP = 0x88CC
LLDP_MULTICAST = bytes.fromhex("0180c200000e")  # nearest bridge: what a switch port sends
MAX_TEXT = 255  # a TLV's length field allows 511; a name longer than this is cut

_END, _CHASSIS, _PORT, _TTL, _PORT_DESC, _SYSTEM_NAME = 0, 1, 2, 3, 4, 5
# Chassis ID subtype 4 and port ID subtype 3 are MAC addresses; chassis 5 and port 4
# network addresses (a family byte first); the others are text.
_MAC = {(_CHASSIS, 4), (_PORT, 3)}
_ADDRESS = {(_CHASSIS, 5), (_PORT, 4)}


def _text(raw: bytes) -> str:
    text = raw[:MAX_TEXT].decode("utf-8", "replace")
    return "".join(c if c.isprintable() else "?" for c in text)


def _id(kind: int, value: bytes) -> str | None:
    if len(value) < 2:
        return None
    subtype, body = value[0], value[1:]
    if (kind, subtype) in _MAC:
        return ":".join(f"{b:02x}" for b in body) if len(body) == 6 else None
    if (kind, subtype) in _ADDRESS:
        family, address = body[0], body[1:]
        try:  # IANA address family numbers: 1 IPv4, 2 IPv6
            return str(ipaddress.ip_address(address)) if family in (1, 2) else None
        except ValueError:
            return None
    return _text(body)


def parse_lldpdu(payload: bytes) -> Neighbour | None:
    """The LLDPDU after the Ethernet header."""
    found: dict[int, bytes] = {}
    at = 0
    while at + 2 <= len(payload):
        header = int.from_bytes(payload[at:at + 2], "big")
        kind, length = header >> 9, header & 0x1FF
        value = payload[at + 2:at + 2 + length]
        if len(value) < length:
            return None  # cut short
        at += 2 + length
        if kind == _END:
            break
        found.setdefault(kind, value)  # the first of each: a repeat is not ours to trust
    if not {_CHASSIS, _PORT, _TTL} <= found.keys() or len(found[_TTL]) < 2:
        return None
    chassis, port = _id(_CHASSIS, found[_CHASSIS]), _id(_PORT, found[_PORT])
    if chassis is None or port is None:
        return None
    name, description = found.get(_SYSTEM_NAME), found.get(_PORT_DESC)
    return Neighbour(chassis, port, int.from_bytes(found[_TTL][:2], "big"),
                     _text(name) or None if name else None,
                     _text(description) or None if description else None)


def parse_frame(frame: bytes) -> Neighbour | None:
    """A whole Ethernet frame as an AF_PACKET raw socket hands it over (an 802.1Q tag, if
    the NIC left one, skipped)."""
    if len(frame) < 14:
        return None
    ethertype, body = int.from_bytes(frame[12:14], "big"), frame[14:]
    if ethertype == 0x8100 and len(body) >= 4:
        ethertype, body = int.from_bytes(body[2:4], "big"), body[4:]
    return parse_lldpdu(body) if ethertype == ETH_P_LLDP else None
