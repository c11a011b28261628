"""The peer probe's handshake over TCP: two fixed-size messages, the way NCCL's bootstrap
hands over a QP number and a GID before RDMA starts (not rdma_cm, which picks the GID from
the route itself: the probe must use the pinned index, as jobs do).

The prober sends a Hello (its QP number, first PSN, GID and path MTU); the responder
answers with a Reply: Accept (its QP number, PSN, GID and a buffer the prober may read) or
Refuse (a code saying why). Everything is big-endian and of one size per version, so a
reader takes exactly that many bytes and anything else is garbage. Pure: no sockets here.

A Hello in a traffic class other than 0 is version 2: it adds the class and service level,
which the responder sets on its own QP, so the read responses travel in the prober's class
as NCCL's do (its receiving side takes the connecting side's `tc` and `sl`:
`meta.tc = remMeta.tc` in src/transport/net_ib/connect.cc). A class-0 Hello stays version
1, which agents before classes answer; the Reply is version 1 whatever the Hello.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from dataclasses import dataclass

MAGIC = b"NAPR"
VERSION = 1  # the Reply's, and a class-0 Hello's
CLASSED = 2  # a Hello with a traffic class and service level
_HELLO = struct.Struct("!4sBBHII16s")  # magic, version, kind, mtu, qpn, psn, gid
_CLASSED = struct.Struct("!4sBBHII16sBBH")  # ... as Hello, then class, level, zero
_REPLY = struct.Struct("!4sBBHII16sQII")  # ... as Hello, then addr, rkey, length
HELLO_SIZE = _HELLO.size  # 32
MAX_HELLO_SIZE = _CLASSED.size  # 36
REPLY_SIZE = _REPLY.size  # 48
_KIND_HELLO, _KIND_ACCEPT, _KIND_REFUSE = 1, 2, 3
MTUS = (256, 512, 1024, 2048, 4096)  # the IB path MTUs (IBV_MTU_256 .. IBV_MTU_4096)
_QPN_MAX = 0xFFFFFF  # QP numbers and PSNs are 24 bits


class WireError(ValueError):
    """A message that is not one of ours (the words say what is wrong with it)."""


class Refusal(enum.IntEnum):
    """Why a responder would not set up; its words go into the prober's message."""

    UNKNOWN_PEER = 1
    RAIL_NOT_READY = 2  # not managed, GID off its pin, device not known
    DEVICE = 3  # its device, PD or QP failed
    BUSY = 4  # at its connection limit
    BAD_HELLO = 5  # the Hello's GID is not the prober's address, or its MTU unknown

    @property
    def words(self) -> str:
        return {1: "this node is not one of its peers", 2: "its rail is not ready",
                3: "its RDMA device failed", 4: "it is at its connection limit",
                5: "it did not accept the handshake"}[self.value]


@dataclass(frozen=True)
class Hello:
    qpn: int
    psn: int
    gid: bytes  # 16 bytes, the prober's GID at its pinned index
    mtu: int  # bytes, one of MTUS
    traffic_class: int = 0  # the GRH traffic class both QPs use (DSCP << 2 | ECN)
    service_level: int = 0  # 0-15


@dataclass(frozen=True)
class Accept:
    qpn: int
    psn: int
    gid: bytes
    mtu: int  # the path MTU the responder set (at most the Hello's)
    addr: int  # the buffer the prober may read, and its key and length
    rkey: int
    length: int


@dataclass(frozen=True)
class Refuse:
    code: Refusal


def ipv4_gid(address: str) -> bytes:
    """The IPv4-mapped GID of an address: what a RoCE v2 GID entry of that address holds."""
    return ipaddress.IPv6Address(f"::ffff:{address}").packed


def _check_header(magic: bytes, version: int, speaks: tuple[int, ...] = (VERSION,)) -> None:
    if magic != MAGIC:
        raise WireError("not a nodeagent peer handshake (bad magic)")
    if version not in speaks:
        raise WireError(f"handshake version {version}, this agent speaks "
                        f"{' and '.join(map(str, speaks))}")


def _check_fields(qpn: int, psn: int, mtu: int) -> None:
    if qpn > _QPN_MAX or psn > _QPN_MAX:
        raise WireError("QP number or PSN over 24 bits")
    if mtu not in MTUS:
        raise WireError(f"path MTU {mtu} is not an IB MTU")


def pack_hello(h: Hello) -> bytes:
    if h.traffic_class == h.service_level == 0:
        return _HELLO.pack(MAGIC, VERSION, _KIND_HELLO, h.mtu, h.qpn, h.psn, h.gid)
    return _CLASSED.pack(MAGIC, CLASSED, _KIND_HELLO, h.mtu, h.qpn, h.psn, h.gid,
                         h.traffic_class, h.service_level, 0)


def hello_size(head: bytes) -> int:
    """How long the Hello that starts with `head` is: its version says (a head too short
    to say, or of no version we speak, is read as version 1, which then fails to parse)."""
    if len(head) > 4 and head[:4] == MAGIC and head[4] == CLASSED:
        return MAX_HELLO_SIZE
    return HELLO_SIZE


def parse_hello(data: bytes) -> Hello:
    if len(data) != hello_size(data):
        raise WireError(f"handshake of {len(data)} bytes, not {hello_size(data)}")
    if len(data) == HELLO_SIZE:
        magic, version, kind, mtu, qpn, psn, gid = _HELLO.unpack(data)
        tc = sl = zero = 0
    else:
        magic, version, kind, mtu, qpn, psn, gid, tc, sl, zero = _CLASSED.unpack(data)
    _check_header(magic, version, (VERSION, CLASSED))
    if kind != _KIND_HELLO:
        raise WireError(f"message kind {kind}, not a Hello")
    _check_fields(qpn, psn, mtu)
    if sl > 15 or zero:
        raise WireError(f"service level {sl} over 15, or reserved bytes set")
    return Hello(qpn, psn, gid, mtu, tc, sl)


def pack_reply(r: Accept | Refuse) -> bytes:
    if isinstance(r, Refuse):
        return _REPLY.pack(MAGIC, VERSION, _KIND_REFUSE, int(r.code), 0, 0, bytes(16), 0, 0, 0)
    return _REPLY.pack(MAGIC, VERSION, _KIND_ACCEPT, r.mtu, r.qpn, r.psn, r.gid, r.addr,
                       r.rkey, r.length)


def parse_reply(data: bytes) -> Accept | Refuse:
    if len(data) != REPLY_SIZE:
        raise WireError(f"reply of {len(data)} bytes, not {REPLY_SIZE}")
    magic, version, kind, mtu, qpn, psn, gid, addr, rkey, length = _REPLY.unpack(data)
    _check_header(magic, version)
    if kind == _KIND_REFUSE:
        try:
            return Refuse(Refusal(mtu))  # a refusal's code rides in the MTU field
        except ValueError:
            raise WireError(f"refusal code {mtu} unknown") from None
    if kind != _KIND_ACCEPT:
        raise WireError(f"message kind {kind}, not a reply")
    _check_fields(qpn, psn, mtu)
    return Accept(qpn, psn, gid, mtu, addr, rkey, length)
