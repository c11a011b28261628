"""The gang step of `nodeagent preflight`: every pod of a training job waits for the others
at a barrier, then probes its ring neighbour over RoCE on every rail with the agent's own
peer probe (probes/peer.py, the prober; run/responder.py, the responder), so a gang whose
pods reach each other over TCP but not over RoCE never reaches step 1.

The barrier: each pod serves its card (index, node, rails: address, device, pinned GID
index) as one JSON line on `port` to anyone who connects and says its rank, and fetches
every other pod's card by its stable name (an Indexed Job's `<job>-<i>.<service>`, the
headless Service publishing not-ready addresses) until it has them all or the deadline
passes. Each pod then probes pod i+1 (mod n) on each rail, from the rail's address and
pinned GID index to the neighbour's responder on `probe_port` (a probe that fails over
RoCE is made again once: the daemon, too, calls a peer failing only after two failed
probes in a row), says "done" to pod i+1 by fetching its card once more, and stays until
its card has been fetched by every other pod and pod i-1 has said done (or the
deadline), so no pod leaves before the others are done with it. A card is read bounded
(4 KiB, 2 s); what does not parse is garbage, retried until the deadline and then named.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from nodeagent.io.files import one_line, parse_json_state
from nodeagent.model.jobs import NodeRail, Unfit
from nodeagent.model.peers import Class, PeerOutcome, PeerProbe, RailEndpoint
from nodeagent.probes.peer import CLASS_0, RailEnd, probe_peer
from nodeagent.run.responder import Responder, Served

CARD_MAX = 4096
READ_TIMEOUT = 2.0
RETRY = 0.5
MAX_GANG = 2048  # pods in a gang: each fetches every other's card, n^2 in all


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


MAX_CONNECTIONS = 128  # the card server's open connections, in all
MAX_PER_ADDRESS = 8  # from one address (pods on one host's network share one)
RANK_TIMEOUT = 1.0  # seconds from accept to the fetcher's rank line
DONE = "done"  # after the rank: the fetcher has probed this pod (it may leave)
# Probes of one rail's neighbour before it is called failing, as the daemon's
# peers.failures (2): one probe's 68 ms of RC retries missed a healthy peer in a starved
# guest (lab 4g) and refused the whole gang.
ATTEMPTS = 2
SAY_DONE_FOR = 5.0  # seconds of tries to tell the next pod this one is done with it
RESOLVERS = 8  # name lookups that may be waiting at once (getaddrinfo cannot be cut short)


@dataclass
class _Fetcher:
    address: str
    deadline: float
    data: bytes = b""


class CardServer(threading.Thread):
    """Serves this pod's card to every connection, many at once (one selector, non-blocking
    sockets, a deadline per connection, at most MAX_PER_ADDRESS from one address and
    MAX_CONNECTIONS in all: idle connections cost their own slots, not the gang's barrier).
    Remembers which ranks fetched it, and from where, which fetched it once it said
    ready, and which said they are done with it (a fetcher says its rank first, and
    "done" after it when its probes of this pod are over: pods may share an address, on
    one host's network); a claim counts only from an address the rank's name resolves
    to."""

    def __init__(self, card: GangCard, port: int, bind: str = "0.0.0.0") -> None:
        super().__init__(name="gang-barrier", daemon=True)
        # The card served and whether it says ready, replaced as one when the responder is
        # up: a fetch reads both at once, so one sent the ready card is counted as such
        # (read apart, a mark_ready between the two reads sent the ready card uncounted,
        # and this pod waited for its deadline for a fetch that never came again).
        self.served: tuple[bytes, bool] = (card.encode(), False)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((bind, port))
            self.sock.listen(64)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.claims: set[tuple[int, str]] = set()  # (rank, source address)
        self.ready_claims: set[tuple[int, str]] = set()
        self.done_claims: set[tuple[int, str]] = set()
        self.turned_away = 0  # connections over the limits, closed at once
        self._conns: dict[socket.socket, _Fetcher] = {}
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.sock, selectors.EVENT_READ)
        self._halt = threading.Event()

    @property
    def fetched_by(self) -> set[int]:
        """The ranks that said so, from anywhere (see verified() for the ones to trust)."""
        return {rank for rank, _ in self.claims}

    def verified(self, addresses: Mapping[int, frozenset[str]], ready: bool = False,
                 done: bool = False) -> set[int]:
        """The ranks whose claims (to have fetched the card, once ready, or to be done with
        this pod) came from an address their names resolve to."""
        claims = self.done_claims if done else self.ready_claims if ready else self.claims
        return {rank for rank, source in claims if source in addresses.get(rank, ())}

    def mark_ready(self, card: GangCard) -> None:
        self.served = (replace(card, ready=True).encode(), True)

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                for key, _ in self._sel.select(timeout=0.2):
                    if key.fileobj is self.sock:
                        self._accept()
                    else:
                        self._readable(key.fileobj)  # type: ignore[arg-type]
                now = time.monotonic()
                for conn in [c for c, f in self._conns.items() if f.deadline <= now]:
                    self._close(conn)  # no rank line in time: a trickle or an idle socket
        finally:
            for conn in list(self._conns):
                self._close(conn)
            self._sel.close()

    def _accept(self) -> None:
        for _ in range(64):
            try:
                conn, (address, _port) = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            same = sum(1 for f in self._conns.values() if f.address == address)
            if len(self._conns) >= MAX_CONNECTIONS or same >= MAX_PER_ADDRESS:
                self.turned_away += 1
                conn.close()
                continue
            conn.setblocking(False)
            self._conns[conn] = _Fetcher(address, time.monotonic() + RANK_TIMEOUT)
            self._sel.register(conn, selectors.EVENT_READ)

    def _readable(self, conn: socket.socket) -> None:
        fetcher = self._conns[conn]
        try:
            chunk = conn.recv(RANK_MAX + 1 - len(fetcher.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        fetcher.data += chunk
        if chunk and b"\n" not in fetcher.data and len(fetcher.data) <= RANK_MAX:
            return  # more of the rank line to come
        rank, done = _rank(fetcher.data) if chunk or fetcher.data else (None, False)
        card, ready = self.served
        try:
            conn.setblocking(True)
            conn.settimeout(0.2)  # 4 KiB fits a socket buffer: sent at once to any reader
            conn.sendall(card)
        except OSError:
            pass
        else:
            if rank is not None:
                self.claims.add((rank, fetcher.address))
                if ready:
                    self.ready_claims.add((rank, fetcher.address))
                if done:
                    self.done_claims.add((rank, fetcher.address))
        self._close(conn)

    def _close(self, conn: socket.socket) -> None:
        self._conns.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn)
        conn.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)
        self.sock.close()


RANK_MAX = 16  # bytes of a rank line


def _rank(data: bytes) -> tuple[int | None, bool]:
    """The fetcher's rank line: its rank, and whether it says done (`<rank> done`)."""
    try:
        words = data.decode("ascii").split()
        rank = int(words[0])
    except (ValueError, IndexError):  # UnicodeDecodeError too
        return None, False
    if not 0 <= rank < MAX_GANG or words[1:] not in ([], [DONE]):
        return None, False
    return rank, words[1:] == [DONE]


_resolving = threading.BoundedSemaphore(RESOLVERS)


def resolve(host: str, port: int, timeout: float) -> list[str]:
    """The IPv4 addresses of `host`, looked up on a thread of its own so that a resolver
    that does not answer costs at most `timeout` (and at most RESOLVERS lookups wait at
    once); socket.gaierror, or TimeoutError."""
    try:
        return [str(ipaddress.IPv4Address(host))]  # a literal: nothing to look up
    except ValueError:
        pass
    if not _resolving.acquire(timeout=max(0.0, timeout)):
        raise TimeoutError("name lookups are not answering")
    result: list[Any] = []

    def look() -> None:
        try:
            result.append(socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM))
        except OSError as exc:
            result.append(exc)
        finally:
            _resolving.release()

    lookup = threading.Thread(target=look, name="gang-resolve", daemon=True)
    lookup.start()
    lookup.join(timeout)
    if not result:
        raise TimeoutError("name lookup timed out")
    if isinstance(result[0], OSError):
        raise result[0]
    return sorted({info[4][0] for info in result[0]})


def fetch_card(host: str, port: int, me: int, timeout: float = READ_TIMEOUT,
               deadline: float | None = None, source: str | None = None,
               resolved: dict[str, list[str]] | None = None, done: bool = False) -> GangCard:
    """One peer's card, this pod's rank said first (and, with `done`, that this pod has
    finished probing it), from `source` when given (the pod's own
    address: the one its name resolves to, which the peer checks the rank against); the
    whole fetch, name lookup included, ends by `timeout` from now or `deadline`, whichever
    is first. OSError or ValueError with why not. The name is looked up on every try (a pod
    that starts late is found); `resolved` keeps every address each name has had."""
    end = time.monotonic() + timeout
    end = min(end, deadline) if deadline is not None else end

    def left() -> float:
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("timed out")
        return remaining

    addresses = resolve(host, port, left())
    if resolved is not None:
        resolved[host] = sorted({*resolved.get(host, ()), *addresses})
    with socket.create_connection((addresses[0], port), timeout=left(),
                                  source_address=(source, 0) if source else None) as s:
        s.sendall(f"{me} {DONE}\n".encode() if done else f"{me}\n".encode())
        data = b""
        while len(data) <= CARD_MAX:
            s.settimeout(left())  # one deadline for the whole read: a trickle ends too
            chunk = s.recv(CARD_MAX + 1 - len(data))
            if not chunk:
                break
            data += chunk
    return parse_card(data)


def barrier(peers: Sequence[str], me: int, port: int, deadline: float,
            fetch: Callable[..., GangCard] = fetch_card, source: str | None = None,
            resolved: dict[str, list[str]] | None = None,
            ) -> tuple[dict[int, GangCard], list[Unfit]]:
    """Every other pod's card, or what kept them away by the deadline: one deadline over
    the whole gang, each fetch cut short by it."""
    cards: dict[int, GangCard] = {}
    resolved = {} if resolved is None else resolved
    last: dict[int, str] = {i: "not tried" for i in range(len(peers)) if i != me}
    while True:
        for i in sorted(last):
            if time.monotonic() >= deadline:
                break
            try:
                got = fetch(peers[i], port, me, deadline=deadline, source=source,
                            resolved=resolved)
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
             deadline: float, timeout: float, bind: str = "0.0.0.0",
             klass: Class = CLASS_0) -> tuple[list[RingProbe], list[Unfit]]:
    """The barrier, then each rail's probe of the next pod in the job's traffic class
    (its NCCL_IB_TC and NCCL_IB_SL), then waiting for the previous pod's probe. `card`
    carries this pod's rails (address, device, pinned GID index)."""
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
    source = None if bind == "0.0.0.0" else bind  # fetch from where the card is served
    resolved: dict[str, list[str]] = {}
    try:
        cards, problems = barrier(peers, me, port, deadline, source=source, resolved=resolved)
        addresses = {i: frozenset(resolved.get(peers[i], ())) for i in cards}
        if problems:
            return [], problems
        allowed = frozenset(r.address for c in cards.values() for r in c.rails if r.address)
        responder = Responder(probe_port, hold=2 * timeout + 1.0)
        responder.serve(_served(card, allowed))
        responder.start()
        server.mark_ready(card)
        succ, pred = cards[(me + 1) % n], cards[(me - 1) % n]
        # A barrier that filled at the last moment still leaves the ring its own time.
        deadline = max(deadline, time.monotonic()
                       + 2 * ATTEMPTS * timeout * max(1, len(card.rails)) + 5.0)
        # A card fetched at the barrier may already say ready: the next pod, counting that
        # fetch as this pod having seen it ready, may be gone by now (asking again waited
        # for the deadline: seen 2 in 30 runs of a gang of three on a loaded machine).
        problems = [] if succ.ready else _until_ready(peers[succ.index], port, me, deadline,
                                                      source, resolved)
        probes = [] if problems else _probe_ring(card, succ, probe_port, timeout, klass)
        problems += [u for p in probes if (u := p.unfit()) is not None]
        _say_done(peers[succ.index], port, me, deadline, source, resolved)
        _until_done(server, responder, card, pred, n, deadline, addresses)
        return probes, problems
    finally:
        server.stop()
        if responder is not None:
            responder.stop()
            responder.join(timeout=5)


def _fetch_until(host: str, port: int, me: int, deadline: float, source: str | None,
                 resolved: dict[str, list[str]], done: bool = False) -> str | None:
    """The next pod's card fetched until it says ready (or, with `done`, until one fetch
    telling it so got through), or the deadline: None, or why not."""
    why = "not ready"
    while time.monotonic() < deadline:
        try:
            if fetch_card(host, port, me, deadline=deadline, source=source,
                          resolved=resolved, done=done).ready or done:
                return None
        except (OSError, ValueError) as exc:
            why = _words(exc)
        time.sleep(RETRY / 5)
    return why


def _until_ready(host: str, port: int, me: int, deadline: float, source: str | None,
                 resolved: dict[str, list[str]]) -> list[Unfit]:
    """The next pod's card until it says its responder is up."""
    why = _fetch_until(host, port, me, deadline, source, resolved)
    return [] if why is None else [
        Unfit("gang", f"{host}: its responder was not up by the deadline ({why})")]


def _say_done(host: str, port: int, me: int, deadline: float, source: str | None,
              resolved: dict[str, list[str]]) -> None:
    """Tell the next pod this pod is done with it (a fetch with "done"), whatever this pod
    found: it stays for that or its own deadline. A few seconds' tries: one that has gone
    away needs no word, and this pod need not wait its deadline out for it."""
    _fetch_until(host, port, me, min(deadline, time.monotonic() + SAY_DONE_FOR), source,
                 resolved, done=True)


def probe_again_once_failed(probe: Callable[[], PeerProbe],
                            attempts: int = ATTEMPTS) -> PeerProbe:
    """`probe()` made again after a RoCE failure, up to `attempts` in all: the last one."""
    got = probe()
    for _ in range(attempts - 1):
        if got.outcome not in (PeerOutcome.ROCE_FAILED, PeerOutcome.MTU_FAILED):
            break
        got = probe()
    return got


def _probe_ring(card: GangCard, succ: GangCard, probe_port: int,
                timeout: float, klass: Class) -> list[RingProbe]:
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
            got = probe_again_once_failed(functools.partial(
                probe_peer, end, rail.name, peer.address, succ.node, probe_port, 5, timeout,
                klass=klass))
        finally:
            end.close()
        out.append(RingProbe(rail.name, source, target, got.outcome, got.error))
    return out


def _until_done(server: CardServer, responder: Responder, card: GangCard, pred: GangCard,
                n: int, deadline: float, addresses: Mapping[int, frozenset[str]]) -> None:
    """Until every other pod has this pod's card, the previous pod has seen it ready (it
    waits for that before probing, even with nothing to probe) and has said it is done
    with it (its probes over, the second one included), or the deadline. A rank counts
    only from an address its name resolves to: a stranger claiming it cannot send this pod
    away early."""
    others = set(range(n)) - {card.index}
    while time.monotonic() < deadline:
        fetched = others <= server.verified(addresses) \
            and pred.index in server.verified(addresses, ready=True) \
            and pred.index in server.verified(addresses, done=True)
        if fetched and responder.open_connections == 0:
            return
        time.sleep(0.05)
