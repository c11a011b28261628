"""The peer responder: a network-facing service on every GPU node, so its whole design is
what it refuses and what one connection may cost.

It listens on each ready rail's own address (never a wildcard), one thread for all rails,
every socket non-blocking under one selector. A connection from an address that is not one
of the rail's peers (with discovery: not on the rail's own network) is refused at once (a
48-byte Refuse, no QP); one over the limits
(MAX_CONNECTIONS in all, MAX_PER_PEER from one address, and with discovery at most half of
them from addresses no list names) likewise. A known peer has
HANDSHAKE seconds from its accept to deliver exactly one Hello: more bytes, other bytes or
too slow a trickle closes the connection. A valid Hello gets one RC QP on the rail's pinned
GID, moved to RTS against the prober's QP, and an Accept naming a 4 KiB buffer the prober
may read (zeros; reads are one-sided, so probes cost this thread nothing). The QP lives
while the TCP connection does, at most `hold` seconds.

The loop hands over the rails to serve after every pass (`serve`): a rail leaves when its
GID is off its pin or its device is not known, and its listener, connections, QPs and
device context go with it, so the responder never holds a GID entry a re-pin must free.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from nodeagent.io.files import one_line
from nodeagent.io.wakeable import WakeableSelector
from nodeagent.model.peers import RailEndpoint
from nodeagent.probes.peer import BUFFER, RailEnd, gid_text, ibv_mtu, mtu_bytes, probe_volume
from nodeagent.probes.peerwire import (
    MAX_HELLO_SIZE,
    Accept,
    Refusal,
    Refuse,
    WireError,
    hello_size,
    ipv4_gid,
    pack_reply,
    parse_hello,
)
from nodeagent.probes.transport import connect_rc
from nodeagent.probes.verbs import load as load_pyverbs
from nodeagent.run.own_rdma import OwnRDMA

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64  # open at once, over every rail
MAX_UNLISTED = MAX_CONNECTIONS // 2  # of them, from addresses only the network answers
MAX_PER_PEER = 2  # open at once from one address (a prober probes one at a time)
HANDSHAKE = 1.0  # seconds from accept to a whole Hello
LOG_EVERY = 60.0  # seconds between two warnings of one rail
BACKLOG = 16
IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)  # bind before the address is up


@dataclass(frozen=True)
class Served:
    """One rail the responder answers on: where, and whom."""

    target: RailEndpoint
    peers: frozenset[str]  # the addresses it answers
    # and any address on these (with discovery: the rail's own network)
    networks: frozenset[IPv4Network] = frozenset()

    def answers(self, address: str) -> bool:
        if address in self.peers:
            return True
        try:
            ip = IPv4Address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.networks)


@dataclass
class _Conn:
    sock: socket.socket
    rail: str
    peer: str
    deadline: float
    listed: bool = True  # a peer the lists name, not only an address on the rail's network
    data: bytes = b""
    qp: Any = None  # set once the Hello is answered


@dataclass
class _Rail:
    served: Served
    listener: socket.socket
    end: RailEnd | None = None  # opened at the first valid Hello


@dataclass
class ResponderCounts:
    """What the responder did, for the metrics and the tests (by kind)."""

    accepted: int = 0
    answered: Counter[str] = field(default_factory=Counter)  # QPs set up, by peer address
    refused: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)  # closed without a reply


class Responder(threading.Thread):
    def __init__(self, port: int, hold: float, own_rdma: OwnRDMA | None = None,
                 plan: tuple[int, int] = (5, 60)) -> None:
        super().__init__(name="peer-responder", daemon=True)
        self.port = port
        self.hold = hold
        # The probers' reads and bandwidth_every (a fleet shares one peers section): what a
        # served probe is charged to the rail's own RDMA.
        self.own_rdma = own_rdma or OwnRDMA()
        self.plan = plan
        self.counts = ResponderCounts()
        self._sel = WakeableSelector()
        self._lock = threading.Lock()
        self._wanted: dict[str, Served] = {}
        self._rails: dict[str, _Rail] = {}
        self._conns: dict[socket.socket, _Conn] = {}
        self.errors: dict[str, str] = {}  # rail -> why it is not listening (bind failed)
        self._warned: dict[str, tuple[float, int]] = {}  # rail -> (last warning, held back)

    # ------------------------------------------------------------ the loop's side

    def serve(self, rails: Mapping[str, Served]) -> None:
        """The rails to answer on from now; the rest are closed."""
        with self._lock:
            self._wanted = dict(rails)
        self._sel.poke()

    def stop(self) -> None:
        self._sel.halt()

    def not_listening(self) -> dict[str, str]:
        """Rail -> why the responder could not listen there (the status file says it)."""
        with self._lock:
            return dict(self.errors)

    @property
    def listening(self) -> dict[str, tuple[str, int]]:
        with self._lock:
            return {n: r.listener.getsockname() for n, r in self._rails.items()}

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    # ------------------------------------------------------------ the thread

    def run(self) -> None:
        try:
            while not self._sel.halted:
                self._reconcile()
                now = time.monotonic()
                timeout = min([c.deadline for c in self._conns.values()] + [now + 1.0]) - now
                for data in self._sel.ready(timeout):
                    if isinstance(data, str):
                        self._accept(data)
                    else:
                        self._readable(data)
                self._expire(time.monotonic())
        finally:
            for name in list(self._rails):
                self._close_rail(name)
            self._sel.close()

    def _reconcile(self) -> None:
        with self._lock:
            wanted = dict(self._wanted)
        for name in [n for n, r in self._rails.items() if wanted.get(n) != r.served]:
            if name in wanted and wanted[name].target == self._rails[name].served.target:
                self._rails[name].served = wanted[name]  # only its peers changed
                continue
            self._close_rail(name)
        for name, served in wanted.items():
            if name not in self._rails:
                self._open_rail(name, served)

    def _open_rail(self, name: str, served: Served) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
            sock.bind((served.target.address, self.port))
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            why = f"cannot listen on {served.target.address}:{self.port}: {exc.strerror or exc}"
            with self._lock:
                if self.errors.get(name) != why:
                    log.error("peer responder, %s: %s", name, why)
                self.errors[name] = why
            return
        with self._lock:
            self.errors.pop(name, None)
            self._rails[name] = _Rail(served, sock)
        self._sel.register(sock, name)

    def _close_rail(self, name: str) -> None:
        for conn in [c for c in self._conns.values() if c.rail == name]:
            self._close(conn)
        with self._lock:
            rail = self._rails.pop(name)
        self._sel.unregister(rail.listener)
        rail.listener.close()
        if rail.end is not None:
            rail.end.close()

    def _accept(self, name: str) -> None:
        rail = self._rails.get(name)
        if rail is None:
            return
        for _ in range(BACKLOG):  # a flood is drained in bounded bites
            try:
                sock, (peer, _port) = rail.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("peer responder, %s: accept: %s", name, exc.strerror)
                    return
                continue  # the peer reset before we took it
            sock.setblocking(False)
            refusal = self._refusal(rail, peer)
            if refusal is not None:
                self._refuse(sock, refusal)
                continue
            conn = _Conn(sock, name, peer, time.monotonic() + HANDSHAKE,
                         listed=peer in rail.served.peers)
            self._conns[sock] = conn
            self._sel.register(sock, conn)

    def _refusal(self, rail: _Rail, peer: str) -> Refusal | None:
        if not rail.served.answers(peer):
            return Refusal.UNKNOWN_PEER
        if len(self._conns) >= MAX_CONNECTIONS:
            return Refusal.BUSY
        if sum(1 for c in self._conns.values() if c.peer == peer) >= MAX_PER_PEER:
            return Refusal.BUSY
        # With discovery, any address on the rail's network is answered: those no list
        # names share half the slots, so they cannot crowd out the peers this agent knows.
        if peer not in rail.served.peers and sum(
                1 for c in self._conns.values() if not c.listed) >= MAX_UNLISTED:
            return Refusal.BUSY
        return None

    def _refuse(self, sock: socket.socket, why: Refusal) -> None:
        self.counts.refused[why.name] += 1
        with contextlib.suppress(OSError):  # 48 bytes into an empty buffer: never blocks
            sock.send(pack_reply(Refuse(why)))
        sock.close()

    def _readable(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(MAX_HELLO_SIZE + 1 - len(conn.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk or conn.qp is not None:
            # The prober is done (EOF), or sent bytes after its Hello: either way, the end.
            self._close(conn, None if not chunk or conn.qp is None else "after-hello")
            return
        conn.data += chunk
        size = hello_size(conn.data)
        if len(conn.data) < size:
            return
        if len(conn.data) > size:
            self._close(conn, "oversized")
            return
        self._answer(conn)

    def _answer(self, conn: _Conn) -> None:
        try:
            hello = parse_hello(conn.data)
        except WireError as exc:
            log.debug("peer responder: %s from %s: %s", conn.rail, conn.peer, exc)
            self._close(conn, "garbage")
            return
        rail = self._rails[conn.rail]
        if hello.gid != ipv4_gid(conn.peer):
            self._refuse_conn(conn, Refusal.BAD_HELLO)
            return
        try:
            load_pyverbs()
            import pyverbs.enums as e
            from pyverbs.addr import GID

            if rail.end is None:
                t = rail.served.target
                end = RailEnd(t)
                end.open(remote_read=True)
                rail.end = end
            mtu = min(hello.mtu, mtu_bytes(rail.end.mtu))
            qp = rail.end.new_qp()
            conn.qp = qp
            connect_rc(qp, rail.end.at.port, rail.end.at.gid_index, hello.qpn,
                       GID(gid_text(hello.gid)), remote_psn=hello.psn,
                       local_psn=hello.psn ^ 0x5A5A5A, mtu=ibv_mtu(mtu),
                       access=e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ,
                       traffic_class=hello.traffic_class, service_level=hello.service_level)
        except Exception as exc:  # ProbeFailed, or pyverbs' own errors from any call
            self._warn(conn.rail, f"cannot answer {conn.peer}: {one_line(exc)}")
            if rail.end is not None and conn.qp is None:
                rail.end.close()  # opened, but no QP: open again at the next Hello
                rail.end = None
            self._refuse_conn(conn, Refusal.DEVICE)
            return
        assert rail.end.mr is not None
        reply = Accept(qp.qp_num, hello.psn ^ 0x5A5A5A, ipv4_gid(rail.served.target.address),
                       mtu, rail.end.mr.buf, rail.end.mr.rkey, BUFFER)
        try:
            conn.sock.send(pack_reply(reply))
        except OSError:
            self._close(conn, "reset")
            return
        self.counts.accepted += 1
        self.counts.answered[conn.peer] += 1
        reads, every = self.plan
        sampled = bool(every) and (self.counts.answered[conn.peer] - 1) % every == 0
        self.own_rdma.charge(conn.rail, probe_volume(reads, mtu, BUFFER, sampled))
        conn.deadline = time.monotonic() + self.hold

    def _warn(self, rail: str, what: str) -> None:
        """A warning per rail at most every LOG_EVERY seconds, with the count of those held
        back: a peer's Hellos (one a second, or a flood's thousands) must not flood the
        journal with one line each."""
        now = time.monotonic()
        last, held = self._warned.get(rail, (-LOG_EVERY, 0))
        if now - last < LOG_EVERY:
            self._warned[rail] = (last, held + 1)
            return
        more = f" ({held} more like it in the last {LOG_EVERY:.0f} s)" if held else ""
        log.warning("peer responder, %s: %s%s", rail, what, more)
        self._warned[rail] = (now, 0)

    def _refuse_conn(self, conn: _Conn, why: Refusal) -> None:
        self._drop(conn)
        self._refuse(conn.sock, why)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self._close(conn, "handshake-timeout" if conn.qp is None else None)

    def _drop(self, conn: _Conn) -> None:
        """Forget the connection and its QP (the socket is the caller's)."""
        self._conns.pop(conn.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        if conn.qp is not None:
            rail = self._rails.get(conn.rail)
            if rail is not None and rail.end is not None:
                rail.end.drop_qp(conn.qp)
            conn.qp = None

    def _close(self, conn: _Conn, dropped: str | None = None) -> None:
        if dropped is not None:
            self.counts.dropped[dropped] += 1
        self._drop(conn)
        conn.sock.close()
