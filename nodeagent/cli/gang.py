"""The gang step of `nodeagent preflight`: every pod of a training job waits for the others
at a barrier, then probes its ring neighbour over RoCE on every rail with the agent's own
peer probe (probes/peer.py, the prober; run/responder.py, the responder), so a gang whose
pods reach each other over TCP but not over RoCE never reaches step 1.

The barrier: each pod serves its card (index, node, rails: address, device, pinned GID
index) as one JSON line on `port` to anyone who connects and says its rank, and fetches
every other pod's card by its stable name (an Indexed Job's `<job>-<i>.<service>`, the
headless Service publishing not-ready addresses) until it has them all or the deadline
passes. Each pod
then probes pod i+1 (mod n) on each rail, from the rail's address and pinned GID index to
the neighbour's responder on `probe_port`, and stays until its card has been fetched by
every other pod and pod i-1 has probed it (or the deadline), so no pod leaves before the
others are done with it. A card is read bounded (4 KiB, 2 s); what does not parse is
garbage, retried until the deadline and then named.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from nodeagent.io.files import one_line, parse_json_state
from nodeagent.model import NodeRail, PeerOutcome, RailEndpoint, Unfit
from nodeagent.probes.peer import RailEnd, probe_peer
from nodeagent.run.responder import Responder, Served

CARD_MAX = 4096
READ_TIMEOUT = 2.0
RETRY = 0.5


@dataclass(frozen=True)
class GangCard:
    index: int
    node: str
    rails: tuple[NodeRail, ...]

    ready: bool = False  # its responder answers: it may be probed

    def encode(self) -> bytes:
        return (json.dumps({"index": self.index, "node": self.node, "ready": self.ready,
                            "rails": [{"name": r.name, "address": r.address}
                                      for r in self.rails]}) + "\n").encode()


def parse_card(data: bytes) -> GangCard:
    """A peer's card; ValueError naming what is wrong."""
    if len(data) > CARD_MAX:
        raise ValueError(f"more than {CARD_MAX} bytes")
    try:  # the strict reader: nesting that exhausts the parser is bad content too
        doc = parse_json_state(data.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError too
        raise ValueError(f"not a card: {data[:40]!r}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("index"), int) \
            or isinstance(doc.get("index"), bool) or not isinstance(doc.get("node"), str) \
            or not isinstance(doc.get("rails"), list):
        raise ValueError("not a card: index, node or rails missing")
    rails = []
    for r in doc["rails"][:64]:
        if not isinstance(r, dict) or not isinstance(r.get("name"), str):
            raise ValueError("not a card: a rail without a name")
        address = r.get("address")
        if address is not None:
            try:
                ipaddress.IPv4Address(address)
            except ValueError:
                raise ValueError(f"not a card: rail {r['name'][:40]!r} address "
                                 f"{str(address)[:40]!r}") from None
        rails.append(NodeRail(r["name"][:64], address, None, None, None))
    return GangCard(doc["index"], doc["node"][:253], tuple(rails), doc.get("ready") is True)


class CardServer(threading.Thread):
    """Serves this pod's card to every connection; remembers which ranks fetched it, and
    which fetched it once it said ready (a fetcher says its rank first: pods may share an
    address, on one host's network)."""

    def __init__(self, card: GangCard, port: int, bind: str = "0.0.0.0") -> None:
        super().__init__(name="gang-barrier", daemon=True)
        self.card = card.encode()  # replaced whole when the responder is up (ready)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((bind, port))
            self.sock.listen(64)
        except OSError:
            self.sock.close()
            raise
        self.sock.settimeout(0.2)
        self.ready = False
        self.fetched_by: set[int] = set()
        self.fetched_ready_by: set[int] = set()
        self._halt = threading.Event()

    def mark_ready(self, card: GangCard) -> None:
        self.card = replace(card, ready=True).encode()
        self.ready = True  # after the card: a fetch that sees True was sent the ready card

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(1.0)
                with contextlib.suppress(OSError):
                    rank = _rank(conn.recv(16))
                    ready = self.ready
                    conn.sendall(self.card)
                    if rank is not None:
                        self.fetched_by.add(rank)
                        if ready:
                            self.fetched_ready_by.add(rank)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)
        self.sock.close()


def _rank(data: bytes) -> int | None:
    try:
        return int(data.decode("ascii").strip())
    except ValueError:  # UnicodeDecodeError too
        return None


def fetch_card(host: str, port: int, me: int, timeout: float = READ_TIMEOUT) -> GangCard:
    """One peer's card, this pod's rank said first; OSError or ValueError with why not."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(f"{me}\n".encode())
        data = b""
        while len(data) <= CARD_MAX:
            chunk = s.recv(CARD_MAX + 1 - len(data))
            if not chunk:
                break
            data += chunk
    return parse_card(data)


def barrier(peers: Sequence[str], me: int, port: int, deadline: float,
            fetch: Callable[[str, int, int], GangCard] = fetch_card
            ) -> tuple[dict[int, GangCard], list[Unfit]]:
    """Every other pod's card, or what kept them away by the deadline."""
    cards: dict[int, GangCard] = {}
    last: dict[int, str] = {i: "not tried" for i in range(len(peers)) if i != me}
    while True:
        for i in sorted(last):
            try:
                got = fetch(peers[i], port, me)
            except (OSError, ValueError) as exc:
                last[i] = _words(exc)
                continue
            if got.index != i:
                last[i] = f"answered as pod {got.index}, not {i}"
                continue
            cards[i] = got
            del last[i]
        if not last or time.monotonic() >= deadline:
            break
        time.sleep(min(RETRY, max(0.0, deadline - time.monotonic())))
    if not last:
        return cards, []
    missing = "; ".join(f"{peers[i]} ({why})" for i, why in sorted(last.items())[:8])
    more = f" and {len(last) - 8} more" if len(last) > 8 else ""
    return cards, [Unfit("gang", f"barrier: {len(last)} of {len(peers) - 1} other pods not "
                         f"ready by the deadline: {missing}{more}")]


def _words(exc: BaseException) -> str:
    if isinstance(exc, socket.gaierror):
        return f"name not resolved: {exc.strerror}"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc)[:200]


@dataclass(frozen=True)
class RingProbe:
    """One rail's probe of the ring neighbour: the pair, and how it ended."""

    rail: str
    source: str  # this pod's node and address
    target: str  # the neighbour's
    outcome: PeerOutcome
    error: str = ""

    def unfit(self) -> Unfit | None:
        if self.outcome == PeerOutcome.OK:
            return None
        step = {PeerOutcome.ROCE_FAILED: "RoCE fails while TCP reaches it",
                PeerOutcome.MTU_FAILED: "full-size RoCE frames fail while TCP reaches it",
                PeerOutcome.NO_RESPONDER: "its preflight's responder does not answer on TCP "
                "either",
                PeerOutcome.REFUSED: "its responder refused",
                PeerOutcome.LOCAL: "this pod cannot probe"}[self.outcome]
        return Unfit("gang", f"{self.source} -> {self.target} on {self.rail}: {step} "
                     f"({self.error})")


def _served(card: GangCard, allowed: frozenset[str]) -> dict[str, Served]:
    return {r.name: Served(RailEndpoint(r.device, r.port or 1, r.gid_index, r.address), allowed)
            for r in card.rails
            if r.address and r.device and r.gid_index is not None}


def run_gang(card: GangCard, peers: Sequence[str], port: int, probe_port: int,
             deadline: float, timeout: float, bind: str = "0.0.0.0") -> tuple[
                 list[RingProbe], list[Unfit]]:
    """The barrier, then each rail's probe of the next pod, then waiting for the previous
    pod's probe. `card` carries this pod's rails (address, device, pinned GID index)."""
    n, me = len(peers), card.index
    if n < 2:
        return [], []
    try:
        server = CardServer(card, port, bind)
    except OSError as exc:  # another job's preflight on this host's network, most likely
        return [], [Unfit("gang", f"cannot serve the barrier on {bind}:{port}: "
                          f"{_words(exc)} (another gang's preflight on this node? give each "
                          "job its own --gang-port)")]
    server.start()
    responder: Responder | None = None
    try:
        cards, problems = barrier(peers, me, port, deadline)
        if problems:
            return [], problems
        allowed = frozenset(r.address for c in cards.values() for r in c.rails if r.address)
        responder = Responder(probe_port, hold=2 * timeout + 1.0)
        responder.serve(_served(card, allowed))
        responder.start()
        server.mark_ready(card)
        succ, pred = cards[(me + 1) % n], cards[(me - 1) % n]
        # A barrier that filled at the last moment still leaves the ring its own time.
        deadline = max(deadline, time.monotonic() + 4 * timeout + 5.0)
        problems = _until_ready(peers[succ.index], port, me, deadline)
        probes = [] if problems else _probe_ring(card, succ, probe_port, timeout)
        problems += [u for p in probes if (u := p.unfit()) is not None]
        _until_done(server, responder, card, pred, n, deadline)
        return probes, problems
    finally:
        server.stop()
        if responder is not None:
            responder.stop()
            responder.join(timeout=5)


def _until_ready(host: str, port: int, me: int, deadline: float) -> list[Unfit]:
    """The next pod's card until it says its responder is up."""
    why = "not ready"
    while time.monotonic() < deadline:
        try:
            if fetch_card(host, port, me).ready:
                return []
        except (OSError, ValueError) as exc:
            why = _words(exc)
        time.sleep(RETRY / 5)
    return [Unfit("gang", f"{host}: its responder was not up by the deadline ({why})")]


def _probe_ring(card: GangCard, succ: GangCard, probe_port: int,
                timeout: float) -> list[RingProbe]:
    theirs = {r.name: r for r in succ.rails}
    out = []
    for rail in card.rails:
        peer = theirs.get(rail.name)
        source = f"{card.node} {rail.address}"
        if peer is None or peer.address is None:
            out.append(RingProbe(rail.name, source, succ.node, PeerOutcome.REFUSED,
                                 f"{succ.node} has no rail {rail.name}"))
            continue
        target = f"{succ.node} {peer.address}"
        if not (rail.address and rail.device and rail.gid_index is not None):
            out.append(RingProbe(rail.name, source, target, PeerOutcome.LOCAL,
                                 "the node's agent does not say where this rail's GID is"))
            continue
        end = RailEnd(RailEndpoint(rail.device, rail.port or 1, rail.gid_index, rail.address))
        try:
            end.open(remote_read=False)
        except Exception as exc:  # ProbeFailed names its step; pyverbs' errors do not
            out.append(RingProbe(rail.name, source, target, PeerOutcome.LOCAL,
                                 one_line(exc)))
            continue
        try:
            got = probe_peer(end, rail.name, peer.address, succ.node, probe_port, 5,
                             timeout)
        finally:
            end.close()
        out.append(RingProbe(rail.name, source, target, got.outcome, got.error))
    return out


def _until_done(server: CardServer, responder: Responder, card: GangCard, pred: GangCard,
                n: int, deadline: float) -> None:
    """Until every other pod has this pod's card, the previous pod has seen it ready (it
    waits for that before probing, even with nothing to probe) and has probed it on every
    rail it serves (its probes over), or the deadline."""
    theirs = {r.name: r.address for r in pred.rails}
    wanted = [theirs.get(r.name) for r in card.rails if r.address and r.device
              and r.gid_index is not None]
    others = set(range(n)) - {card.index}
    while time.monotonic() < deadline:
        fetched = others <= server.fetched_by and pred.index in server.fetched_ready_by
        probed = all(a is not None and responder.counts.answered[a] > 0 for a in wanted)
        if fetched and probed and responder.open_connections == 0:
            return
        time.sleep(0.05)
