"""The lldp section's source: the LLDP frames arriving on each rail, the switch port at
its far end.

One AF_PACKET socket per rail's netdev, bound to the LLDP ethertype, with the nearest-
bridge multicast address joined (a real NIC filters it out otherwise). No LLDP daemon is
needed on the host. A netdev that is not there (yet, or lent to a pod) is tried again
every REOPEN seconds. What the switch said is delivered when it changes, at most once a
second (a flood of frames costs a parse each, never a pass each).
"""

from __future__ import annotations

import errno
import socket
import struct
import threading
import time
from collections.abc import Callable

from nodeagent.checks.facts import LLDPSeen
from nodeagent.config import Config
from nodeagent.io.files import one_line
from nodeagent.io.wakeable import WakeableSelector
from nodeagent.model.network import Neighbour
from nodeagent.probes.lldp import ETH_P_LLDP, LLDP_MULTICAST, parse_frame
from nodeagent.run.work import Deliver

REOPEN = 5.0
MIN_GAP = 1.0  # seconds between deliveries
REFRESH = 30.0  # what is still heard is delivered again this often (at most; MIN_GAP apart)
SOL_PACKET, PACKET_ADD_MEMBERSHIP, PACKET_MR_MULTICAST = 263, 1, 0


def open_lldp_socket(interface: str) -> socket.socket:
    """Raises OSError (ENODEV: no such netdev here)."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_LLDP))
    try:
        sock.bind((interface, ETH_P_LLDP))
        index = socket.if_nametoindex(interface)
        mreq = struct.pack("iHH8s", index, PACKET_MR_MULTICAST, 6, LLDP_MULTICAST)
        sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class LLDPListener(threading.Thread):
    def __init__(self, cfg: Config, deliver: Deliver,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(name="lldp", daemon=True)
        self.cfg = cfg
        self.deliver = deliver
        self.clock = clock
        self._sel = WakeableSelector()
        self._socks: dict[str, tuple[str, socket.socket]] = {}  # rail -> (netdev, socket)
        self._heard: dict[str, tuple[Neighbour, float]] = {}  # rail -> last, when
        self._unopened: dict[str, str] = {}  # rail -> why its socket cannot be opened
        self._delivered: tuple[tuple[dict[str, Neighbour], dict[str, str]], float] = (
            ({}, {}), 0.0)
        self._reopen_at = 0.0  # the netdevs looked at again (a reload: at once)

    def stop(self) -> None:
        self._sel.halt()

    def reconfigure(self, cfg: Config) -> None:
        self.cfg = cfg
        self._reopen_at = 0.0
        self._sel.poke()

    def run(self) -> None:
        try:
            while not self._sel.halted:
                now = self.clock()
                if now >= self._reopen_at:
                    self._reopen_at = now + REOPEN
                    self._reconcile()
                wait = min(self._reopen_at - now, MIN_GAP)
                for rail in self._sel.ready(max(0.0, wait)):
                    self._receive(rail)
                self._maybe_deliver()
        finally:
            for name in list(self._socks):
                self._close(name)
            self._sel.close()

    def _reconcile(self) -> None:
        wanted = {r.name: r.interface for r in self.cfg.rails}
        for name, (netdev, _) in list(self._socks.items()):
            if wanted.get(name) != netdev:
                self._close(name)
        for name, netdev in wanted.items():
            if name in self._socks:
                continue
            try:
                sock = open_lldp_socket(netdev)
            except OSError as exc:
                # ENODEV: not here (yet, or lent to a pod): heard as nothing. Anything else
                # (EPERM without CAP_NET_RAW) is said, or it would read as a silent switch.
                if exc.errno != errno.ENODEV:
                    self._unopened[name] = "cannot listen for LLDP: " + (
                        "no CAP_NET_RAW" if exc.errno == errno.EPERM else one_line(exc))
                continue
            self._unopened.pop(name, None)
            self._socks[name] = (netdev, sock)
            self._sel.register(sock, name)
        for name in [n for n in self._heard if n not in wanted]:
            del self._heard[name]
        for name in [n for n in self._unopened if n not in wanted]:
            del self._unopened[name]

    def _close(self, name: str) -> None:
        _, sock = self._socks.pop(name)
        self._sel.unregister(sock)
        sock.close()

    def _receive(self, rail: str) -> None:
        _, sock = self._socks[rail]
        for _ in range(64):  # what is queued now, not a flood without end
            try:
                frame = sock.recv(2048)
            except BlockingIOError:
                return
            except OSError:  # the netdev went away: reopened at the next reconcile
                self._close(rail)
                return
            neighbour = parse_frame(frame)
            if neighbour is not None:
                self._heard[rail] = (neighbour, self.clock())

    def _maybe_deliver(self) -> None:
        now = self.clock()
        for rail in [r for r, (n, at) in self._heard.items() if now - at > n.ttl]:
            del self._heard[rail]  # its TTL is over (0: the switch withdrew it)
        current = ({r: n for r, (n, _) in self._heard.items()}, dict(self._unopened))
        last, at = self._delivered
        # Again while it holds, well within its TTL: the judge ages what it was given.
        refresh = min([REFRESH] + [n.ttl / 2 for n in current[0].values()])
        if now - at < MIN_GAP or (current == last and (not current[0] or now - at < refresh)):
            return
        self.deliver(LLDPSeen(dict(self._heard), dict(self._unopened)))
        self._delivered = (current, now)
